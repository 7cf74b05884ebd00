"""Data-parallel and ZeRO communication of one sub-stage, as the framework schedules it.

Per iteration (Rajbhandari et al. 2020; the Scaling Book, seeds/004): without ZeRO the fp32
gradients are all-reduced over the ``dp·cp`` replicas; ZeRO-1 reduce-scatters them once and
all-gathers the 16-bit weights after the step; ZeRO-2 must reduce-scatter every micro-batch;
ZeRO-3 also gathers the weights every micro-batch. Collectives run on NVLink inside a node and on
``k`` rails across nodes (:meth:`~solver.cost.efficiency.Links.data_parallel`). Overlap is the
framework's, bucket by bucket (:func:`hide`); :mod:`solver.cost.stage_costs` says more.

ZeRO-3 issues its per-micro-batch collectives module by module, each a ring paying its own
``q - 1`` step latencies: one per weight matrix with DeepSpeed (``fetch_sub_module`` gathers a
submodule's parameters, tensors under ``stage3_param_persistence_threshold`` stay gathered),
one per layer with FSDP's per-block wrapping (:func:`zero3_collectives`). Under full
recomputation DeepSpeed gathers a layer again for its recomputed forward (the module hooks
fire again) and keeps it for the backward only within ``stage3_max_reuse_distance``
parameters: the share of a layer whose reuse lies farther is gathered a third time
(:func:`regathered_share`). With ``zero3_prefetch`` off (DeepSpeed before v0.5.6, whose
"asynchronous" gathers each synchronized the device: PR #1188) nothing of it hides, and with
``zero3_list_collectives`` (the same DeepSpeed) every collective also pays host work per rank
of its group (:func:`list_collective_host`).

Under Megatron-Core's interleaved schedule (``v`` model chunks per rank, each its own DDP
buffer) the per-iteration sync runs chunk by chunk (:func:`hide_interleaved`):
``forward_backward_pipelining_with_interleaving`` (``megatron/core/pipeline_parallel/
schedules.py``, Megatron-LM at 8479eb3) launches a chunk's gradient reduce-scatter
(``config.grad_sync_func[chunk]``) once its last micro-batch's backward is done, at the same
moment on every pipeline rank (``grad_sync_virtual_microbatch_id = virtual_microbatch_id -
pipeline_parallel_rank``, ``--align-grad-reduce``, the default), and dispatches a chunk's
parameter all-gather (``config.param_sync_func``) when the chunk before it starts its first
micro-batch (chunks 0 and 1 at the start).
"""

from __future__ import annotations

import numpy as np

from solver.cost.efficiency import ring_time
from solver.cost.memory import param_counts, weight_bytes
from solver.cost.stage import ConfigArrays, expert_tp
from solver.cost.timing import TimeInputs
from solver.spec.domain import ModelSpec


def hide(comm: np.ndarray, window: np.ndarray, buckets: np.ndarray) -> np.ndarray:
    """Exposed part of a bucketed collective ``comm`` overlapped with ``window`` seconds of
    compute: every bucket but the last hides behind the work that follows it."""
    return np.maximum(comm - window * (1.0 - 1.0 / buckets), comm / buckets)


def hide_interleaved(comm: np.ndarray, work: np.ndarray, buckets: np.ndarray, chunks: float,
                     pp: np.ndarray, bucketed: bool) -> np.ndarray:
    """Exposed part of a per-iteration collective ``comm`` run chunk by chunk under the
    interleaved schedule (module docstring): ``chunks`` equal parts, one link.

    Backward processes the chunks of the last micro-batches in reverse, ``pp`` micro-batches
    per chunk, so after chunk ``c``'s last backward ``c pp`` chunk passes of ``work / chunks``
    seconds remain (``work``: one micro-batch's pass over all of the rank's chunks; pipeline
    waits only add to it). Chunks ``c .. 0`` then still have ``(c + 1) comm / chunks`` to send:
    the exposed time is ``max_c ((c + 1) comm / chunks - c pp work / chunks)``, linear in ``c``
    and so largest at an end. The forward's parameter gathers mirror it. At ``c = 0`` a gradient
    sync starts only after the chunk's backward (``bucketed`` False: the schedule calls it
    then), so the ends are ``c = 0`` and ``c = chunks - 1``; a parameter gather is waited for
    bucket by bucket (``bucketed``: :func:`hide` over the chunk's pass and buckets), so its
    ``c = 0`` term is that, and the others' ends are ``c = 1`` and ``c = chunks - 1``.
    """
    part, per_chunk = comm / chunks, work / chunks
    if not bucketed:
        return np.maximum(part, comm - (chunks - 1) * pp * per_chunk)
    first = hide(part, per_chunk, np.maximum(buckets / chunks, 1.0))
    if chunks < 2:
        return first
    return np.maximum(first, np.maximum(2 * part - pp * per_chunk,
                                        comm - (chunks - 1) * pp * per_chunk))


def zero3_collectives(model: ModelSpec, per_matrix: bool, local_experts
                      ) -> tuple[int, np.ndarray]:
    """ZeRO-3 collectives of one layer per gather or reduce-scatter pass, on the dense and on
    the expert data-parallel group, for ``local_experts`` routed experts per rank.

    ``per_matrix`` (DeepSpeed): one per weight matrix in Megatron's fused layout (QKV, output
    projection, up-projection with its gate, down-projection; for MoE the router, the shared
    experts' two and each local expert's two); norm vectors and biases, under
    ``stage3_param_persistence_threshold`` (1e5), stay gathered. Otherwise (FSDP) one per layer
    and group.
    """
    local = np.asarray(local_experts, dtype=float)
    if not model.is_moe:
        return (4 if per_matrix else 1), np.zeros_like(local)
    if not per_matrix:
        return 1, np.ones_like(local)
    return 2 + 1 + (2 if model.shared_experts else 0), 2.0 * local


def regathered_share(ti: TimeInputs, cfg: ConfigArrays, share: np.ndarray) -> np.ndarray:
    """Share of the sub-stage's layers whose weights ZeRO-3 gathers a third time per
    micro-batch (see the module docstring; 0 without a reuse distance, i.e. FSDP).

    A module's weights are reused, after its recomputed forward, once the rest of the layer has
    run forward and backward: about twice the layer's parameters after it. They stay gathered
    only if that is within the reuse distance ``R``, so of a layer of ``P`` gathered parameters
    the first ``P - R/2`` are gathered again: ``max(1 - R / 2P, 0)`` of it, for the
    recomputed ``share`` of the layers.
    """
    reuse = ti.profile.zero3_reuse_params
    if reuse <= 0:
        return np.zeros(np.broadcast(np.asarray(cfg.tp), np.asarray(share)).shape)
    one, none = np.ones(np.shape(cfg.tp)), np.zeros(np.shape(cfg.tp), dtype=bool)
    dense, expert = param_counts(ti.model, cfg, one, none, none)
    layer = dense + expert
    return np.clip(1.0 - reuse / (2.0 * np.maximum(layer, 1.0)), 0.0, 1.0) * share


def list_collective_host(ti: TimeInputs, dense_colls: np.ndarray, expert_colls: np.ndarray,
                         q_dense: np.ndarray, q_expert: np.ndarray) -> np.ndarray:
    """Host seconds per gather or reduce-scatter pass of ZeRO-3's list-based collectives
    (``Calibration.zero3_list_collectives``; 0 otherwise): each of the pass's per-module
    collectives (``dense_colls`` on the dense group, ``expert_colls`` on the expert group,
    :func:`zero3_collectives`) builds, records and copies one tensor per rank of its group,
    ``list_collective_rank_s`` each."""
    if not ti.calib.zero3_list_collectives:
        return np.zeros(np.broadcast(dense_colls, q_dense).shape)
    ranks = dense_colls * q_dense + expert_colls * q_expert
    return ranks * ti.calib.list_collective_rank_s


def _collectives(ti: TimeInputs, cfg: ConfigArrays, layers: np.ndarray, emb: np.ndarray,
                 head: np.ndarray):
    """``coll(bytes_per_param, factor)`` over the sub-stage's data-parallel groups (dense and
    expert), the latency of ZeRO-3's per-module collectives beyond the first of each group
    (and the list-based ones' host work), the gradient bucket count and the locally updated
    parameters."""
    dense, expert = param_counts(ti.model, cfg, layers, emb, head)
    q_dense = cfg.dp * cfg.cp
    # The expert grid (tp-ep-dp over the stage's GPUs): expert-DP ranks sit etp·ep apart.
    etp = expert_tp(cfg)
    q_expert = q_dense * cfg.tp // (etp * cfg.ep)
    bw_d, lat_d = ti.links.data_parallel(cfg.tp, q_dense)
    bw_e, lat_e = ti.links.data_parallel(etp * cfg.ep, q_expert)

    def coll(bytes_per_param: float, factor: float = 1.0) -> np.ndarray:
        # No expert weights (a dense model, or no layer here): no expert collective to run.
        experts = np.where(expert > 0, ring_time(bytes_per_param * expert, q_expert, bw_e,
                                                 lat_e, factor), 0.0)
        return ring_time(bytes_per_param * dense, q_dense, bw_d, lat_d, factor) + experts

    # coll prices each group as one collective: the other per-module ones add their latency.
    n_d, n_e = zero3_collectives(ti.model, ti.profile.zero3_per_matrix,
                                 ti.model.experts / cfg.ep)
    all_d, all_e = layers * n_d + emb + head, layers * n_e
    more_d = np.maximum(all_d - 1, 0)
    more_e = np.where(expert > 0, np.maximum(all_e - 1, 0), 0)
    steps = (more_d * ring_time(0.0, q_dense, bw_d, lat_d)
             + more_e * ring_time(0.0, q_expert, bw_e, lat_e)
             + list_collective_host(ti, all_d, all_e, q_dense, q_expert))
    buckets = np.maximum(np.ceil((dense + expert) / ti.profile.bucket_params(cfg.dp)), 1.0)
    local = np.where(cfg.zero >= 1, dense / q_dense + expert / q_expert, dense + expert)
    return coll, steps, buckets, local


def _zero_and_sync(ti: TimeInputs, cfg: ConfigArrays, layers: np.ndarray, emb: np.ndarray,
                   head: np.ndarray, fwd_work: np.ndarray, bwd_work: np.ndarray,
                   share: np.ndarray | float = 0.0, chunks: float = 1.0
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Exposed per-micro-batch ZeRO-2/3 collectives (fwd, bwd), exposed per-iteration sync and
    the optimizer step of a sub-stage (the module docstring says what overlaps); ``share``:
    the recomputed fraction of its layers; ``chunks``: model chunks per rank (``v`` under the
    interleaved schedule, else 1). Weights travel as stored (FP8 with
    ``ti.fp8_params``, else 16-bit), gradients in the gradient buffer's type."""
    coll, steps, nb, local = _collectives(ti, cfg, layers, emb, head)
    z3, z2 = cfg.zero >= 3, cfg.zero == 2
    w_bytes, g_bytes = weight_bytes(ti.fp8_params, ti.fp8_params), ti.grad_bytes
    gather = np.where(z3, coll(w_bytes) + steps, 0.0)
    scatter = np.where(z3, coll(g_bytes) + steps, np.where(z2, coll(g_bytes), 0.0))
    again = regathered_share(ti, cfg, share)
    z_fwd, z_bwd = gather, gather * (1.0 + again) + scatter
    if ti.overlap:  # prefetched gathers, bucketed reduce-scatters (DeepSpeed, FSDP)
        hides = ti.calib.zero3_prefetch | ~z3  # 2021 DeepSpeed's ZeRO-3 waited for each
        z_fwd = np.where(hides, hide(z_fwd, fwd_work, nb), z_fwd)
        z_bwd = np.where(hides, hide(z_bwd, bwd_work, nb), z_bwd)
    grads = np.where(cfg.zero == 0, coll(g_bytes, 2.0), np.where(z3 | z2, 0.0, coll(g_bytes)))
    weights = np.where((cfg.zero >= 1) & ~z3, coll(w_bytes), 0.0)
    if ti.profile.overlap_grad_reduce:
        grads = (hide_interleaved(grads, bwd_work, nb, chunks, cfg.pp, False) if chunks > 1
                 else hide(grads, bwd_work, nb))
    if ti.profile.overlap_param_gather:
        weights = (hide_interleaved(weights, fwd_work, nb, chunks, cfg.pp, True) if chunks > 1
                   else hide(weights, fwd_work, nb))
    optimizer = ti.calib.optimizer_bytes * local / ti.links.hbm_bw
    return z_fwd, z_bwd, grads + weights, optimizer
