"""Partial recomputation (the block method: ``k`` of a stage's ``L`` layers recomputed):
memory and time checked by hand, the least-``k`` rule and its dominance argument by brute force
over every ``k``, the validator's own counts against the cost model, and the runtimes' rules."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import INSTANCES, REFERENCE_MODELS

from solver.cost.efficiency import DEFAULT_CALIBRATION
from solver.cost.runtime.frameworks import PROFILES, Runtime, profile, violations
from solver.cost.memory import activation_bytes, substage_memory
from solver.cost.parallelizer import AnalyticParallelizer, PlanContext
from solver.cost.recompute_layers import least_recompute_layers, with_partial_recompute
from solver.cost.stage import ConfigArrays, ModelSlice, StageConfig
from solver.cost.stage_costs import PipelineSetting, island_substage_memory, stage_costs
from solver.islands import group_island
from solver.planner.check.memory_check import substage_bytes
from solver.planner.stages.runs import cluster_islands
from solver.planner.check.time_check import stage_seconds
from solver.spec.constraints import Constraints
from solver.spec.domain import Framework, Island, ModelSpec, Recompute
from solver.spec.loaders import load_catalog, load_job

FULL = Recompute.FULL
#: GPT-style shape for hand counts: h = 1024, 16 heads of 64 (MHA), f = 4h, no gate.
HAND = ModelSpec("hand", layers=8, hidden=1024, ffn=4096, heads=16, kv_heads=16, vocab=32000,
                 gated_mlp=False)
FLAGSCALE = Runtime(Framework.FLAGSCALE)


def _island(name: str = "H100-SXM-80GB", gpus: int = 8) -> Island:
    return Island.homogeneous("x", load_catalog()[name], gpus)


def test_the_field_is_checked_and_survives_the_arrays():
    with pytest.raises(ValueError):
        StageConfig(recompute=Recompute.NONE, recompute_layers=3)
    with pytest.raises(ValueError):
        StageConfig(recompute=FULL, recompute_layers=0)
    configs = [StageConfig(recompute=FULL), StageConfig(recompute=FULL, recompute_layers=3),
               StageConfig()]
    assert ConfigArrays.of(configs).configs([0, 1, 2]) == configs
    assert [c.recomputed_layers(8) for c in configs] == [8, 3, 0]
    assert StageConfig(recompute=FULL, recompute_layers=12).recomputed_layers(8) == 8


def test_activation_memory_of_three_of_eight_layers_by_hand():
    """Per token (FlashAttention, no dropout): a layer keeps 4h + 4q + 4kv + 4a (attention)
    + 4h + 4f (MLP) = 4096 + 4096 + 4096 + 64 + 4096 + 16384 = 32,832 bytes, and only its
    input, 2h = 2,048 bytes, when recomputed. One micro-batch of 2,048 tokens, 2 in flight:
    (3 x 2,048 + 5 x 32,832) x 2,048 x 2 = 697,565,184, plus one layer's working set while
    it is recomputed, 32,832 x 2,048 = 67,239,936: 764,805,120 bytes."""
    cfg = ConfigArrays.of([StageConfig(recompute=FULL, recompute_layers=3, micro_batch=1)])
    acts, host = activation_bytes(HAND, 2048, cfg, np.asarray(8), np.asarray(False),
                                  np.asarray(2.0), 1.0)
    assert acts[0] == 764_805_120 and host[0] == 0
    everything = ConfigArrays.of([StageConfig(recompute=FULL)])
    assert activation_bytes(HAND, 2048, everything, np.asarray(8), np.asarray(False),
                            np.asarray(2.0), 1.0)[0][0] == 8 * 2048 * 2048 * 2 + 67_239_936
    mine = substage_bytes(HAND, 2048, cfg.config(0), 8, False, False, 2.0, flash=True,
                          framework=Framework.FLAGSCALE, fp8=False, cf=1.0)
    states = substage_memory(HAND, 2048, cfg, np.asarray(8), np.asarray(False),
                             np.asarray(False), np.asarray(2.0), 1.0).total[0] - acts[0]
    assert mine == pytest.approx(states + 764_805_120, rel=1e-12)


@pytest.mark.parametrize("k", [1, 3, 7])
def test_time_of_k_layers_is_k_recomputed_forwards(k):
    """The backward of a stage with ``k`` of 8 layers recomputed repeats ``k`` layer forwards:
    its recompute term is ``k/8`` of the stage's forward compute, and its latency lies
    ``k/8`` of the way from no recomputation to full (ZeRO-1, one sub-stage: nothing else
    depends on it)."""
    slc, island = ModelSlice(HAND, 8), _island()
    rows = [StageConfig(tp=2, dp=4, zero=1, recompute=r, recompute_layers=kk, micro_batch=2)
            for r, kk in ((Recompute.NONE, None), (FULL, k), (FULL, None))]
    costs = stage_costs(slc, island, 2048, ConfigArrays.of(rows), runtime=FLAGSCALE)
    none, part, full = costs.latency_s
    assert costs.bwd.recompute[1] == pytest.approx(k / 8 * costs.fwd.compute[1], rel=1e-12)
    assert part == pytest.approx(none + k / 8 * (full - none), rel=1e-12)


def _random_full(rng, m: ModelSpec, pp: int) -> StageConfig:
    dp = int(rng.choice([1, 2, 4]))
    return StageConfig(tp=int(rng.choice([1, 2, 4, 8])), pp=pp, dp=dp,
                       zero=int(rng.integers(2)) if dp > 1 else 0, recompute=FULL,
                       micro_batch=int(rng.integers(1, 4)))


def _total(m, island, seq, cfgs, layers, pipe, emb=False, head=False) -> np.ndarray:
    return stage_costs(ModelSlice(m, layers, emb, head), island, seq, ConfigArrays.of(cfgs),
                       pipe, runtime=FLAGSCALE).memory.total


@pytest.mark.parametrize("seed", range(3))
def test_least_k_is_the_least_that_fits_by_brute_force(seed):
    """:func:`least_recompute_layers` equals trying every ``k`` (pipelined stages too), with
    the limit drawn between the memory of full and of no recomputation."""
    rng, island = np.random.default_rng(seed), _island("A100-SXM-80GB", 16)
    for _ in range(12):
        m = REFERENCE_MODELS[int(rng.integers(len(REFERENCE_MODELS)))]
        pp = int(rng.choice([1, 1, 2, 3]))
        layers = int(rng.integers(max(pp, 2), m.layers + 1))
        c = _random_full(rng, m, pp)
        emb, head = bool(rng.integers(2)), bool(rng.integers(2))
        pipe = PipelineSetting(16, int(rng.integers(1, 9)))
        every = [dataclasses.replace(c, recompute_layers=k) for k in range(1, layers + 1)]
        mem = _total(m, island, 2048, every, layers, pipe, emb, head)
        none = _total(m, island, 2048, [dataclasses.replace(c, recompute=Recompute.NONE)],
                      layers, pipe, emb, head)[0]
        limit = float(rng.uniform(mem[-1], none))
        got = least_recompute_layers(m, island, 2048, ConfigArrays.of([c]), layers, emb, head,
                                     pipe, limit, DEFAULT_CALIBRATION, FLAGSCALE)[0]
        fitting = [k for k, x in zip(range(1, layers + 1), mem) if x <= limit]
        assert got == (fitting[0] if none > limit else 0), (m.name, c, layers, pipe, limit)


def test_rows_per_level_are_the_least_k_at_each_count_by_brute_force():
    """The stage-candidate rows (one sub-stage, memory affine in the in-flight count) carry,
    for every count ``h``, exactly the least ``k`` that fits at ``h`` (tried ``k`` by ``k``)."""
    island, m = _island("A100-SXM-80GB", 8), REFERENCE_MODELS[0]
    c = StageConfig(tp=2, zero=0, recompute=FULL, micro_batch=2)
    layers, n = 14, 12
    pipe = PipelineSetting(n, 1)
    limit = 0.9 * 80e9
    out, src = with_partial_recompute(m, island, 4096, ConfigArrays.of([c]), layers, False,
                                      False, pipe, list(range(1, n + 1)), limit,
                                      DEFAULT_CALIBRATION, FLAGSCALE)
    got = sorted(cfg.recompute_layers for cfg in out.configs(range(1, len(out))))
    want = set()
    for h in range(1, n + 1):
        at = dataclasses.replace(pipe, in_flight=h)
        mem = [_total(m, island, 4096, [dataclasses.replace(c, recompute_layers=k)], layers,
                      at)[0] for k in range(1, layers + 1)]
        none = _total(m, island, 4096, [dataclasses.replace(c, recompute=Recompute.NONE)],
                      layers, at)[0]
        fit = [k for k, x in zip(range(1, layers + 1), mem) if x <= limit]
        if fit and none > limit and fit[0] < layers:
            want.add(fit[0])
    assert len(want) >= 3  # the case exercises several counts
    assert got == sorted(want) and list(src) == [0] * len(out)


@pytest.mark.parametrize("framework", [Framework.FLAGSCALE, Framework.MEGATRON_CORE])
def test_more_recomputed_layers_never_make_a_faster_iteration(framework):
    """The dominance argument, term by term over every ``k``: memory falls, latency grows, and
    the per-iteration terms fall by no more than the latency grows (so the iteration time,
    which counts every stage's latency once in its sum, never falls)."""
    rng, island = np.random.default_rng(7), _island("H100-SXM-80GB", 16)
    for _ in range(10):
        m = REFERENCE_MODELS[int(rng.integers(len(REFERENCE_MODELS)))]
        c = _random_full(rng, m, 1)
        layers = int(rng.integers(2, m.layers + 1))
        every = [dataclasses.replace(c, recompute_layers=k) for k in range(1, layers)] + [c]
        costs = stage_costs(ModelSlice(m, layers, False, bool(rng.integers(2))), island, 4096,
                            ConfigArrays.of(every), PipelineSetting(8, int(rng.integers(1, 6))),
                            runtime=Runtime(framework))
        lat, it, mem = costs.latency_s, costs.iteration_s, costs.memory.total
        assert np.all(np.diff(mem) <= 0) and np.all(np.diff(lat) >= 0)
        assert np.all(-np.diff(it) <= np.diff(lat) * (1 + 1e-12) + 1e-15), (m.name, c)


@pytest.mark.parametrize("seed", range(3))
def test_validator_counts_equal_the_cost_model_with_k_layers(seed):
    """The validator's own memory and time (re-derived, scalar) equal the vectorized model on
    random stages with the block method, pipelined ones included."""
    rng = np.random.default_rng(seed)
    islands = [_island("A100-SXM-80GB", 16), _island("H100-SXM-80GB", 16)]
    for _ in range(25):
        m = REFERENCE_MODELS[int(rng.integers(len(REFERENCE_MODELS)))]
        pp = int(rng.choice([1, 2, 3]))
        layers = int(rng.integers(max(pp, 2), m.layers + 1))
        c = dataclasses.replace(_random_full(rng, m, pp),
                                recompute_layers=int(rng.integers(1, layers + 2)))
        island = islands[int(rng.integers(2))]
        runtime = Runtime(Framework.FLAGSCALE if rng.integers(2) else Framework.MEGATRON_CORE)
        emb, head = bool(rng.integers(2)), bool(rng.integers(2))
        held = float(rng.integers(1, 6))
        mine = substage_bytes(m, 2048, c, layers, emb, head, held, flash=True,
                              framework=runtime.framework, fp8=False, cf=1.25)
        model = island_substage_memory(m, island, 2048, ConfigArrays.of([c]), np.asarray(layers),
                                       np.asarray(emb), np.asarray(head), np.asarray(held),
                                       runtime=runtime).total[0]
        assert mine == pytest.approx(model, rel=1e-12), (m.name, c, layers)
        subs, per_iteration = stage_seconds(m, 2048, island, c, layers, emb, head,
                                            profile=runtime.profile)
        costs = stage_costs(ModelSlice(m, layers, emb, head), island, 2048,
                            ConfigArrays.of([c]), runtime=runtime)
        assert max(subs) == pytest.approx(costs.latency_s[0], rel=1e-9), (m.name, c, layers)
        assert per_iteration == pytest.approx(costs.iteration_s[0], rel=1e-9)


def test_only_the_runtimes_with_the_block_method_run_it():
    """Megatron-Core and FlagScale recompute k layers (Megatron-Core: one k for the job);
    Megatron-LM 2021, DeepSpeed and FSDP recompute all layers or none."""
    part = StageConfig(tp=8, recompute=FULL, recompute_layers=4)
    assert [f for f, p in PROFILES.items() if p.recompute_layers] == [Framework.FLAGSCALE,
                                                                        Framework.MEGATRON_CORE]
    for f in (Framework.DEEPSPEED, Framework.FSDP, Framework.MEGATRON_2021):
        assert any("not 4 of them" in v for v in violations([part], profile(f), False))
    other = dataclasses.replace(part, recompute_layers=2)
    assert violations([part, other], profile(Framework.FLAGSCALE), True) == []
    assert any("one recomputation" in v
               for v in violations([part, other], profile(Framework.MEGATRON_CORE), True))


def test_the_405b_job_gets_block_method_options_where_memory_binds():
    """deep-405b: a 20-layer stage on 8 H100 nodes at TP 8 cannot hold two micro-batches
    without recomputation; its options include the block method with a k below 20."""
    job = load_job(INSTANCES / "jobs" / "deep-405b.toml")
    island = next(i for i in cluster_islands(job).islands if "H100" in i.name)
    ctx = PlanContext(job.training.seq_len, 8, job.training.n_micro,
                      framework=job.planner.framework, precision=job.training.precision)
    options = AnalyticParallelizer(job.planner.features).plan_stages(
        job.model, [20], False, False, group_island(island, 8), ctx)[0]
    ks = {p.config.recompute_layers for p in options if p.config.recompute is FULL}
    assert any(k is not None and 1 <= k < 20 for k in ks)


def test_the_plan_cache_keeps_k():
    """A cached partial plan row carries ``recompute_layers`` (None or k) back exactly."""
    import json

    from solver.planner.stages.plancache import plan_from_row, plan_to_row
    model = REFERENCE_MODELS[0]
    plan = AnalyticParallelizer().plan(ModelSlice(model, 8), _island(),
                                       PlanContext(2048, 8, 8))[0]
    for k in (None, 5):
        p = dataclasses.replace(plan, config=dataclasses.replace(
            plan.config, recompute=FULL, recompute_layers=k))
        assert plan_from_row(json.loads(json.dumps(plan_to_row(p)))) == p


@pytest.mark.parametrize("v", [1, 2])
def test_one_megatron_mesh_recomputes_the_least_k_on_every_rank(v):
    """Megatron-Core, one mesh with internal pipelining: the block-method plans use one k for
    every rank (whole chunks' worth when interleaved), fit, are priced as the cost model
    prices that configuration, and are no slower than full recomputation of the same layout."""
    from solver.spec.domain import Schedule
    model = REFERENCE_MODELS[0]
    island = _island("A100-SXM-40GB", 16)
    schedule = Schedule.INTERLEAVED if v > 1 else Schedule.ONE_F_ONE_B
    # A 10 % margin keeps memory tight enough that some layouts need the block method; the
    # distributed optimizer only (Megatron-FSDP's ZeRO-3 fits a single stage without it).
    ctx = PlanContext(4096, 8, 8, in_flight=1, epsilon=0.1, max_pp=4,
                      framework=Framework.MEGATRON_CORE, schedule=schedule, virtual_stages=v,
                      constraints=Constraints(zero=(0, 1)))
    plans = AnalyticParallelizer().plan(ModelSlice.whole(model), island, ctx)
    part = [p for p in plans if p.config.recompute_layers is not None]
    assert part
    pipe = PipelineSetting(8, 1, schedule, v)
    for p in part:
        assert p.config.recompute_layers % v == 0 and p.memory_gb <= 0.9 * 40
        costs = stage_costs(ModelSlice.whole(model), island, 4096, ConfigArrays.of(
            [p.config, dataclasses.replace(p.config, recompute_layers=None)]), pipe,
            runtime=Runtime(Framework.MEGATRON_CORE))
        assert costs.latency_s[0] == pytest.approx(p.latency_s, rel=1e-12)
        assert costs.latency_s[0] <= costs.latency_s[1]


PLANNED = """
model = { layers = 48, hidden = 8192, ffn = 28672, heads = 64, kv_heads = 8, vocab = 32000 }
cluster = { nodes = [ { gpu = "A100-SXM-40GB", count = 1, name = "a0" },
                      { gpu = "A100-SXM-40GB", count = 1, name = "a1" },
                      { gpu = "H100-SXM-80GB", count = 1, name = "h0" } ] }
[training]
global_batch = 64
seq_len = 8192
n_micro = 16
"""


def _every_k(model, island, seq_len, cfg, layers, emb, head, pipe, levels, limit, calib,
             runtime):
    """Brute force: every ``k`` from 1 to the longest sub-stage's layers less one, for every
    configuration with full recomputation of all layers (the rows the search may extend)."""
    from solver.cost.stage import split_layers
    n = len(cfg)
    layers_row = np.broadcast_to(np.asarray(layers), (n,))
    first, second, _ = split_layers(layers_row, np.asarray(cfg.pp))
    longest = np.maximum(first, second)
    base = np.flatnonzero((np.broadcast_to(cfg.recompute, (n,)) == 2)
                          & ~np.broadcast_to(cfg.offload, (n,))
                          & (np.broadcast_to(cfg.zero, (n,)) <= 1))
    pairs = np.array([(i, k) for i in base for k in range(1, int(longest[i]))],
                     dtype=np.int64).reshape(-1, 2)
    if not len(pairs):
        return cfg, np.arange(n)
    extra = dataclasses.replace(cfg.take(pairs[:, 0]), recompute_layers=pairs[:, 1])
    return cfg.joined(extra), np.concatenate([np.arange(n), pairs[:, 0]])


def test_the_least_k_plan_is_the_best_over_every_k(tmp_path, monkeypatch):
    """A small job where memory binds (48 layers of a 70B-wide model on two A100-40GB nodes
    and one H100 node): the plan searched with the least k per in-flight count equals the
    plan searched with every k, and it recomputes part of a stage."""
    import solver.cost.parallelizer as par_module
    import solver.cost.stage_options as options_module
    from solver.planner.stages.search import plan_job
    path = tmp_path / "job.toml"
    path.write_text(PLANNED)
    job = load_job(path)
    least = plan_job(job, parallelizer=AnalyticParallelizer(job.planner.features))
    assert any(s.plan.config.recompute_layers for s in least.stages)
    monkeypatch.setattr(options_module, "with_partial_recompute", _every_k)
    monkeypatch.setattr(par_module, "with_partial_recompute", _every_k)
    every = plan_job(job, parallelizer=AnalyticParallelizer(job.planner.features))
    assert least.iteration_time_s == pytest.approx(every.iteration_time_s, rel=1e-12)
