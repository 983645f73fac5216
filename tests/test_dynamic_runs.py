"""Dynamic tables through the command line (issue 15): what they move is recorded as sub-spans of
input_dist and per-table counts, the report shows them, a Redis store trains exactly as the
embedded one, and an unreachable store fails the run in one line, its records kept."""

from __future__ import annotations

import json

from harness.cli import main
from harness.report.api import format_summary, load_run, resolve_run
from tests.test_param_store import free_port, redis_url  # noqa: F401  (redis_url: a fixture)

DYNAMIC = ["--preset", "tiny", "--iters", "4", "--warmup", "1", "--shard", "2=dynamic,6=dynamic",
           "--dynamic-slots", "100"]
"""Tables of 1000 rows and one id a sample: a global batch of 96 fits in 100 slots, five do not."""


def run(tmp_path, name: str, *extra: str) -> int:
    return main(["bench", "--device", "cpu", "--run-id", name, "--runs-root", str(tmp_path), *DYNAMIC, *extra])


def test_a_run_records_what_its_dynamic_tables_moved(tmp_path):
    assert run(tmp_path, "embedded") == 0
    r = load_run(resolve_run(tmp_path, "embedded"))
    assert [tp.kind for tp in r.manifest.plan if tp.kind == "dynamic"] == ["dynamic", "dynamic"]
    assert r.manifest.config.dynamic.slots == 100 and r.manifest.config.dynamic.policy == "hybrid"
    # Sub-spans of input_dist: the dynamic tables' work (the loop's between-iterations pieces aside).
    assert set(r.subspans["stage"]) == {"input_dist", "between_iterations"}
    sub = r.subspans[r.subspans["stage"] == "input_dist"]
    assert set(sub["name"]) == {"dynamic_transform", "dynamic_write_back", "dynamic_fetch"}
    # Every iteration transforms each table's ids once, on the table's rank.
    per_it = sub[sub["name"] == "dynamic_transform"].groupby("iteration").size()
    assert per_it.to_dict() == {i: 2 for i in range(5)}
    counts = {}
    for path in sorted((tmp_path / "embedded").glob("rank*/dynamic.json")):
        counts.update({int(t): c for t, c in json.loads(path.read_text()).items()})
    assert set(counts) == {2, 6}
    assert all(c["evicted"] > 0 and c["transformed"] == 5 * 96 for c in counts.values())
    # 100 slots (hybrid): at least its 512 buckets of 16 bytes and each slot's id, use and coldest() room.
    assert all(c["transformer_host_bytes"] >= 512 * 16 + 100 * (8 + 16 + 24) for c in counts.values())
    assert "inside the stages:" in format_summary(r) and "dynamic_write_back" in format_summary(r)


def test_a_redis_store_trains_exactly_as_the_embedded_one(tmp_path, redis_url):  # noqa: F811
    import redis

    assert run(tmp_path, "embedded") == 0
    assert run(tmp_path, "redis", "--ps", redis_url) == 0
    losses = {name: load_run(resolve_run(tmp_path, name)).iterations.sort_values(["rank", "iteration"])["loss"].tolist()
              for name in ("embedded", "redis")}
    assert losses["embedded"] == losses["redis"]
    # A completed run removes its keys (issue 47); a failed one keeps them: tests/test_hardening_store.py.
    assert redis.Redis.from_url(redis_url).keys("dlrm:redis:*") == []


def test_an_unreachable_store_fails_the_run_in_one_line(tmp_path):
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    assert run(tmp_path, "nostore", "--ps", url) == 1
    status = json.loads((tmp_path / "nostore" / "manifest.json").read_text())["status"]
    assert status["state"] == "failed"
    assert f"StoreError: parameter store {url} unreachable" in status["error"]
    assert "\n" not in status["error"]
