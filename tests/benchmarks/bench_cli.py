"""Whole-command times of ``tangram``, each a fresh process, beside ``python -c pass`` (the
interpreter's own start) measured the same way.

Targets (issue 47; reported with the measured medians, not asserted: wall time depends on the
machine and its load): ``tangram --help`` under 0.3 s; the worked example's whole ``tangram
plan instances/jobs/seed-llama3-70b.toml`` under 1 s once compiled (a warm-up round fills
numba's cache first). The worked example runs its kernels' NumPy twins and never imports numba
(:mod:`solver.compose.kernels.kernel_switch`); the same plan with ``TANGRAM_KERNELS=compiled`` shows
what numba's start-up would add. Each command's answer is checked, so a fast failure is no
result.

    python -m pytest tests/benchmarks/bench_cli.py -m benchmark --benchmark-enable -p no:randomly
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.benchmark

SCRIPT = Path(sys.executable).with_name("tangram")
# The console script when installed beside this interpreter, else the same entry point.
TANGRAM = [str(SCRIPT)] if SCRIPT.is_file() else [sys.executable, "-m", "solver"]
WORKED_EXAMPLE = str(ROOT / "instances" / "jobs" / "seed-llama3-70b.toml")
ROUNDS = 5


def _run(argv: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env=None if env is None else {**os.environ, **env})


def _measure(benchmark, argv: list[str], warmup: int = 1,
             env: dict | None = None) -> subprocess.CompletedProcess:
    done = benchmark.pedantic(_run, args=(argv, env), rounds=ROUNDS, iterations=1,
                              warmup_rounds=warmup)
    assert done.returncode == 0, done.stderr
    return done


def test_bench_python_start(benchmark):
    """The floor: an interpreter that does nothing."""
    _measure(benchmark, [sys.executable, "-c", "pass"])


def test_bench_tangram_help(benchmark):
    done = _measure(benchmark, [*TANGRAM, "--help"])
    assert "plan a job" in done.stdout


def test_bench_tangram_version(benchmark):
    done = _measure(benchmark, [*TANGRAM, "--version"])
    assert done.stdout.startswith("tangram ")


def test_bench_tangram_plan_worked_example(benchmark):
    """The README's first command, whole process, JSON out (the plan is validated by the
    planner before it is printed)."""
    done = _measure(benchmark, [*TANGRAM, "plan", WORKED_EXAMPLE, "--json"])
    plan = json.loads(done.stdout)
    assert plan["job"]["name"] == "seed-llama3-70b" and plan["stages"]


def test_bench_tangram_plan_worked_example_compiled_kernels(benchmark):
    """The same command with the compiled kernels forced: numba imported and its kernels loaded
    from its cache (the price the NumPy twins avoid on a table this small)."""
    done = _measure(benchmark, [*TANGRAM, "plan", WORKED_EXAMPLE, "--json"],
                    env={"TANGRAM_KERNELS": "compiled"})
    assert json.loads(done.stdout)["stages"]
