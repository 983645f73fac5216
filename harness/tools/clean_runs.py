"""`make clean-runs [PS=redis://...]`: remove what old runs left in their parameter stores.

A completed run removes its own spill files and Redis keys; a failed one keeps them for a look
(its ranks say where). This removes those of every run under --runs-root that is no longer
running: each rank's spill folder (rankNNNNN/ps/) and, for a run on Redis, its keys
(`dlrm:<run_id>:*`). The run folders and their records stay. A Redis URL recorded with its password
masked needs --ps with the password (make: PS=...); the password is never recorded.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from harness.store_url import mask_secrets


def _spill_dirs(run_dir: Path) -> list[Path]:
    return sorted(p for p in run_dir.glob("rank*/ps") if p.is_dir())


def _remove_keys(run_id: str, recorded: str, given: str | None) -> str:
    """Delete the run's keys; a line saying how many, or why not."""
    from harness.run.param_store import RedisStore, StoreError

    url = given if given is not None and mask_secrets(given) == recorded else recorded
    if ":***@" in url:
        return f"its keys on {recorded} are kept: give the URL with its password (PS=...)"
    try:
        store = RedisStore(url, prefix=f"dlrm:{run_id}", allow_eviction=True)
    except StoreError as exc:
        return f"its keys are kept: {exc}"
    try:
        return f"{store.remove_rows()} keys removed from {store.url}"
    finally:
        store.close()


def clean(runs_root: Path, given_ps: str | None) -> list[str]:
    """One line a run that had something to remove (or a reason it was kept)."""
    lines = []
    for manifest_path in sorted(runs_root.glob("*/manifest.json")):
        run_dir = manifest_path.parent
        try:
            manifest = json.loads(manifest_path.read_text())
        except (OSError, ValueError) as exc:
            lines.append(f"{run_dir.name}: skipped, its manifest is unreadable ({exc})")
            continue
        state = manifest.get("status", {}).get("state")
        ps = (manifest.get("config", {}).get("dynamic") or {}).get("ps")
        spills = _spill_dirs(run_dir)
        if not spills and ps is None:
            continue
        if state == "running":
            lines.append(f"{run_dir.name}: skipped, it is still running")
            continue
        said = []
        if spills:
            size = sum(f.stat().st_size for d in spills for f in d.rglob("*") if f.is_file())
            for d in spills:
                shutil.rmtree(d)
            said.append(f"{len(spills)} spill folder(s), {size:,} B, removed")
        if ps is not None:
            said.append(_remove_keys(manifest["run_id"], ps, given_ps))
        lines.append(f"{run_dir.name} ({state}): " + "; ".join(said))
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="harness.tools.clean_runs", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs-root", type=Path, default=Path("runs"), help="the runs folder (default %(default)s)")
    p.add_argument("--ps", default=None, metavar="redis://...", help="the Redis URL with its password, for runs "
                   "whose recorded URL has it masked")
    args = p.parse_args(argv)
    if not args.runs_root.is_dir():
        print(f"clean-runs: {args.runs_root} is not a folder; nothing to clean", file=sys.stderr)
        return 2
    lines = clean(args.runs_root, args.ps)
    print("\n".join(lines) if lines else f"clean-runs: no run under {args.runs_root} left a parameter store behind")
    return 0


if __name__ == "__main__":
    sys.exit(main())
