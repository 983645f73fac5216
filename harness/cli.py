"""`python -m harness bench|report ...`: argument parsing, then the command. Only the parser is
imported here: --help and a refused option answer in a quarter of a second, not after torch's
seconds of imports; the commands' modules (harness/launch/bench.py, the report) load once the
line is parsed."""

from __future__ import annotations

import argparse
import difflib
import shutil
import sys
from pathlib import Path

from harness.launch import fork_server
from harness.launch.options import add_config_options, config_from_args, refuse
from harness.names import PRESET_NAMES


WIDTH = 100
"""Columns every --help fits in, whatever the terminal says."""


class Formatter(argparse.HelpFormatter):
    def __init__(self, prog: str) -> None:
        super().__init__(prog, width=min(WIDTH, shutil.get_terminal_size((WIDTH, 24)).columns), max_help_position=32)


class OneLineParser(argparse.ArgumentParser):
    """Errors are one line on stderr (what is wrong and where to look), exit status 2. An option is
    never taken from a prefix (--pinned is not --pinned-d2h): an unknown one is refused with the
    nearest valid names."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        prefix = "unrecognized arguments: "
        if message.startswith(prefix):
            message = "; ".join(unknown_option(a, self._all_options()) for a in message[len(prefix):].split())
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        sys.exit(2)

    def _all_options(self) -> list[str]:
        """Every option of this parser and of its subcommands."""
        out = []
        for a in self._actions:
            out += a.option_strings
            if isinstance(a, argparse._SubParsersAction):
                for sub in a.choices.values():
                    out += [o for b in sub._actions for o in b.option_strings]
        return sorted(set(out))


def unknown_option(arg: str, options: list[str]) -> str:
    """'unknown option --cuda-graphz; nearest: --cuda-graphs': prefixes first, then look-alikes."""
    name = arg.split("=", 1)[0]
    if not name.startswith("-"):
        return f"unexpected argument {arg!r}"
    near = [o for o in options if o.startswith(name) and o != name][:3]
    near += [o for o in difflib.get_close_matches(name, options, n=3, cutoff=0.6) if o not in near]
    return f"unknown option {name}" + (f"; nearest: {', '.join(near[:3])}" if near else "")


def preset_in(argv: list[str]) -> str:
    """The preset named on a command line, for --help's values (before the line is parsed)."""
    for i, a in enumerate(argv):
        value = a.split("=", 1)[1] if a.startswith("--preset=") else argv[i + 1] if a == "--preset" and i + 1 < len(argv) else None
        if value in PRESET_NAMES:
            return value
    return "small"


def build_parser(preset: str = "small") -> argparse.ArgumentParser:
    """`preset`: whose values --help shows (main passes the one on the command line)."""
    parser = OneLineParser(prog="harness", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)

    usage = "harness %s [options]   (every option below; --preset NAME --help: NAME's values)"
    bench = sub.add_parser("bench", help="train DLRM-DCNv2 and record every iteration's stages", usage=usage % "bench")
    add_bench_arguments(bench, preset)
    abl = sub.add_parser("ablation", help="baseline, each flag, all, all-but-one: repeated bench runs",
                         usage=usage % "ablation")
    add_bench_arguments(abl, preset)
    abl.add_argument("--repeats", type=int, default=3, metavar="N", help="runs per config (inactive-only configs: one) "
                     "[default: 3]")

    cmp = sub.add_parser("compare", help="torchrec and harness engines, runs interleaved, one comparison report",
                         usage=usage % "compare")
    add_bench_arguments(cmp, preset)
    cmp.add_argument("--repeats", type=int, default=3, metavar="N", help="runs per engine [default: 3]")
    cmp.add_argument("--reports-root", type=Path, default=Path("reports"), metavar="DIR",
                     help="where the comparison report goes [default: reports]")
    wk = sub.add_parser("worker", help="one rank (what torchrun starts on each node)")
    wk.add_argument("--run-dir", type=Path, required=True)

    rep = sub.add_parser("report", help="report a run, an ablation or an nsys export (reads nothing else)")
    which = rep.add_mutually_exclusive_group()
    which.add_argument("--run", default=None, help="run id under --runs-root, or 'latest' (the default); "
                       "'a,b' compares run b against run a")
    which.add_argument("--ablation", default=None, help="ablation id under --runs-root/ablations, or 'latest'")
    which.add_argument("--nsys", type=Path, default=None, help="an `nsys export --type sqlite` file")
    rep.add_argument("--runs-root", type=Path, default=Path("runs"))
    rep.add_argument("--reports-root", type=Path, default=Path("reports"))
    rep.add_argument("--all-ranks", action="store_true", help="list every rank in the per-rank tables and plots "
                     "[default: past 16 ranks, the ranks that bound the run, each with why; the CSVs hold all]")
    return parser


def add_bench_arguments(bench: argparse.ArgumentParser, preset: str = "small") -> None:
    """The hand-written options (what is not config), then one generated option per config field."""
    bench.add_argument("--preset", choices=PRESET_NAMES, default="small", metavar="NAME",
                       help=f"model and batch preset. One of: {', '.join(PRESET_NAMES)} (make help: a table) "
                            "[default: small]")
    bench.add_argument("--runs-root", type=Path, default=Path("runs"), metavar="DIR",
                       help="where run folders go [default: runs]")
    bench.add_argument("--run-id", default=None, metavar="NAME",
                       help="name the run (multi-host launches: the same on every host) [default: a new sortable id]")
    bench.add_argument("--dry-run", action="store_true", help="print the launcher, the flags and the plan a node; "
                       "start nothing, make no folder")
    bench.add_argument("--plan-detail", nargs="?", const="-", default=None, metavar="FILE",
                       help="with --dry-run: the plan's per-rank table too, printed, or written to FILE")
    bench.add_argument("--rdzv-endpoint", default=None, metavar="HOST:PORT",
                       help="multi-host rendezvous [default: MASTER_ADDR:MASTER_PORT when set]")
    bench.add_argument("--node-rank", type=int, default=None, metavar="K",
                       help="this host's node, 0..nodes-1 [default: NODE_RANK]")
    bench.add_argument("--in-process", action="store_true",
                       help="one rank only: run it in this process, start none (each run saves the "
                            "interpreter's, torch's and CUDA's start; make gpu-bench on one GPU)")
    bench.add_argument("--start-method", choices=fork_server.START_METHODS, default=None,
                       help="a local simulation's ranks: forked from a server that imported torch once "
                            "for every run of this process, or each a fresh interpreter [default: "
                            "forkserver on CPU, spawn on CUDA]")
    add_config_options(bench, preset=preset)


def worker(args: argparse.Namespace) -> int:
    """One rank under torchrun (multi-node launches); the local simulation calls run_rank directly."""
    from harness.run.worker import run_rank

    run_rank(str(args.run_dir))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(preset_in(argv)).parse_args(argv)
    if args.command == "worker":
        return worker(args)
    if args.command in ("bench", "ablation", "compare"):
        try:
            cfg = config_from_args(args)
            if args.command != "bench" and args.repeats < 1:
                raise ValueError(f"--repeats must be a positive integer, got {args.repeats}")
        except ValueError as exc:
            return refuse(exc)
        from harness.launch import bench as commands

        how = commands.Invocation.from_args(args)
        if args.command == "bench":
            return commands.bench(cfg, how)
        if args.command == "compare":
            return commands.compare(cfg, how, repeats=args.repeats, reports_root=args.reports_root)
        return commands.ablation(cfg, how, repeats=args.repeats)
    from harness.report import api as report

    run = args.run if args.run or args.ablation or args.nsys else "latest"
    return report.report_main(run, args.runs_root, args.reports_root, ablation=args.ablation, nsys=args.nsys,
                              all_ranks=args.all_ranks)
