"""harness/tools/device_tree.py on a repository made here: the recorded sets leave the index for a
device call and come back, the exclude file as it was; the sizes by hand."""

from __future__ import annotations

import subprocess
from pathlib import Path

from harness.tools import device_tree
from harness.tools.device_tree import LIMIT, RECORDED


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout


def _repo(tmp_path: Path, bundle_bytes: int) -> Path:
    """Each recorded set a 1000-byte file, h100-runs-5 and a source file 500 bytes each, a .gpu
    bundle of bundle_bytes (sparse: no disk) ignored through the exclude file, as make-bundle.sh does."""
    root = tmp_path / "repo"
    root.mkdir()
    _git(root, "init", "-q")
    for p in RECORDED:
        (root / p).mkdir(parents=True)
        (root / p / "manifest.json").write_bytes(b"x" * 1000)
    (root / "tests/data/h100-runs-5").mkdir(parents=True)
    (root / "tests/data/h100-runs-5/manifest.json").write_bytes(b"y" * 500)
    (root / "main.py").write_bytes(b"z" * 500)
    _git(root, "add", "-A")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "data")
    (root / ".gpu").mkdir()
    with open(root / ".gpu/fbgemm.tar.xz", "wb") as f:
        f.truncate(bundle_bytes)
    (root / ".git/info/exclude").write_text("# git's own\n/.gpu/\n")
    return root


def test_slim_takes_the_recorded_sets_out_for_the_call_and_restore_puts_them_back(tmp_path, capsys):
    root = _repo(tmp_path, LIMIT - 2500)
    exclude = (root / ".git/info/exclude").read_text()
    assert device_tree.travelling_bytes(root, [".gpu"]) == LIMIT - 2500 + 1000 * len(RECORDED) + 1000
    assert device_tree.main(["slim", "--root", str(root)]) == 0
    assert "a commit before it deletes 5 recorded run sets" in capsys.readouterr().out
    assert _git(root, "ls-files").split() == ["main.py", "tests/data/h100-runs-5/manifest.json"]
    # Gone from the index, ignored on disk: nothing untracked would travel, the files are all still there.
    assert _git(root, "status", "--porcelain", "--untracked-files=all").splitlines() == \
        sorted(f"D  {p}/manifest.json" for p in RECORDED)
    assert all((root / p / "manifest.json").is_file() for p in RECORDED)
    assert device_tree.travelling_bytes(root, [".gpu"]) == LIMIT - 2500 + 1000
    assert device_tree.main(["slim", "--root", str(root)]) == 2  # twice: restore first
    assert device_tree.main(["restore", "--root", str(root)]) == 0
    assert _git(root, "status", "--porcelain", "--untracked-files=all") == ""
    assert (root / ".git/info/exclude").read_text() == exclude


def test_a_carry_too_big_even_slim_is_refused_and_nothing_changes(tmp_path, capsys):
    root = _repo(tmp_path, LIMIT)
    assert device_tree.main(["slim", "--root", str(root), "--carry", ".gpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "would still travel without the recorded sets" in err[0]
    assert _git(root, "status", "--porcelain", "--untracked-files=all") == ""
    assert (root / ".git/info/exclude").read_text() == "# git's own\n/.gpu/\n"


def test_every_recorded_set_but_the_default_calibrations_leaves_for_a_call():
    """RECORDED is every run set under tests/data except those `make project`'s default GPU
    calibration reads (the one set a device command may read): a new set must be named there, or
    the next device call's tree grows by its size."""
    from harness.tools.project import DEFAULT_CALIBRATION

    data = Path(__file__).parent / "data"
    sets = {f"tests/data/{p.name}" for p in data.iterdir() if p.is_dir()}
    read = {"/".join(Path(run).parts[:3]) for hw in ("h100", "h200") for run in DEFAULT_CALIBRATION[hw]}
    assert read and read <= sets
    assert set(RECORDED) == sets - read, "name the new run set in harness/tools/device_tree.py RECORDED"
