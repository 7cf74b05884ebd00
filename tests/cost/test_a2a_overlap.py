"""Megatron-Core's MoE all-to-all overlap (``--overlap-moe-expert-parallel-comm``): its price,
its memory, its rules, and the cost model against the validator's independent restatement.

Sources: ``TransformerLayerSchedulePlan.run`` (``megatron/core/models/common/
model_chunk_schedule_plan.py``, core_v0.15.0) for the order of one layer pair's operations on
the two streams; ``combined_1f1b_schedule_for_no_pipelining`` (``megatron/core/
pipeline_parallel/combined_1f1b.py``) for the iteration; ``TransformerConfig.__post_init__``
for the rules.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from solver.cost.a2a_overlap import a2a_overlap_hidden, pair_period
from solver.cost.efficiency import DEFAULT_CALIBRATION
from solver.cost.runtime.frameworks import PROFILES, Runtime, a2a_overlap_problem, violations
from solver.cost.stage import ConfigArrays, ModelSlice, StageConfig
from solver.cost.stage_costs import PipelineSetting, _time_inputs, stage_costs
from solver.cost.timing import layer_times, tokens_per_gpu
from solver.planner.check.time_check import stage_seconds
from solver.spec.domain import Framework, Island, ModelSpec, Recompute, Schedule
from solver.spec.loaders import load_catalog

CAT = load_catalog()
#: Mixtral 8x7B's layer shape, four layers.
MOE = ModelSpec("moe", layers=4, hidden=4096, ffn=14336, heads=32, kv_heads=8, vocab=32000,
                experts=8, top_k=2, expert_ffn=14336)
MCORE = PROFILES[Framework.MEGATRON_CORE]


def _list_schedule(pairs: int, a: float, b: float, m: float, e: float) -> float:
    """Two streams, operations in ``TransformerLayerSchedulePlan.run``'s order, each starting
    when its stream is free and its inputs are done (list scheduling, written out): the
    makespan of ``pairs`` layer pairs."""
    comp = comm = 0.0
    attn_b = combine_f = 0.0  # the previous pair's backward attention and forward combine
    for _ in range(pairs):
        cb = max(comm, attn_b) + e                # combine_bwd (comm)
        af = max(comp, combine_f) + a             # attn_fwd + post_attn (comp)
        df = max(cb, af) + e                      # dispatch_fwd (comm) needs attn_fwd
        mb = max(af, cb) + 2 * m                  # mlp_bwd, data and weight gradients (comp)
        db = max(df, mb) + e                      # dispatch_bwd (comm) needs mlp_bwd
        mf = max(mb, df) + m                      # mlp_fwd (comp) needs dispatch_fwd
        combine_f = max(db, mf) + e               # combine_fwd (comm) needs mlp_fwd
        attn_b = max(mf, db) + b                  # post_attn_bwd + attn_bwd needs dispatch_bwd
        comm, comp = combine_f, attn_b
    return max(comm, comp)


def test_pair_period_by_hand():
    """a = 2, b = 4, m = 1: with e = 0.5 every all-to-all hides (P = 2 + 2 + 1 + 4 = 9 against
    2 + 4 + 3 + 2 = 11); with e = 3 the all-to-alls lead (3 + 3 + 3 + 4 = 13 against 21)."""
    assert pair_period(2.0, 4.0, 1.0, 0.5) == 9.0
    assert pair_period(2.0, 4.0, 1.0, 3.0) == 13.0


def test_pair_period_is_the_list_schedule():
    rng = random.Random(7)
    for _ in range(200):
        a, b, m, e = (rng.uniform(0.0, 3.0) for _ in range(4))
        layers = rng.randint(1, 6)
        assert _list_schedule(layers, a, b, m, e) == pytest.approx(
            layers * pair_period(a, b, m, e), rel=1e-12)
        assert 0.0 <= a + b + 3 * m + 4 * e - pair_period(a, b, m, e) <= 4 * e + 1e-12


@pytest.mark.parametrize("framework, moe, ep, rc, piped, v, ok", [
    (Framework.MEGATRON_CORE, True, 8, Recompute.NONE, False, 1, True),
    (Framework.FLAGSCALE, True, 8, Recompute.SELECTIVE, False, 1, True),
    (Framework.MEGATRON_CORE, True, 8, Recompute.NONE, True, 2, True),   # interleaved
    (Framework.MEGATRON_CORE, True, 1, Recompute.NONE, False, 1, False),  # ep > 1
    (Framework.MEGATRON_CORE, False, 8, Recompute.NONE, False, 1, False),  # a dense model
    (Framework.MEGATRON_CORE, True, 8, Recompute.FULL, False, 1, False),  # no full recompute
    (Framework.MEGATRON_CORE, True, 8, Recompute.NONE, True, 1, False),  # pipelined: needs v
    (Framework.DEEPSPEED, True, 8, Recompute.NONE, False, 1, False),     # not Megatron
])
def test_rules(framework, moe, ep, rc, piped, v, ok):
    problem = a2a_overlap_problem(PROFILES[framework], moe, ep, rc, piped, virtual_stages=v)
    assert (problem is None) == ok


def test_violations_names_the_overlap():
    cfg = StageConfig(tp=1, dp=8, ep=8, recompute=Recompute.FULL, a2a_overlap=True)
    assert violations([cfg], MCORE, False, model=MOE) == [
        "stage 0: the MoE all-to-all overlap runs without full recomputation"]
    assert violations([dataclasses.replace(cfg, recompute=Recompute.NONE)], MCORE, False,
                      model=MOE) == []


def _pair(gpu: str = "H100-SXM-80GB", gpus: int = 16, **kw):
    island = Island.homogeneous("g", CAT[gpu], gpus, 8)
    off = StageConfig(tp=1, dp=gpus, ep=8, micro_batch=2, zero=1, **kw)
    return island, ConfigArrays.of([off, dataclasses.replace(off, a2a_overlap=True)])


def test_stage_costs_move_the_hidden_time_to_the_iteration():
    """With the overlap a micro-batch is ``layers x H`` shorter and the iteration ``layers x
    H`` longer (the first forward and the last backward run alone), so ``n`` micro-batches take
    ``n (f + b) - (n - 1) layers H``; nothing else changes."""
    island, cfg = _pair()
    ti = _time_inputs(MOE, island, 4096, DEFAULT_CALIBRATION, Runtime())
    lf, lb = layer_times(ti, cfg)
    hidden = a2a_overlap_hidden(ti, cfg, tokens_per_gpu(cfg, 4096), lf, lb)
    # On NVLink (EP 8 inside a node) each all-to-all is shorter than what it runs beside: all
    # four hide.
    assert hidden[0] == 0.0 and hidden[1] == pytest.approx(lf.ep[1] + lb.ep[1], rel=1e-12)
    costs = stage_costs(ModelSlice.whole(MOE), island, 4096, cfg, PipelineSetting(8, 1))
    per_stage = MOE.layers * hidden[1]
    assert costs.latency_s[1] == pytest.approx(costs.latency_s[0] - per_stage, rel=1e-12)
    assert costs.iteration_s[1] == pytest.approx(costs.iteration_s[0] + per_stage, rel=1e-12)
    assert costs.fwd.compute[1] == costs.fwd.compute[0]


def test_one_layer_more_of_activations():
    """A forward layer stores before its backward twin frees: one layer's activations more,
    ``1 / layers`` of a micro-batch's (the stage's other memory unchanged)."""
    island, cfg = _pair()
    costs = stage_costs(ModelSlice.whole(MOE), island, 4096, cfg, PipelineSetting(8, 1))
    two = stage_costs(ModelSlice.whole(MOE), island, 4096, cfg, PipelineSetting(8, 2))
    per_micro = two.memory.activations[0] - costs.memory.activations[0]
    assert costs.memory.activations[1] == pytest.approx(
        costs.memory.activations[0] + per_micro / MOE.layers, rel=1e-9)
    assert costs.memory.params[1] == costs.memory.params[0]


def test_nothing_hidden_when_every_transfer_is_exposed():
    island, cfg = _pair()
    costs = stage_costs(ModelSlice.whole(MOE), island, 4096, cfg, PipelineSetting(8, 1),
                        runtime=Runtime(overlap=False))
    assert costs.latency_s[1] == costs.latency_s[0]


@pytest.mark.parametrize("gpu, gpus, tp, ep, recompute", [
    ("H100-SXM-80GB", 16, 1, 8, Recompute.NONE), ("H100-SXM-80GB", 8, 1, 4, Recompute.SELECTIVE),
    ("GB200", 8, 1, 8, Recompute.NONE), ("A100-SXM-80GB", 32, 1, 8, Recompute.NONE),
    ("H100-SXM-80GB", 16, 2, 8, Recompute.NONE)])  # expert-TP 2 x EP 8: across two nodes
def test_validator_restates_the_price(gpu, gpus, tp, ep, recompute):
    """The validator's scalar restatement (:mod:`solver.planner.check.time_check`) agrees with
    the cost model on overlapped stages, latency and per-iteration seconds."""
    island = Island.homogeneous("g", CAT[gpu], gpus, 8 if gpu != "GB200" else 4)
    c = StageConfig(tp=tp, dp=gpus // tp, ep=ep, micro_batch=1, zero=1, recompute=recompute,
                    a2a_overlap=True)
    costs = stage_costs(ModelSlice.whole(MOE), island, 4096, ConfigArrays.of([c]),
                        PipelineSetting(8, 1), runtime=Runtime(Framework.MEGATRON_CORE))
    subs, per_iter = stage_seconds(MOE, 4096, island, c, MOE.layers, True, True, profile=MCORE)
    assert subs[0] == pytest.approx(float(costs.latency_s[0]), rel=1e-9)
    assert per_iter == pytest.approx(float(costs.iteration_s[0]), rel=1e-9)


def test_all_to_all_across_nodes_hides_in_part():
    """64 fine experts (top 8 of width 512) at EP 32 over four H100 nodes: each all-to-all
    crosses the network and outlasts the experts' compute beside it, so only part hides."""
    fine = dataclasses.replace(MOE, experts=64, top_k=8, expert_ffn=512)
    island = Island.homogeneous("g", CAT["H100-SXM-80GB"], 32, 8)
    cfg = ConfigArrays.of([StageConfig(tp=1, dp=32, ep=32, micro_batch=1, a2a_overlap=True)])
    ti = _time_inputs(fine, island, 4096, DEFAULT_CALIBRATION, Runtime())
    lf, lb = layer_times(ti, cfg)
    hidden = float(a2a_overlap_hidden(ti, cfg, tokens_per_gpu(cfg, 4096), lf, lb)[0])
    assert 0.1 * float(lf.ep[0] + lb.ep[0]) < hidden < 0.9 * float(lf.ep[0] + lb.ep[0])
    c = cfg.config(0)
    costs = stage_costs(ModelSlice.whole(fine), island, 4096, cfg, PipelineSetting(8, 1))
    subs, per_iter = stage_seconds(fine, 4096, island, c, fine.layers, True, True,
                                   profile=Runtime().profile)
    assert subs[0] == pytest.approx(float(costs.latency_s[0]), rel=1e-9)
    assert per_iter == pytest.approx(float(costs.iteration_s[0]), rel=1e-9)


def test_not_with_megatron_fsdp():
    """Megatron-Core does not refuse the overlap with Megatron-FSDP, but the combined schedule
    holds two layers' gathered weights, which the ZeRO-3 memory term does not count: the
    planner leaves the pair out and says why."""
    cfg = StageConfig(tp=1, dp=8, ep=8, zero=3, a2a_overlap=True)
    assert violations([cfg], MCORE, False, model=MOE) == [
        "stage 0: the MoE all-to-all overlap is priced without Megatron-FSDP only (two "
        "layers' gathered weights at once are not counted)"]


def test_interleaved_stage_prices_pp_times_a_ranks_share():
    """PP 2 x 2 chunks, 8 layers: each rank's latency drops by its 4 layers' hidden time
    ``4 H`` and the iteration pays ``pp`` times it (the closed form the simulator checks,
    ``tests/schedule/test_a2a_overlap_sim.py``); the validator says the same."""
    model = dataclasses.replace(MOE, layers=8)
    island = Island.homogeneous("g", CAT["H100-SXM-80GB"], 16, 8)
    off = StageConfig(tp=1, pp=2, dp=8, ep=8, micro_batch=1, zero=1)
    cfg = ConfigArrays.of([off, dataclasses.replace(off, a2a_overlap=True)])
    pipe = PipelineSetting(8, 1, Schedule.INTERLEAVED, 2)
    costs = stage_costs(ModelSlice.whole(model), island, 4096, cfg, pipe)
    ti = _time_inputs(model, island, 4096, DEFAULT_CALIBRATION, Runtime())
    lf, lb = layer_times(ti, cfg)
    rank = 4 * float(a2a_overlap_hidden(ti, cfg, tokens_per_gpu(cfg, 4096), lf, lb)[1])
    assert rank > 0.0
    assert costs.latency_s[1] == pytest.approx(costs.latency_s[0] - rank, rel=1e-9)
    assert costs.iteration_s[1] == pytest.approx(costs.iteration_s[0] + 2 * rank, rel=1e-9)
    subs, per_iter = stage_seconds(model, 4096, island, cfg.config(1), 8, True, True,
                                   profile=MCORE, p2p_factor=2.0)
    assert max(subs) == pytest.approx(float(costs.latency_s[1]), rel=1e-9)
    assert per_iter == pytest.approx(float(costs.iteration_s[1]), rel=1e-9)
