"""The independent time check's data-parallel part: ZeRO collectives and gradient
synchronisation of one sub-stage, and the Adam step, recomputed from the shapes (see
:mod:`solver.planner.check.time_check`, whose setup ``st`` these functions read: the model, the
machine, the calibration, the framework profile and whether overlap is priced).

Ring collectives over the dense and the expert data-parallel groups
(:func:`~solver.planner.check.time_check_machine.strided` links); ZeRO-3 runs one collective per
module (DeepSpeed: per weight matrix; FSDP: per layer), DeepSpeed gathers recomputed layers a
third time beyond its reuse distance, and 2021 DeepSpeed hid none of it
(``zero3_prefetch``) and did host work per rank of every collective
(``zero3_list_collectives``); bucketed collectives hide behind the pass they overlap except the
last bucket, ``max(c - w (1 - 1/nb), c / nb)``. Under the interleaved schedule Megatron-Core syncs
chunk by chunk (``forward_backward_pipelining_with_interleaving``: a chunk's gradients once its
last backward is done, aligned over the pipeline ranks; a chunk's parameters gathered from the
start of the chunk before it): :func:`by_chunks`.
"""

from __future__ import annotations

import math

from solver.cost.stage import StageConfig
from solver.planner.check.memory_check import held_params, layer_weights
from solver.planner.check.time_check_machine import ring, strided
from solver.spec.domain import Framework

__all__ = ["by_chunks", "hide", "sync"]

_WEIGHT = 2.0  # bytes per parameter of the 16-bit weights


def hide(comm: float, window: float, buckets: float) -> float:
    """Exposed part of a bucketed collective behind ``window`` seconds: the last bucket."""
    return max(comm - window * (1.0 - 1.0 / buckets), comm / buckets)


def by_chunks(comm: float, work: float, buckets: float, v: int, pp: int,
              bucketed: bool) -> float:
    """Exposed part of a per-iteration sync split over ``v`` chunks on one link, each chunk's
    part free to run once the chunks after it in the pass (``pp`` micro-batches each, ``work /
    v`` per chunk and micro-batch) are done, recomputed as the largest backlog over chunks: the
    last chunk's part alone (bucketed over its pass for parameter gathers) or everything less
    the ``(v - 1) pp`` chunk passes before it."""
    part = comm / v
    last = hide(part, work / v, max(buckets / v, 1.0)) if bucketed else part
    backlog = max(((k + 1) * part - k * pp * work / v for k in range(1, v)), default=last)
    return max(last, backlog)


def _module_latency(st, c: StageConfig, layers: int, emb: bool, head: bool,
                    link_d: tuple[float, float], link_e: tuple[float, float],
                    has_experts: bool) -> float:
    """Step latencies of ZeRO-3's collectives beyond one per group, per gather or scatter pass:
    DeepSpeed fetches module by module, one collective per weight matrix (fused QKV, output,
    gated up, down; router, shared experts and each local expert's two); the norms and
    biases stay gathered (persistence threshold). FSDP runs one per layer and group. With
    list-based collectives (2021 DeepSpeed) each of them also does host work per rank of its
    group: a view, a stream record and a copy (``list_collective_rank_s``)."""
    m = st.model
    if st.profile.zero3_per_matrix:
        per_dense = 4 if not m.is_moe else 3 + (2 if m.shared_experts else 0)
        per_expert = 2 * m.experts / c.ep if m.is_moe else 0
    else:
        per_dense, per_expert = 1, (1 if m.is_moe else 0)
    dense_n = layers * per_dense + int(emb) + int(head)
    out = max(dense_n - 1, 0) * ring(0.0, c.dp * c.cp, *link_d)
    host = dense_n * c.dp * c.cp
    if has_experts:
        q_e = c.tp * c.cp * c.dp // (c.etp * c.ep)
        out += max(layers * per_expert - 1, 0) * ring(0.0, q_e, *link_e)
        host += layers * per_expert * q_e
    if st.calib.zero3_list_collectives:
        out += host * st.calib.list_collective_rank_s
    return out


def _gathered_again(st, c: StageConfig, dense_l: float, expert_l: float,
                    redone: float) -> float:
    """Extra ZeRO-3 gathers per micro-batch, as a share of one: with full recomputation
    DeepSpeed gathers a module for its recomputed forward and holds it for its backward only
    within the reuse distance R; the reuse lies about twice the layer's later parameters away,
    so ``1 - R / (2 P)`` of a layer of P (tensor-parallel shard) parameters is gathered again,
    on the ``redone`` fraction of the layers."""
    reuse = st.profile.zero3_reuse_params
    if reuse <= 0 or redone <= 0:
        return 0.0
    per_layer = dense_l / c.tp + expert_l / (c.etp * c.ep)
    return min(max(1.0 - reuse / (2.0 * max(per_layer, 1.0)), 0.0), 1.0) * redone


def sync(st, c: StageConfig, layers: int, emb: bool, head: bool, fwd_work: float,
          bwd_work: float, redone: int = 0, v: int = 1) -> tuple[float, float, float, float]:
    """Exposed ZeRO traffic per micro-batch (fwd, bwd), exposed DP sync and the Adam step
    (``redone``: layers of the sub-stage fully recomputed; ``v``: model chunks per rank)."""
    m, g, prof = st.model, st.gpu, st.profile
    dense_l, expert_l = layer_weights(m)
    dense, expert = held_params(m, c, layers, emb, head)
    q_d = c.dp * c.cp
    q_e = c.tp * c.cp * c.dp // (c.etp * c.ep)  # the expert-data-parallel group
    link_d, link_e = strided(g, c.tp, q_d), strided(g, c.etp * c.ep, q_e)

    def coll(per_param: float, phases: float = 1.0) -> float:
        experts = ring(per_param * expert, q_e, *link_e, phases) if expert > 0 else 0.0
        return ring(per_param * dense, q_d, *link_d, phases) + experts

    megatron = prof.framework in (Framework.MEGATRON_CORE, Framework.FLAGSCALE)
    bucket = max(prof.grad_bucket_params, 1e6 * c.dp) if megatron else prof.grad_bucket_params
    nb = max(math.ceil((dense + expert) / bucket), 1.0)
    z3 = c.zero >= 3
    # ZeRO-3 runs one collective per module: coll() paid one ring latency per group.
    lag = _module_latency(st, c, layers, emb, head, link_d, link_e, expert > 0) if z3 else 0.0
    # Weights travel as stored (FP8 with --fp8-param-gather), gradients in the buffer's type.
    w = 1.0 if st.gpu.cast != (0.0, 0.0) and st.fp8_params else _WEIGHT
    gb = st.grad_bytes
    gather = coll(w) + lag if z3 else 0.0
    scatter = (coll(gb) + lag) if z3 else (coll(gb) if c.zero == 2 else 0.0)
    again = _gathered_again(st, c, dense_l, expert_l, redone / max(layers, 1)) if z3 else 0.0
    z_fwd, z_bwd = gather, gather * (1.0 + again) + scatter
    if st.overlap and (st.calib.zero3_prefetch or not z3):
        z_fwd, z_bwd = hide(z_fwd, fwd_work, nb), hide(z_bwd, bwd_work, nb)
    grads = coll(gb, 2.0) if c.zero == 0 else (coll(gb) if c.zero == 1 else 0.0)
    params = coll(w) if c.zero in (1, 2) else 0.0
    if st.overlap and prof.overlap_grad_reduce:
        grads = (by_chunks(grads, bwd_work, nb, v, c.pp, False) if v > 1
                 else hide(grads, bwd_work, nb))
    if st.overlap and prof.overlap_param_gather:
        params = (by_chunks(params, fwd_work, nb, v, c.pp, True) if v > 1
                  else hide(params, fwd_work, nb))
    local = dense / q_d + expert / q_e if c.zero >= 1 else dense + expert
    return z_fwd, z_bwd, grads + params, st.calib.optimizer_bytes * local / g.hbm
