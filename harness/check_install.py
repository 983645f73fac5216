"""After `make venv`: exactly one fbgemm package (the one the machine's requirements name) and the
pinned torch. TorchRec's metadata asks for fbgemm-gpu and a torch of its own; installing either would
leave two fbgemm builds registering the same ops, or a torch the fbgemm build does not match."""

from __future__ import annotations

import sys
from importlib import metadata

TORCH_VERSION = "2.13.0"
FBGEMM_PACKAGES = ("fbgemm-gpu", "fbgemm-gpu-cpu", "fbgemm-gpu-genai", "fbgemm-gpu-nightly", "fbgemm-gpu-nightly-cpu")
EXPECTED_FBGEMM = {"requirements-cpu": "fbgemm-gpu-cpu", "requirements-cuda": "fbgemm-gpu"}


def problems(expected_fbgemm: str) -> list[str]:
    """What is wrong with the installed torch/fbgemm pair; empty when it is as pinned."""
    found = []
    for name in FBGEMM_PACKAGES:
        try:
            found.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            pass
    out = []
    if [f.split("==")[0] for f in found] != [expected_fbgemm]:
        out.append(f"expected only {expected_fbgemm}, found fbgemm packages: {found or 'none'}")
    torch_version = metadata.version("torch").split("+")[0]
    if torch_version != TORCH_VERSION:
        out.append(f"expected torch {TORCH_VERSION}, found {metadata.version('torch')}")
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] not in EXPECTED_FBGEMM:
        print(f"usage: python -m harness.check_install {{{','.join(EXPECTED_FBGEMM)}}}", file=sys.stderr)
        return 2
    bad = problems(EXPECTED_FBGEMM[args[0]])
    for line in bad:
        print(f"check_install: {line}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
