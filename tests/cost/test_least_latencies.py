"""The least latencies the floor stage table starts from
(:func:`solver.cost.least_costs.least_latencies`): for one configuration without
recomputation they are the stage's own latency, and no configuration's stage is faster."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import INSTANCES

from solver.cost.parallelizer import AnalyticParallelizer, PlanContext
from solver.cost.configs import FeatureSet, enumerate_configs
from solver.cost.runtime.frameworks import Runtime
from solver.cost.stage import ModelSlice
from solver.cost.least_costs import least_latencies
from solver.cost.stage_costs import PipelineSetting, stage_costs
from solver.islands import group_island
from solver.planner.stages.runs import cluster_islands
from solver.spec.loaders import load_job


@pytest.mark.parametrize("name", ["seed-llama3-70b", "mixtral-a100-h100", "small-7b-512"])
def test_least_latencies_are_one_layer_stages_and_bound_every_stage(name):
    job = load_job(INSTANCES / "jobs" / f"{name}.toml")
    par = AnalyticParallelizer(job.planner.features)
    island = cluster_islands(job).islands[0]
    group = group_island(island, min(2, len(island.nodes)))
    runtime = Runtime(job.planner.framework, job.training.precision)
    ctx = PlanContext(job.training.seq_len, 8, 8, framework=job.planner.framework,
                      precision=job.training.precision)
    feats = FeatureSet.of(par.features)
    cfg = enumerate_configs(ModelSlice(job.model, 4), group, ctx, feats)
    cfg = cfg.take(np.flatnonzero(np.asarray(cfg.pp) == 1))
    assert len(cfg) > 1
    layer, head, emb = least_latencies(job.model, group, ctx.seq_len, cfg, par.calibration,
                                       runtime)
    pipe = PipelineSetting(8)
    # One configuration without recomputation, offload or per-micro-batch ZeRO traffic
    # (ZeRO-0 or 1): a one-layer middle stage's latency is the layer's least latency.
    one = np.flatnonzero((np.asarray(cfg.recompute) == 0) & (np.asarray(cfg.zero) <= 1)
                         & ~np.asarray(cfg.offload))[:1]
    assert one.size == 1
    single = cfg.take(one)
    alone = least_latencies(job.model, group, ctx.seq_len, single, par.calibration, runtime)[0]
    stage = stage_costs(ModelSlice(job.model, 1), group, ctx.seq_len, single, pipe,
                        par.calibration, runtime).latency_s[0]
    assert alone == pytest.approx(float(stage), rel=1e-12)
    # Every configuration's stage of d layers, with embedding and head, takes at least d
    # times the least layer latency plus the least head and embedding latencies.
    for d, first, last in ((1, False, False), (4, True, False), (3, False, True)):
        lat = stage_costs(ModelSlice(job.model, d, first, last), group, ctx.seq_len, cfg, pipe,
                          par.calibration, runtime).latency_s
        floor = d * layer + head * last + emb * first
        assert np.all(lat >= floor * (1 - 1e-12)), (d, float(lat.min()), floor)


@pytest.mark.parametrize("name", ["seed-llama3-70b", "mixtral-a100-h100", "small-7b-512"])
def test_least_iterations_bound_every_stage_and_are_exact_under_full_recomputation(name):
    """Per length and position, no configuration's per-iteration time is below the least (the
    positions priced one at a time or all in one call, the same values); a configuration with
    full recomputation (the widest backward window, the one the floor
    assumes) has exactly its own."""
    from solver.cost.least_costs import least_iterations
    job = load_job(INSTANCES / "jobs" / f"{name}.toml")
    par = AnalyticParallelizer(job.planner.features)
    island = cluster_islands(job).islands[-1]
    group = group_island(island, len(island.nodes))
    runtime = Runtime(job.planner.framework, job.training.precision)
    ctx = PlanContext(job.training.seq_len, 16, 8, framework=job.planner.framework,
                      precision=job.training.precision)
    cfg = enumerate_configs(ModelSlice(job.model, 4), group, ctx, FeatureSet.of(par.features))
    cfg = cfg.take(np.flatnonzero(np.asarray(cfg.pp) == 1))
    lengths = np.array([1, 3, 7])
    pipe = PipelineSetting(8)
    ends = ((False, False), (True, False), (False, True), (True, True))
    # Every position in one call (flags per length): each value as when priced alone.
    together = least_iterations(job.model, group, ctx.seq_len, cfg, np.tile(lengths, 4),
                                np.repeat([f for f, _ in ends], 3),
                                np.repeat([h for _, h in ends], 3), par.calibration, runtime)
    for first, last in ends:
        least = least_iterations(job.model, group, ctx.seq_len, cfg, lengths, first, last,
                                 par.calibration, runtime)
        assert together[3 * ends.index((first, last)):][:3].tolist() == least.tolist()
        for d, low in zip(lengths, least):
            it = stage_costs(ModelSlice(job.model, int(d), first, last), group, ctx.seq_len,
                             cfg, pipe, par.calibration, runtime).iteration_s
            assert np.all(it >= low * (1 - 1e-12)), (d, first, last, float(it.min()), low)
    if name == "small-7b-512":
        return  # its features leave full recomputation out: nothing to compare below
    full = np.flatnonzero(np.asarray(cfg.recompute) == 2)[:1]
    assert full.size == 1
    one = cfg.take(full)
    own = stage_costs(ModelSlice(job.model, 3), group, ctx.seq_len, one, pipe, par.calibration,
                      runtime).iteration_s[0]
    got = least_iterations(job.model, group, ctx.seq_len, one, np.array([3]), False, False,
                           par.calibration, runtime)[0]
    assert got == pytest.approx(float(own), rel=1e-12)
