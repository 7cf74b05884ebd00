"""The replica search's parts one by one: proportional shares, the plan memo and its budget
semantics, tie-breaking of the share DP, the windows and the note."""

from __future__ import annotations

import math

import pytest

import solver.planner.replica.replica_workers as replica_workers
import solver.planner.replica.replicas as replicas
from solver.planner.replica.replica_workers import ReplicaMemo, ReplicaPlanner
from solver.planner.replica.replica_pass import SearchState as _State
from solver.planner.replica.replica_pass import solve_partition as _solve_partition
from solver.planner.replica.replicas import (_note, best_shares, holds_model, partition_bound,
                                     proportional_shares, rebalanced_shares, replica_floor,
                                     share_window)
from solver.planner.stages.search import PlannerConfig, job_islands, plan_job
from solver.planner.replica.replica_plan import allreduce_s, replica_job
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
    # Whatever order the shares were planned in (the window walk plans from the top).
    assert best_shares([{2: 1.0, 1: 1.0}, {2: 1.0, 1: 1.0}], 3, 1) == (1.0, (1, 2))


def _in_process(job, unit=8):
    """The replica memo of a search planning in this process."""
    return ReplicaMemo(job, ReplicaPlanner(job, PlannerConfig(), unit))


class _Counting:
    def __init__(self):
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return plan_job(*args, **kwargs)


def test_replica_memo_counts_the_calls_of_a_search_that_found_nothing(job):
    """Just below the optimum the search must price slices before it knows nothing is
    faster: those calls are the search's cost too, and the memo counts them."""
    from solver.spec.errors import InfeasibleError
    group = (job_islands(job).islands[2],)
    exact = plan_job(replica_job(job, group, 16)).iteration_time_s
    with pytest.raises(InfeasibleError) as none:
        plan_job(replica_job(job, group, 16), upper=exact * 0.99)
    reps = _in_process(job)
    assert reps.time(group, 16, exact * 0.99) == math.inf
    assert reps.calls == none.value.calls > 0


def test_replica_memo_plans_once_and_remembers_budgets(job, monkeypatch):
    counter = _Counting()
    monkeypatch.setattr(replica_workers, "plan_job", counter)
    group = (job_islands(job).islands[2],)
    exact = plan_job(replica_job(job, group, 16)).iteration_time_s
    reps = _in_process(job)
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
    reps = ReplicaMemo(job, ReplicaPlanner(job, PlannerConfig(features=FeaturePreset.METIS), 8,
                                         parallelizer=spy))
    reps.time(group, 16)
    assert spy.calls > 0
    plan = reps.plan(group, 16)
    assert all(s.plan.config.zero == 0 for s in plan.stages)  # metis: no ZeRO


def test_windows_bounds_and_memory_cut(job):
    isl = job_islands(job).islands
    part = ((isl[0],), (isl[2],))
    # Budget below every floor: no share of either replica is worth planning.
    tiny = min(replica_floor(job, g, 8) for g in part) * 0.5
    assert all(len(w) == 0 for w in share_window(job, part, 8, tiny))
    # Between the two floors at one unit: the H200 keeps shares, the A100 none.
    mid = (replica_floor(job, part[0], 8) + replica_floor(job, part[1], 8)) / 2
    fast, slow = share_window(job, part, 8, mid)
    assert len(slow) == 0 and all(replica_floor(job, part[0], b) < mid for b in fast)
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
    from solver.planner.bounds.floors import compute_floor, kernel_floor
    isl = job_islands(job).islands
    one, two = (isl[2],), (isl[0], isl[2])
    n, layers = job.training.n_micro, job.model.layers
    # Alone, the floor is the plain compute floor: every layer and the head on the island.
    alone = compute_floor(job, isl[2], len(isl[2].nodes))
    assert replica_floor(job, one, 64) == pytest.approx(alone)
    # Across two islands: (n - 1) micro-batches of the layers and the head spread over both
    # (the head in layers of the island where it costs fewest), plus one micro-batch of the
    # layers on the faster island and the head where it is cheapest.
    (c0, h0), (c2, h2) = (kernel_floor(job, i, len(i.nodes)) for i in (isl[0], isl[2]))
    spread = (layers + min(h0 / c0, h2 / c2)) / (1 / c0 + 1 / c2)
    expect = ((n - 1) * spread + layers * min(c0, c2) + min(h0, h2)) / n
    assert replica_floor(job, two, 64) == pytest.approx(expect)
    assert replica_floor(job, two, 32) == pytest.approx(expect / 2)


def test_notes_say_how_the_search_ended():
    assert "fewer than two islands" in _note(_State(1.0), 0)
    assert _note(_State(1.0, settled=3), 7) == ("replica search stopped at its time limit after "
                                                "3 of 7 island partitions")
    assert _note(_State(1.0, settled=7), 7) == "replica search: 7 island partitions settled"
    assert _note(_State(1.0, settled=1), 1) == "replica search: 1 island partition settled"


def test_every_planned_share_is_on_the_grid(job, monkeypatch):
    asked = []
    real = ReplicaMemo.time

    def spy(self, group, share, budget=math.inf):
        asked.append(share)
        return real(self, group, share, budget)

    monkeypatch.setattr(ReplicaMemo, "time", spy)
    from solver.planner.replica.replicas import ReplicaOptions, plan_replicas
    plan_replicas(job, plan_job(job), options=ReplicaOptions(share_steps=8))
    assert asked and all(b % 8 == 0 and 8 <= b <= 56 for b in asked)


def test_two_workers_find_the_same_plan(job):
    from solver.planner.replica.replicas import ReplicaOptions, plan_replicas
    single = plan_job(job)
    # No wall-clock deadline: the proof asserted below never depends on the machine's load.
    one = plan_replicas(job, single, options=ReplicaOptions(share_steps=8, time_limit_s=math.inf))
    two = plan_replicas(job, single, options=ReplicaOptions(share_steps=8, workers=2,
                                                            time_limit_s=math.inf))
    assert two.iteration_time_s == one.iteration_time_s and two.shares == one.shares
    assert two.solver.optimal and two.partitions == one.partitions


def test_prefetch_fills_the_memo_from_the_workers(job):
    isl = job_islands(job).islands
    a, c = (isl[0],), (isl[2],)
    exact = plan_job(replica_job(job, c, 16)).iteration_time_s
    with ReplicaPlanner(job, PlannerConfig(), 8, workers=2) as planner:
        reps = ReplicaMemo(job, planner)
        reps.prefetch([(a, 16, math.inf), (c, 16, exact * 0.5)])
        # Both answered without planning here: a plan for one, "none below" for the other.
        assert isinstance(reps.plans[(("i0-H200-SXM-141GB",), 16)], replicas.Plan)
        assert reps.plans[((c[0].name,), 16)] == exact * 0.5
        assert reps.calls == reps.plans[(("i0-H200-SXM-141GB",), 16)].solver.parallelizer_calls
    alone = _in_process(job)  # no workers: nothing planned ahead
    alone.prefetch([(a, 16, math.inf), (c, 16, math.inf)])
    assert alone.plans == {}


def test_proportional_incumbent_by_hand(job):
    from solver.planner.replica.replicas import _try_proportional
    isl = job_islands(job).islands
    part = ((isl[0],), (isl[2],))
    shares = proportional_shares(job, part, 8)
    extra = allreduce_s(job, part)
    times = [plan_job(replica_job(job, g, b)).iteration_time_s for g, b in zip(part, shares)]
    # One rebalancing round: the shares the rates reached call for, planned too.
    again = rebalanced_shares(times, shares, 64, 8)
    value = min(max(times) + extra, max(plan_job(replica_job(job, g, b)).iteration_time_s
                                        for g, b in zip(part, again)) + extra)
    reps = _in_process(job)
    st = _State(max(times) * 1.5)
    _try_proportional(reps, part, 8, st)
    assert st.value == pytest.approx(value)
    assert st.choice[1] in (shares, again)
    for worse in (value, value / 1.5):  # a tie or a better incumbent is kept
        st = _State(worse)
        _try_proportional(reps, part, 8, st)
        assert st.value == worse and st.choice is None


def test_rebalanced_shares_by_hand():
    # Replica 0 took 2 s for 4 sequences, replica 1 took 1 s: per sequence 0.5 s and 0.25 s.
    # Eight sequences: 3/5 gives 1.5 s and 1.25 s; 2/6 ties at 1.5 s (3/5 comes first: every
    # unit goes to the replica it leaves fastest, the first on ties); 8/3 each is not whole.
    assert rebalanced_shares([2.0, 1.0], [4, 4], 8, 1) == (3, 5)
    assert rebalanced_shares([1.0, 1.0, 1.0], [2, 2, 2], 6, 2) == (2, 2, 2)
    assert rebalanced_shares([3.0, 1.0], [8, 8], 32, 8) == (8, 24)


@pytest.mark.parametrize("seed", range(20))
def test_rebalanced_shares_match_brute_force(seed):
    import itertools
    import random
    rng = random.Random(seed)
    r, unit = rng.randint(2, 4), rng.choice([1, 2, 8])
    batch = unit * rng.randint(r, 12)
    shares = [unit * rng.randint(1, 4) for _ in range(r)]
    times = [rng.uniform(0.1, 3.0) for _ in range(r)]
    got = rebalanced_shares(times, shares, batch, unit)
    assert sum(got) == batch and all(b >= unit and b % unit == 0 for b in got)

    def slowest(split):
        return max(t / s * b for t, s, b in zip(times, shares, split))
    best = min(slowest([unit * k for k in ks])
               for ks in itertools.product(range(1, batch // unit + 1), repeat=r)
               if sum(ks) * unit == batch)
    assert slowest(got) == pytest.approx(best, rel=1e-12)


def test_a_partition_below_every_floor_is_settled_without_planning(job):
    isl = job_islands(job).islands
    part = ((isl[0],), (isl[2],))
    extra = allreduce_s(job, part)
    reps = _in_process(job)
    st = _State(extra * 1.01)  # leaves 1% of the all-reduce for the replicas: nothing fits
    assert _solve_partition(reps, part, 8, st, math.inf) is True
    assert reps.plans == {} and st.choice is None


def test_a_top_that_fails_settles_the_partition_before_the_other_top_is_planned(job,
                                                                               monkeypatch):
    """The window walk plans one top at a time, the one whose floor is nearest the budget
    first. Floors at share b (batch 64): A 7b/64, B b/64; every share of A is slower than the
    incumbent. A's tops 56 ... 8 (floors 6.125 ... 0.875) all come before B's top 56 (0.875:
    a tie with A's last, which goes to the first replica), so A's walk alone settles the
    partition and B (whose plan would be dear) is never planned."""
    isl = job_islands(job).islands
    reps = _in_process(job)
    part = ((isl[0],), (isl[2],))
    floors = {part[0]: 7.0, part[1]: 1.0}
    asked = []

    def fake_time(group, share, budget=math.inf):
        asked.append((group, share))
        return math.inf if group == part[0] else 0.0

    monkeypatch.setattr(reps, "whole_floor", lambda g: floors[g])
    monkeypatch.setattr(reps, "time", fake_time)
    st = _State(100.0)  # every share is in its window
    assert _solve_partition(reps, part, 8, st, math.inf) is True
    assert asked == [(part[0], b) for b in range(56, 7, -8)] and st.choice is None


def test_export_refusal_text():
    from solver.planner.replica.replica_plan import not_exportable
    assert not_exportable((24, 8)) == (
        "the plan trains 2 pipeline replicas with batch shares [24, 8]; FlagScale's "
        "heterogeneous meshes form one pipeline and Megatron-LM runs one layout, so neither "
        "trains separate pipelines (plan without [planner] replicas = true, or with "
        "[constraints] max_replicas = 1, for an exportable plan)")
    # With the plan's runtime verdict, the verdict is the reason.
    assert not_exportable((24, 8), "no supported runtime trains it: why") == (
        "the plan trains 2 pipeline replicas with batch shares [24, 8]; no supported runtime "
        "trains it: why (plan without [planner] replicas = true, or with [constraints] "
        "max_replicas = 1, for an exportable plan)")


def test_one_partition_solved_from_scratch_equals_its_brute_force(job):
    """With no incumbent the exact pass plans every share of the partition and its DP must
    find the brute-force min-max (plus the all-reduce)."""
    isl = job_islands(job).islands
    part = ((isl[0],), (isl[2],))
    extra = allreduce_s(job, part)
    reps = _in_process(job)
    st = _State(math.inf)
    assert _solve_partition(reps, part, 8, st, math.inf) is True
    t = {(g, b): plan_job(replica_job(job, g, b)).iteration_time_s
         for g in part for b in range(8, 57, 8)}
    brute = min((max(t[part[0], b], t[part[1], 64 - b]) + extra, (b, 64 - b))
                for b in range(8, 57, 8))
    assert st.value == pytest.approx(brute[0]) and st.choice == (part, brute[1])
    assert len(reps.plans) == 14  # every share of both replicas was planned
    stopped = _State(math.inf)
    assert _solve_partition(_in_process(job), part, 8, stopped, 0.0) is False


def test_partitions_of_three_islands_by_hand(job):
    from solver.planner.replica.replicas import partitions
    a, b, c = job_islands(job).islands
    got = {frozenset(frozenset(i.name for i in g) for g in p) for p in partitions((a, b, c), 3)}
    n = lambda *xs: frozenset(x.name for x in xs)  # noqa: E731
    assert got == {frozenset({n(a), n(b), n(c)}), frozenset({n(a, b), n(c)}),
                   frozenset({n(a, c), n(b)}), frozenset({n(a), n(b, c)}),
                   frozenset({n(a), n(b)}), frozenset({n(a), n(c)}), frozenset({n(b), n(c)})}
    assert all(g for p in partitions((a, b, c), 3) for g in p)
    assert list(partitions((), 3)) == [] and list(partitions((a,), 3)) == []


def test_plan_replicas_passes_the_parallelizer_and_reports_its_own_time(job):
    import time as clock
    from solver.cost.parallelizer import AnalyticParallelizer
    from solver.planner.replica.replicas import ReplicaOptions, plan_replicas

    class Spy(AnalyticParallelizer):
        used = 0

        def plan_stages(self, *a, **k):
            Spy.used += 1
            return super().plan_stages(*a, **k)

    single = plan_job(job)
    t0 = clock.perf_counter()
    rp = plan_replicas(job, single, parallelizer=Spy(FeaturePreset.FULL),
                       options=ReplicaOptions(share_steps=8, workers=2))
    wall = clock.perf_counter() - t0
    assert Spy.used > 0  # a given parallelizer is used (and no pool is started for it)
    assert single.solver.time_s <= rp.solver.time_s <= single.solver.time_s + wall


def test_workers_are_started_only_for_several_workers_and_no_parallelizer(job, monkeypatch):
    from solver.cost.parallelizer import AnalyticParallelizer
    from solver.planner.replica.replicas import ReplicaOptions, plan_replicas
    started, sent = [], []
    enter, plan = ReplicaPlanner.__enter__, ReplicaPlanner.plan

    def recording_enter(self):
        got = enter(self)
        started.append(len(self._conns))
        return got

    def recording_plan(self, asks):
        sent.extend(asks if self._conns else [])
        return plan(self, asks)

    monkeypatch.setattr(ReplicaPlanner, "__enter__", recording_enter)
    monkeypatch.setattr(ReplicaPlanner, "plan", recording_plan)
    single = plan_job(job)
    plan_replicas(job, single, options=ReplicaOptions(share_steps=8, workers=2))
    assert started == [2] and sent  # the workers planned shares
    plan_replicas(job, single, options=ReplicaOptions(share_steps=8, workers=1))
    plan_replicas(job, single, parallelizer=AnalyticParallelizer(FeaturePreset.FULL),
                  options=ReplicaOptions(share_steps=8, workers=2))
    assert started == [2, 0, 0]


def test_a_worker_error_is_raised_in_the_search(job):
    from solver.spec.errors import InputError
    with ReplicaPlanner(job, PlannerConfig(), 8, workers=2) as planner:
        with pytest.raises(InputError, match="no island"):
            planner.plan([(("no-such-island",), 16, math.inf), (("no-such-island",), 24, 1.0)])
        group = (job_islands(job).islands[2].name,)
        assert planner.plan([(group, 16, math.inf)])[0] is not None  # the workers live on


def test_holds_model_boundary_by_hand(job):
    from dataclasses import replace
    a100 = (job_islands(job).islands[2],)
    m = job.model
    # 8 x (81,920 MiB - 2,923,429,888 B of CUDA context and NCCL buffers) at ε = 0:
    # 8 x 82,975,916,032 = 663,807,328,256 B for 18 B/param -> 36.88e9 parameters.
    fixed = m.total_params - m.layers * m.params_per_layer
    most = int((663_807_328_256 / 18 - fixed) // m.params_per_layer)
    assert holds_model(replace(job, model=replace(m, layers=most)), a100)
    assert not holds_model(replace(job, model=replace(m, layers=most + 1)), a100)


def test_result_reports_gap_name_calls_and_the_single_plans_islands(job):
    from solver.planner.replica.replicas import ReplicaOptions, plan_replicas
    single = plan_job(job)
    stopped = plan_replicas(job, single, options=ReplicaOptions(share_steps=8, time_limit_s=1e-9))
    info = stopped.solver
    assert info.name == "replicas" and not info.optimal
    assert info.gap == pytest.approx((stopped.iteration_time_s - info.bound)
                                     / stopped.iteration_time_s)
    assert 0 <= info.gap < 1 and info.parallelizer_calls >= single.solver.parallelizer_calls
    used = tuple(i for i in single.islands.islands
                 if any(s.island.name == i.name for s in single.stages))
    assert stopped.replicas[0].islands == used and stopped.replicas[0].plan is single


@pytest.mark.parametrize("layers_times", [1, 12])
def test_ranked_partitions_are_the_bounds_sorted_after_the_memory_cut(job, layers_times):
    from dataclasses import replace
    from solver.planner.replica.replicas import partitions, ranked_partitions
    big = replace(job, model=replace(job.model, layers=job.model.layers * layers_times))
    every = list(partitions(job_islands(big).islands, 3))
    expect = sorted((p for p in every if all(holds_model(big, g) for g in p)),
                    key=lambda p: partition_bound(big, p))
    got = ranked_partitions(big, every)
    assert [p for _, p in got] == expect
    assert [b for b, _ in got] == [partition_bound(big, p) for p in expect]
    assert layers_times == 1 or len(expect) < len(every)  # 12 x 7B: some sets cannot hold it
