"""A command imports what it uses and nothing else (issue 47: ``tangram --help`` took 1.3 s).

Each check runs the command in a fresh interpreter and lists the heavy libraries it imported:
facts about imports, not timings (the timings are in tests/benchmarks/bench_cli.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib

import pytest

import solver
from solver.cli.main import COMMANDS, build_parser, command_modules
from tests.conftest import ROOT

HEAVY = ("numba", "numpy", "networkx", "ortools", "pulp", "highspy", "rich", "matplotlib",
         "scipy", "yaml", "jsonschema")
SOLVERS_AND_PLOTS = {"ortools", "pulp", "highspy", "matplotlib", "rich"}
PROBE = """
import contextlib, io, json, sys
from solver.cli.main import main
with contextlib.redirect_stdout(io.StringIO()):
    try:
        code = main(sys.argv[1:])
    except SystemExit as exc:  # --help, --version
        code = exc.code
print(json.dumps({"code": code, "heavy": sorted(m for m in %r if m in sys.modules)}))
""" % (HEAVY,)


def _imports(*argv: str) -> set[str]:
    """The heavy libraries ``tangram ARGV`` imports (run in a fresh interpreter)."""
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["code"] in (0, None), done.stderr
    return set(result["heavy"])


def test_help_and_version_import_no_heavy_library():
    assert _imports("--help") == set()
    assert _imports("--version") == set()
    assert _imports("plan", "--help") & SOLVERS_AND_PLOTS == set()


def test_light_commands_import_only_what_they_use():
    assert _imports("gen", "--seed", "1") == set()
    assert _imports("islands", "seed-h100-a100") == {"networkx"}  # the similarity graph
    table = str(ROOT / "instances" / "tables" / "paper_80x3.json")
    assert _imports("compose", table) == {"numpy"}  # the DP, not CP-SAT or MILP


def test_plan_imports_no_solver_library_nor_plotting():
    """The default composition is the exact DP: OR-Tools, PuLP and HiGHS are for cross-checks,
    matplotlib for --plot, rich for a terminal's progress. The worked example's kernels are
    small enough for their NumPy twins (:mod:`solver.compose.kernels.kernel_switch`): no numba, whose
    start-up alone would cost more than all of them."""
    job = str(ROOT / "instances" / "jobs" / "seed-llama3-70b.toml")
    assert _imports("plan", job) & (SOLVERS_AND_PLOTS | {"numba"}) == set()


def test_the_worked_example_plans_the_same_with_numpy_or_compiled_kernels():
    """``TANGRAM_KERNELS`` fixes the twins; the plan, as JSON with wall times zeroed, is the
    same byte for byte."""
    job = str(ROOT / "instances" / "jobs" / "seed-llama3-70b.toml")
    out = {}
    for mode in ("numpy", "compiled"):
        done = subprocess.run([sys.executable, "-m", "solver", "plan", job, "--json",
                               "--stable-json"], capture_output=True, text=True, cwd=ROOT,
                              timeout=300, env={**os.environ, "TANGRAM_KERNELS": mode})
        assert done.returncode == 0, done.stderr
        out[mode] = done.stdout
    assert out["numpy"] == out["compiled"] and json.loads(out["numpy"])["stages"]


def test_version_is_the_package_version(capsys):
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert solver.__version__ == pyproject["project"]["version"]
    with pytest.raises(SystemExit) as exit_:
        build_parser(["--version"]).parse_args(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"tangram {solver.__version__}"


def test_help_lists_every_command_with_the_summary_its_module_registers():
    """``tangram --help`` lists commands from :data:`COMMANDS` without importing them; each
    summary must be the one the command's own ``register`` gives."""
    full = build_parser()
    sub = next(a for a in full._actions if a.dest == "command")
    registered = {a.dest: a.help for a in sub._choices_actions}
    assert registered == dict(COMMANDS)
    assert [m.replace("_", "-") for m in command_modules()] == list(COMMANDS)
    light = build_parser(["--help"])
    sub = next(a for a in light._actions if a.dest == "command")
    assert {a.dest: a.help for a in sub._choices_actions} == registered
