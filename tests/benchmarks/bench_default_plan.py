"""Planning time of the default path: what ``tangram plan JOB --json`` runs, on the shipped small
jobs (run with ``-m benchmark --benchmark-enable``; skipped by default).

Pipeline replicas are a research option (``[planner] replicas = true``), so the default path
plans one pipeline; before that change it also ran the replica search. Run this file on the
code before and after (``PYTHONPATH`` pointing at the other tree; ``solver_file`` in each
benchmark's extra info says which one ran) with few rounds, under ``nice``:

    nice -n 10 python -m pytest tests/benchmarks/bench_default_plan.py -m benchmark \\
        --benchmark-enable -p no:cacheprovider -p no:randomly

``TANGRAM_BENCH_PLAN_ARGS`` adds flags to the command (e.g. ``--replicas``, to time the
replica search on the new code). Each job is timed twice: in this process (the planning
alone, after a warm-up round) and in a fresh process (what a user waits for). No timing is
asserted (wall time depends on the machine's load); each round checks the answer: the command
succeeds and prints a plan whose objective agrees with its throughput.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys

import pytest

import solver
from solver.cli.main import main
from solver.spec.loaders import INSTANCES, load_job

pytestmark = pytest.mark.benchmark

#: The shipped small jobs (seconds per plan, not minutes).
JOBS = ("seed-llama3-70b", "small-7b-512", "odd-3h100-5a100-llama2-13b",
        "three-gen-512-llama3-70b", "homog-a100-llama2-13b")
#: Extra flags for the command (environment, so that the same file runs on the old code).
EXTRA = tuple(os.environ.get("TANGRAM_BENCH_PLAN_ARGS", "").split())


def _fresh(path: str) -> dict:
    """``tangram plan PATH --json`` (plus :data:`EXTRA`) in a fresh process, as a user runs it
    (imports, the numba kernels loaded, worker processes started), its output parsed."""
    tree = os.path.dirname(os.path.dirname(solver.__file__))  # the child plans with this tree
    env = dict(os.environ, PYTHONPATH=tree)
    done = subprocess.run([sys.executable, "-c", "from solver.cli import run; run()", "plan",
                           path, "--json", *EXTRA], capture_output=True, text=True, check=False,
                          cwd=tree, env=env)
    assert done.returncode == 0, f"tangram plan {path} exited {done.returncode}: {done.stderr}"
    return json.loads(done.stdout)


def _in_process(path: str) -> dict:
    """The same command in this process: the planning alone (the warm-up round loaded the
    kernels)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["plan", path, "--json", *EXTRA])
    assert code == 0, f"tangram plan {path} exited {code}"
    return json.loads(out.getvalue())


@pytest.mark.parametrize("how", ["in-process", "fresh-process"])
@pytest.mark.parametrize("name", JOBS)
def test_bench_default_plan(benchmark, name, how):
    path = str(INSTANCES / "jobs" / f"{name}.toml")
    benchmark.extra_info["solver_file"] = solver.__file__
    benchmark.extra_info["flags"] = " ".join(EXTRA)
    run = _fresh if how == "fresh-process" else _in_process
    got = benchmark.pedantic(run, args=(path,), rounds=3, iterations=1, warmup_rounds=1)
    objective, training = got["objective"], load_job(path).training
    assert objective["tokens_per_s"] * objective["iteration_time_s"] == pytest.approx(
        training.tokens, rel=1e-6)
    assert sum(r["share"] for r in got.get("replicas", [])) in (0, training.global_batch)
    benchmark.extra_info["replicas"] = len(got.get("replicas", [None]))
    benchmark.extra_info["tokens_per_s"] = objective["tokens_per_s"]
