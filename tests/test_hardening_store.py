"""The parameter store hardened (issue 47, rows 1, 2 and 7, and its leftovers): a row once written
and then lost fails the run; a Redis that may evict is refused at connect; a password in the store
URL is never written or printed; a URL the ranks could not use is refused before start; a completed
run removes its spill files and keys, a failed one keeps them and says where, `make clean-runs`
removes those of old runs. The Redis tests start real redis-servers on loopback ports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.cli import main
from harness.run.param_store import RedisStore, StoreError
from harness.store_url import ALLOW_EVICTION_ENV, PS_URL_ENV, mask_secrets
from harness.tools.clean_runs import main as clean_runs
from tests.redis_server import redis_server

ROOT = Path(__file__).resolve().parent.parent
TINY_ROWS = ",".join(["1000"] * 5 + ["3", "1000", "1000", "63"] + ["1000"] * 3 + ["10", "1000", "1000", "155", "4", "976",
                                                                                  "14", "1000", "20000"] + ["1000"] * 3
                     + ["108", "36"])
"""tiny's rows with table 20 (100 ids a sample) at 20,000 rows: the issue's reproduction."""
DYNAMIC = ["--preset", "tiny", "--warmup", "0", "--shard", "2=dynamic,6=dynamic", "--dynamic-slots", "100"]
SECRET = "s3cretPW"


def bench_argv(runs: Path, run_id: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "harness", "bench", "--device", "cpu", "--run-id", run_id, "--runs-root", str(runs),
            *args]


def bench(runs: Path, run_id: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """A bench run in its own process: everything it and its ranks print comes back."""
    return subprocess.run(bench_argv(runs, run_id, *args), cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env=env)


def bench_two(runs: Path, *runs_args: tuple[str, ...]) -> list[subprocess.CompletedProcess]:
    """Two bench runs (run id, then its arguments) side by side, each in its own process: they are
    independent (their own run ids, files and store keys), and one after the other they made
    these tests the slowest of make test."""
    procs = [subprocess.Popen(bench_argv(runs, *run), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for run in runs_args]
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=600)
        out.append(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr))
    return out


def status(run_dir: Path) -> dict:
    return json.loads((run_dir / "manifest.json").read_text())["status"]


def no_secret_in(folder: Path, secret: str) -> None:
    """Not in any file's bytes under `folder` (manifests, errors, parquet, logs)."""
    hits = [str(p) for p in folder.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert hits == []


# Row 1: a Redis that evicts, or loses a row, no longer trains on re-initialised rows.

def test_a_redis_that_may_evict_is_refused_at_connect(tmp_path):
    with redis_server(tmp_path, "--maxmemory", "3mb", "--maxmemory-policy", "allkeys-lru") as port:
        url = f"redis://127.0.0.1:{port}/0"
        with pytest.raises(StoreError, match=f"parameter store {url}: maxmemory-policy is allkeys-lru, so it may drop "
                                             f"rows; run it with --maxmemory-policy noeviction, or set {ALLOW_EVICTION_ENV}=1"):
            RedisStore(url)
        out = bench(tmp_path / "runs", "evicts", *DYNAMIC, "--iters", "2", "--ps", url)
        assert out.returncode == 1
        st = status(tmp_path / "runs" / "evicts")
        assert st["state"] == "failed" and "maxmemory-policy is allkeys-lru" in st["error"] and "\n" not in st["error"]


def test_a_row_written_and_then_missing_is_an_error_naming_the_store_and_the_count(tmp_path):
    with redis_server(tmp_path, "--maxmemory-policy", "noeviction") as port:
        url = f"redis://127.0.0.1:{port}/0"
        s = RedisStore(url)
        s.put(3, torch.arange(10), torch.ones(10, 4))
        s.client.flushall()  # FLUSHALL mid-run
        with pytest.raises(StoreError, match=f"parameter store {url} lost 7 of table 3's rows written to it") as exc:
            s.get(3, torch.arange(3, 13), 4)  # ids 10..12 were never written: only 3..9 count
        assert "\n" not in str(exc.value)
        found, _ = s.get(4, torch.arange(5), 4)  # a table never written: rows never seen, no error
        assert not found.any()
        s.close()


def test_an_evicting_redis_accepted_by_override_fails_the_run_when_it_drops_rows(tmp_path):
    """The issue's reproduction: 3 MB, allkeys-lru, a 20,000-row dynamic table behind 10,000 slots."""
    with redis_server(tmp_path, "--maxmemory", "3mb", "--maxmemory-policy", "allkeys-lru") as port:
        url = f"redis://127.0.0.1:{port}"
        out = bench(tmp_path / "runs", "lru", "--preset", "tiny", "--iters", "20", "--table-rows", TINY_ROWS,
                    "--shard", "20=dynamic", "--dynamic-slots", "10000", "--id-exponent", "0", "--ps", url,
                    env={**__import__("os").environ, ALLOW_EVICTION_ENV: "1"})
    assert out.returncode == 1, out.stdout[-2000:]
    st = status(tmp_path / "runs" / "lru")
    assert st["state"] == "failed" and f"parameter store {url} lost " in st["error"] and "of table 20's rows" in st["error"]


# Row 2: the password.

def test_a_password_is_never_written_or_printed(tmp_path):
    runs = tmp_path / "runs"
    with redis_server(tmp_path, "--requirepass", SECRET, "--maxmemory-policy", "noeviction") as port:
        url = f"redis://:{SECRET}@127.0.0.1:{port}/0"
        ok, wrong = bench_two(runs, ("pw", *DYNAMIC, "--iters", "3", "--ps", url),
                              ("wrongpw", *DYNAMIC, "--iters", "2", "--ps", f"redis://:wrongPW9@127.0.0.1:{port}/0"))
        assert ok.returncode == 0, ok.stderr[-2000:]
    assert wrong.returncode == 1
    st = status(runs / "wrongpw")
    assert "authentication failed" in st["error"] and "unreachable" not in st["error"]
    manifest = json.loads((runs / "pw" / "manifest.json").read_text())
    assert manifest["config"]["dynamic"]["ps"] == f"redis://:***@127.0.0.1:{port}/0"
    assert any(f"redis://:***@127.0.0.1:{port}/0" in a for a in manifest["argv"])
    for secret in (SECRET, "wrongPW9"):
        no_secret_in(runs, secret)
        assert secret not in ok.stdout + ok.stderr + wrong.stdout + wrong.stderr


def test_a_rank_without_the_password_in_its_environment_says_so(monkeypatch):
    from harness.store_url import real_store_url

    monkeypatch.delenv(PS_URL_ENV, raising=False)
    with pytest.raises(ValueError, match=f"its password is not in this rank's environment \\({PS_URL_ENV}\\)"):
        real_store_url("redis://:***@127.0.0.1:1/0")
    assert real_store_url("redis://:***@h:1/0", {PS_URL_ENV: "redis://:pw@h:1/0"}) == "redis://:pw@h:1/0"
    assert mask_secrets("--ps redis://u:pw@h:1/0 --x") == "--ps redis://u:***@h:1/0 --x"


# Row 7: a URL the ranks could not use.

@pytest.mark.parametrize("url, message", [
    ("redis://127.0.0.1:99999", "the port must be a number 1..65535"),
    ("redis://127.0.0.1:6379/abc", "the database must be a number"),
    ("redis://127.0.0.1:6379/0?db=3", "options after the database are not taken"),
    ("redis://:pw@127.0.0.1:0/1", "the port must be a number 1..65535"),
])
def test_a_store_url_the_ranks_could_not_use_is_refused_before_start(url, message, tmp_path, capsys):
    runs = tmp_path / "runs"
    assert main(["bench", "--device", "cpu", *DYNAMIC, "--iters", "2", "--runs-root", str(runs), "--ps", url]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and ":pw@" not in err[0]
    assert not runs.exists()


# Leftovers: what a run leaves in its store.

def test_a_completed_run_removes_its_spill_files_a_failed_one_keeps_them_and_clean_runs_removes_them(tmp_path):
    runs = tmp_path / "runs"
    spill = ["--ps-memory-gib", "0"]  # every evicted row goes to the spill file
    done, failed = bench_two(runs, ("done", *DYNAMIC, "--iters", "4", *spill),
                             ("failed", *DYNAMIC, "--iters", "4", *spill, "--fail-at", "1:3"))
    assert done.returncode == 0 and not list((runs / "done").glob("rank*/ps"))
    assert failed.returncode == 1
    kept = sorted((runs / "failed").glob("rank*/ps"))
    assert kept and all(any(d.iterdir()) for d in kept)
    assert f"the parameter store's rows are kept: {kept[0]}" in failed.stderr
    assert clean_runs(["--runs-root", str(runs)]) == 0
    assert not list((runs / "failed").glob("rank*/ps")) and (runs / "failed" / "manifest.json").exists()


def test_a_completed_run_removes_its_redis_keys_a_failed_one_keeps_them_and_clean_runs_removes_them(tmp_path):
    import redis

    runs = tmp_path / "runs"
    with redis_server(tmp_path, "--requirepass", SECRET, "--maxmemory-policy", "noeviction") as port:
        url = f"redis://:{SECRET}@127.0.0.1:{port}/0"
        client = redis.Redis.from_url(url)
        done, failed = bench_two(runs, ("done", *DYNAMIC, "--iters", "4", "--ps", url),
                                 ("failed", *DYNAMIC, "--iters", "4", "--ps", url, "--fail-at", "1:3"))
        assert done.returncode == 0 and client.keys("dlrm:done:*") == []
        assert failed.returncode == 1 and client.keys("dlrm:failed:*")
        assert f"keys dlrm:failed:rank0:* on redis://:***@127.0.0.1:{port}/0" in failed.stderr
        assert clean_runs(["--runs-root", str(runs)]) == 0  # without the password: kept, and said why
        assert client.keys("dlrm:failed:*")
        assert clean_runs(["--runs-root", str(runs), "--ps", url]) == 0
        assert client.keys("dlrm:failed:*") == []
    no_secret_in(runs, SECRET)
