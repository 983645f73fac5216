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


PINNED_FBGEMM = "1.8.0"
"""fbgemm-gpu of the pinned pair (requirements-cuda.txt), beside TORCH_VERSION."""


def torch_for_fbgemm(fbgemm_version: str) -> str:
    """The torch minor release an fbgemm-gpu release is built against: fbgemm 1.x goes with torch
    2.(x + 5) (1.6 with 2.11, 1.8 with 2.13: each fbgemm release ships with one torch release)."""
    major, minor = (int(v) for v in fbgemm_version.split("+")[0].split(".")[:2])
    if major != 1:
        raise ValueError(f"fbgemm-gpu {fbgemm_version}: no known torch pairing for a major other than 1")
    return f"2.{minor + 5}"


def host_problems(*, versions: Mapping[str, str], torch_cuda: str | None, cuda: bool,
                  fbgemm_loads: str | None) -> tuple[list[str], list[str]]:
    """(problems, warnings) of a host's own interpreter (make ... PY=python3): torch with CUDA where
    the machine has a GPU (`cuda`), fbgemm-gpu installed, loading (`fbgemm_loads`: None, or why
    not) and built for this torch; a pair other than the pinned one only warns."""
    torch_version = versions.get("torch")
    fbgemm = next((name for name in FBGEMM_PACKAGES if name in versions), None)
    if torch_version is None:
        return ["no torch in this interpreter"], []
    problems = []
    if cuda and torch_cuda is None:
        problems.append(f"torch {torch_version} is a CPU build on a machine with a GPU: give PY an interpreter "
                        "whose torch is built for CUDA")
    if fbgemm is None:
        return problems + ["no fbgemm-gpu in this interpreter (../shared/gpu/make-bundle.sh brings one)"], []
    if fbgemm_loads is not None:
        problems.append(f"{fbgemm} {versions[fbgemm]} does not load: {fbgemm_loads}")
    try:
        wants = torch_for_fbgemm(versions[fbgemm])
    except ValueError as exc:
        wants, unknown = None, str(exc)
    if wants is not None and ".".join(torch_version.split("+")[0].split(".")[:2]) != wants:
        problems.append(f"{fbgemm} {versions[fbgemm]} is built for torch {wants}, this is torch {torch_version}")
    pinned = (TORCH_VERSION, PINNED_FBGEMM)
    found = (torch_version.split("+")[0], versions[fbgemm].split("+")[0])
    warnings = [] if found == pinned else [f"torch {found[0]} with {fbgemm} {found[1]}, not the pinned pair "
                                           f"torch {pinned[0]} with fbgemm-gpu {pinned[1]}: results are this pair's"]
    if wants is None:
        warnings.append(unknown)
    return problems, warnings


def _fbgemm_load_error() -> str | None:
    """None when fbgemm_gpu imports and registers its ops with this torch, else why not."""
    try:
        import fbgemm_gpu  # noqa: F401
        import torch

        torch.ops.fbgemm.asynchronous_complete_cumsum  # one of the sparse ops the harness calls
    except Exception as exc:  # an undefined symbol, a missing op: one line either way
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return None


def check_host(cuda: bool) -> int:
    """make ... PY=python3: the host interpreter's packages, a line each problem or warning."""
    problems, warnings = host_problems(versions=installed_versions(), torch_cuda=torch_cuda_build(), cuda=cuda,
                                       fbgemm_loads=_fbgemm_load_error())
    for line in warnings:
        print(f"check_install: warning: {line}", file=sys.stderr)
    for line in problems:
        print(f"check_install: {line}", file=sys.stderr)
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--host"] and set(args[1:]) <= {"--cuda"}:
        return check_host(cuda="--cuda" in args)
    if len(args) != 1 or args[0] not in EXPECTED_FBGEMM:
        print(f"usage: python -m harness.tools.check_install {{{','.join(EXPECTED_FBGEMM)}}} | --host [--cuda]",
              file=sys.stderr)
        return 2
    bad = problems(args[0])
    for line in bad:
        print(f"check_install: {line}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
