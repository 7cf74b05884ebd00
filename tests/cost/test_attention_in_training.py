"""The fused attention core runs at its stand-alone efficiency derated by the GPU's in-training
fraction, as the GEMMs do.

Both figures are stand-alone kernel measurements (``gemm_eff``: the max-achievable-matmul
table; ``attention_eff``: FlashAttention-2/3's benchmarks), and inside a training step both
kernels run on the same tensor cores at the same sustained clock, with the same SMs lent to
communication kernels: the catalog's ``gemm_in_training`` is a property of the GPU in the step,
so it applies to both. The unfused attention core's efficiency was fitted inside training runs
(SC'21 Table 1, ``calibration.py``) and is not derated again.
"""

from __future__ import annotations

import dataclasses

import pytest

from solver.cost.efficiency import DEFAULT_CALIBRATION
from solver.cost.runtime.frameworks import Runtime
from solver.cost.stage import ConfigArrays, StageConfig
from solver.cost.stage_costs import _time_inputs
from solver.cost.timing import _layer_compute_fwd
from solver.spec.domain import Island, ModelSpec
from solver.spec.loaders import load_catalog

CAT = load_catalog()
#: Llama 3 8B's attention shape: 32 query heads of 128.
LLAMA = ModelSpec("llama", layers=2, hidden=4096, ffn=14336, heads=32, kv_heads=8,
                  vocab=128256)


def _attention_core(gpu, seq=8192, tp=1, micro_batch=1):
    island = Island.homogeneous("g", gpu, 8)
    ti = _time_inputs(LLAMA, island, seq, DEFAULT_CALIBRATION, Runtime())
    cfg = ConfigArrays.of([StageConfig(tp=tp, dp=8 // tp, micro_batch=micro_batch)])
    _, attn, _ = _layer_compute_fwd(ti, cfg, cfg.micro_batch * seq)
    return float(attn[0])


def test_fused_attention_core_by_hand():
    """One H100, one sequence of 8,192 tokens: Megatron counts 4 s^2 a d = 1.0995e12 FLOPs of
    which the causal kernel runs half, at 989 TFLOP/s x 0.58 (FlashAttention-3's figure) x
    Hopper's in-training fraction: 1.0995e12 / 2 / (989e12 x 0.58 x 0.605) = 1.5842 ms."""
    h100 = CAT["H100-SXM-80GB"]
    assert (h100.attention_eff, h100.gemm_in_training) == (0.58, 0.605)
    expected = 4 * 8192 * 8192 * 32 * 128 / 2 / (989e12 * 0.58 * 0.605)
    assert expected == pytest.approx(1.5842e-3, rel=1e-4)
    assert _attention_core(h100) == pytest.approx(expected, rel=1e-9)
    # Tensor parallelism splits the heads.
    assert _attention_core(h100, tp=2) == pytest.approx(expected / 2, rel=1e-9)


@pytest.mark.parametrize("gpu", ["H100-SXM-80GB", "GB200", "GB300"])
def test_the_fraction_scales_the_core(gpu):
    """The same GPU at a fraction of 1 runs the core faster by exactly its fraction."""
    g = CAT[gpu]
    whole = dataclasses.replace(g, gemm_in_training=1.0)
    assert _attention_core(g) == pytest.approx(_attention_core(whole) / g.gemm_in_training,
                                               rel=1e-12)


def test_unfused_core_is_not_derated_again():
    """V100 runs unfused attention, at the calibration's in-training fit: its fraction plays
    no part (the whole square at ``unfused_attention_eff`` of 125 TFLOP/s)."""
    v100 = CAT["V100-SXM2-32GB"]
    assert v100.attention == "unfused"
    expected = 4 * 2048 * 2048 * 32 * 128 / (v100.bf16_tflops * 1e12
                                             * DEFAULT_CALIBRATION.unfused_attention_eff)
    for kappa in (0.5, 1.0):
        assert _attention_core(dataclasses.replace(v100, gemm_in_training=kappa),
                               seq=2048) == pytest.approx(expected, rel=1e-9)
