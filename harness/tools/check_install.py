"""After `make venv`: the torch/fbgemm pair the machine's requirements name, and only that one.

TorchRec's metadata asks for fbgemm-gpu and a torch of its own; installing either would leave two
fbgemm builds registering the same ops, or a torch the fbgemm build does not match. And the two
variants must not mix: `torch==2.13.0` is satisfied by the CPU build as well as the CUDA one, so
a venv made on a CPU login node and reused on a GPU node would keep CPU torch under CUDA fbgemm.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from importlib import metadata

TORCH_VERSION = "2.13.0"
FBGEMM_PACKAGES = ("fbgemm-gpu", "fbgemm-gpu-cpu", "fbgemm-gpu-genai", "fbgemm-gpu-nightly", "fbgemm-gpu-nightly-cpu")
EXPECTED_FBGEMM = {"requirements-cpu": "fbgemm-gpu-cpu", "requirements-cuda": "fbgemm-gpu"}


def installed_versions() -> dict[str, str]:
    """Versions of torch and of every fbgemm package installed here."""
    out = {}
    for name in ("torch", *FBGEMM_PACKAGES):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def torch_cuda_build() -> str | None:
    """The CUDA version torch was built for (None: a CPU build); imports torch."""
    import torch

    return torch.version.cuda


_READ = object()


def problems(variant: str, *, versions: Mapping[str, str] | None = None, torch_cuda: object = _READ) -> list[str]:
    """What is wrong with the installed pair for `variant` (requirements-cpu or -cuda); empty when
    it is as pinned. versions / torch_cuda (torch.version.cuda): the facts, injected by tests
    (left out: read here)."""
    versions = installed_versions() if versions is None else versions
    expected = EXPECTED_FBGEMM[variant]
    found = [f"{name}=={versions[name]}" for name in FBGEMM_PACKAGES if name in versions]
    out = []
    if [f.split("==")[0] for f in found] != [expected]:
        out.append(f"expected only {expected}, found fbgemm packages: {found or 'none'}")
    torch_version = versions.get("torch", "none")
    if torch_version.split("+")[0] != TORCH_VERSION:
        out.append(f"expected torch {TORCH_VERSION}, found {torch_version}")
    cuda = torch_cuda_build() if torch_cuda is _READ else torch_cuda
    if variant == "requirements-cuda" and cuda is None:
        out.append(f"torch {torch_version} is a CPU build; the CUDA variant needs torch built for CUDA "
                   "(a venv made on a CPU host? run make clean-venv, then make again)")
    if variant == "requirements-cpu" and cuda is not None:
        out.append(f"torch {torch_version} is built for CUDA {cuda}; the CPU variant pins the CPU build")
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] not in EXPECTED_FBGEMM:
        print(f"usage: python -m harness.tools.check_install {{{','.join(EXPECTED_FBGEMM)}}}", file=sys.stderr)
        return 2
    bad = problems(args[0])
    for line in bad:
        print(f"check_install: {line}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
