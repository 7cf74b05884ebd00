"""ZeRO-3's per-module collectives, DeepSpeed's third gather under full recomputation, the 2021
synchronous gathers, and Megatron-Core's sort of the routed tokens by local expert.

Sources: DeepSpeed ``deepspeed/runtime/zero/partitioned_param_coordinator.py``
(``fetch_sub_module``: gathers submodule by submodule; ``stage3_max_reuse_distance`` 1e9,
``stage3_param_persistence_threshold`` 1e5), v0.3.16 ``partition_parameters.py``
(``_allgather_param``: one ``all_gather`` per parameter) and PR #1188 (October 2021, "the async
version is not async at all, because each all_gather calls torch.cuda.synchronize()");
Megatron-Core ``megatron/core/transformer/moe/token_dispatcher.py``
(``MoEAlltoAllTokenDispatcher.dispatch_postprocess`` / ``combine_preprocess``:
``sort_chunks_by_idxs`` with more than one local expert).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from solver.cost.efficiency import DEFAULT_CALIBRATION
from solver.cost.runtime.frameworks import Runtime
from solver.cost.stage import ConfigArrays, ModelSlice, StageConfig
from solver.cost.stage_costs import PipelineSetting, _time_inputs, stage_costs
from solver.cost.sync import _zero_and_sync, regathered_share, zero3_collectives
from solver.cost.timing import _expert_sort
from solver.planner.check.time_check import stage_seconds
from solver.spec.domain import Framework, Island, ModelSpec, Recompute
from solver.spec.loaders import load_catalog

CAT = load_catalog()
GPT3 = ModelSpec("gpt3-175b", layers=96, hidden=12288, ffn=49152, heads=96, kv_heads=96,
                 vocab=51200, gated_mlp=False, tied_embeddings=True)
SMALL = ModelSpec("small", layers=4, hidden=1024, ffn=4096, heads=16, kv_heads=16, vocab=32000,
                  gated_mlp=False)
MOE = ModelSpec("moe", layers=4, hidden=2048, ffn=6144, heads=32, kv_heads=4, vocab=151936,
                experts=128, top_k=8, expert_ffn=768, head_dim=128)
DEEPSPEED = Runtime(Framework.DEEPSPEED)


def test_collectives_per_layer_by_hand():
    """DeepSpeed: QKV, output, up, down (norms under the persistence threshold); with MoE QKV,
    output and the router on the dense group, two per local expert on the expert group (128
    experts over EP 8: 16 local, 32 collectives). FSDP: one per layer and group."""
    assert zero3_collectives(GPT3, True, 1)[0] == 4
    assert zero3_collectives(GPT3, False, 1)[0] == 1
    dense, expert = zero3_collectives(MOE, True, 128 / 8)
    assert (dense, float(expert)) == (3, 32.0)
    dense, expert = zero3_collectives(MOE, False, 16)
    assert (dense, float(expert)) == (1, 1.0)


def test_third_gather_share_by_hand():
    """GPT-3 175B without TP: a layer holds 12 h^2 weights and two norm vectors (2 h, the
    shape's default RMSNorm) = 1,811,988,480 + 24,576 parameters; DeepSpeed keeps a module for
    its backward only within 1e9, about twice the later parameters of the layer away, so
    1 - 1e9 / (2 x 1,812,013,056) = 0.72406... of it is gathered a third time."""
    cfg = ConfigArrays.of([StageConfig(tp=1, dp=384, zero=3, recompute=Recompute.FULL)])
    ti = _time_inputs(GPT3, Island.homogeneous("a", CAT["A100-SXM-80GB"], 384), 2048,
                      DEFAULT_CALIBRATION, DEEPSPEED)
    per_layer = 12 * 12288 ** 2 + 2 * 12288
    assert GPT3.params_per_layer == per_layer
    expected = 1 - 1e9 / (2 * per_layer)
    assert regathered_share(ti, cfg, 1.0)[0] == pytest.approx(expected, rel=1e-12)
    assert regathered_share(ti, cfg, 0.5)[0] == pytest.approx(expected / 2, rel=1e-12)
    # At TP 8 a layer shard (226M) stays within the reuse distance: no third gather.
    cfg8 = ConfigArrays.of([StageConfig(tp=8, dp=48, zero=3, recompute=Recompute.FULL)])
    assert regathered_share(ti, cfg8, 1.0)[0] == 0.0
    fsdp = _time_inputs(GPT3, Island.homogeneous("a", CAT["A100-SXM-80GB"], 384), 2048,
                        DEFAULT_CALIBRATION, Runtime(Framework.FSDP))
    assert regathered_share(fsdp, cfg, 1.0)[0] == 0.0


def test_module_latency_by_hand():
    """Two layers of a small dense model, DeepSpeed ZeRO-3 over 16 A100 (two servers of 8):
    every ring crosses servers, (16 - 1) steps of the 8 us NIC latency = 120 us each. One
    collective per group is in the bandwidth term already; the other 2 x 4 + embedding + head
    - 1 = 9 add 9 x 120 us = 1.08 ms to every gather and every reduce-scatter pass."""
    island = Island.homogeneous("a", CAT["A100-SXM-80GB"], 16)
    cfg = ConfigArrays.of([StageConfig(tp=1, dp=16, zero=3)])
    args = (cfg, np.array([2]), np.array([True]), np.array([True]), np.array([1.0]),
            np.array([1.0]))
    ds = _time_inputs(SMALL, island, 1024, DEFAULT_CALIBRATION,
                      dataclasses.replace(DEEPSPEED, overlap=False))
    fsdp = _time_inputs(SMALL, island, 1024, DEFAULT_CALIBRATION,
                        Runtime(Framework.FSDP, overlap=False))
    z_fwd_ds = _zero_and_sync(ds, *args)[0][0]
    z_fwd_fsdp = _zero_and_sync(fsdp, *args)[0][0]
    # FSDP: one per layer, 2 + embedding + head - 1 = 3 extra collectives.
    assert z_fwd_ds - z_fwd_fsdp == pytest.approx((9 - 3) * 15 * 8e-6, rel=1e-9)
    assert ds.links.data_parallel(1, 16)[1] == 8e-6


def test_2021_gathers_hide_nothing():
    """With ``zero3_prefetch`` off every ZeRO-3 collective is exposed: the scheduled time
    equals the all-exposed total; with it on, part hides behind compute."""
    island = Island.homogeneous("a", CAT["A100-SXM-80GB"], 64)
    slc = ModelSlice(GPT3, 4, False, False)
    cfg = ConfigArrays.of([StageConfig(tp=1, dp=64, zero=3, recompute=Recompute.FULL,
                                       micro_batch=4)])
    pipe = PipelineSetting(1, 1)
    calib = dataclasses.replace(DEFAULT_CALIBRATION, zero3_prefetch=False)
    sync_2021 = stage_costs(slc, island, 2048, cfg, pipe, calib, DEEPSPEED).bwd.zero[0]
    raw = stage_costs(slc, island, 2048, cfg, pipe, calib,
                      dataclasses.replace(DEEPSPEED, overlap=False)).bwd.zero[0]
    hidden = stage_costs(slc, island, 2048, cfg, pipe, DEFAULT_CALIBRATION,
                         DEEPSPEED).bwd.zero[0]
    assert sync_2021 == pytest.approx(raw, rel=1e-12) and hidden < 0.5 * raw


@pytest.mark.parametrize("framework", [Framework.DEEPSPEED, Framework.FSDP])
@pytest.mark.parametrize("prefetch", [True, False])
@pytest.mark.parametrize("listed", [False, True])
def test_validator_agrees_on_zero3(framework, prefetch, listed):
    """The independent time check prices the same per-module latency, third gather and
    (2021) exposure and list-based collectives, on a 175B-sized layer where the third gather
    is non-zero."""
    island = Island.homogeneous("a", CAT["A100-SXM-80GB"], 128)
    calib = dataclasses.replace(DEFAULT_CALIBRATION, zero3_prefetch=prefetch,
                                zero3_list_collectives=listed)
    runtime = Runtime(framework)
    for rc, k in ((Recompute.FULL, None), (Recompute.FULL, 2), (Recompute.NONE, None)):
        c = StageConfig(tp=1, dp=128, zero=3, recompute=rc, recompute_layers=k, micro_batch=2)
        if framework is Framework.FSDP and k is not None:
            continue
        slc = ModelSlice(GPT3, 3, True, True)
        costs = stage_costs(slc, island, 2048, ConfigArrays.of([c]), PipelineSetting(2, 1),
                            calib, runtime)
        subs, per_iter = stage_seconds(GPT3, 2048, island, c, 3, True, True, calib=calib,
                                       profile=runtime.profile)
        assert subs[0] == pytest.approx(float(costs.latency_s[0]), rel=1e-9)
        assert per_iter == pytest.approx(float(costs.iteration_s[0]), rel=1e-9)


def test_expert_sort_by_hand():
    """Qwen3-30B-A3B-shaped layer, 16384 tokens per GPU, EP 8 (16 local experts), no TP:
    each rank's experts receive 16384 x 8 routed copies of 2048 16-bit elements, sorted and
    unsorted (read and write each): 8 B x 16384 x 8 x 2048 over 80 % of 8 TB/s = 335.5 us.
    With one local expert (EP = 128) there is nothing to sort."""
    island = Island.homogeneous("g", CAT["GB200"], 128)
    calib = dataclasses.replace(DEFAULT_CALIBRATION, moe_capacity_factor=1.0)
    ti = _time_inputs(MOE, island, 4096, calib, Runtime())
    n = np.array([16384.0])
    expected = 8 * 16384 * 8 * 2048 / (8000e9 * 0.8)
    ep8 = ConfigArrays.of([StageConfig(tp=1, dp=8, ep=8)])
    ep128 = ConfigArrays.of([StageConfig(tp=1, dp=128, ep=128)])
    assert _expert_sort(ti, ep8, n)[0] == pytest.approx(expected, rel=1e-12)
    assert _expert_sort(ti, ep128, n)[0] == 0.0
    # Expert-TP 2 under TP 2: the expert-TP group gathers two shards' tokens, n/tp each.
    etp = ConfigArrays.of([StageConfig(tp=2, dp=8, ep=8, expert_tp=2)])
    assert _expert_sort(ti, etp, n)[0] == pytest.approx(expected, rel=1e-12)
