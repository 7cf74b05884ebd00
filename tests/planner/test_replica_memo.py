"""The memo the replica search plans through: the same plans as without it, calls remembered
across jobs that differ only in their islands, and constraints that leave the islands out."""

from __future__ import annotations

from solver.cost.parallelizer import AnalyticParallelizer
from solver.planner.stages.memo import MemoParallelizer
from solver.planner.replica.replica_plan import replica_job
from solver.planner.stages.search import job_islands, plan_job
from solver.spec.constraints import Constraints
from solver.spec.loaders import load_job
from tests.planner.test_replicas import _write


def _stages(plan):
    return [(s.island.name, s.start, s.end, s.plan.config, len(s.nodes)) for s in plan.stages]


def test_plans_through_the_memo_are_the_plans_without_it(tmp_path):
    job = load_job(_write(tmp_path, batch=32, n='"auto"'))
    memo = MemoParallelizer(AnalyticParallelizer(job.planner.features))
    plain, first = plan_job(job), plan_job(job, parallelizer=memo)
    assert first.iteration_time_s == plain.iteration_time_s and first.n_micro == plain.n_micro
    assert _stages(first) == _stages(plain) and memo.inner_calls > 0
    misses = memo.inner_calls
    again = plan_job(job, parallelizer=memo)  # every call answered from memory
    assert memo.inner_calls == misses and memo.hits >= misses
    assert again.iteration_time_s == plain.iteration_time_s and _stages(again) == _stages(plain)


def test_replicas_sharing_an_island_share_its_calls(tmp_path):
    job = load_job(_write(tmp_path))
    a, b, c = job_islands(job).islands
    memo = MemoParallelizer(AnalyticParallelizer(job.planner.features))
    for group in ((a, c), (b, c)):  # c at share 24 in two replica sets
        got = plan_job(replica_job(job, group, 24), parallelizer=memo)
        assert got.iteration_time_s == plan_job(replica_job(job, group, 24)).iteration_time_s
    assert memo.hits > 0  # the second set asked some of c's questions again


def test_stage_constraints_leave_out_the_island_selection():
    c = Constraints(tp=(1, 2), zero=(1,), islands=("i0",), exclude_islands=("i1",),
                    max_replicas=1, max_stages=4)
    assert c.on_stages() == Constraints(tp=(1, 2), zero=(1,), max_stages=4)
    assert Constraints(islands=("a",)).on_stages() == Constraints(islands=("b",)).on_stages()


def test_the_memo_forgets_its_oldest_answers_past_its_size(tmp_path):
    job = load_job(_write(tmp_path, batch=32))
    memo = MemoParallelizer(AnalyticParallelizer(job.planner.features), max_entries=3)
    plain = plan_job(job)
    assert plan_job(job, parallelizer=memo).iteration_time_s == plain.iteration_time_s
    assert len(memo._seen) == 3 and memo.inner_calls > 3
