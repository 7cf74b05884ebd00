"""The replica search's parts one by one: proportional shares, the plan memo and its budget
semantics, tie-breaking of the share DP, the windows and the note."""

from __future__ import annotations

import math

import pytest

import solver.planner.replicas as replicas
from solver.planner.replicas import (_Replicas, _note, _State, best_shares, holds_model,
                                     partition_bound, proportional_shares, replica_floor,
                                     share_window)
from solver.planner.search import PlannerConfig, job_islands, plan_job
from solver.planner.replica_plan import allreduce_s, replica_job
from solver.spec.domain import FeaturePreset
from solver.spec.loaders import load_job
from tests.planner.test_replicas import _write


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return load_job(_write(tmp_path_factory.mktemp("units")))


def test_proportional_shares_follow_the_floor_rates(job):
    isl = job_islands(job).islands
    part = ((isl[0],), (isl[1],), (isl[2],))
    rates = [1 / replica_floor(job, g, 64) for g in part]
    shares = proportional_shares(job, part, 8)
    assert sum(shares) == 64 and all(s % 8 == 0 and s >= 8 for s in shares)
    # 8 units split by rate, the rounding remainder on the largest.
    raw = [max(1, round(8 * r / sum(rates))) for r in rates]
    raw[raw.index(max(raw))] += 8 - sum(raw)
    assert shares == tuple(8 * k for k in raw)
    assert shares[0] > shares[2]  # the H200 outruns the A100
    assert proportional_shares(job, part, 32) is None  # 2 units for 3 replicas
    assert proportional_shares(job, part[:2], 32) == (32, 32)


def test_share_dp_breaks_ties_towards_the_first_vector_found():
    # (1, 2) and (2, 1) both give 1.0: the DP keeps the first (smaller first share).
    assert best_shares([{1: 1.0, 2: 1.0}, {1: 1.0, 2: 1.0}], 3, 1) == (1.0, (1, 2))


class _Counting:
    def __init__(self):
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return plan_job(*args, **kwargs)


def test_replica_memo_plans_once_and_remembers_budgets(job, monkeypatch):
    counter = _Counting()
    monkeypatch.setattr(replicas, "plan_job", counter)
    group = (job_islands(job).islands[2],)
    exact = plan_job(replica_job(job, group, 16)).iteration_time_s
    reps = _Replicas(job, PlannerConfig(), None)
    # Below the optimum: nothing as fast, remembered for this and smaller budgets.
    assert reps.time(group, 16, exact * 0.5) == math.inf and counter.calls == 1
    assert reps.time(group, 16, exact * 0.5) == math.inf and counter.calls == 1
    assert reps.time(group, 16, exact * 0.4) == math.inf and counter.calls == 1
    # A larger budget plans again and finds the exact optimum, kept for every later ask.
    assert reps.time(group, 16, exact * 2) == pytest.approx(exact) and counter.calls == 2
    assert reps.time(group, 16, exact * 0.1) == pytest.approx(exact) and counter.calls == 2
    assert reps.time(group, 16) == pytest.approx(exact) and counter.calls == 2
    assert reps.plan(group, 16).iteration_time_s == pytest.approx(exact)
    assert reps.calls == reps.plan(group, 16).solver.parallelizer_calls > 0
    reps.time(group, 24)
    assert reps.calls == sum(p.solver.parallelizer_calls for p in reps.plans.values())


def test_replica_memo_uses_the_given_config_and_parallelizer(job):
    class Spy:
        def __init__(self):
            from solver.cost.parallelizer import AnalyticParallelizer
            self.inner, self.calls = AnalyticParallelizer(FeaturePreset.METIS), 0

        def plan(self, *a, **k):
            self.calls += 1
            return self.inner.plan(*a, **k)

        def plan_stages(self, *a, **k):
            self.calls += 1
            return self.inner.plan_stages(*a, **k)

    spy = Spy()
    group = (job_islands(job).islands[2],)
    reps = _Replicas(job, PlannerConfig(features=FeaturePreset.METIS), spy)
    reps.time(group, 16)
    assert spy.calls > 0
    plan = reps.plan(group, 16)
    assert all(s.plan.config.zero == 0 for s in plan.stages)  # metis: no ZeRO


def test_windows_bounds_and_memory_cut(job):
    isl = job_islands(job).islands
    part = ((isl[0],), (isl[2],))
    # Budget below every floor: no share of either replica is worth planning.
    tiny = min(replica_floor(job, g, 8) for g in part) * 0.5
    assert all(len(w) == 0 for w in share_window(job, part, 8, tiny)) or \
        any(len(w) == 0 for w in share_window(job, part, 8, tiny))
    wide = share_window(job, part, 8, 1e9)
    assert [list(w) for w in wide] == [list(range(8, 57, 8))] * 2
    # The bound: all-reduce plus the min-max of the floors, B / sum(B / F_r(B)).
    rate = sum(1 / replica_floor(job, g, 64) for g in part)
    assert partition_bound(job, part) == pytest.approx(allreduce_s(job, part) + 1 / rate)
    assert holds_model(job, (isl[2],))
    from dataclasses import replace
    huge = replace(job, model=replace(job.model, layers=job.model.layers * 40))
    assert not holds_model(huge, (isl[2],))   # 40 x 7B of states on 8 A100s


def test_replica_floor_adds_the_fill_of_a_pipeline_across_islands(job):
    isl = job_islands(job).islands
    one, two = (isl[2],), (isl[0], isl[2])
    n = job.training.n_micro
    caps = [1 / replica_floor(job, (i,), 64) * n / n for i in (isl[0], isl[2])]
    # Alone, the floor is the plain compute floor (factor 1); across two islands it is
    # W ((n - 1)/C + 1/C_max) with W = 1/n of the batch.
    assert replica_floor(job, one, 64) == pytest.approx(1 / caps[1])
    expect = (1 / n) * ((n - 1) / sum(caps) + 1 / max(caps))
    assert replica_floor(job, two, 64) == pytest.approx(expect)
    assert replica_floor(job, two, 32) == pytest.approx(expect / 2)


def test_notes_say_how_the_search_ended():
    assert "fewer than two islands" in _note(_State(1.0), 0)
    assert _note(_State(1.0, settled=3), 7) == ("replica search stopped at its time limit after "
                                                "3 of 7 island partitions")
    assert _note(_State(1.0, settled=7), 7) == "replica search: 7 island partitions settled"


def test_every_planned_share_is_on_the_grid(job, monkeypatch):
    asked = []
    real = _Replicas.time

    def spy(self, group, share, budget=math.inf):
        asked.append(share)
        return real(self, group, share, budget)

    monkeypatch.setattr(_Replicas, "time", spy)
    from solver.planner.replicas import ReplicaOptions, plan_replicas
    plan_replicas(job, plan_job(job), options=ReplicaOptions(share_steps=8))
    assert asked and all(b % 8 == 0 and 8 <= b <= 56 for b in asked)


def test_two_workers_find_the_same_plan(job):
    from solver.planner.replicas import ReplicaOptions, plan_replicas
    single = plan_job(job)
    one = plan_replicas(job, single, options=ReplicaOptions(share_steps=8))
    two = plan_replicas(job, single, options=ReplicaOptions(share_steps=8, workers=2))
    assert two.iteration_time_s == one.iteration_time_s and two.shares == one.shares
    assert two.solver.optimal and two.partitions == one.partitions
