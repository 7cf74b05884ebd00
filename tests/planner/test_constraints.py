"""``[constraints]``: validated with one-line errors, honoured by every solver, binding where
they should."""

from __future__ import annotations

import math

import pytest

from solver.cli.main import main
from solver.planner.stages.search import PlannerConfig, plan_job
from solver.planner.check.validate import problems
from solver.spec.domain import Recompute, SolverKind
from solver.spec.errors import InputError
from solver.spec.loaders import load_job
from tests.planner.test_planner import write_job

GPUS = ["H100-SXM-80GB", "A100-SXM-80GB", "L40S"]


#: Layers of the test model: enough that the unconstrained optimum pipelines over all three
#: GPUs (3 stages, tp 1, micro-batch 2, no recomputation), so each constraint below binds.
LAYERS = 12


def _job(tmp_path, table: str, gpus=GPUS, layers=LAYERS, n=4):
    path = write_job(tmp_path, gpus, layers=layers, n=n)
    path.write_text(path.read_text() + "[constraints]\n" + table)
    return path


@pytest.fixture(scope="module")
def free(tmp_path_factory):
    path = write_job(tmp_path_factory.mktemp("free"), GPUS, layers=LAYERS, n=4)
    return plan_job(load_job(path))


def _solvers(job):
    """The plan of each solver, each proven (no wall-clock limit: a model stopped by one would
    hand back the DP's plan, and the agreement below would prove nothing)."""
    plans = [plan_job(job, PlannerConfig(solver=k, time_limit_s=math.inf)) for k in
             (SolverKind.DP, SolverKind.CPSAT, SolverKind.MILP)]
    assert all(p.solver.optimal for p in plans), [p.solver for p in plans]
    return plans


@pytest.mark.parametrize("table,check", [
    ("tp = [2, 4]\n", lambda p: all(s.plan.config.tp in (2, 4) for s in p.stages)),
    ("micro_batch = [1]\n", lambda p: all(s.plan.config.micro_batch == 1 for s in p.stages)),
    ("max_stages = 1\n", lambda p: sum(s.plan.config.pp for s in p.stages) == 1),
    ('exclude_islands = ["H100-SXM-80GB"]\n',
     lambda p: all(s.island.gpu.name != "H100-SXM-80GB" for s in p.stages)),
    ('recompute = ["full"]\n', lambda p: all(s.plan.config.recompute is Recompute.FULL
                                             for s in p.stages)),
])
def test_each_constraint_binds_and_all_solvers_agree(tmp_path, free, table, check):
    assert not check(free)  # the unconstrained optimum breaks it: the constraint binds
    job = load_job(_job(tmp_path, table))
    plans = _solvers(job)
    for p in plans:
        assert check(p) and problems(p, job) == []
        assert p.iteration_time_s >= free.iteration_time_s * (1 - 1e-9)  # never better
    times = [p.iteration_time_s for p in plans]
    assert max(times) - min(times) <= 1e-4 * min(times)


def test_validator_rejects_a_plan_outside_the_constraints(tmp_path, free):
    job = load_job(_job(tmp_path, "tp = [2]\n"))
    assert any("constraints.tp" in p for p in problems(free, job))


def test_validator_rejects_a_plan_at_another_fixed_n_micro(tmp_path, free):
    # The job fixes n_micro = 2; the free plan was made at 4 micro-batches.
    job = load_job(write_job(tmp_path, GPUS, layers=LAYERS, n=2))
    assert "n_micro 4 is not the job's training.n_micro 2" in problems(free, job)


@pytest.mark.parametrize("table,key", [
    ("tp = [0]\n", "constraints.tp"),
    ('recompute = ["sometimes"]\n', "constraints.recompute"),
    ("max_stages = 0\n", "constraints.max_stages"),
    ('schedule = ["gpipe"]\n', "constraints.schedule"),
    ("colour = 3\n", "constraints.colour"),
])
def test_bad_constraints_get_one_line_errors(tmp_path, capsys, table, key):
    path = _job(tmp_path, table)
    with pytest.raises(InputError, match=key):
        load_job(path)
    assert main(["plan", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and key in err and "\n" not in err


def test_unknown_island_is_a_one_line_error(tmp_path, capsys):
    path = _job(tmp_path, 'islands = ["TPU-v5"]\n')
    assert main(["plan", str(path)]) == 2
    err = capsys.readouterr().err
    assert "constraints.islands" in err and "TPU-v5" in err


@pytest.mark.parametrize("pp", [[2], [2, 5]])
def test_pp_sets_the_pipeline_depth_in_every_solver(tmp_path, free, pp):
    """``pp`` (Megatron's --pipeline-model-parallel-size): the unconstrained optimum has 3
    stages; allowing 2 (or 2 and an impossible 5) gives a 2-stage plan from DP, CP-SAT and MILP,
    no faster than the free one, and the same time from all."""
    depth = lambda p: sum(s.plan.config.pp for s in p.stages)  # noqa: E731
    assert depth(free) == 3
    job = load_job(_job(tmp_path, f"pp = {pp}\n"))
    plans = _solvers(job)
    for p in plans:
        assert depth(p) == 2 and problems(p, job) == []
        assert p.iteration_time_s >= free.iteration_time_s * (1 - 1e-9)
    times = [p.iteration_time_s for p in plans]
    assert max(times) - min(times) <= 1e-4 * min(times)
    assert any("constraints.pp" in x for x in problems(free, job))


def test_pp_nothing_can_meet_says_why_in_one_line(tmp_path, capsys):
    path = _job(tmp_path, "pp = [5]\n")
    assert main(["plan", str(path)]) == 3
    err = capsys.readouterr().err.strip()
    assert "constraints.pp [5]" in err and "\n" not in err
