"""Frozen dataclasses to JSON and back, driven by their type hints (torch-free).

Handles what the run manifest and the configs hold: nested dataclasses, tuple[X, ...],
fixed tuples, dict[str, X], X | None, and str/int/float/bool. A value of the wrong shape
raises ValueError naming where it is, so a foreign or damaged file is reported, not half-read.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import types
import typing
from typing import Any, TypeVar

T = TypeVar("T")


def to_jsonable(obj: Any) -> Any:
    """Plain JSON data: dataclasses become objects of their fields, tuples become lists."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (tuple, list)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    return obj


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def from_jsonable(tp: Any, data: Any, where: str = "$") -> Any:
    """`data` (as to_jsonable wrote it) rebuilt as type `tp`; the dataclasses' own checks run again."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if data is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return from_jsonable(inner, data, where)
    if dataclasses.is_dataclass(tp):
        if not isinstance(data, dict):
            raise ValueError(f"{where}: expected an object for {tp.__name__}, got {type(data).__name__}")
        hints = _hints(tp)
        names = {f.name for f in dataclasses.fields(tp)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"{where}: {tp.__name__} has no field(s) {', '.join(unknown)}")
        missing = [f.name for f in dataclasses.fields(tp) if f.name not in data
                   and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        if missing:
            raise ValueError(f"{where}: {tp.__name__} lacks field(s) {', '.join(missing)}")
        return tp(**{k: from_jsonable(hints[k], v, f"{where}.{k}") for k, v in data.items()})
    if origin is tuple:
        if not isinstance(data, list):
            raise ValueError(f"{where}: expected a list, got {type(data).__name__}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(from_jsonable(args[0], v, f"{where}[{i}]") for i, v in enumerate(data))
        if len(args) != len(data):
            raise ValueError(f"{where}: expected {len(args)} entries, got {len(data)}")
        return tuple(from_jsonable(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, data)))
    if origin is dict:
        if not isinstance(data, dict):
            raise ValueError(f"{where}: expected an object, got {type(data).__name__}")
        return {k: from_jsonable(args[1], v, f"{where}.{k}") for k, v in data.items()}
    if tp is Any:
        return data
    if tp is float and isinstance(data, int) and not isinstance(data, bool):
        return float(data)  # JSON writes 300.0 as 300.0, but hand-made files may say 300
    if tp in (str, int, float, bool):
        # bool is an int in Python: keep true/false out of int fields and numbers out of bool ones
        if not isinstance(data, tp) or (tp is int and isinstance(data, bool)):
            raise ValueError(f"{where}: expected {tp.__name__}, got {data!r}")
        return data
    raise TypeError(f"{where}: no JSON form for type {tp!r}")


def dumps(obj: Any) -> str:
    return json.dumps(to_jsonable(obj), indent=2) + "\n"


def loads(cls: type[T], text: str) -> T:
    """An instance of `cls` from JSON text; ValueError (naming the place) if it does not fit."""
    return from_jsonable(cls, json.loads(text))
