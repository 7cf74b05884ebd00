"""Stage options at one ``n_micro`` from the candidates of a larger count
(:func:`solver.cost.stage_options.stage_candidates`, :meth:`StageOptions.capped`): the same
options, configurations and order as evaluating the stage at that ``n_micro`` directly, which
is what lets the replica search's memo price a group once for every ``n_micro``."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from conftest import INSTANCES
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.cost.parallelizer import AnalyticParallelizer, PlanContext
from solver.cost.stage_options import (candidate_mask, pareto_capacity_mask, shares_across_n,
                                       stage_candidates)
from solver.islands import group_island
from solver.planner.stages.runs import cluster_islands
from solver.spec.domain import Schedule
from solver.spec.loaders import load_job

JOBS = ["seed-llama3-70b", "mixtral-a100-h100", "small-7b-512", "v100-a100-llama2-13b",
        "long-context-llama3-8b"]


def _same(a, b) -> None:
    assert len(a) == len(b)
    assert np.array_equal(a.latency, b.latency) and np.array_equal(a.iteration, b.iteration)
    assert np.array_equal(a.capacity, b.capacity)
    assert [p.config for p in a] == [p.config for p in b]
    assert [p.max_in_flight for p in a] == [p.max_in_flight for p in b]


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(JOBS), data=st.data())
def test_capped_candidates_are_the_options_at_that_count(name, data):
    job = load_job(INSTANCES / "jobs" / f"{name}.toml")
    par = AnalyticParallelizer(job.planner.features)
    island = data.draw(st.sampled_from(cluster_islands(job).islands))
    nodes = data.draw(st.integers(1, len(island.nodes)))
    micro = data.draw(st.sampled_from([1, 2, 4, 8, 16]))
    top = data.draw(st.sampled_from([16, 128]))
    n = data.draw(st.integers(1, top))
    position = data.draw(st.sampled_from([(False, False), (True, False), (False, True)]))
    lengths = sorted(set(data.draw(st.lists(st.integers(1, job.model.layers - 1),
                                            min_size=1, max_size=5))))
    ctx = PlanContext(job.training.seq_len, micro, n, framework=job.planner.framework,
                      precision=job.training.precision)
    group = group_island(island, nodes)
    direct = par.plan_stages(job.model, lengths, *position, group, ctx)
    shared = stage_candidates(par, job.model, lengths, *position, group, replace(ctx, n_micro=top))
    for a, b in zip(direct, shared):
        _same(a, b.capped(n))


def test_an_earlier_configuration_of_equal_cost_survives_the_cap():
    """Two configurations of equal latency and per-iteration time, the later holding more
    micro-batches: the candidates keep both (at a cap of 2 or more the later one wins, at 1
    they tie and the earlier one is the Pareto set's); a third, slower and smaller, goes."""
    group = np.zeros(3, dtype=np.int64)
    lat, it = np.array([1.0, 1.0, 2.0]), np.array([0.5, 0.5, 0.5])
    cap = np.array([1, 4, 1])
    assert candidate_mask(group, lat, it, cap).tolist() == [True, True, False]
    assert pareto_capacity_mask(group, lat, it, cap).tolist() == [False, True, False]
    capped = np.minimum(cap, 1)
    assert pareto_capacity_mask(group, lat, it, capped).tolist() == [True, False, False]


@pytest.mark.parametrize("schedule,v,shares", [
    (Schedule.ONE_F_ONE_B, 1, True), (Schedule.GPIPE, 1, False),
    (Schedule.INTERLEAVED, 2, False), (Schedule.INTERLEAVED, 1, True)])
def test_only_schedules_whose_stage_options_ignore_n_share_them(schedule, v, shares):
    ctx = PlanContext(4096, 8, 16, schedule=schedule, virtual_stages=v)
    assert shares_across_n(ctx) is shares
