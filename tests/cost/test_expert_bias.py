"""The routed experts' second bias, which Megatron-Core adds outside the grouped GEMM.

Source: ``TEGroupedMLP._apply_bias`` (``megatron/core/transformer/moe/experts.py``, Megatron-Core
core_v0.15.0 on; added by "Enable bias in expert mlp [gpt-oss 5/5]"): the second grouped GEMM
runs with ``skip_bias_add=True`` and the bias is added per local expert as ``t + b * p``, the
pieces joined by ``torch.cat``. Up to core_v0.15.0rc5 ``TransformerConfig.__post_init__``
refuses linear biases with MoE, so the planner still does (``check_model``).
"""

from __future__ import annotations

import dataclasses

import pytest

from solver.cost.efficiency import DEFAULT_CALIBRATION
from solver.cost.fidelity.evaluate import model_of
from solver.cost.fidelity.rows import load_rows
from solver.cost.runtime.frameworks import Runtime
from solver.cost.stage import ConfigArrays, ModelSlice, StageConfig
from solver.cost.stage_costs import PipelineSetting, _time_inputs, stage_costs
from solver.cost.timing import EXPERT_BIAS_BYTES, layer_times
from solver.planner.check.time_check import stage_seconds
from solver.spec.domain import Island, ModelSpec, Recompute
from solver.spec.loaders import load_catalog

CAT = load_catalog()
#: GPT-OSS 120B's layer shape (hidden 2880, 64 query and 8 KV heads of 64, 128 experts, top 4).
OSS = ModelSpec("oss", layers=2, hidden=2880, ffn=2880, heads=64, kv_heads=8, vocab=201088,
                experts=128, top_k=4, expert_ffn=2880, head_dim=64, bias=True)
BALANCED = dataclasses.replace(DEFAULT_CALIBRATION, moe_capacity_factor=1.0)


def test_expert_bias_bytes_by_hand():
    """EP 64 on 64 GB300, one micro-batch of 2 x 8,192 tokens: each rank receives its 16,384
    tokens' 4 routed copies back (65,536 rows of 2,880), 12 bytes per element each way at the
    GPU's effective HBM bandwidth (8 TB/s x 0.8): 0.3539 ms forward and as much backward."""
    island = Island.homogeneous("g", CAT["GB300"], 64, 4)
    cfg = ConfigArrays.of([StageConfig(tp=1, dp=64, ep=64, micro_batch=2)])
    with_bias = _time_inputs(OSS, island, 8192, BALANCED, Runtime())
    without = _time_inputs(dataclasses.replace(OSS, bias=False), island, 8192, BALANCED,
                           Runtime())
    (f1, b1), (f0, b0) = layer_times(with_bias, cfg), layer_times(without, cfg)
    expected = 12.0 * 65536 * 2880 / (8000e9 * 0.8)
    assert EXPERT_BIAS_BYTES == (12.0, 12.0)
    assert expected == pytest.approx(0.3539e-3, rel=1e-3)
    assert float(f1.compute[0] - f0.compute[0]) == pytest.approx(expected, rel=1e-9)
    assert float(b1.compute[0] - b0.compute[0]) == pytest.approx(expected, rel=1e-9)
    assert float(b1.recompute[0]) == float(b0.recompute[0]) == 0.0


def test_recomputation_repeats_the_forward_bias():
    """Full recomputation reruns the forward, bias included: the recompute term grows by the
    forward's share, the backward by its own."""
    island = Island.homogeneous("g", CAT["GB200"], 64, 4)
    cfg = ConfigArrays.of([StageConfig(tp=1, dp=64, ep=64, micro_batch=1, recompute=Recompute.FULL)])
    with_bias = _time_inputs(OSS, island, 8192, BALANCED, Runtime())
    without = _time_inputs(dataclasses.replace(OSS, bias=False), island, 8192, BALANCED,
                           Runtime())
    (_, b1), (_, b0) = layer_times(with_bias, cfg), layer_times(without, cfg)
    one = 12.0 * 32768 * 2880 / (8000e9 * 0.8)
    assert float(b1.recompute[0] - b0.recompute[0]) == pytest.approx(one, rel=1e-9)
    assert float(b1.compute[0] - b0.compute[0]) == pytest.approx(one, rel=1e-9)


def test_dense_biases_cost_nothing_extra():
    """A dense model's biases are fused into the GEMMs' epilogues (Transformer Engine)."""
    dense = ModelSpec("gpt", layers=2, hidden=2048, ffn=8192, heads=16, kv_heads=16,
                      vocab=50257, gated_mlp=False)
    island = Island.homogeneous("h", CAT["H100-SXM-80GB"], 8)
    cfg = ConfigArrays.of([StageConfig(tp=1, dp=8, micro_batch=1)])
    times = [layer_times(_time_inputs(m, island, 2048, DEFAULT_CALIBRATION, Runtime()), cfg)
             for m in (dense, dataclasses.replace(dense, bias=True))]
    assert float(times[0][0].compute[0]) == float(times[1][0].compute[0])
    assert float(times[0][1].compute[0]) == float(times[1][1].compute[0])


@pytest.mark.parametrize("etp", [1, 2])
def test_validator_agrees_on_expert_bias(etp):
    """The independent time check restates the bias (expert-TP 1 and 2, 8 GB200)."""
    island = Island.homogeneous("g", CAT["GB200"], 8, 4)
    c = StageConfig(tp=2, dp=4, ep=4, micro_batch=1, expert_tp=etp)
    costs = stage_costs(ModelSlice(OSS, 2, True, True), island, 4096, ConfigArrays.of([c]),
                        PipelineSetting(4, 1), BALANCED, Runtime())
    subs, per_iter = stage_seconds(OSS, 4096, island, c, 2, True, True, calib=BALANCED,
                                   profile=Runtime().profile)
    assert (subs[0], per_iter) == pytest.approx(
        (float(costs.latency_s[0]), float(costs.iteration_s[0])), rel=1e-9)


def test_fidelity_rows_carry_their_models_biases():
    """GPT-OSS and Megatron's GPTs have linear biases; Llama 3, Qwen3 and DeepSeek-V3 none."""
    rows = {r.id: r for r in load_rows()}
    assert model_of(rows["bridge-gb300-gptoss-120b-bf16"]).bias
    assert model_of(rows["mcore-h100-1.7B"]).bias and model_of(rows["sc21-ptdp-96L-384"]).bias
    for rid in ("bridge-gb300-llama3-8b-fp8", "bridge-gb300-qwen3-30b-a3b-fp8",
                "bridge-gb200-dsv3-bf16"):
        assert not model_of(rows[rid]).bias
