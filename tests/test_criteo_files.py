"""The MLPerf-layout loader (harness/data/criteo_files.py) and the generator (harness/tools/make_dataset.py).

A hand-written 3-day file set is read back exactly; every corruption is refused in one line that
names the file; a rank reads only its slice of each global batch.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest

from harness.data.criteo_files import CriteoFiles, DataError
from harness.presets import tiny

MODEL = tiny().model
HOT = MODEL.multi_hot
ROWS = (5, 4, 6)  # days 0, 1 train (9 rows); day 2 is held out: val its first 3 rows, test the last 3


def day_arrays(d: int, n: int) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """Values that say where they come from: dense 1000d + 10 row + col / 100, label row % 2,
    id 1_000_000 d + 1000 row + 10 feature + slot (above tiny's 1000 rows: the loader must hash)."""
    r = np.arange(n)
    dense = (1000 * d + 10 * r[:, None] + np.arange(13)[None, :] / 100).astype(np.float32)
    labels = (r % 2).astype(np.int32).reshape(-1, 1)
    sparse = [(1_000_000 * d + 1000 * r[:, None] + 10 * f + np.arange(h)[None, :]).astype(np.int32)
              for f, h in enumerate(HOT)]
    return dense, labels, sparse


def write_days(folder: Path, rows=ROWS) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for d, n in enumerate(rows):
        dense, labels, sparse = day_arrays(d, n)
        np.save(folder / f"day_{d}_dense.npy", dense)
        np.save(folder / f"day_{d}_labels.npy", labels)
        np.savez(folder / f"day_{d}_sparse_multi_hot.npz", **{str(f): s for f, s in enumerate(sparse)})
    return folder


def expected(rows: list[tuple[int, int]]):
    """(dense, labels, ids of each feature) of (day, row) pairs, from day_arrays, hashed as the model's tables."""
    dense = np.stack([day_arrays(d, ROWS[d])[0][r] for d, r in rows])
    labels = np.array([r % 2 for _, r in rows], dtype=np.float32)
    ids = [np.concatenate([day_arrays(d, ROWS[d])[2][f][r] for d, r in rows]) % MODEL.table_rows[f]
           for f in range(len(HOT))]
    return dense, labels, ids


def check_batch(batch, rows: list[tuple[int, int]]) -> None:
    dense, labels, ids = expected(rows)
    assert np.array_equal(batch.dense.numpy(), dense)
    assert np.array_equal(batch.labels.numpy(), labels)
    assert batch.sparse.lengths.tolist() == [[h] * len(rows) for h in HOT]
    assert np.array_equal(batch.sparse.values.numpy(), np.concatenate(ids))


def test_three_hand_written_days_read_back_exactly(tmp_path):
    files = CriteoFiles(write_days(tmp_path / "d"), MODEL, global_batch_size=4)
    assert files.train_rows == 9 and files.train_batches == 2
    train = [(0, r) for r in range(5)] + [(1, r) for r in range(4)]
    check_batch(files.global_batch(0), train[0:4])
    check_batch(files.global_batch(1), train[4:8])  # spans day 0's last row and day 1's first three
    check_batch(files.local_batch(1, 1, 2), train[6:8])  # rank 1 of 2: the second half
    check_batch(files.held_out_batch("val", 0, 3), [(2, r) for r in range(3)])
    check_batch(files.held_out_batch("test", 1, 2), [(2, 4), (2, 5)])
    with pytest.raises(DataError, match="hold 9 samples, 2 global batches of 4; the run asks for 3 iterations"):
        files.check_iterations(3)


def _corrupt(folder: Path, case: str) -> str:
    """Damage a written day set one way; returns the file name the error must name."""
    dense, labels, sparse = day_arrays(1, ROWS[1])
    if case == "missing labels":
        (folder / "day_1_labels.npy").unlink()
        return "day_1_labels.npy"
    if case == "truncated dense":
        p = folder / "day_0_dense.npy"
        p.write_bytes(p.read_bytes()[:-7])
        return "day_0_dense.npy"
    if case == "dense float64":
        np.save(folder / "day_1_dense.npy", dense.astype(np.float64))
        return "day_1_dense.npy"
    if case == "dense 12 columns":
        np.save(folder / "day_1_dense.npy", dense[:, :12])
        return "day_1_dense.npy"
    if case == "labels rows":
        np.save(folder / "day_1_labels.npy", labels[:3])
        return "day_1_labels.npy"
    if case == "pickled labels":
        np.save(folder / "day_1_labels.npy", np.array([[0]] * ROWS[1], dtype=object), allow_pickle=True)
        return "day_1_labels.npy"
    if case == "member missing":
        np.savez(folder / "day_1_sparse_multi_hot.npz", **{str(f): s for f, s in enumerate(sparse[:-1])})
        return "day_1_sparse_multi_hot.npz member 25.npy"
    if case == "member compressed":
        np.savez_compressed(folder / "day_1_sparse_multi_hot.npz", **{str(f): s for f, s in enumerate(sparse)})
        return "day_1_sparse_multi_hot.npz member 0.npy"
    if case == "member hotness":
        bad = list(sparse)
        bad[20] = bad[20][:, :5]
        np.savez(folder / "day_1_sparse_multi_hot.npz", **{str(f): s for f, s in enumerate(bad)})
        return "day_1_sparse_multi_hot.npz member 20.npy"
    if case == "member int64":
        np.savez(folder / "day_1_sparse_multi_hot.npz", **{str(f): s.astype(np.int64) for f, s in enumerate(sparse)})
        return "day_1_sparse_multi_hot.npz member 0.npy"
    if case == "member truncated":
        p = folder / "day_1_sparse_multi_hot.npz"
        with zipfile.ZipFile(p) as zf:
            info = zf.getinfo("25.npy")
        p.write_bytes(p.read_bytes()[: info.header_offset + 200])  # the zip's directory is gone too
        return "day_1_sparse_multi_hot.npz"
    if case == "not a zip":
        (folder / "day_1_sparse_multi_hot.npz").write_bytes(b"not a zip at all")
        return "day_1_sparse_multi_hot.npz"
    if case == "day gap":
        for kind in ("dense", "labels"):
            (folder / f"day_1_{kind}.npy").rename(folder / f"day_3_{kind}.npy")
        return "day_1_dense.npy is missing"
    raise AssertionError(case)


CORRUPTIONS = ("missing labels", "truncated dense", "dense float64", "dense 12 columns", "labels rows",
               "pickled labels", "member missing", "member compressed", "member hotness", "member int64",
               "member truncated", "not a zip", "day gap")


@pytest.mark.parametrize("case", CORRUPTIONS)
def test_every_corruption_is_refused_in_one_line_naming_the_file(case, tmp_path):
    folder = write_days(tmp_path / "d")
    name = _corrupt(folder, case)
    with pytest.raises(DataError) as err:
        CriteoFiles(folder, MODEL, global_batch_size=4)
    assert name in str(err.value) and "\n" not in str(err.value), str(err.value)


@pytest.mark.parametrize("case, what", [
    ("negative id", r"day_1_sparse_multi_hot.npz member 3.npy: a negative id in rows 0..2"),
    ("label 2", r"day_1_labels.npy: a label other than 0 or 1 in rows 0..2"),
])
def test_bad_values_are_refused_naming_the_day_that_holds_them(case, what, tmp_path):
    """Global batch 1 is day 0's last row and day 1's first three: the bad value sits in day 1."""
    folder = write_days(tmp_path / "d")
    dense, labels, sparse = day_arrays(1, ROWS[1])
    if case == "negative id":
        sparse[3][1, 0] = -5
        np.savez(folder / "day_1_sparse_multi_hot.npz", **{str(f): s for f, s in enumerate(sparse)})
    else:
        labels[1] = 2
        np.save(folder / "day_1_labels.npy", labels)
    files = CriteoFiles(folder, MODEL, global_batch_size=4)
    files.global_batch(0)  # day 0 alone: clean
    with pytest.raises(DataError, match=what):
        files.global_batch(1)


def test_too_few_days_are_refused(tmp_path):
    folder = write_days(tmp_path / "d", rows=(5,))
    with pytest.raises(DataError, match="holds 1 day"):
        CriteoFiles(folder, MODEL, global_batch_size=4)


def test_a_rank_reads_only_its_slice_of_each_global_batch(tmp_path, monkeypatch):
    """Every row that leaves a mapped file passes read_rows: count them per array."""
    files = CriteoFiles(write_days(tmp_path / "d", rows=(40, 40, 8)), MODEL, global_batch_size=8)
    read: list[tuple[int, int, int]] = []
    real = CriteoFiles.read_rows

    def spy(self, arr, first, count):
        read.append((arr.shape[1], first, count))
        return real(self, arr, first, count)

    monkeypatch.setattr(CriteoFiles, "read_rows", spy)
    for it in range(files.train_batches):
        files.local_batch(it, 2, 4)  # rank 2 of 4: rows 8 it + 4, 8 it + 5 of the training days
    mine = [(8 * it + 4) % 40 for it in range(10)]
    firsts = sorted({first for _, first, _ in read})
    assert firsts == sorted(set(mine)) and all(count == 2 for _, _, count in read)
    arrays = 2 + len(HOT)  # dense, labels and each feature's ids: each read once a batch
    assert len(read) == 10 * arrays


def test_bench_refuses_a_corrupt_data_folder_before_making_a_run(tmp_path, capsys):
    from harness.cli import main

    folder = write_days(tmp_path / "d")
    _corrupt(folder, "dense 12 columns")
    runs = tmp_path / "runs"
    code = main(["bench", "--preset", "tiny", "--device", "cpu", "--data", str(folder), "--runs-root", str(runs)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and not runs.exists()
    assert len(err.splitlines()) == 1 and "day_1_dense.npy: shape (4, 12)" in err


def test_generated_days_open_and_repeat_with_their_seed(tmp_path, capsys):
    from harness.tools.make_dataset import main

    assert main(["--out", str(tmp_path / "a"), "--rows", "3000", "--days", "2", "--seed", "7"]) == 0
    assert main(["--out", str(tmp_path / "b"), "--rows", "3000", "--days", "2", "--seed", "7"]) == 0
    a, b = (CriteoFiles(tmp_path / x, MODEL, global_batch_size=96) for x in "ab")
    assert a.train_batches == 3000 // 96
    for x, y in ((a.global_batch(5), b.global_batch(5)), (a.held_out_batch("test", 0, 50), b.held_out_batch("test", 0, 50))):
        assert np.array_equal(x.sparse.values.numpy(), y.sparse.values.numpy())
        assert np.array_equal(x.labels.numpy(), y.labels.numpy())
    assert "teacher's own AUROC on the last day" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path / "a")])  # never overwrites


def test_the_generators_auroc_by_hand():
    from harness.tools.make_dataset import auroc

    # Positives score 0.35 and 0.8, negatives 0.1 and 0.4: 3 of the 4 pairs ordered right.
    assert auroc(np.array([0.1, 0.4, 0.35, 0.8]), np.array([0, 0, 1, 1])) == 0.75
    # A tie between a positive and a negative counts half.
    assert auroc(np.array([0.5, 0.5]), np.array([0, 1])) == 0.5
