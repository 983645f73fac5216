"""The MLPerf DLRM-DCNv2 dataset on disk: multi-hot Criteo 1TB as the MLPerf reference reads it.

Layout (mlcommons/training recommendation_v2/torchrec_dlrm, TorchRec's preprocessed Criteo), per
day d = 0, 1, ... in one directory:

- ``day_{d}_dense.npy``: float32, (rows, 13), the log-transformed integer features;
- ``day_{d}_labels.npy``: int32, (rows, 1), 0 or 1;
- ``day_{d}_sparse_multi_hot.npz``: an uncompressed zip of ``0.npy`` .. ``25.npy``; member f is
  int32, (rows, hotness of feature f). Ids are raw: a table of R rows looks up id % R (the
  reference's hashing).

The days but the last train, in day order; the last day is split in halves, the first
ceil(rows / 2) to validate, the rest to test (as the reference does).

Every array is memory-mapped where it lies in its file (npy headers read without pickle; an npz
member located through its zip entry), so a rank touches only the rows it reads. Global batch i
is rows [iG, (i+1)G) of the training days laid end to end, and rank r reads rows
[iG + rB, iG + (r+1)B) of it: any world size sees the same global batches, as with the
synthetic stream. (The reference instead gives each rank one contiguous block of the whole
dataset, so its global batches change with the world size.)

A file that is missing, truncated, compressed, of another dtype or shape than the model needs,
or at odds with its day's other files is refused when the dataset is opened, in one line that
names the file; ids below zero and labels other than 0/1 are refused in the batch that holds them.
"""

from __future__ import annotations

import math
import os
import re
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from harness.config import ModelConfig
from harness.data.synthetic import Batch
from model.features import SparseFeatures

DENSE, LABELS, SPARSE = "day_{}_dense.npy", "day_{}_labels.npy", "day_{}_sparse_multi_hot.npz"
DENSE_DTYPE, LABEL_DTYPE, ID_DTYPE = np.dtype("<f4"), np.dtype("<i4"), np.dtype("<i4")
_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, then the name's and the extra field's lengths
_LOCAL_SIGNATURE = b"PK\x03\x04"


class DataError(ValueError):
    """A dataset file the harness cannot read as the MLPerf layout; the message names the file."""


def _map_npy(path: Path, offset: int, end: int, what: str) -> np.ndarray:
    """The array whose npy header starts at `offset` in `path` (its bytes end by `end`), mapped read-only."""
    with open(path, "rb") as f:
        f.seek(offset)
        try:
            version = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read(f)
        except ValueError as exc:
            raise DataError(f"{what}: not an npy array ({exc})") from None
        data_start = f.tell()
    if dtype.hasobject:
        raise DataError(f"{what}: holds Python objects (pickled); the layout stores plain numbers")
    if fortran and len(shape) > 1:
        raise DataError(f"{what}: stored column-major (Fortran order); rows must be contiguous")
    need = math.prod(shape) * dtype.itemsize
    if data_start + need > end:
        raise DataError(f"{what}: truncated: its header says {shape} {dtype} ({need} bytes), "
                        f"the file holds {max(end - data_start, 0)}")
    if need == 0:
        return np.zeros(shape, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=data_start, shape=shape)


def map_npy_file(path: Path) -> np.ndarray:
    if not path.is_file():
        raise DataError(f"{path}: missing")
    return _map_npy(path, 0, path.stat().st_size, str(path))


def map_npz_member(path: Path, member: str) -> np.ndarray:
    """One array of an uncompressed npz, mapped where the zip stores it (np.load would copy it)."""
    if not path.is_file():
        raise DataError(f"{path}: missing")
    what = f"{path} member {member}"
    try:
        with zipfile.ZipFile(path) as zf:
            info = zf.getinfo(member)
    except zipfile.BadZipFile as exc:
        raise DataError(f"{path}: not a readable zip ({exc}); truncated?") from None
    except KeyError:
        raise DataError(f"{what}: missing") from None
    if info.compress_type != zipfile.ZIP_STORED:
        raise DataError(f"{what}: compressed; the layout needs stored members (np.savez, not np.savez_compressed)")
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        raw = f.read(_LOCAL_HEADER.size)
    if len(raw) < _LOCAL_HEADER.size or raw[:4] != _LOCAL_SIGNATURE:
        raise DataError(f"{what}: its zip entry's local header is damaged")
    _, name_len, extra_len = _LOCAL_HEADER.unpack(raw)
    start = info.header_offset + _LOCAL_HEADER.size + name_len + extra_len
    return _map_npy(path, start, min(start + info.file_size, path.stat().st_size), what)


def _expect(arr: np.ndarray, what: str, dtype: np.dtype, shape: tuple[int | None, ...]) -> None:
    if arr.dtype != dtype:
        raise DataError(f"{what}: dtype {arr.dtype}, the layout has {dtype}")
    if arr.ndim != len(shape) or any(want is not None and have != want for have, want in zip(arr.shape, shape)):
        shown = tuple("rows" if s is None else s for s in shape)
        raise DataError(f"{what}: shape {arr.shape}, the layout has {shown}")


@dataclass(frozen=True)
class Day:
    dense: np.ndarray
    labels: np.ndarray
    sparse: tuple[np.ndarray, ...]
    files: tuple[Path, Path, Path]
    """dense, labels, sparse."""

    @property
    def rows(self) -> int:
        return self.dense.shape[0]


def open_day(folder: Path, d: int, model: ModelConfig) -> Day:
    files = tuple(folder / name.format(d) for name in (DENSE, LABELS, SPARSE))
    dense, labels = map_npy_file(files[0]), map_npy_file(files[1])
    _expect(dense, str(files[0]), DENSE_DTYPE, (None, model.num_dense))
    _expect(labels, str(files[1]), LABEL_DTYPE, (dense.shape[0], 1))
    sparse = []
    for f, hot in enumerate(model.multi_hot):
        ids = map_npz_member(files[2], f"{f}.npy")
        _expect(ids, f"{files[2]} member {f}.npy", ID_DTYPE, (dense.shape[0], hot))
        sparse.append(ids)
    return Day(dense=dense, labels=labels, sparse=tuple(sparse), files=files)  # type: ignore[arg-type]


def day_numbers(folder: Path) -> list[int]:
    """The days present (by their dense file), which must be 0, 1, ... without a gap."""
    if not folder.is_dir():
        raise DataError(f"{folder}: not a directory")
    found = sorted(int(m.group(1)) for p in folder.iterdir() if (m := re.fullmatch(r"day_(\d+)_dense\.npy", p.name)))
    if len(found) < 2:
        raise DataError(f"{folder}: holds {len(found)} day(s) of {DENSE.format('N')}; the layout needs at least 2 "
                        "(the days but the last train; the last validates and tests)")
    if found != list(range(len(found))):
        missing = sorted(set(range(found[-1] + 1)) - set(found))
        raise DataError(f"{folder}: days are numbered 0, 1, ...; {DENSE.format(missing[0])} is missing")
    return found


class CriteoFiles:
    """The training stream and the held-out halves of an MLPerf-layout folder; the same interface
    as harness.data.synthetic.SyntheticCriteo (samples, global_batch, local_batch, is_regular)."""

    def __init__(self, folder: str | os.PathLike, model: ModelConfig, global_batch_size: int) -> None:
        self.folder, self.model, self.global_batch_size = Path(folder), model, global_batch_size
        self.days = [open_day(self.folder, d, model) for d in day_numbers(self.folder)]
        train = self.days[:-1]
        self.starts = np.cumsum([0] + [d.rows for d in train])
        self.train_rows = int(self.starts[-1])
        self.hashes = np.asarray(model.table_rows, dtype=np.int64)

    @property
    def train_batches(self) -> int:
        """Whole global batches the training days hold (a last partial one is dropped)."""
        return self.train_rows // self.global_batch_size

    def check_iterations(self, iterations: int) -> None:
        if iterations > self.train_batches:
            raise DataError(f"{self.folder}: the training days hold {self.train_rows} samples, {self.train_batches} global "
                            f"batches of {self.global_batch_size}; the run asks for {iterations} iterations")

    def _pieces(self, start: int, count: int):
        """(day, first row, rows) pieces covering training rows start .. start+count-1."""
        end = start + count
        d = int(np.searchsorted(self.starts, start, side="right")) - 1
        while start < end:
            take = min(end, int(self.starts[d + 1])) - start
            yield self.days[d], start - int(self.starts[d]), take
            start += take
            d += 1

    def read_rows(self, arr: np.ndarray, first: int, count: int) -> np.ndarray:
        """The one place rows leave a mapped file (a test counts what passes here)."""
        return np.asarray(arr[first:first + count])

    def _gather(self, pieces: list[tuple[Day, int, int]], column: int, bad, why: str) -> np.ndarray:
        """One array's rows over the pieces (column: 0 dense, 1 labels, 2 + f feature f's ids);
        a piece where bad(rows) holds is refused, naming its own file and rows."""
        out = []
        for day, a, n in pieces:
            rows = self.read_rows(day.dense if column == 0 else day.labels if column == 1 else day.sparse[column - 2], a, n)
            if bad is not None and rows.size and bad(rows):
                where = day.files[column] if column < 2 else f"{day.files[2]} member {column - 2}.npy"
                raise DataError(f"{where}: {why} in rows {a}..{a + n - 1}")
            out.append(rows)
        return np.concatenate(out)

    def _batch(self, pieces: list[tuple[Day, int, int]]) -> Batch:
        # A NaN or inf feature would train every loss to NaN and still complete: refused here, per batch
        # (a check of whole days at open would read every file before the first iteration).
        dense = self._gather(pieces, 0, lambda x: not np.isfinite(x).all(), "a non-finite dense value (NaN or inf)")
        labels = self._gather(pieces, 1, lambda x: x.min() < 0 or x.max() > 1, "a label other than 0 or 1").reshape(-1)
        count = dense.shape[0]
        values = []
        for f in range(len(self.model.multi_hot)):
            ids = self._gather(pieces, 2 + f, lambda x: x.min() < 0, "a negative id")
            values.append((ids.astype(np.int64) % self.hashes[f]).reshape(-1))  # sample by sample
        hot = np.asarray(self.model.multi_hot, dtype=np.int64)
        return Batch(
            dense=torch.from_numpy(dense),
            sparse=SparseFeatures(lengths=torch.from_numpy(np.repeat(hot[:, None], count, axis=1)),
                                  values=torch.from_numpy(np.concatenate(values)),
                                  feature_values=tuple(int(h) * count for h in hot)),
            labels=torch.from_numpy(labels.astype(np.float32)),
        )

    def samples(self, start: int, count: int) -> Batch:
        """Training samples start .. start+count-1 (the training days end to end)."""
        if start < 0 or start + count > self.train_rows:
            raise IndexError(f"samples {start}..{start + count - 1} outside the {self.train_rows} training samples")
        return self._batch(list(self._pieces(start, count)))

    def is_regular(self, iteration: int) -> bool:
        """Every sample of the layout has its features' full hotness."""
        return True

    def global_batch(self, iteration: int) -> Batch:
        return self.samples(iteration * self.global_batch_size, self.global_batch_size)

    def local_batch(self, iteration: int, rank: int, world_size: int, *, pin: bool = False) -> Batch:
        """pin: copied to page-locked memory once read, for an asynchronous copy to a GPU."""
        local = self.global_batch_size // world_size
        batch = self.samples(iteration * self.global_batch_size + rank * local, local)
        return batch.pin() if pin else batch

    def held_out(self, stage: str) -> tuple[int, int]:
        """(first row, rows) of the last day's half for `stage`: val the first ceil(n / 2), test the rest."""
        n = self.days[-1].rows
        half = -(-n // 2)
        if stage == "val":
            return 0, half
        if stage == "test":
            return half, n - half
        raise ValueError(f"stage {stage!r} is not val or test")

    def held_out_scored(self, stage: str) -> int:
        """The samples an evaluation scores: `stage`'s half cut to whole global batches (harness/run/evaluate.py)."""
        return self.held_out(stage)[1] // self.global_batch_size * self.global_batch_size

    def held_out_batch(self, stage: str, first: int, count: int) -> Batch:
        """Rows first .. first+count-1 of `stage`'s half of the last day."""
        start, rows = self.held_out(stage)
        if first < 0 or first + count > rows:
            raise IndexError(f"{stage} rows {first}..{first + count - 1} outside its {rows}")
        return self._batch([(self.days[-1], start + first, count)])
