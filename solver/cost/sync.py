"""Data-parallel and ZeRO communication of one sub-stage, as the framework schedules it.

Per iteration (Rajbhandari et al. 2020; the Scaling Book, seeds/004): without ZeRO the fp32
gradients are all-reduced over the ``dp·cp`` replicas; ZeRO-1 reduce-scatters them once and
all-gathers the 16-bit weights after the step; ZeRO-2 must reduce-scatter every micro-batch;
ZeRO-3 also gathers the weights every micro-batch. Collectives run on NVLink inside a node and on
``k`` rails across nodes (:meth:`~solver.cost.efficiency.Links.data_parallel`). Overlap is the
framework's, bucket by bucket (:func:`hide`); :mod:`solver.cost.stage_costs` says more.
"""

from __future__ import annotations

import numpy as np

from solver.cost.efficiency import ring_time
from solver.cost.memory import GRAD_BYTES, WEIGHT_BYTES, param_counts
from solver.cost.stage import ConfigArrays
from solver.cost.timing import TimeInputs


def hide(comm: np.ndarray, window: np.ndarray, buckets: np.ndarray) -> np.ndarray:
    """Exposed part of a bucketed collective ``comm`` overlapped with ``window`` seconds of
    compute: every bucket but the last hides behind the work that follows it."""
    return np.maximum(comm - window * (1.0 - 1.0 / buckets), comm / buckets)


def _collectives(ti: TimeInputs, cfg: ConfigArrays, layers: np.ndarray, emb: np.ndarray,
                 head: np.ndarray):
    """``coll(bytes_per_param, factor)`` over the sub-stage's data-parallel groups (dense and
    expert), the gradient bucket count and the locally updated parameters."""
    dense, expert = param_counts(ti.model, cfg, layers, emb, head)
    q_dense = cfg.dp * cfg.cp
    q_expert = q_dense // cfg.ep
    bw_d, lat_d = ti.links.data_parallel(cfg.tp, q_dense)
    bw_e, lat_e = ti.links.data_parallel(cfg.tp * cfg.ep, q_expert)

    def coll(bytes_per_param: float, factor: float = 1.0) -> np.ndarray:
        # No expert weights (a dense model, or no layer here): no expert collective to run.
        experts = np.where(expert > 0, ring_time(bytes_per_param * expert, q_expert, bw_e,
                                                 lat_e, factor), 0.0)
        return ring_time(bytes_per_param * dense, q_dense, bw_d, lat_d, factor) + experts

    buckets = np.maximum(np.ceil((dense + expert) / ti.profile.bucket_params(cfg.dp)), 1.0)
    local = np.where(cfg.zero >= 1, dense / q_dense + expert / q_expert, dense + expert)
    return coll, buckets, local


def _zero_and_sync(ti: TimeInputs, cfg: ConfigArrays, layers: np.ndarray, emb: np.ndarray,
                   head: np.ndarray, fwd_work: np.ndarray, bwd_work: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Exposed per-micro-batch ZeRO-2/3 collectives (fwd, bwd), exposed per-iteration sync and
    the optimizer step of a sub-stage (the module docstring says what overlaps)."""
    coll, nb, local = _collectives(ti, cfg, layers, emb, head)
    z3, z2 = cfg.zero >= 3, cfg.zero == 2
    gather = np.where(z3, coll(WEIGHT_BYTES), 0.0)
    scatter = np.where(z3 | z2, coll(GRAD_BYTES), 0.0)
    z_fwd, z_bwd = gather, gather + scatter
    if ti.overlap:  # prefetched gathers, bucketed reduce-scatters (DeepSpeed, FSDP)
        z_fwd, z_bwd = hide(z_fwd, fwd_work, nb), hide(z_bwd, bwd_work, nb)
    grads = np.where(cfg.zero == 0, coll(GRAD_BYTES, 2.0),
                     np.where(z3 | z2, 0.0, coll(GRAD_BYTES)))
    weights = np.where((cfg.zero >= 1) & ~z3, coll(WEIGHT_BYTES), 0.0)
    if ti.profile.overlap_grad_reduce:
        grads = hide(grads, bwd_work, nb)
    if ti.profile.overlap_param_gather:
        weights = hide(weights, fwd_work, nb)
    optimizer = ti.calib.optimizer_bytes * local / ti.links.hbm_bw
    return z_fwd, z_bwd, grads + weights, optimizer
