"""The ``tangram`` command: subcommands, one-line errors and exit codes.

Exit codes: 0 ok, 2 bad input (``error: <file>: <key>: <reason>``), 3 infeasible
(``no plan: <reason>``), 130 interrupted. Library code raises; only this module prints errors.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
import time
from pathlib import Path

import solver.cli.commands
from solver.spec.errors import InfeasibleError, InputError

# Subcommand modules live in ``solver.cli.commands``; each exposes ``register(subparsers)``, which adds
# its parser and sets ``func``. The listing order below is the order of ``tangram --help``.
FIRST = ("islands", "estimate", "compose", "plan", "export", "verify", "sweep", "bench", "gen",
         "replan", "pareto", "sweep_islands")


def command_modules() -> list[str]:
    """Names of the subcommand modules, the main ones first."""
    found = sorted(m.name for m in pkgutil.iter_modules(solver.cli.commands.__path__))
    return [m for m in FIRST if m in found] + [m for m in found if m not in FIRST]


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors in the project's one-line format (exit 2)."""

    def error(self, message: str) -> None:  # noqa: D102 - argparse hook
        raise InputError("<cli>", self.prog, message)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every available subcommand."""
    parser = _Parser(prog="tangram", description="Plan LLM training on mixed-GPU clusters.")
    parser.add_argument("--stable-json", action="store_true",
                        help="write wall-clock times as 0 so --json output is byte-identical "
                             "across runs (everything else already is)")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in command_modules():
        importlib.import_module(f"solver.cli.commands.{name}").register(sub)
    for command in sub.choices.values():  # also accepted after the subcommand
        command.add_argument("--stable-json", action="store_true", default=argparse.SUPPRESS,
                             help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    try:
        args = build_parser().parse_args(argv)
        return _run_command(args)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except InfeasibleError as exc:
        print(f"no plan: {exc}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


KERNEL_MODULES = ("solver.compose.group_kernel", "solver.cost.stage_options")  # numba users


def _run_command(args: argparse.Namespace) -> int:
    """Run the subcommand; say on stderr when numba compiled kernels for it.

    The kernels are compiled on their first use after an install and cached next to the
    sources (``cache=True``); that run's planning times include the compilation, so it is
    reported rather than left to look like planning.
    """
    start = time.time()
    code = int(args.func(args) or 0)
    fresh = _kernels_cached_since(start)
    if fresh:
        print(f"note: this run compiled {fresh} numba kernels, so its times include their "
              "compilation (once after an install; later runs load them from numba's cache)",
              file=sys.stderr)
    return code


def _kernels_cached_since(since: float) -> int:
    """Kernels numba compiled and cached since ``since``, by this process or its workers: the
    index files written in the cache directories of the kernel modules imported (numba writes
    one when it compiles a kernel, never when it loads one)."""
    dirs = {Path(path) for mod in KERNEL_MODULES if mod in sys.modules
            for obj in vars(sys.modules[mod]).values()
            if (path := getattr(getattr(obj, "stats", None), "cache_path", None))}
    return sum(1 for d in dirs for f in d.glob("*.nbi") if f.stat().st_mtime >= since)


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())
