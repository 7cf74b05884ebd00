"""The loss over the vocabulary: HBM bytes per logit of the two kernels the runtimes run.

Sources, counted by hand from the code (one HBM read or write per tensor a kernel touches):

- Megatron-LM's default, ``megatron/core/tensor_parallel/cross_entropy.py`` at core_v0.14.0
  (``VocabParallelCrossEntropy``): ``calculate_logits_max`` casts the 16-bit logits to fp32
  (read 2, write 4) and takes their max (read 4); ``calculate_predicted_logits`` subtracts it in
  place (4 + 4), exponentiates in place (4 + 4) and sums (4); ``calculate_cross_entropy_loss``
  divides in place (4 + 4): 38 bytes. Backward: ``grad_input.mul_`` (4 + 4), then the fp32
  gradient cast back to 16 bits for the head's GEMMs (4 + 2): 14 bytes.
- Transformer Engine's fused loss (``transformer_engine/pytorch/triton/cross_entropy.py``,
  v2.9), what Megatron-Bridge's performance scripts run (``cross_entropy_fusion_impl = "te"``,
  ``scripts/performance/utils/overrides.py`` at 97ad8cc6): ``online_softmax_kernel`` reads the
  logits (2), ``cross_entropy_kernel`` reads them again and writes the gradient in their place
  (2 + 2): 6 bytes; backward ``element_mul_kernel`` scales it in place (2 + 2): 4 bytes.
"""

from __future__ import annotations

import pytest

from solver.cost.efficiency import DEFAULT_CALIBRATION
from solver.cost.runtime.frameworks import Runtime, profile
from solver.cost.stage import ConfigArrays, StageConfig
from solver.cost.stage_costs import _time_inputs
from solver.cost.timing import head_times
from solver.planner.check.time_check import _head, _setup
from solver.spec.domain import (CrossEntropyKernel, Framework, Island, ModelSpec, Precision,
                                TrainingSpec)
from solver.spec.loaders import load_catalog

CAT = load_catalog()
#: A 1.7B-like model with a 131,072-word vocabulary (the shape of Megatron-LM's H100 table).
SMALL = ModelSpec("gpt-small", layers=24, hidden=2048, ffn=8192, heads=16, kv_heads=16,
                  vocab=131072, gated_mlp=False)


def test_bytes_per_logit_by_hand():
    assert CrossEntropyKernel.UNFUSED.bytes_per_logit == (2 + 4 + 4 + 8 + 8 + 4 + 8, 8 + 6)
    assert CrossEntropyKernel.TE.bytes_per_logit == (2 + 2 + 2, 2 + 2)
    assert Runtime().cross_entropy is CrossEntropyKernel.UNFUSED
    assert TrainingSpec(8, 4096).cross_entropy is CrossEntropyKernel.UNFUSED


def test_head_pays_the_loss_kernel_bytes():
    """On an H100 (3.35 TB/s at 80 %), 4 x 4096 tokens, tp 2: each pass's head time less the
    kernel's bytes over 16384 x 65536 logits is the same (the GEMM) whichever loss runs, and
    the unfused loss costs 32 + 10 bytes per logit more: 42 x 2^30 B at 2.68 TB/s, 16.8 ms."""
    island = Island.homogeneous("h100", CAT["H100-SXM-80GB"], 8)
    cfg = ConfigArrays.of([StageConfig(tp=2, dp=4, micro_batch=4)])
    logits, hbm = 16384 * 65536, 3350e9 * 0.8
    rest, passes = [], []
    for kernel in CrossEntropyKernel:
        runtime = Runtime(cross_entropy=kernel)
        f, b = head_times(_time_inputs(SMALL, island, 4096, DEFAULT_CALIBRATION, runtime), cfg)
        fb, bb = kernel.bytes_per_logit
        rest.append((f.compute[0] - fb * logits / hbm, b.compute[0] - bb * logits / hbm))
        passes.append(f.compute[0] + b.compute[0])
    assert rest[0] == pytest.approx(rest[1], rel=1e-12)
    assert passes[0] - passes[1] == pytest.approx(42 * 2**30 / 2.68e12, rel=1e-9)


@pytest.mark.parametrize("kernel", list(CrossEntropyKernel))
def test_validator_restates_the_loss(kernel):
    """The independent time check prices the head exactly as the cost model does."""
    island = Island.homogeneous("h100", CAT["H100-SXM-80GB"], 8)
    calib = DEFAULT_CALIBRATION
    prof = profile(Framework.MEGATRON_CORE)
    config = StageConfig(tp=2, dp=4, micro_batch=4)
    st = _setup(SMALL, 4096, island, calib, prof, Precision.BF16, True, 4.0, False, kernel.value)
    fwd, fwd_tp, bwd, bwd_tp = _head(st, config, 16384.0)
    f, b = head_times(_time_inputs(SMALL, island, 4096, calib, Runtime(cross_entropy=kernel)),
                      ConfigArrays.of([config]))
    assert fwd == pytest.approx(f.compute[0], rel=1e-9)
    assert bwd == pytest.approx(b.compute[0], rel=1e-9)


def test_head_stage_holds_both_copies_of_the_logits():
    """At the loss the last stage holds the 16-bit logits (``GPTModel.forward`` keeps them while
    ``compute_language_model_loss`` runs) and the fp32 copy the cross entropy makes and keeps
    as its softmax: 6 bytes per logit. Llama 3 8B-like head, micro-batch 2 of 8192 tokens,
    tp 2, one micro-batch held: the head adds 8192 x (4 x 4096 + 6 x 128256) bytes per
    sequence-parallel shard of 16384 / 2 tokens."""
    import numpy as np

    from solver.cost.memory import activation_bytes

    model = ModelSpec("llama3-8b", layers=32, hidden=4096, ffn=14336, heads=32, kv_heads=8,
                      vocab=128256)
    cfg = ConfigArrays.of([StageConfig(tp=2, dp=4, micro_batch=2)])
    one = np.ones(1)

    def hbm(head: float) -> float:
        return float(activation_bytes(model, 8192, cfg, 2 * one, head * one, one, 1.0)[0][0])

    assert hbm(1.0) - hbm(0.0) == pytest.approx(8192 * (4 * 4096 + 6 * 128256), rel=1e-12)


def test_stage_memory_follows_the_loss_kernel():
    """The same head stage under Transformer Engine's loss holds 4 bytes per logit less (its
    gradient overwrites the 16-bit logits; no fp32 copy), plus the allocator's share of them."""
    import numpy as np

    from solver.cost.reserve import FRAGMENTATION
    from solver.cost.stage_costs import island_substage_memory

    island = Island.homogeneous("h100", CAT["H100-SXM-80GB"], 8)
    cfg = ConfigArrays.of([StageConfig(tp=2, dp=4, micro_batch=4)])
    one = np.ones(1)

    def total(kernel: CrossEntropyKernel) -> float:
        return float(island_substage_memory(SMALL, island, 4096, cfg, 2 * one,
                                            np.zeros(1, dtype=bool), np.ones(1, dtype=bool),
                                            one, DEFAULT_CALIBRATION,
                                            Runtime(cross_entropy=kernel)).total[0])

    logits = 16384 / 2 * 131072
    assert total(CrossEntropyKernel.UNFUSED) - total(CrossEntropyKernel.TE) == pytest.approx(
        4 * logits * (1 + FRAGMENTATION), rel=1e-12)
