"""The ``tangram`` command: subcommands, one-line errors and exit codes.

Exit codes: 0 ok, 2 bad input (``error: <file>: <key>: <reason>``), 3 infeasible
(``no plan: <reason>``), 130 interrupted. Library code raises; only this module prints errors.

Start-up: a command line imports the module of the one subcommand it runs, nothing else; the
others appear in ``tangram --help`` through their one-line summaries in :data:`COMMANDS`, so
``tangram --help`` imports no solver, no numba and no plotting library.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
import time
from pathlib import Path
from types import MappingProxyType

import solver
import solver.cli.commands
from solver.spec.errors import InfeasibleError, InputError

#: Subcommands in the order of ``tangram --help``, each with the summary its module's
#: ``register`` gives (tests/cli/test_startup.py checks that both say the same). A module of
#: ``solver.cli.commands`` not listed here is still found; it is imported to be listed.
COMMANDS = MappingProxyType({
    "islands": "group a cluster's nodes into homogeneous GPU islands",
    "estimate": "estimate iteration time, throughput and memory of one configuration",
    "compose": "optimal pipeline composition of a latency table",
    "plan": "plan a job: islands, stages, configuration, throughput",
    "export": "write a plan as FlagScale YAML or a Megatron-LM launch",
    "verify": "check that pruning keeps the optimum; cross-check solvers",
    "sweep": "exact plan at every n_micro: throughput and bubble curve",
    "bench": "run the benchmark suite: one row of measurements per job",
    "gen": "generate a random but realistic job (TOML, cluster inline)",
    "replan": "re-plan after node failures or additions (cached)",
    "pareto": "Pareto fronts of iteration time vs cost and vs energy",
    "sweep-islands": "islands and throughput as the threshold tau_C varies",
})
PLOT_EXTRA = "needs matplotlib (pip install 'tangram-planner[plot]')"


def command_modules() -> list[str]:
    """Names of the subcommand modules, the main ones first."""
    found = sorted(m.name for m in pkgutil.iter_modules(solver.cli.commands.__path__))
    first = [name.replace("-", "_") for name in COMMANDS]
    return [m for m in first if m in found] + [m for m in found if m not in first]


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors in the project's one-line format (exit 2)."""

    def error(self, message: str) -> None:  # noqa: D102 - argparse hook
        raise InputError("<cli>", self.prog, message)


def chosen_command(argv: list[str]) -> str | None:
    """The subcommand a command line runs: its first word that is not an option (the top-level
    options take no value), or None."""
    return next((a for a in argv if not a.startswith("-")), None)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The argument parser. Without ``argv`` every subcommand is complete (all modules
    imported); with it, only the subcommand ``argv`` runs is, and the others are listed by name
    and summary, which is all ``--help`` and a usage error need of them."""
    parser = _Parser(prog="tangram", description="Plan LLM training on mixed-GPU clusters.")
    parser.add_argument("--version", action="version", version=f"tangram {solver.__version__}")
    parser.add_argument("--stable-json", action="store_true",
                        help="write wall-clock times as 0 so --json output is byte-identical "
                             "across runs (everything else already is)")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    wanted = None if argv is None else chosen_command(argv)
    for module in command_modules():
        name = module.replace("_", "-")
        if argv is None or name == wanted or name not in COMMANDS:
            importlib.import_module(f"solver.cli.commands.{module}").register(sub)
        else:
            sub.add_parser(name, help=COMMANDS[name], add_help=False)
    for command in sub.choices.values():  # also accepted after the subcommand
        command.add_argument("--stable-json", action="store_true", default=argparse.SUPPRESS,
                             help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = build_parser(argv).parse_args(argv)
        check_before_running(args)
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


def check_before_running(args: argparse.Namespace) -> None:
    """Checks that cost nothing and would otherwise fail only after the work: ``--plot`` needs
    matplotlib and an existing directory."""
    plot = getattr(args, "plot", None)
    if not plot:
        return
    import importlib.util
    if importlib.util.find_spec("matplotlib") is None:
        raise InputError("<cli>", "--plot", PLOT_EXTRA)
    folder = Path(plot).parent
    if not folder.is_dir():
        raise InputError("<cli>", "--plot", f"directory {folder} does not exist")


#: Modules holding numba dispatchers once the compiled kernels run (imported only then: a small
#: plan runs the NumPy twins and imports no numba, :mod:`solver.compose.kernels.kernel_switch`).
KERNEL_MODULES = ("solver.compose.kernels.group_kernel_jit", "solver.compose.kernels.group_bounds_jit",
                  "solver.cost.stage_options")


#: Seconds a file's modification time may trail ``time.time()`` taken before it was written.
MTIME_SLACK_S = 2.0


def _run_command(args: argparse.Namespace) -> int:
    """Run the subcommand; say on stderr when numba compiled kernels for it.

    The kernels are compiled on their first use after an install and cached next to the
    sources (``cache=True``); that run's planning times include the compilation, so it is
    reported rather than left to look like planning. On a terminal, a command that runs past
    two seconds shows that it is working (:mod:`solver.cli.progress`) unless it draws its own.
    """
    from solver.cli.progress import DelayedProgress
    start = time.time()
    with DelayedProgress(_describe(args), enabled=not getattr(args, "own_progress", False)):
        code = int(args.func(args) or 0)
    # File times come from the kernel's coarse clock (a tick, up to a second on some file
    # systems, behind time.time()): a kernel compiled at once could look older than the start.
    fresh = _kernels_cached_since(start - MTIME_SLACK_S)
    if fresh:
        print(f"note: this run compiled {fresh} numba kernels, so its times include their "
              "compilation (once after an install; later runs load them from numba's cache)",
              file=sys.stderr)
    return code


def _describe(args: argparse.Namespace) -> str:
    """``plan seed-llama3-70b``: the command and what it works on, for the progress line."""
    target = next((getattr(args, k) for k in ("job", "target", "table", "config", "plan")
                   if isinstance(getattr(args, k, None), str)), "")
    return f"{args.command} {Path(target).stem}".rstrip()


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
