"""The parameter server of dynamic tables: a key-value store of evicted rows (issue 15, part 3).

A dynamic table keeps a fixed number of slots (model/id_transformer.py). When an id is evicted,
its row and its optimizer state go here, as one float32 vector of the table's row width; when it
comes back, they are read from here. The store is only a key-value store: (table, id) -> row.

- `EmbeddedStore` (the default): in this process, in host memory up to a budget, then in a
  memory-mapped file under the run folder up to a second budget.
- `RedisStore` (`redis://host:port[/db]`): one key a row, written and read in pipelined batches,
  for a store shared by many ranks and hosts.

Both raise `StoreError` with one line when they cannot do what is asked: unreachable, or full.
A put that cannot be stored whole stores nothing (the rows stay in their slots, and the run
fails saying so); a get returns which ids it found.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Protocol
from urllib.parse import urlparse

import numpy as np
import torch

from harness.store_url import ALLOW_EVICTION_ENV, check_store_url, mask_secrets
from model.extensions import extension


class StoreError(RuntimeError):
    """The store is unreachable or full (one line, naming it)."""


class ParamStore(Protocol):
    def put(self, table: int, ids: torch.Tensor, rows: torch.Tensor) -> None:
        """Store rows[i] (float32, (n, width)) as the row of ids[i] (int64) of `table`; ids are distinct."""

    def get(self, table: int, ids: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(found: bool (n,), rows: float32 (n, width), zeros where not found)."""

    def close(self) -> None: ...


def _check(ids: torch.Tensor, rows: torch.Tensor | None = None) -> None:
    if ids.dtype != torch.int64 or ids.dim() != 1:
        raise ValueError("store: ids must be a 1-d int64 tensor")
    if rows is not None and (rows.dtype != torch.float32 or rows.dim() != 2 or rows.shape[0] != ids.numel()):
        raise ValueError("store: rows must be float32, one row an id")


class EmbeddedStore:
    """Rows in host memory up to `memory_bytes`, then in `spill_dir/table<t>.f32` (memory-mapped,
    grown as needed) up to `spill_bytes`; beyond both, a put fails whole."""

    def __init__(self, *, memory_bytes: int, spill_dir: Path, spill_bytes: int) -> None:
        if memory_bytes < 0 or spill_bytes < 0:
            raise ValueError("store: budgets must be >= 0 bytes")
        self.memory_bytes, self.spill_bytes, self.spill_dir = memory_bytes, spill_bytes, Path(spill_dir)
        self._tables: dict[int, _Table] = {}

    def _table(self, table: int, width: int) -> _Table:
        t = self._tables.get(table)
        if t is None:
            t = self._tables[table] = _Table(self, table, width)
        elif t.width != width:
            raise ValueError(f"store: table {table} holds rows of {t.width} floats, not {width}")
        return t

    def bytes_held(self) -> tuple[int, int]:
        """(bytes in memory, bytes in spill files) the rows take."""
        memory = sum(t.memory_rows_used * t.width * 4 for t in self._tables.values())
        spilled = sum(t.spill_rows_used * t.width * 4 for t in self._tables.values())
        return memory, spilled

    def put(self, table: int, ids: torch.Tensor, rows: torch.Tensor) -> None:
        _check(ids, rows)
        self._table(table, rows.shape[1]).put(ids, rows.numpy())

    def get(self, table: int, ids: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        _check(ids)
        found, rows = self._table(table, width).get(ids)
        return torch.from_numpy(found), torch.from_numpy(rows)

    def close(self) -> None:
        for t in self._tables.values():
            t.close()

    def remove_files(self) -> None:
        """Delete the spill files (a completed run's: nothing will read them again)."""
        self.close()
        shutil.rmtree(self.spill_dir, ignore_errors=True)


def _row_index():
    """A new id -> row position index (csrc/row_index.cpp), and the position it gives an id not held."""
    ext = extension("harness.run._row_index", "parameter store's index")
    return ext.RowIndex(), ext.ABSENT


class _Table:
    """One table's rows: position p < memory_rows in an array in memory, the rest in its file."""

    def __init__(self, store: EmbeddedStore, table: int, width: int) -> None:
        self.store, self.table, self.width = store, table, width
        # id -> position (negative: -1 - its row in the spill file); every id put, never forgotten
        self.where, self.absent = _row_index()
        self.memory = np.empty((0, width), dtype=np.float32)
        self.memory_rows_used = 0
        self.spill: np.memmap | None = None
        self.spill_rows_used = 0
        self.path = store.spill_dir / f"table{table}.f32"

    def _free_memory_rows(self) -> int:
        used, _ = self.store.bytes_held()
        return max(0, (self.store.memory_bytes - used) // (4 * self.width))

    def _free_spill_rows(self) -> int:
        _, used = self.store.bytes_held()
        return max(0, (self.store.spill_bytes - used) // (4 * self.width))

    # Whole-batch steps only (the index's lookups in C++, the rows' copies in numpy): with a
    # Python step an id, a put of 30,000 evicted rows took tens of ms.
    def put(self, ids: torch.Tensor, rows: np.ndarray) -> None:
        pos = self.where.find(ids).numpy()
        new = np.flatnonzero(pos == self.absent)
        to_memory = min(len(new), self._free_memory_rows())
        to_spill = len(new) - to_memory
        if to_spill > self._free_spill_rows():  # checked before anything moves: all or nothing
            memory, spilled = self.store.bytes_held()
            raise StoreError(
                f"parameter store full: {len(new)} new rows of table {self.table} ({len(new) * self.width * 4:,} B) do not "
                f"fit: {memory:,} of {self.store.memory_bytes:,} B in memory and {spilled:,} of "
                f"{self.store.spill_bytes:,} B in {self.store.spill_dir} are taken")
        self._grow_memory(self.memory_rows_used + to_memory)
        if to_spill:
            self._grow_spill(self.spill_rows_used + to_spill)
        # New ids take the next memory rows, then the next spill rows (negative: -1 - spill row).
        pos[new[:to_memory]] = np.arange(self.memory_rows_used, self.memory_rows_used + to_memory)
        pos[new[to_memory:]] = -1 - np.arange(self.spill_rows_used, self.spill_rows_used + to_spill)
        self.where.insert(ids[torch.from_numpy(new)], torch.from_numpy(pos[new]))
        self.memory_rows_used += to_memory
        self.spill_rows_used += to_spill
        in_memory = pos >= 0
        if in_memory.all():  # the usual case: one scatter, no masked copy of the rows first
            self.memory[pos] = rows
            return
        self.memory[pos[in_memory]] = rows[in_memory]
        spilled = ~in_memory
        self.spill[-1 - pos[spilled]] = rows[spilled]

    def get(self, ids: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        pos = self.where.find(ids).numpy()
        found = pos != self.absent
        if (pos >= 0).all():  # the usual case: every row found in memory, one gather
            return found, self.memory[pos]
        out = np.zeros((len(ids), self.width), dtype=np.float32)
        in_memory = np.flatnonzero(pos >= 0)  # ABSENT is negative: held in memory implies found
        out[in_memory] = self.memory[pos[in_memory]]
        spilled = np.flatnonzero(found & (pos < 0))
        if len(spilled):
            out[spilled] = self.spill[-1 - pos[spilled]]
        return found, out

    def _grow_memory(self, rows: int) -> None:
        # Once, the most rows this table can ever hold in memory (free rows only shrink as the store
        # fills): np.empty of that many is address space, its pages taken only as rows are written,
        # so the array never grows again. Grown by doubling, a copy of every row held came with
        # each growth: 0.1-0.6 s at a time in a mlperf-ids run.
        if rows > self.memory.shape[0]:
            cap = self.memory_rows_used + self._free_memory_rows()
            try:
                grown = np.empty((cap, self.width), dtype=np.float32)
            except MemoryError:
                raise StoreError(f"parameter store: cannot reserve {cap * self.width * 4:,} B for table {self.table}'s "
                                 "rows in memory (the memory budget, --ps-memory-gib, is more than this host "
                                 "can give)") from None
            grown[: self.memory_rows_used] = self.memory[: self.memory_rows_used]
            self.memory = grown

    def _grow_spill(self, rows: int) -> None:
        have = 0 if self.spill is None else self.spill.shape[0]
        if rows <= have:
            return
        cap = min(max(rows, 2 * have, 1024), self.spill_rows_used + self._free_spill_rows())
        try:
            self.store.spill_dir.mkdir(parents=True, exist_ok=True)
            # Extend the file with its blocks allocated now: a disk too full says so here, where a
            # sparse extension would fail later as a SIGBUS on a write through the mapping. The
            # mapping is made anew over it; the old one needs no flush first, as both map the same
            # pages of the file.
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)  # not O_APPEND: glibc's fallback refuses it
            try:
                os.posix_fallocate(fd, have * self.width * 4, (cap - have) * self.width * 4)
            finally:
                os.close(fd)
            self.spill = np.memmap(self.path, dtype=np.float32, mode="r+", shape=(cap, self.width))
        except OSError as exc:
            raise StoreError(f"parameter store: cannot grow {self.path}: {exc.strerror or exc}") from exc

    def close(self) -> None:
        if self.spill is not None:
            self.spill.flush()
            self.spill = None


class RedisStore:
    """Rows as Redis strings, key `<prefix>:<table>:<id>`, written (MSET) and read (MGET) in
    pipelined chunks of `chunk` keys. The ids written are remembered (an index a table, as the
    embedded store's): a row written once and then missing (evicted, flushed) fails the run, where
    taking it for a row never seen would silently train a re-initialised one."""

    def __init__(self, url: str, *, prefix: str = "dlrm", chunk: int = 4096, timeout_s: float = 5.0,
                 allow_eviction: bool | None = None) -> None:
        import redis

        check_store_url(url)
        self.url, self.prefix, self.chunk = mask_secrets(url), prefix, chunk  # self.url: for messages
        self._errors = (redis.ConnectionError, redis.TimeoutError)
        self._auth_errors = (redis.AuthenticationError, redis.AuthenticationWrongNumberOfArgsError)
        self._response_error = redis.ResponseError
        self._written: dict[int, object] = {}
        self.client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        try:
            self.client.ping()
            policy = self.client.config_get("maxmemory-policy").get("maxmemory-policy", "noeviction")
        except self._auth_errors as exc:
            raise StoreError(f"parameter store {self.url}: authentication failed ({exc})") from exc
        except self._errors as exc:
            raise StoreError(f"parameter store {self.url} unreachable: {exc}") from exc
        except self._response_error as exc:  # a server that refuses CONFIG (a managed one) or a wrong password
            first = str(exc).splitlines()[0]
            if "AUTH" in first.upper() or "password" in first:
                raise StoreError(f"parameter store {self.url}: authentication failed ({first})") from exc
            policy = None
        self._check_policy(policy, allow_eviction)

    def _check_policy(self, policy: str | None, allow: bool | None) -> None:
        """Refused at connect: a server that may evict keys drops rows the run still needs."""
        if allow is None:
            allow = os.environ.get(ALLOW_EVICTION_ENV) == "1"
        if policy != "noeviction" and not allow:
            said = f"maxmemory-policy is {policy}" if policy else "it does not tell its maxmemory-policy (CONFIG GET)"
            raise StoreError(f"parameter store {self.url}: {said}, so it may drop rows; run it with "
                             f"--maxmemory-policy noeviction, or set {ALLOW_EVICTION_ENV}=1 to accept the risk "
                             "(a row lost then fails the run)")

    def _keys(self, table: int, ids: list[int]) -> list[str]:
        return [f"{self.prefix}:{table}:{i}" for i in ids]

    def _index(self, table: int):
        if table not in self._written:
            self._written[table] = _row_index()
        return self._written[table]

    def put(self, table: int, ids: torch.Tensor, rows: torch.Tensor) -> None:
        _check(ids, rows)
        keys, data = self._keys(table, ids.tolist()), rows.contiguous().numpy()
        try:
            # One MULTI/EXEC transaction: Redis runs all of it or none (an out-of-memory write
            # refuses the whole transaction before any of it runs).
            pipe = self.client.pipeline(transaction=True)
            for start in range(0, len(keys), self.chunk):
                part = range(start, min(start + self.chunk, len(keys)))
                pipe.mset({keys[j]: data[j].tobytes() for j in part})
            pipe.execute()
        except self._errors as exc:
            raise StoreError(f"parameter store {self.url} unreachable: {exc}") from exc
        except self._response_error as exc:
            what = "full" if "OOM" in str(exc) or "maxmemory" in str(exc) else "refused the write"
            raise StoreError(f"parameter store {self.url} {what}: {str(exc).splitlines()[0]}") from exc
        index, _ = self._index(table)
        index.insert(ids, torch.zeros_like(ids))

    def get(self, table: int, ids: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        _check(ids)
        keys = self._keys(table, ids.tolist())
        try:
            pipe = self.client.pipeline(transaction=False)
            for start in range(0, len(keys), self.chunk):
                pipe.mget(keys[start : start + self.chunk])
            values = [v for chunk in pipe.execute() for v in chunk]
        except self._errors as exc:
            raise StoreError(f"parameter store {self.url} unreachable: {exc}") from exc
        found = torch.tensor([v is not None for v in values], dtype=torch.bool)
        self._check_none_lost(table, ids, found)
        held = [v for v in values if v is not None]
        for j, v in enumerate(values):
            if v is not None and len(v) != 4 * width:
                raise StoreError(f"parameter store {self.url}: key {keys[j]} holds {len(v)} B, not a row of {width} floats")
        rows = torch.zeros(len(keys), width, dtype=torch.float32)
        if held:  # the rows side by side in one buffer, copied in at once (not a tensor a row)
            rows[found] = torch.from_numpy(np.frombuffer(b"".join(held), dtype=np.float32).reshape(-1, width).copy())
        return found, rows

    def _check_none_lost(self, table: int, ids: torch.Tensor, found: torch.Tensor) -> None:
        if found.all() or table not in self._written:
            return
        index, absent = self._written[table]
        lost = int(((index.find(ids) != absent) & ~found).sum())
        if lost:
            raise StoreError(f"parameter store {self.url} lost {lost} of table {table}'s rows written to it (evicted or "
                             "flushed: a Redis with maxmemory needs --maxmemory-policy noeviction)")

    def remove_rows(self) -> int:
        """Delete this store's keys (`<prefix>:*`), as a completed run does; how many went."""
        removed = 0
        batch = []
        for key in self.client.scan_iter(match=f"{self.prefix}:*", count=10_000):
            batch.append(key)
            if len(batch) >= self.chunk:
                removed += self.client.unlink(*batch)
                batch = []
        if batch:
            removed += self.client.unlink(*batch)
        return removed

    def close(self) -> None:
        self.client.close()


def open_store(url: str | None, *, run_dir: Path, memory_bytes: int, spill_bytes: int,
               prefix: str = "dlrm") -> ParamStore:
    """`--ps`: None for the embedded store (spilling under run_dir/ps), or a redis:// URL (keys
    under `prefix`, which a run makes its own)."""
    if url is None:
        return EmbeddedStore(memory_bytes=memory_bytes, spill_dir=Path(run_dir) / "ps", spill_bytes=spill_bytes)
    if url.startswith("redis://"):
        return RedisStore(url, prefix=prefix)
    raise ValueError(f"--ps {mask_secrets(url)!r}: give redis://host:port[/db], or leave it out for the embedded store")


def kept_where(store: ParamStore) -> str:
    """Where a failed run's rows stay, for its one line; "" when none was spilled anywhere."""
    if isinstance(store, RedisStore):
        return f"keys {store.prefix}:* on {store.url}"
    if isinstance(store, EmbeddedStore) and store.spill_dir.exists():
        return str(store.spill_dir)
    return ""


def remove_rows(store: ParamStore) -> None:
    """A completed run's rows go: its spill files (up to --ps-spill-gib a rank) or its Redis keys."""
    if isinstance(store, RedisStore):
        store.remove_rows()
    elif isinstance(store, EmbeddedStore):
        store.remove_files()
