"""Fit the working tree into a device call with the GPU bundle carried, and put it back after.

The device tool sends the tracked and untracked-not-ignored files and the paths a call carries,
64 MiB in all. The bundle (`.gpu/`, about 60 MB) and the tracked files (8.6 MB, three quarters of
them recorded run sets under tests/data) are over it together. `slim` takes the recorded sets no
device command reads (RECORDED: only tests read them) out of the index and ignores them through
.git/info/exclude, after checking that what would travel then fits; `restore` puts both back.
Nothing on disk moves: the files stay where they are, only git stops seeing them.

    python3 -m harness.tools.device_tree slim --carry .gpu   # before the call
    python3 -m harness.tools.device_tree restore             # after it, before any commit

A commit made between the two would delete the sets from the repository: `slim` says so.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

LIMIT = 64 * 2**20
"""What one device call may send, tree and carried paths together (the device tool's README)."""

RECORDED = ("tests/data/h100-runs", "tests/data/h100-runs-2", "tests/data/h100-runs-3",
            "tests/data/h100-runs-4", "tests/data/cpu-runs-2core")
"""The recorded run sets that leave the tree for a call. Not tests/data/h100-runs-5: `make
project`'s default H100 calibration reads it, and gpu-bench's projection names it."""

MARK = "# device_tree slim: restore takes these lines out"


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout


def _path_bytes(path: Path) -> int:
    """A file's size, or a folder's files' (links as the device tool sends them: not followed)."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def travelling_bytes(root: Path, carry: list[str], leaving: tuple[str, ...] = ()) -> int:
    """What a device call would send: the tracked and untracked-not-ignored files (less those under
    `leaving`; a carried path's counted once) and the carried paths."""
    names = _git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
    kept = [n for n in names if n and not _under(n, leaving) and not _under(n, carry)]
    return sum(_path_bytes(root / n) for n in [*kept, *carry])


def _under(name: str, paths) -> bool:
    return any(name == p or name.startswith(p.rstrip("/") + "/") for p in paths)


def _exclude(root: Path) -> Path:
    return root / _git(root, "rev-parse", "--git-path", "info/exclude").strip()


def slimmed(root: Path) -> bool:
    exclude = _exclude(root)
    return exclude.is_file() and MARK in exclude.read_text()


def slim(root: Path, carry: list[str]) -> int:
    if slimmed(root):
        print("device_tree: already slim; `restore` first", file=sys.stderr)
        return 2
    before, after = travelling_bytes(root, carry), travelling_bytes(root, carry, RECORDED)
    if after > LIMIT:
        print(f"device_tree: {after / 2**20:.1f} MiB would still travel without the recorded sets "
              f"(limit {LIMIT / 2**20:.0f} MiB); carry less", file=sys.stderr)
        return 2
    present = [p for p in RECORDED if _git(root, "ls-files", p)]
    if present:
        _git(root, "rm", "-r", "-q", "--cached", *present)
    exclude = _exclude(root)
    exclude.parent.mkdir(parents=True, exist_ok=True)
    text = exclude.read_text() if exclude.is_file() else ""
    lines = [MARK, *(f"/{p}/" for p in RECORDED), MARK]
    exclude.write_text(text + ("" if text.endswith("\n") or not text else "\n") + "\n".join(lines) + "\n")
    print(f"device_tree: {before / 2**20:.1f} -> {after / 2**20:.1f} MiB travel with {', '.join(carry) or 'nothing'} "
          f"carried (limit {LIMIT / 2**20:.0f}); run `python3 -m harness.tools.device_tree restore` after the call: "
          f"a commit before it deletes {len(present)} recorded run sets")
    return 0


def restore(root: Path) -> int:
    if not slimmed(root):
        print("device_tree: nothing to restore")
        return 0
    exclude = _exclude(root)
    lines, out, inside = exclude.read_text().splitlines(), [], False
    for line in lines:
        if line == MARK:
            inside = not inside
        elif not inside:
            out.append(line)
    exclude.write_text("\n".join(out) + ("\n" if out else ""))
    _git(root, "reset", "-q", "HEAD", "--", *RECORDED)
    print(f"device_tree: restored {', '.join(RECORDED)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="device_tree", description=__doc__.split("\n\n")[0])
    ap.add_argument("action", choices=("slim", "restore", "size"))
    ap.add_argument("--carry", nargs="*", default=[".gpu"], help="the paths the call carries (default .gpu)")
    ap.add_argument("--root", type=Path, default=Path("."), help="the repository's root")
    args = ap.parse_args(argv)
    root = args.root.resolve()
    if args.action == "slim":
        return slim(root, args.carry)
    if args.action == "restore":
        return restore(root)
    print(f"{travelling_bytes(root, args.carry) / 2**20:.1f} MiB would travel (limit {LIMIT / 2**20:.0f})"
          + (", slim" if slimmed(root) else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
