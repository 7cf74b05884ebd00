"""The exact pass with workers: partitions side by side, committed in bound order, the same
answer as one at a time; a stale (larger) budget finds the same best shares; the deadline."""

from __future__ import annotations

import math
import time

import pytest

from solver.planner.replica.replica_bounds import partitions, ranked_partitions
from solver.planner.replica.replica_pass import (ParallelPass, SearchState, partition_search,
                                         solve_partition)
from solver.planner.replica.replica_plan import allreduce_s
from solver.planner.replica.replica_workers import ReplicaMemo, ReplicaPlanner
from solver.planner.replica.replicas import ReplicaOptions, plan_replicas
from solver.planner.stages.search import PlannerConfig, job_islands, plan_job
from solver.spec.loaders import load_job
from tests.planner.test_replicas import _write


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return load_job(_write(tmp_path_factory.mktemp("pass")))


def _run(search):
    """Drive a partition search in this process (its reads planned when read)."""
    try:
        while True:
            next(search)
    except StopIteration as end:
        return end.value


def test_a_stale_budget_finds_the_same_best_shares(job):
    """A partition started before an earlier one lowered the incumbent searches a wider
    window; its best value and shares are those a search at the lower incumbent finds."""
    isl = job_islands(job).islands
    part = ((isl[0],), (isl[2],))
    reps = ReplicaMemo(job, ReplicaPlanner(job, PlannerConfig(), 8))
    wide = _run(partition_search(reps, part, 8, SearchState(math.inf)))
    assert wide is not None
    for above in (1.001, 1.05, 1.5):  # incumbents just above the optimum and further off
        fresh = ReplicaMemo(job, ReplicaPlanner(job, PlannerConfig(), 8))
        assert _run(partition_search(fresh, part, 8, SearchState(wide[0] * above))) == wide
    below = ReplicaMemo(job, ReplicaPlanner(job, PlannerConfig(), 8))
    assert _run(partition_search(below, part, 8, SearchState(wide[0]))) is None  # a tie: none


def test_an_incumbent_lowered_mid_search_is_read_and_keeps_the_best(job):
    """Side by side, an earlier partition may lower the incumbent while this one walks: the
    walk cuts with the new one (fewer replicas planned) and finds the same best shares."""
    isl = job_islands(job).islands
    part = ((isl[0],), (isl[2],))
    fresh = lambda: ReplicaMemo(job, ReplicaPlanner(job, PlannerConfig(), 8))  # noqa: E731
    loose = fresh()
    wide = _run(partition_search(loose, part, 8, SearchState(math.inf)))
    reps, st = fresh(), SearchState(math.inf)
    search = partition_search(reps, part, 8, st)
    next(search)
    st.value = wide[0] * 1.001  # the incumbent moves after the first asks
    assert _run(search) == wide
    assert len(reps.plans) < len(loose.plans)


def test_partitions_side_by_side_give_the_answer_of_one_at_a_time(job, monkeypatch):
    active = []
    real = ParallelPass._start

    def spy(self):
        real(self)
        active.append(len(self.active))

    monkeypatch.setattr(ParallelPass, "_start", spy)
    single = plan_job(job)
    # No wall-clock deadline: the proof asserted below never depends on the machine's load.
    one = plan_replicas(job, single, options=ReplicaOptions(share_steps=8, time_limit_s=math.inf))
    two = plan_replicas(job, single, options=ReplicaOptions(share_steps=8, workers=2,
                                                            time_limit_s=math.inf))
    assert max(active) >= 2  # the workers' pass had several partitions open at once
    assert two.iteration_time_s == one.iteration_time_s and two.shares == one.shares
    assert two.partitions == one.partitions and two.solver.optimal
    assert [r.islands for r in two.replicas] == [r.islands for r in one.replicas]


def test_the_parallel_pass_stops_at_its_deadline_with_the_lowest_open_bound(job):
    every = list(partitions(job_islands(job).islands, 3))
    with ReplicaPlanner(job, PlannerConfig(), 8, workers=2) as planner:
        reps = ReplicaMemo(job, planner)
        ranked = ranked_partitions(job, every, reps.calib)
        st = SearchState(plan_job(job).iteration_time_s,
                         least_allreduce=min(allreduce_s(job, p) for _, p in ranked))
        ParallelPass(reps, ranked, 8, st).run(deadline=time.perf_counter())
        assert st.settled == 0 and st.open_bound == ranked[0][0] and st.choice is None
        # A deadline leaves asks out; leaving the planner stops their workers, unread.
        planner.send(((job_islands(job).islands[2].name,), 64, math.inf))
        assert planner.idle() == 1
    assert not any(p.is_alive() for p in planner._procs)
    stopped = SearchState(math.inf)
    in_process = ReplicaMemo(job, ReplicaPlanner(job, PlannerConfig(), 8))
    assert solve_partition(in_process, ranked[0][1], 8, stopped, 0.0) is False


