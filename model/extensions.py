"""The project's C++ extensions (csrc/, built by `make ext` beside the Python that loads them)."""

from __future__ import annotations

import importlib
from types import ModuleType


def extension(module: str, what: str) -> ModuleType:
    """The built extension `module` (e.g. "model._row_init"); if it is not built, an ImportError
    naming `what` it is and the command that builds it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:  # a checkout where `make ext` has not run
        raise ImportError(f"the {what} extension is not built ({exc}); run `make ext`") from exc
