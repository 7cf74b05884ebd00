"""The floor stage table (:mod:`solver.planner.bounds.floor_table`): every option the parallelizer
prices is at least its floor entry (latency and per-iteration time), so the floor table's optimum is at most the real one and a
cut against a bar never drops a plan that beats it."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from conftest import INSTANCES
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.compose.groups.group_dp import compose_groups_dp
from solver.cost.parallelizer import AnalyticParallelizer
from solver.planner.stages import search as search_module
from solver.planner.stages.candidates import TableSpec, build_stage_table
from solver.planner.bounds.floor_table import floor_cuts, floor_table
from solver.planner.replica.replica_plan import replica_job
from solver.planner.stages.search import (PlannerConfig, _restrictions, link_rates, plan_job,
                                   rule_tables, run_groups, search, views)
from solver.spec.domain import Precision
from solver.spec.errors import InfeasibleError
from solver.spec.loaders import load_job

JOBS = ["seed-llama3-70b", "odd-3h100-5a100-llama2-13b", "mixtral-a100-h100",
        "v100-a100-llama2-13b", "small-7b-512"]


def _runs(name: str, n: int):
    job = load_job(INSTANCES / "jobs" / f"{name}.toml")
    return views(job, PlannerConfig(), n, AnalyticParallelizer(job.planner.features))


def _spec(run) -> TableSpec:
    groups = run_groups(run)
    caps, windows = rule_tables(run, groups)
    return TableSpec(windows, caps, groups)


def _floor_value(run, spec) -> float:
    table = floor_table(run, spec, link_rates(run), iterations=True)
    restr = _restrictions(run, frozenset(), None)
    got = compose_groups_dp(table, restr, run.job.planner.overlap)
    assert got.feasible
    return got.objective


def _check_premise(runs) -> int:
    """Every option of every entry of the runs' real stage tables is at least its floor entry;
    the number of entries checked."""
    checked = 0
    for run in runs:
        spec = _spec(run)
        names = tuple(i.name for i in run.islands.islands)
        real = build_stage_table(run.cache, spec, link_rates(run), names, run.features)
        if real is None:  # nothing fits (a small micro-batch of a large MoE): nothing to check
            continue
        floor = floor_table(run, spec, link_rates(run), iterations=True)
        index = {s.name: k for k, s in enumerate(floor.islands)}
        for (k, g, pos), opts in real.table.options.items():
            fk = index[real.table.islands[k].name]  # every priced island is in the floor table
            low = floor.options[(fk, g, pos)].latency[:, 0]
            low_it = floor.options[(fk, g, pos)].iteration[:, 0]
            for d in range(1, real.table.layers + 1):
                live = np.isfinite(opts.latency[d])
                finite = opts.latency[d][live]
                if finite.size:
                    assert np.isfinite(low[d]), (run.view, k, g, pos, d)
                    assert finite.min() >= low[d] * (1 - 1e-12), (run.view, k, g, pos, d)
                    # Every option's per-iteration time too (the floor's may come from
                    # another option of the entry: each is bounded on its own).
                    assert opts.iteration[d][live].min() >= low_it[d], (run.view, k, g, pos, d)
                    checked += 1
    return checked


@pytest.mark.parametrize("n", [1, 4, 16])
@pytest.mark.parametrize("name", JOBS)
def test_every_priced_option_is_at_least_its_floor_entry(name, n):
    assert _check_premise(_runs(name, n)) > 0


@settings(max_examples=25, deadline=None)
@given(name=st.sampled_from(["long-context-llama3-8b", "mixtral-a100-h100", "small-7b-512",
                             "v100-a100-llama2-13b"]),
       fp8=st.booleans(), n=st.sampled_from([1, 2, 8]), per_micro=st.sampled_from([1, 2, 4]))
def test_the_premise_holds_at_fp8_long_context_and_any_micro_batch(name, fp8, n, per_micro):
    job = load_job(INSTANCES / "jobs" / f"{name}.toml")
    training = replace(job.training, global_batch=n * per_micro, n_micro=n,
                       precision=Precision.FP8 if fp8 else job.training.precision)
    job = replace(job, training=training)
    _check_premise(views(job, PlannerConfig(), n, AnalyticParallelizer(job.planner.features)))


@pytest.mark.parametrize("name", JOBS)
def test_the_floor_optimum_is_at_most_the_plan_and_the_cut_is_tight_at_it(name):
    for run in _runs(name, 8):
        spec = _spec(run)
        found = search(run)
        assert found is not None and found.result.feasible
        value = _floor_value(run, spec)
        assert 0 < value <= found.total * (1 + 1e-12), (run.view, value, found.total)
        restr = _restrictions(run, frozenset(), None)
        rate = link_rates(run)
        # Nothing in the floor table beats its own optimum (up to rounding); above it, no cut.
        assert floor_cuts(run, spec, restr, rate, value * (1 - 1e-9))
        assert not floor_cuts(run, spec, restr, rate, value * (1 + 1e-6))
        assert not floor_cuts(run, spec, restr, rate, found.total * (1 + 1e-9))
        assert not floor_cuts(run, spec, restr, rate, math.inf)  # no bar: nothing to prove


@settings(max_examples=12, deadline=None)
@given(name=st.sampled_from(JOBS[:4]), n=st.sampled_from([1, 2, 3, 8, 32]),
       ratio=st.floats(0.5, 1.5))
def test_a_search_against_a_bar_finds_the_plan_exactly_when_it_beats_the_bar(name, n, ratio):
    # With the cut: against a bar above the optimum the search still finds
    # the optimum, below it nothing.
    for run in _runs(name, n):
        best = search(run)
        assert best is not None and best.result.feasible
        bar = best.total * ratio
        got = search(run, bar, floor_cut=True)
        if best.total < bar:
            assert got is not None and got.result.feasible
            assert got.total == pytest.approx(best.total, rel=1e-12)
        else:
            assert got is None or not got.result.feasible


def _plan_or_none(job, upper):
    try:
        return plan_job(job, upper=upper)
    except InfeasibleError:
        return None


@pytest.mark.parametrize("islands,share,factor", [
    (("i2-A100-SXM-80GB",), 256, 1.02), (("i0-H200-SXM-141GB", "i1-H100-SXM-80GB"), 768, 1.0),
    (("i1-H100-SXM-80GB",), 384, 0.98)])
def test_replica_asks_plan_the_same_with_and_without_the_cut(monkeypatch, islands, share,
                                                             factor):
    job = load_job(INSTANCES / "jobs" / "small-7b-512.toml")
    ask = replica_job(job, islands, share)
    alone = plan_job(ask).iteration_time_s
    upper = alone * factor
    with_cut = _plan_or_none(ask, upper)
    monkeypatch.setattr(search_module, "floor_cuts", lambda *args: False)
    monkeypatch.setattr(search_module, "relaxed_cuts", lambda *args: False)
    without = _plan_or_none(ask, upper)
    assert (with_cut is None) == (without is None) == (factor <= 1.0)
    if with_cut is not None:
        assert with_cut.iteration_time_s == without.iteration_time_s
        assert with_cut.stages == without.stages


def _floor_latencies(run) -> dict:
    table = floor_table(run, _spec(run), link_rates(run))
    return {(table.islands[k].name, g, pos): o.latency for (k, g, pos), o in table.options.items()}


def test_floors_remembered_per_micro_batch_are_the_floors_computed():
    """Two replica jobs of one micro-batch (64 sequences at n = 4 and 128 at n = 8): the floor
    tables built through the replica search's memo (the second from the first's floors) equal
    those built without it."""
    from solver.planner.stages.memo import MemoParallelizer
    job = load_job(INSTANCES / "jobs" / "small-7b-512.toml")
    islands = ("i0-H200-SXM-141GB", "i1-H100-SXM-80GB")
    memo = MemoParallelizer(AnalyticParallelizer(job.planner.features))
    for share, n in ((256, 4), (1024, 16)):
        ask = replica_job(job, islands, share)
        direct = views(ask, PlannerConfig(), n, AnalyticParallelizer(job.planner.features))[0]
        through = views(ask, PlannerConfig(), n, memo)[0]
        want, got = _floor_latencies(direct), _floor_latencies(through)
        assert want.keys() == got.keys()
        assert all(np.array_equal(want[k], got[k]) for k in want)
    assert memo.hits > 0  # the second job's floors came from the first's


def test_the_cost_model_raises_the_floor_above_the_kernels_alone(monkeypatch):
    """With the parallelizer priced by the cost model, each entry's floor is the least
    latency of its layouts (communication, kernel fixed costs, narrow GEMMs): above the
    kernel floor, and the floor table's optimum rises with it."""
    (run, _) = _runs("seed-llama3-70b", 8)
    with_model = _floor_latencies(run)
    value = _floor_value(run, _spec(run))
    # The per-iteration floors (gradient sync no window hides, the optimizer step) add to it.
    latencies_only = compose_groups_dp(floor_table(run, _spec(run), link_rates(run)),
                                       _restrictions(run, frozenset(), None),
                                       run.job.planner.overlap).objective
    assert value > latencies_only
    monkeypatch.setattr("solver.planner.bounds.floor_table.stage_calibration", lambda par: None)
    kernels = _floor_latencies(run)
    finite = [np.isfinite(kernels[k]) for k in kernels]
    assert all(np.all(with_model[k][f] >= kernels[k][f]) for k, f in zip(kernels, finite))
    assert any(np.any(with_model[k][f] > kernels[k][f] * 1.01) for k, f in zip(kernels, finite))
    assert _floor_value(run, _spec(run)) < value


@settings(max_examples=5, deadline=None)
@given(name=st.sampled_from(["small-7b-512", "three-gen-512-llama3-70b", "odd-3h100-5a100-llama2-13b"]),
       data=st.data())
def test_random_asks_plan_the_same_with_and_without_the_cut(name, data):
    """Seeded random replica asks (island set, share, n_micro fixed or searched, a budget
    around the ask's optimum): the floor table's cut, its per-iteration floors and the memo's
    remembered floors change nothing but the work."""
    from solver.planner.stages.memo import MemoParallelizer
    job = load_job(INSTANCES / "jobs" / f"{name}.toml")
    names = [i.name for i in job_islands_of(job)]
    chosen = tuple(data.draw(st.lists(st.sampled_from(names), min_size=1, max_size=len(names),
                                      unique=True)))
    share = data.draw(st.sampled_from([job.training.global_batch // 4,
                                       job.training.global_batch // 2]))
    ask = replica_job(job, chosen, share)
    if data.draw(st.booleans()):
        ask = replace(ask, training=replace(ask.training, n_micro=None))
    alone = _plan_or_none(ask, math.inf)
    if alone is None:
        return  # the islands cannot hold the model: nothing to compare
    upper = alone.iteration_time_s * data.draw(st.sampled_from([0.97, 1.0, 1.001, 1.05]))
    memo = MemoParallelizer(AnalyticParallelizer(job.planner.features))
    with_cut = _plan_or_none_with(ask, upper, memo)
    again = _plan_or_none_with(ask, upper, memo)  # the floors now come from the memo
    originals = search_module.floor_cuts, search_module.relaxed_cuts
    search_module.floor_cuts = search_module.relaxed_cuts = lambda *args: False
    try:
        without = _plan_or_none(ask, upper)
    finally:
        search_module.floor_cuts, search_module.relaxed_cuts = originals
    for got in (with_cut, again):
        assert (got is None) == (without is None)
        if got is not None:
            assert got.iteration_time_s == without.iteration_time_s
            assert got.stages == without.stages


def job_islands_of(job):
    from solver.planner.stages.search import job_islands
    return job_islands(job).islands


def _plan_or_none_with(job, upper, parallelizer):
    try:
        return plan_job(job, upper=upper, parallelizer=parallelizer)
    except InfeasibleError:
        return None


def _floor_optima(name: str):
    """``(run, spec, the floor table's optimum)`` of every view of ``name`` at n = 2 and 8
    whose floor table has a plan."""
    for run in [r for n in (2, 8) for r in _runs(name, n)]:
        spec = _spec(run)
        table = floor_table(run, spec, link_rates(run), iterations=True)
        got = compose_groups_dp(table, _restrictions(run, frozenset(), None),
                                run.job.planner.overlap)
        if got.feasible:
            yield run, spec, got.objective


@pytest.mark.parametrize("name", JOBS)
def test_the_relaxed_cut_never_cuts_where_the_floor_table_has_a_plan(name):
    """The relaxed floor (every length, no head or embedding terms, no links; per-iteration
    floors only as the cut to shorter stages) cuts only below the floor table's optimum, and
    it does cut there: at 0.9 times it on some view."""
    from solver.planner.bounds.floor_table import relaxed_cuts
    cut_below = False
    for run, spec, best in _floor_optima(name):
        for ratio in (1 + 1e-9, 1.01, 1.5):
            assert not relaxed_cuts(run, best * ratio, spec), (run.view, ratio)
        cut_below = cut_below or relaxed_cuts(run, best * 0.9, spec)
    assert cut_below


@pytest.mark.parametrize("name", ["extreme-a10-h100-llama2-13b", "v100-a100-llama2-13b"])
def test_the_per_iteration_floors_cut_where_the_latency_bounds_do_not(name):
    """Just below the floor table's optimum (0.97 or 0.98 times it), some view the latency
    bounds alone cannot settle is settled once the per-iteration floors count (the cut is
    below that optimum, where no plan of the floor table is, so it is a right cut)."""
    from solver.planner.bounds.floor_table import _least_stages, relaxed_cuts
    settled = [(run.view, ratio) for run, spec, best in _floor_optima(name)
               for ratio in (0.97, 0.98)
               if _least_stages(run, spec).might_beat(run.n_micro, best * ratio)
               and relaxed_cuts(run, best * ratio, spec)]
    assert settled
