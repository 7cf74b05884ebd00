"""Megatron-Core's MoE all-to-all overlap (``--overlap-moe-expert-parallel-comm``), priced.

Without pipelining, ``combined_1f1b_schedule_for_no_pipelining`` (``megatron/core/
pipeline_parallel/combined_1f1b.py``, core_v0.14.0 on) runs the first micro-batch's forward
alone, then every next forward beside the previous micro-batch's backward, then the last
backward alone. The two run layer by layer, forward layer ``i`` beside backward layer
``L - 1 - i`` (``TransformerModelChunkSchedulePlan.run``, ``megatron/core/models/common/
model_chunk_schedule_plan.py``), on two CUDA streams, in the order of
``TransformerLayerSchedulePlan.run``::

    comm stream: combine_bwd         | dispatch_fwd, dispatch_bwd     | combine_fwd
    comp stream: attn_fwd, post_attn | mlp_bwd, mlp_bwd_dw, mlp_fwd   | post_attn_bwd, attn_bwd

"mlp" is the experts' side (the sort by local expert, the grouped GEMMs, the shared experts;
``build_transformer_layer_callables`` in ``megatron/core/models/gpt/fine_grained_callables.py``),
"attn" and "post_attn" the rest (attention, norms, router, permutation, TP collectives). Without
``--delay-wgrad-compute`` (never exported) ``mlp_bwd_dw`` does nothing and ``mlp_bwd`` computes
data and weight gradients together (``ScheduleNode.backward_dw`` returns unless
``delay_wgrad_compute``). With ``a`` / ``b`` the attention side's forward / backward, ``m``
the experts' forward (``2 m`` their backward) and ``e`` one all-to-all, list scheduling of those
operations in that order, each waiting for its inputs and its stream (combine_bwd waits for
the previous pair's attn_bwd, attn_fwd for its combine_fwd), gives a layer pair the period

    ``P = max(a, e) + max(2 m, e) + max(m, e) + max(b, e)``

(combine_bwd beside attn_fwd, dispatch_fwd beside mlp_bwd, dispatch_bwd beside mlp_fwd,
combine_fwd beside attn_bwd) against ``a + b + 3 m + 4 e`` one after the other: the overlap
hides ``H = a + b + 3 m + 4 e - P`` per layer (``0 <= H <= 4 e``: all four all-to-alls when each
is shorter than what it runs beside). The two streams are priced as if they did not slow each
other (no SM contention, as the cost model's other overlaps). An iteration of ``n``
micro-batches then takes ``n (f + b) - (n - 1) H_stage``: the stage's latency is
``f + b - H_stage`` and the first forward's and the last backward's exposed all-to-alls,
``H_stage``, are a per-iteration term.

With pipeline stages Megatron-Core requires virtual ones and runs
``combined_1f1b_schedule_for_interleaved_pipelining``: every rank runs one warm-up forward
more (``get_pp_rank_microbatches``), and each steady step pairs a chunk's forward with
another chunk's backward the same way, while the warm-up forwards and cool-down backwards run
alone. For ``p`` equal ranks of ``v`` chunks, ``n`` micro-batches and ``H`` hidden per rank
and micro-batch, the simulator (:mod:`solver.schedule.simulator`, ``overlap_hidden_s``)
gives ``n (τ − H) + (p − 1)(τ − H)/v + p H``: the interleaved closed form at the latency
``τ − H`` plus ``p H`` per iteration (``tests/schedule/test_a2a_overlap_sim.py``), which is
how the stage is priced (``p = 1``: the case above). Memory: forward layer ``i`` stores its
activations before backward layer ``L - 1 - i`` frees its own, so a pair holds one layer's
activations more; interleaved, the extra warm-up forward takes the place of the steady
forward that runs before its backward without the overlap, so no more chunks are held
(:func:`held_micro_batches`).
"""

from __future__ import annotations

import numpy as np

from solver.cost.stage import ConfigArrays
from solver.cost.timing import (Components, TimeInputs, _expert_bias, _expert_sort,
                                _routed_gemm_fwd, mlp_gemm_fwd)

__all__ = ["a2a_overlap_hidden", "expert_side_fwd", "held_micro_batches", "pair_period"]


def expert_side_fwd(ti: TimeInputs, cfg: ConfigArrays, n: np.ndarray) -> np.ndarray:
    """Forward seconds of one MoE layer's experts' side ("mlp" above): the routed experts'
    grouped GEMMs, the sort by local expert and back, the experts' second bias and the shared
    experts' MLP."""
    m = ti.model
    side = _routed_gemm_fwd(ti, cfg, n) + _expert_sort(ti, cfg, n) + _expert_bias(ti, cfg, n)[0]
    if m.shared_experts:
        side = side + mlp_gemm_fwd(ti, cfg, n, m.shared_experts * m.expert_ffn)
    return side


def pair_period(a: np.ndarray, b: np.ndarray, m: np.ndarray, e: np.ndarray) -> np.ndarray:
    """Seconds of one overlapped layer pair (module docstring): attention side forward ``a``
    and backward ``b``, experts' forward ``m``, one all-to-all ``e``."""
    return np.maximum(a, e) + np.maximum(2 * m, e) + np.maximum(m, e) + np.maximum(b, e)


def a2a_overlap_hidden(ti: TimeInputs, cfg: ConfigArrays, n: np.ndarray, fwd: Components,
                       bwd: Components) -> np.ndarray:
    """Seconds per micro-batch and layer the overlap hides (0 where a row does not overlap).

    ``fwd`` / ``bwd``: one layer's forward and backward :class:`~solver.cost.timing.Components`
    (:func:`~solver.cost.timing.layer_times`) at ``n`` tokens per GPU; the overlap runs without
    full recomputation, so the backward's all-to-alls equal the forward's (two each). Nothing is
    hidden where the timing exposes every transfer (``ti.overlap`` False).
    """
    on = np.asarray(cfg.a2a_overlap, dtype=bool)
    if not ti.overlap or not ti.model.is_moe or not on.any():
        return np.zeros(np.broadcast(fwd.ep, on).shape)
    m = expert_side_fwd(ti, cfg, n)
    e = fwd.ep / 2
    a = fwd.total - fwd.ep - m
    b = bwd.total - bwd.ep - 2 * m
    hidden = a + b + 3 * m + 4 * e - pair_period(a, b, m, e)
    return np.where(on, np.maximum(hidden, 0.0), 0.0)


def held_micro_batches(cfg: ConfigArrays, in_flight: np.ndarray, layers: np.ndarray
                       ) -> np.ndarray:
    """Micro-batches of activations held with the overlap: one layer's more than ``in_flight``
    (module docstring; interleaved, the extra warm-up forward takes the place of the steady
    forward that runs before its backward without the overlap, so the chunks held are as
    many)."""
    extra = np.where(np.asarray(cfg.a2a_overlap, dtype=bool), 1.0 / np.maximum(layers, 1), 0.0)
    return in_flight + extra
