"""Interleaved 1F1B in the planner: the family is searched exactly and validated."""

from __future__ import annotations

from dataclasses import replace

import pytest

from solver.cost.parallelizer import AnalyticParallelizer
from solver.cost.stage import ModelSlice
from solver.islands import group_island
from solver.planner.interleaved import _context, chunk_counts
from solver.planner.search import PlannerConfig, plan_job
from solver.planner.validate import problems
from solver.spec.domain import SolverKind
from solver.spec.loaders import INSTANCES, load_job

HOMOG = INSTANCES / "jobs" / "homog-a100-llama2-13b.toml"


def test_chunk_counts_by_hand():
    assert chunk_counts(40) == [2, 4, 5, 8, 10, 20]
    assert chunk_counts(7) == []


@pytest.fixture(scope="module")
def homog():
    job = load_job(HOMOG)
    return job, plan_job(job)


def _brute(job, n):
    """Every (nodes, v, configuration) of the family, no pruning: the objective by hand."""
    from solver.islands import Thresholds, build_islands
    best = None
    for isl in build_islands(job.cluster, Thresholds.of(job.planner)).islands:
        for nodes in range(1, len(isl.nodes) + 1):
            for v in chunk_counts(job.model.layers):
                ctx = _context(job, job.planner.features, n, v, nodes, isl)
                for p in AnalyticParallelizer(job.planner.features).plan(
                        ModelSlice.whole(job.model), group_island(isl, nodes), ctx):
                    pp = p.config.pp
                    if pp < 2 or job.model.layers % (pp * v) or n % pp:
                        continue
                    taus = p.stage_latencies
                    t = (n - 1) * max(taus) + max(taus) + (sum(taus) - max(taus)) / v
                    t += p.iteration_s
                    best = t if best is None else min(best, t)
    return best


def test_homogeneous_job_interleaves_and_matches_brute_force(homog):
    job, plan = homog
    assert plan.virtual_stages > 1 and len(plan.stages) == 1
    assert plan.solver.name.endswith("+interleaved") and plan.solver.optimal
    assert problems(plan, job) == []
    assert plan.iteration_time_s == pytest.approx(_brute(job, plan.n_micro), rel=1e-9)


def test_interleaving_is_taken_only_when_it_beats_plain_1f1b(homog, monkeypatch):
    job, plan = homog
    import solver.planner.search as search
    monkeypatch.setattr(search, "best_interleaved", lambda *a, **k: (None, 0))
    plain = plan_job(job)
    assert plain.virtual_stages == 1
    assert plan.iteration_time_s < plain.iteration_time_s


def test_every_solver_finds_the_same_interleaved_plan(homog):
    job, plan = homog
    for kind in (SolverKind.CPSAT, SolverKind.MILP):
        other = plan_job(job, PlannerConfig(solver=kind), n_micro=plan.n_micro)
        assert other.iteration_time_s == pytest.approx(plan.iteration_time_s, rel=1e-6)
        assert other.virtual_stages == plan.virtual_stages


def test_validator_enforces_megatrons_interleaving_rules(homog):
    job, plan = homog
    pp = plan.stages[0].plan.config.pp
    bad_n = replace(plan, n_micro=plan.n_micro * pp + 1)  # never a multiple of pp >= 2
    assert any("divisible by pp" in p for p in problems(bad_n, job))
    odd_v = replace(plan, virtual_stages=3)
    assert any("pp·v" in p for p in problems(odd_v, job))


def test_heterogeneous_multi_stage_plans_never_interleave():
    job = load_job(INSTANCES / "jobs" / "seed-llama3-70b.toml")
    plan = plan_job(job)
    assert len(plan.stages) == 1 or plan.virtual_stages == 1
    two = replace(plan, virtual_stages=2)
    assert any("one pipeline of one layout" in p for p in problems(two, job))


def test_compute_floor_is_below_every_interleaved_plan(homog):
    job, plan = homog
    from solver.planner.interleaved import compute_floor
    stage = plan.stages[0]
    assert compute_floor(job, stage.island, len(stage.nodes)) < plan.iteration_time_s
