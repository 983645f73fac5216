"""How a config field (harness/config.py) is declared and checked: its command-line metadata and
the checks of integer fields, shared by every concern."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import field
from typing import Any

# The command line is generated from the config's dataclasses (harness/launch/options.py): a field's option
# is --<field-name> unless OPTION names it (today's option names), its help is the field's
# docstring, and CHOICES lists its valid values for --help and argparse's check.
OPTION = "option"
CHOICES = "choices"
METAVAR = "metavar"


def option(default: Any = dataclasses.MISSING, **meta: Any) -> Any:
    """A field with command-line metadata (option name, choices, metavar); `option=None`: not an option."""
    return field(default=default, metadata=meta)


def one_of(name: str, value: Any, choices: Any) -> None:
    if value not in choices:
        raise ValueError(f"{name} {value!r} is not one of {list(choices)}")


def positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def non_negative_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")


def positive_numbers(prefix: str, config: Any, names: tuple[str, ...], *, zero: bool = False) -> None:
    """Each named number field of `config` is > 0 (>= 0 with zero); None (left out) passes."""
    for name in names:
        v = getattr(config, name)
        if v is not None and not (v >= 0 if zero else v > 0):
            raise ValueError(f"{prefix}.{name} must be {'>=' if zero else '>'} 0, got {v}")


def finite_numbers(config: Any, prefix: str = "") -> None:
    """Every float field, in `config` and the concerns it holds, is finite: inf passes a `> 0` check
    and then overflows a timeout, trains on NaN, or writes `Infinity` (not JSON) to the manifest."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        name = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            finite_numbers(value, f"{name}.")
        elif isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value}")
