"""Compute floors: seconds per iteration no plan beats, from the fastest rates at which the
analytic cost model runs each kernel. The views, the one-mesh family and the replica search
cut with them, so each must hold for every plan the parallelizer can price (provably safe;
``tests/planner/test_view_floor.py`` checks them against the cost model itself).

Per token, one Transformer layer's forward runs its GEMMs, its attention core and its
memory-bound operators; the backward pass costs twice the forward's compute
(:mod:`solver.cost.timing`); everything else a plan does (communication, recomputation, the
pipeline's fill, the optimizer step) only adds time. The rates:

* GEMMs: at most the GPUs' GEMM peak (FP8 where the job trains in it and they have it) times
  the max-achievable-matmul ceiling. With the parallelizer's calibration
  (:func:`~solver.cost.parallelizer.kernel_calibration`) each GEMM is held at the efficiency
  the cost model gives its largest possible shape: rows without limit and the layer's full
  width (tensor parallelism only narrows a GEMM, and the efficiency grows with every side),
  in-training fraction included, the fixed cost per kernel left out.
* Attention: counted as Megatron counts it, the full score square. A fused kernel executes the
  causal half at ``attention_eff`` of the 16-bit peak, so per counted FLOP it runs at
  ``2 · attention_eff`` of peak, above the GEMM ceiling (1.16 on Hopper); an unfused core runs
  the whole square at the calibration's ``unfused_attention_eff``, at most the upper end of
  its fitting range. Charging attention at the GEMM rate put the floor above real plans at
  long context (Llama 3 8B at 128k tokens on 128 H200: floor 5.18 s, plan 4.72 s).
* Memory-bound operators (with the calibration): ``elementwise_bytes`` per hidden element
  and token through HBM, whatever the layout (tensor parallelism splits them, and the GPUs).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from solver.cost.calibration import BOUNDS
from solver.cost.efficiency import Calibration, GemmKernel
from solver.cost.stage_costs import attention_flops_per_token, model_flops_per_token
from solver.planner.pruning import precision_speedup
from solver.spec.domain import Island, JobSpec, ModelSpec, Precision

__all__ = ["kernel_floor", "compute_floor", "pipeline_floor"]

_UNBOUNDED_ROWS = 1e15  # a GEMM's token rows, above any micro-batch


def _dense_gemm_seconds(model: ModelSpec, island: Island, rate: float, ceiling: float,
                        calib: Calibration) -> float:
    """GPU-seconds per token of one dense layer's GEMMs, forward and backward, each at the
    cost model's efficiency of its widest shape (QKV, output, MLP up and down projections);
    the fixed cost per kernel is left out (it only adds time)."""
    h, q, kv = model.hidden, model.heads * model.d_head, model.kv_heads * model.d_head
    up = 2 if model.gated_mlp else 1
    # The curve at the floor's ceiling (the largest of the island's, at any precision).
    curve = dataclasses.replace(GemmKernel.of(island, Precision.BF16, calib), ceiling=ceiling)

    def one(flops: float, cols: float, inner: float) -> float:
        eff = float(curve.efficiency(_UNBOUNDED_ROWS, cols, inner))
        return flops / (rate / ceiling * eff)

    return 3.0 * (one(2 * h * (q + 2 * kv), q + 2 * kv, h) + one(2 * q * h, h, q)
                  + one(2 * h * up * model.ffn, up * model.ffn, h)
                  + one(2 * model.ffn * h, h, model.ffn))


def kernel_floor(job: JobSpec, island: Island, nodes: int,
                 calib: Calibration | None = None) -> tuple[float, float]:
    """Seconds per iteration of one Transformer layer and of the LM head on ``nodes`` nodes of
    ``island`` at the module's rates (``calib``: the parallelizer's calibration, for the
    size-dependent GEMM efficiency and the memory-bound operators; None: ceilings only).
    Provably safe for the analytic cost model."""
    prec, gpus, m = job.training.precision, island.gpu_types, job.model
    sixteen = island.tflops_per_gpu * 1e12
    ceiling = max(max(g.gemm_ceiling(prec), g.gemm_eff) for g in gpus)
    gemm_rate = sixteen * precision_speedup(island, prec) * ceiling
    attention_rate = sixteen * max(max(2.0 * g.attention_eff for g in gpus),
                                   BOUNDS["unfused_attention_eff"][1])
    attention = attention_flops_per_token(m, job.training.seq_len) / m.layers
    head = 6.0 * m.vocab * m.hidden  # the LM head's GEMM, forward and backward
    gemm = (model_flops_per_token(m, job.training.seq_len) - head) / m.layers - attention
    layer = gemm / gemm_rate + attention / attention_rate
    if calib is not None:
        if not m.is_moe:  # routed experts: their shapes vary with the routing, ceiling only
            layer += _dense_gemm_seconds(m, island, gemm_rate, ceiling, calib) - gemm / gemm_rate
        layer += 3.0 * calib.elementwise_bytes * m.hidden / (island.hbm_bw_gbs * 1e9 *
                                                             calib.hbm_eff)
    per_gpu = job.training.tokens / (nodes * island.gpus_per_node)
    return per_gpu * layer, per_gpu * head / gemm_rate


def compute_floor(job: JobSpec, island: Island, nodes: int,
                  calib: Calibration | None = None) -> float:
    """Seconds per iteration no plan on ``nodes`` nodes of ``island`` beats: every layer and
    the LM head at :func:`kernel_floor`'s rates."""
    layer, head = kernel_floor(job, island, nodes, calib)
    return job.model.layers * layer + head


def pipeline_floor(job: JobSpec, islands: Sequence[Island], n: int,
                   calib: Calibration | None = None) -> float:
    """Seconds per iteration no plain 1F1B pipeline of ``n`` micro-batches over groups of
    ``islands`` beats (provably safe).

    With ``c_i`` and ``h_i`` one layer's and the LM head's seconds per iteration on all of
    island ``i`` (:func:`kernel_floor`), ``L`` layers and stage latencies ``τ``: a stage of
    ``x`` layers on a fraction ``f`` of island ``i``'s nodes needs ``n τ >= (x c_i + h_i [it
    holds the head]) / f``, and the groups are disjoint (``Σ f <= 1`` per island), so summing
    ``x <= (n τ f − h_i [head]) / c_i`` over the stages gives ``n max τ >= (L + min_i h_i /
    c_i) / Σ_i 1/c_i`` (the layers and the head share the GPUs); every stage lies in one
    island, so ``n Σ τ >= L min c + min h``. Hence ``T >= (n − 1) · max τ + Σ τ`` is at least
    their sum. Boundary transfers and the per-iteration terms only add to it.
    """
    parts = [kernel_floor(job, i, len(i.nodes), calib) for i in islands]
    layers = job.model.layers
    spread = (layers + min(h / c for c, h in parts)) / sum(1.0 / c for c, _ in parts)
    alone = layers * min(c for c, _ in parts) + min(h for _, h in parts)
    return ((n - 1) * spread + alone) / n
