"""The parameter store (harness/run/param_store.py): the embedded store and Redis pass the same round
trip and fault tests; the Redis tests start a real redis-server on a loopback port."""

from __future__ import annotations

import os

import pytest
import torch

from harness.run.param_store import EmbeddedStore, RedisStore, StoreError, open_store
from tests.redis_server import free_port, redis_server  # noqa: F401  (free_port: other tests take it from here)

WIDTH = 6  # e.g. a 3-wide row and its Adagrad state


@pytest.fixture
def redis_url(tmp_path):
    """A redis-server of this test's own: 2 MB and no eviction (a full store refuses writes
    instead of dropping rows)."""
    with redis_server(tmp_path, "--maxmemory", "2mb", "--maxmemory-policy", "noeviction") as port:
        yield f"redis://127.0.0.1:{port}/0"


@pytest.fixture(params=["embedded", "redis"])
def store(request, tmp_path):
    if request.param == "embedded":
        s = EmbeddedStore(memory_bytes=4096, spill_dir=tmp_path / "ps", spill_bytes=1 << 20)
    else:
        s = RedisStore(request.getfixturevalue("redis_url"))
    yield s
    s.close()


def rows_of(n: int, seed: int) -> torch.Tensor:
    """Rows with the values a round trip must keep bit for bit: -0.0, subnormals, extremes."""
    rows = torch.randn(n, WIDTH, generator=torch.Generator().manual_seed(seed))
    special = torch.tensor([-0.0, 1e-45, -3.4e38, 3.4e38, 1e-40, 1.0])
    rows[0, :] = special
    return rows


def test_rows_come_back_bit_for_bit(store):
    ids = torch.tensor([5, (1 << 62) + 7, 0, 123456789])
    rows = rows_of(4, 0)
    store.put(3, ids, rows)
    found, got = store.get(3, torch.tensor([123456789, 9, 5, (1 << 62) + 7, 0]), WIDTH)
    assert found.tolist() == [True, False, True, True, True]
    want = torch.stack([rows[3], torch.zeros(WIDTH), rows[0], rows[1], rows[2]])
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))  # bits, -0.0 included
    found, got = store.get(3, ids.flip(0), WIDTH)  # every id held (the embedded store's one-gather path)
    assert found.all() and torch.equal(got.view(torch.int32), rows.flip(0).view(torch.int32))
    found, _ = store.get(4, ids, WIDTH)  # tables are apart
    assert not found.any()


def test_a_row_put_again_replaces_the_old_one(store):
    ids = torch.arange(300)
    store.put(0, ids, rows_of(300, 1))
    again = rows_of(300, 2)
    store.put(0, ids[::3].contiguous(), again[::3].contiguous())
    found, got = store.get(0, ids, WIDTH)
    want = rows_of(300, 1)
    want[::3] = again[::3]
    assert found.all() and torch.equal(got, want)


def test_the_embedded_store_spills_past_its_memory_budget_to_a_file(tmp_path):
    s = EmbeddedStore(memory_bytes=10 * WIDTH * 4, spill_dir=tmp_path / "ps", spill_bytes=1 << 20)
    ids = torch.arange(1000, 1100)
    rows = rows_of(100, 3)
    s.put(7, ids, rows)
    assert s.bytes_held() == (10 * WIDTH * 4, 90 * WIDTH * 4)  # 10 rows in memory, 90 in the file
    assert (tmp_path / "ps" / "table7.f32").stat().st_size >= 90 * WIDTH * 4
    found, got = s.get(7, ids.flip(0), WIDTH)
    assert found.all() and torch.equal(got, rows.flip(0))
    s.close()


def test_a_full_embedded_store_refuses_a_put_whole(tmp_path):
    s = EmbeddedStore(memory_bytes=10 * WIDTH * 4, spill_dir=tmp_path / "ps", spill_bytes=20 * WIDTH * 4)
    s.put(0, torch.arange(25), rows_of(25, 4))
    with pytest.raises(StoreError, match=r"parameter store full: 6 new rows of table 0") as exc:
        s.put(0, torch.arange(20, 31), rows_of(11, 5))  # 5 known ids, 6 new: 1 row too many
    assert "\n" not in str(exc.value)
    found, got = s.get(0, torch.arange(31), WIDTH)
    assert found.tolist() == [True] * 25 + [False] * 6 and torch.equal(got[:25], rows_of(25, 4))  # nothing half-written


def test_a_memory_budget_no_host_can_reserve_is_one_line(tmp_path):
    # 1 PiB: more than a 64-bit process's address space, whatever the host's overcommit setting.
    s = EmbeddedStore(memory_bytes=1 << 50, spill_dir=tmp_path / "ps", spill_bytes=0)
    with pytest.raises(StoreError, match=r"parameter store: cannot reserve [\d,]+ B for table 2's rows in memory") as exc:
        s.put(2, torch.arange(3), rows_of(3, 8))
    assert "\n" not in str(exc.value)
    assert not s.get(2, torch.arange(3), WIDTH)[0].any()  # nothing half-stored


def test_an_unwritable_spill_folder_is_one_line(tmp_path):
    (tmp_path / "ps").write_text("a file where the folder should be")
    s = EmbeddedStore(memory_bytes=0, spill_dir=tmp_path / "ps", spill_bytes=1 << 20)
    with pytest.raises(StoreError, match="parameter store: cannot grow .*table0.f32"):
        s.put(0, torch.arange(3), rows_of(3, 6))
    assert not s.get(0, torch.arange(3), WIDTH)[0].any()


def test_a_full_redis_refuses_the_put_whole(redis_url):
    s = RedisStore(redis_url, chunk=256)
    width = 4096  # 16 KB a row: 2 MB of maxmemory holds ~100 of them
    ids = torch.arange(400)
    with pytest.raises(StoreError, match=f"parameter store {redis_url} full: .*maxmemory") as exc:
        for start in range(0, 400, 50):  # batches as evictions come; one of them meets the limit
            s.put(1, ids[start : start + 50], torch.ones(50, width))
    assert "\n" not in str(exc.value)
    found, _ = s.get(1, ids[start : start + 50], width)  # the batch that failed
    assert not found.any()  # a refused transaction wrote none of its rows
    s.close()


def test_an_unreachable_redis_is_one_line():
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    with pytest.raises(StoreError, match=f"parameter store {url} unreachable") as exc:
        RedisStore(url, timeout_s=1.0)
    assert "\n" not in str(exc.value)


def test_open_store_takes_a_redis_url_or_nothing(tmp_path):
    s = open_store(None, run_dir=tmp_path, memory_bytes=0, spill_bytes=1 << 20)
    s.put(0, torch.arange(2), rows_of(2, 7))
    assert (tmp_path / "ps" / "table0.f32").exists()
    with pytest.raises(ValueError, match="--ps 'memcached://x': give redis://host:port"):
        open_store("memcached://x", run_dir=tmp_path, memory_bytes=0, spill_bytes=0)
    assert os.path.isdir(tmp_path / "ps")
