"""The bench/ablation command-line options, generated from the config dataclasses.

Every field of every concern of BenchConfig becomes one option: its name is --<field-name>
(or the field's `option` metadata, which keeps today's names), its help is the field's
docstring, its choices come from the field's metadata. No option has a default of its own:
a value the user did not give means the preset's, and a value the user gave goes into the
config unchanged, so the config's own checks judge it (--column-shards 0 is refused there).
A new documented field becomes an option with no edit here.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import sys
import typing
from collections.abc import Iterator
from typing import Any

from harness.config import BenchConfig
from harness.config_fields import CHOICES, METAVAR, OPTION
from harness.names import OPTIMIZATION_FLAGS
from harness.presets import PRESETS


@dataclasses.dataclass(frozen=True, kw_only=True)
class ConfigOption:
    """One generated option and the config field it sets."""

    concern: str
    """BenchConfig's field holding the concern (run, data, sharding, ...)."""
    field: str
    """The concern's field the option sets."""
    flag: str
    """The option, e.g. --global-batch."""
    type: Any
    """The field's type hint."""
    help: str
    """The field's docstring, one line."""

    @property
    def dest(self) -> str:
        return f"{self.concern}.{self.field}"


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Field -> its docstring (the string literal under it in the class body), whitespace folded."""
    body = ast.parse(inspect.getsource(cls)).body[0].body
    docs = {}
    for node, nxt in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def concerns(root: type = BenchConfig) -> dict[str, type]:
    """The config's concerns: field name -> dataclass."""
    hints = typing.get_type_hints(root)
    return {f.name: hints[f.name] for f in dataclasses.fields(root) if dataclasses.is_dataclass(hints[f.name])}


def config_options(root: type = BenchConfig) -> Iterator[tuple[ConfigOption, dataclasses.Field]]:
    """Every generated option with its field; fields whose metadata says option=None are left out."""
    for concern, cls in concerns(root).items():
        hints, docs = typing.get_type_hints(cls), field_docs(cls)
        for f in dataclasses.fields(cls):
            name = f.metadata.get(OPTION, f.name.replace("_", "-"))
            if name is None:
                continue
            if f.name not in docs:
                raise TypeError(f"{cls.__name__}.{f.name} has no docstring: it is the option's help")
            yield ConfigOption(concern=concern, field=f.name, flag=f"--{name}", type=hints[f.name],
                               help=docs[f.name]), f


def _strip_none(tp: Any) -> Any:
    args = typing.get_args(tp)
    if type(None) in args:
        (inner,) = [a for a in args if a is not type(None)]
        return inner
    return tp


def _scalar(tp: type, text: str) -> Any:
    try:
        return tp(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid {tp.__name__} value: {text!r}") from None


def parser_for(tp: Any, metavar: str | None) -> Any:
    """argparse `type=` for a field type: scalars as themselves, tuples as text.

    tuple[int, ...]: "1,2,3"; tuple[int, int]: "A:B"; tuple[tuple[int, str], ...]: "A=x,B=y".
    """
    tp = _strip_none(tp)
    if tp in (int, float, str):
        return functools.partial(_scalar, tp)
    if typing.get_origin(tp) is not tuple:
        raise TypeError(f"no command-line form for {tp!r}")
    args = typing.get_args(tp)
    if len(args) == 2 and args[1] is Ellipsis:
        item = args[0]
        if typing.get_origin(item) is tuple:  # pairs
            a, b = typing.get_args(item)
            split = lambda t: tuple(_scalar(a if i == 0 else b, x) for i, x in enumerate(t.split("=", 1)))  # noqa: E731
        else:
            split = lambda t: _scalar(item, t)  # noqa: E731
        sep = ","
    else:
        split, sep = None, ":"

    def parse(text: str) -> tuple:
        try:
            if split is None:
                parts = text.split(sep)
                if len(parts) != len(args):
                    raise argparse.ArgumentTypeError("")
                return tuple(_scalar(a, p) for a, p in zip(args, parts))
            out = tuple(split(t) for t in text.split(sep))
            if any(isinstance(x, tuple) and len(x) != 2 for x in out):
                raise argparse.ArgumentTypeError("")
            return out
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(f"expected {metavar or 'a comma-separated list'}, got {text!r}") from None

    return parse


def _metavar(tp: Any, field: str = "") -> str:
    """What --help shows for a value: N for an int, X for a float, N,N,... for a tuple of ints; a
    field named for its unit shows the unit (..._s: SECONDS, ..._gib: GIB, ..._gbps: GB/S)."""
    for suffix, unit in UNITS.items():
        if field.endswith(suffix):
            return unit
    tp = _strip_none(tp)
    if typing.get_origin(tp) is tuple:
        return ",".join(_metavar(a) for a in typing.get_args(tp)[:1]) + ",..."
    return {int: "N", float: "X"}.get(tp, "TEXT")


UNITS = {"_s": "SECONDS", "_gib": "GIB", "_gbps": "GB/S"}
"""A field's unit, read off its name: every time and size on the command line says its unit."""


def show_value(value: Any) -> str:
    """A preset's value as --help shows it: on/off, 'not set', a long tuple as its count and range."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return "not set"
    if isinstance(value, tuple):
        if not value:
            return "none"
        if all(isinstance(v, tuple) and len(v) == 2 for v in value):  # (table, kind) pairs, by kind
            by: dict[str, list[str]] = {}
            for t, k in value:
                by.setdefault(str(k), []).append(str(t))
            return "; ".join(f"{','.join(ts)}={k}" for k, ts in by.items())
        text = ",".join("=".join(map(str, v)) if isinstance(v, tuple) else str(v) for v in value)
        if len(text) <= 24:
            return text
        nums = [v for v in value if isinstance(v, int)]
        span = f", {min(nums)}..{max(nums)}" if len(nums) == len(value) else ""
        return f"{len(value)} values{span}"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _help(opt: ConfigOption, choices: tuple | None, preset: str, value: Any) -> str:
    listed = f" One of: {', '.join(map(str, choices))}." if choices else ""
    return f"{opt.help}{listed} [{preset}: {show_value(value)}]".replace("%", "%%")  # argparse formats help with %


def add_config_options(parser: argparse.ArgumentParser, *, root: type = BenchConfig, preset: str = "small") -> None:
    """One option per config field, grouped by concern; every default is None (= the preset's).
    Each help ends with the value `preset` gives the field.

    `root`: the config class whose concerns become options (BenchConfig; tests pass their own).
    """
    cfg = PRESETS[preset]() if root is BenchConfig else None
    for concern, cls in concerns(root).items():
        group = parser.add_argument_group(f"{concern} (config.{cls.__name__})")
        for opt, f in config_options(root):
            if opt.concern != concern:
                continue
            value = getattr(getattr(cfg, concern), opt.field) if cfg is not None else f.default
            choices = f.metadata.get(CHOICES)
            kw: dict[str, Any] = dict(dest=opt.dest, default=None, help=_help(opt, choices, preset, value))
            if _strip_none(opt.type) is bool:
                kw["action"] = argparse.BooleanOptionalAction
            else:
                kw["type"] = parser_for(opt.type, f.metadata.get(METAVAR))
                if choices:  # listed in the help: a {a,b,...} metavar can be wider than the screen
                    kw["choices"] = choices
                kw["metavar"] = f.metadata.get(METAVAR) or ("NAME" if choices else _metavar(opt.type, f.name))
            group.add_argument(opt.flag, **kw)
    parser.add_argument("--opts", choices=["none", "all"], default=None, metavar="none|all",
                        help="none: every optimization flag off first, all: every one on; --X/--no-X then change "
                             f"single ones [{preset}: not set]")


ALTERNATIVES = (("dynamic", ("slots", "memory_gib")),)
"""(concern, fields) that size the same thing in different units: --dynamic-slots or --dynamic-memory-gib."""


def refuse(exc: Exception) -> int:
    """A command line refused: its one line on stderr, exit status 2 (argparse's)."""
    sys.stderr.write(f"harness bench: error: {exc}\n")
    return 2


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """The preset's config with every option the user gave put in (raises ValueError from the config's checks)."""
    cfg = PRESETS[args.preset]()
    given: dict[str, dict[str, Any]] = {}
    if args.opts is not None:
        given["optimizations"] = {f: args.opts == "all" for f in OPTIMIZATION_FLAGS}
    for opt, _ in config_options():
        value = getattr(args, opt.dest)
        if value is not None:
            given.setdefault(opt.concern, {})[opt.field] = value
    # Options that say the same thing two ways: the one the user gives replaces the preset's other
    # (given both, the config's check refuses them).
    for concern, pair in ALTERNATIVES:
        kv = given.get(concern, {})
        if sum(f in kv for f in pair) == 1:
            kv.update({f: None for f in pair if f not in kv})
    # All concerns at once: the cross-concern checks see the final combination, not a half-changed one.
    return cfg.replace(**{c: dataclasses.replace(getattr(cfg, c), **kv) for c, kv in given.items()})


PURPOSE = {"small": "the default: tables capped at 100k rows, CPU",
           "tiny": "milliseconds an iteration: quick checks",
           "mlperf": "exactly MLPerf, H100 nodes (here: DRY_RUN=1)",
           "mlperf-ids": "full id spaces, dynamic tables, on CPU"}
"""What each preset is for, in the preset table (make help, docs/targets-and-knobs.md)."""


def preset_table() -> str:
    """The presets side by side: batch, ranks, iterations, warm-up, tables, what each is for."""
    lines = [f"{'PRESET':<11} {'batch':>6} {'ranks':>5} {'iters':>5} {'warm-up':>7} {'tables, rows':<12} what for"]
    for name, make in PRESETS.items():
        cfg = make()
        most = max(cfg.model.table_rows)
        rows = f"{cfg.model.num_sparse}, <= " + (f"{most / 1e6:g}M" if most >= 10**6 else f"{most / 1e3:g}k")
        purpose = PURPOSE.get(name) or (make.__doc__ or "").split(".")[0]
        lines.append(f"{name:<11} {cfg.data.global_batch_size:>6} {cfg.run.world_size:>5} {cfg.run.iters:>5} "
                     f"{cfg.run.warmup_iters:>7} {rows:<12} {purpose}"[:100])
    return "\n".join(lines)
