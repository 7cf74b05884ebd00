"""FP8 layers: the quantization casts Transformer Engine runs on every GEMM operand, and the LM
head that stays 16-bit.

Sources: Transformer Engine ``transformer_engine/pytorch/csrc/extensions/normalization.cpp``
(per-tensor current scaling: the norm kernel writes 16 bits and the amax, then the quantizer
casts, ``FUSED_NORM_AMAX_FP8``; MXFP8: norm, then quantize), ``csrc/quantizer.cpp`` (a
transposed copy only where ``nvte_is_non_tn_fp8_gemm_supported`` is false: Hopper, Ada);
Megatron-Core ``megatron/core/models/gpt/gpt_model.py`` (``output_layer`` is
``tensor_parallel.ColumnParallelLinear`` unless the opt-in MXFP8 head, May 2026).

Hand values: a Llama 3 8B layer (h 4096, q 4096, kv 1024, gated f 14336) on 16384 tokens
without TP. Forward operands: two norm outputs (QKV and up-projection inputs, 2 x 16384 x 4096
elements) and two others (output-projection input 16384 x 4096, down-projection input
16384 x 14336); backward: the four output gradients, 16384 x (4096 + 6144 + 4096 + 28672).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from solver.cost.efficiency import DEFAULT_CALIBRATION
from solver.cost.fp8_casts import cast_bytes, layer_cast_bytes
from solver.cost.runtime.frameworks import Runtime
from solver.cost.stage import ConfigArrays, ModelSlice, StageConfig
from solver.cost.stage_costs import PipelineSetting, _time_inputs, stage_costs
from solver.cost.timing import head_times, layer_times
from solver.planner.check.time_check import stage_seconds
from solver.spec.domain import Framework, Island, ModelSpec, Precision, Recompute
from solver.spec.loaders import load_catalog

CAT = load_catalog()
LLAMA8B = ModelSpec("llama3-8b", layers=32, hidden=4096, ffn=14336, heads=32, kv_heads=8,
                    vocab=128256)
N = 16384
NORM_ELEMENTS = 2 * N * 4096
OTHER_FWD = N * (4096 + 14336)
BWD = N * (4096 + 6144 + 4096 + 28672)


def _island(gpu: str, gpus: int = 8) -> Island:
    return Island.homogeneous(gpu, CAT[gpu], gpus, 4 if gpu.startswith("GB") else 8)


def test_cast_bytes_by_recipe_and_gpu():
    """Per-tensor on Blackwell 3 / 5, on Hopper one transposed byte more; MXFP8 4 / 4; none
    without FP8 (BF16, or a GPU without it)."""
    gb200, h100, a100 = _island("GB200"), _island("H100-SXM-80GB"), _island("A100-SXM-80GB")
    assert cast_bytes(gb200, Precision.FP8_CS, True) == (3.0, 5.0)
    assert cast_bytes(gb200, Precision.FP8, True) == (3.0, 5.0)
    assert cast_bytes(h100, Precision.FP8_CS, True) == (4.0, 6.0)
    assert cast_bytes(gb200, Precision.FP8_MX, True) == (4.0, 4.0)
    assert cast_bytes(a100, Precision.FP8_CS, False) == (0.0, 0.0)


@pytest.mark.parametrize("norm, other", [(3.0, 5.0), (4.0, 6.0), (4.0, 4.0)])
def test_layer_cast_bytes_by_hand(norm, other):
    fwd, bwd = layer_cast_bytes(LLAMA8B, 1, 1, N, 1.0, norm, other)
    assert float(fwd) == norm * NORM_ELEMENTS + other * OTHER_FWD
    assert float(bwd) == other * BWD
    # GB200 per-tensor: 1,912,602,624 B forward, 3,523,215,360 B backward.
    if (norm, other) == (3.0, 5.0):
        assert (float(fwd), float(bwd)) == (1_912_602_624.0, 3_523_215_360.0)


def test_layer_times_carry_the_casts():
    """On GB200 (8 TB/s at 80 %): the forward gains its casts, the backward twice the
    16-bit forward work plus the gradients' casts, not twice the forward casts."""
    island = _island("GB200")
    cfg = ConfigArrays.of([StageConfig(tp=1, dp=8, micro_batch=4)])
    bf16 = _time_inputs(LLAMA8B, island, 4096, DEFAULT_CALIBRATION, Runtime())
    fp8 = _time_inputs(LLAMA8B, island, 4096, DEFAULT_CALIBRATION,
                       Runtime(precision=Precision.FP8_CS))
    hbm = 8000e9 * 0.8
    cast_f, cast_b = 1_912_602_624 / hbm, 3_523_215_360 / hbm
    f8, b8 = layer_times(fp8, cfg)
    f16, b16 = layer_times(dataclasses.replace(fp8, fp8_cast=(0.0, 0.0)), cfg)
    assert f8.compute[0] - f16.compute[0] == pytest.approx(cast_f, rel=1e-9)
    assert b8.compute[0] - b16.compute[0] == pytest.approx(cast_b, rel=1e-9)
    assert bf16.fp8_cast == (0.0, 0.0) and bf16.head_gemm is None


def test_lm_head_stays_16_bit():
    """The head (GEMM and loss) costs the same under FP8 as under BF16."""
    island = _island("GB200")
    cfg = ConfigArrays.of([StageConfig(tp=2, dp=4, micro_batch=2)])
    f8, b8 = head_times(_time_inputs(LLAMA8B, island, 8192, DEFAULT_CALIBRATION,
                                     Runtime(precision=Precision.FP8_CS)), cfg)
    f16, b16 = head_times(_time_inputs(LLAMA8B, island, 8192, DEFAULT_CALIBRATION,
                                       Runtime()), cfg)
    assert f8.total[0] == pytest.approx(f16.total[0], rel=1e-12)
    assert b8.total[0] == pytest.approx(b16.total[0], rel=1e-12)


MOE_SHARED = ModelSpec("moe-shared", layers=6, hidden=2048, ffn=6144, heads=16, kv_heads=4,
                       vocab=32000, experts=16, top_k=4, expert_ffn=1024, shared_experts=1,
                       head_dim=128)


@pytest.mark.parametrize("precision", [Precision.FP8_CS, Precision.FP8_MX])
@pytest.mark.parametrize("model, cfg", [
    (LLAMA8B, StageConfig(tp=2, dp=4, pp=2, micro_batch=2)),
    (LLAMA8B, StageConfig(tp=1, dp=8, recompute=Recompute.FULL, micro_batch=1)),
    (MOE_SHARED, StageConfig(tp=2, dp=4, ep=4, expert_tp=1, micro_batch=2)),
    (MOE_SHARED, StageConfig(tp=2, dp=4, ep=2, recompute=Recompute.SELECTIVE, micro_batch=1)),
])
def test_validator_agrees_on_fp8(precision, model, cfg):
    """The independent time check prices the same casts and 16-bit head on Blackwell
    (MXFP8, no transposes) and Hopper (per-tensor with transposes)."""
    gpus = ["GB200"] + (["H100-SXM-80GB"] if precision is Precision.FP8_CS else [])
    for gpu in gpus:
        island = _island(gpu, cfg.gpus)
        runtime = Runtime(Framework.MEGATRON_CORE, precision)
        slc = ModelSlice(model, model.layers, True, True)
        costs = stage_costs(slc, island, 4096, ConfigArrays.of([cfg]), PipelineSetting(4, 1),
                            DEFAULT_CALIBRATION, runtime)
        subs, per_iter = stage_seconds(model, 4096, island, cfg, model.layers, True, True,
                                       profile=runtime.profile, precision=precision)
        assert max(subs) == pytest.approx(float(costs.latency_s[0]), rel=1e-9), gpu
        assert per_iter == pytest.approx(float(costs.iteration_s[0]), rel=1e-9), gpu
        assert np.isfinite(max(subs))
