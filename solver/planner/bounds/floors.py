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
  causal half at ``attention_eff`` of the 16-bit peak at most (the cost model also derates it by
  the in-training fraction, at most 1, which the floor leaves out), so per counted FLOP it runs
  at ``2 · attention_eff`` of peak, above the GEMM ceiling (1.16 on Hopper); an unfused core runs
  the whole square at the calibration's ``unfused_attention_eff``, at most the upper end of
  its fitting range. Charging attention at the GEMM rate put the floor above real plans at
  long context (Llama 3 8B at 128k tokens on 128 H200: floor 5.18 s, plan 4.72 s).
* Memory-bound operators (with the calibration): ``elementwise_bytes`` per hidden element
  and token through HBM, whatever the layout (tensor parallelism splits them, and the GPUs).
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Sequence

import numpy as np

from solver.cost.calibrate.calibration import BOUNDS
from solver.cost.efficiency import Calibration, GemmKernel
from solver.cost.parallelizer import kernel_calibration
from solver.cost.flops import attention_flops_per_token, model_flops_per_token
from solver.planner.pruning import precision_speedup
from solver.spec.domain import Island, JobSpec, ModelSpec, Precision

if TYPE_CHECKING:  # annotations only (the runs are built in solver.planner.stages.runs)
    from solver.planner.stages.runs import PlanningRun

__all__ = ["kernel_rates", "kernel_floor", "compute_floor", "usable_nodes", "pipeline_floor",
           "view_floor"]

_UNBOUNDED_ROWS = 1e15  # a GEMM's token rows, above any micro-batch


def _dense_gemm_seconds(model: ModelSpec, island: Island, rate: float, ceiling: float,
                        calib: Calibration, shapes: tuple[np.ndarray, np.ndarray] | None = None
                        ) -> float:
    """GPU-seconds per token of one dense layer's GEMMs, forward and backward, each at the
    cost model's efficiency of its widest shape (QKV, output, MLP up and down projections);
    the fixed cost per kernel is left out (it only adds time).

    ``shapes``: the layouts a stage may use, as arrays of GEMM rows (a rank's tokens per
    micro-batch) and tensor-parallel degrees; the layer then costs at least the least of
    them at their own shapes (tensor parallelism narrows the QKV and MLP-up columns and the
    output and MLP-down inner dimension). None: rows without limit, no tensor parallelism."""
    h, q, kv = model.hidden, model.heads * model.d_head, model.kv_heads * model.d_head
    up = 2 if model.gated_mlp else 1
    rows, tp = (np.array([_UNBOUNDED_ROWS]), np.ones(1)) if shapes is None else shapes
    # The curve at the floor's ceiling (the largest of the island's, at any precision).
    curve = dataclasses.replace(GemmKernel.of(island, Precision.BF16, calib), ceiling=ceiling)

    def one(flops: float, cols: np.ndarray, inner: np.ndarray) -> np.ndarray:
        return flops / (rate / ceiling * curve.efficiency(rows, cols, inner))

    total = 3.0 * (one(2 * h * (q + 2 * kv), (q + 2 * kv) / tp, h) + one(2 * q * h, h, q / tp)
                   + one(2 * h * up * model.ffn, up * model.ffn / tp, h)
                   + one(2 * model.ffn * h, h, model.ffn / tp))
    return float(total.min()) if total.size else math.inf  # no layout: no stage


def kernel_rates(job: JobSpec, island: Island, calib: Calibration | None = None,
                 shapes: tuple[np.ndarray, np.ndarray] | None = None
                 ) -> tuple[float, float, float]:
    """What :func:`kernel_floor` scales by the tokens each GPU works on: one layer's seconds per
    token at the module's rates, the LM head's FLOPs per token and the GEMM rate it runs at.
    They depend on the island's GPUs, not its size or the batch, so a caller may keep them."""
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
            layer += _dense_gemm_seconds(m, island, gemm_rate, ceiling, calib, shapes) \
                - gemm / gemm_rate
        layer += 3.0 * calib.elementwise_bytes * m.hidden / (island.hbm_bw_gbs * 1e9 *
                                                             calib.hbm_eff)
    return layer, head, gemm_rate


def kernel_floor(job: JobSpec, island: Island, nodes: int,
                 calib: Calibration | None = None,
                 shapes: tuple[np.ndarray, np.ndarray] | None = None,
                 rates: tuple[float, float, float] | None = None) -> tuple[float, float]:
    """Seconds per iteration of one Transformer layer and of the LM head on ``nodes`` nodes of
    ``island`` at the module's rates (``calib``: the parallelizer's calibration, for the
    size-dependent GEMM efficiency and the memory-bound operators; None: ceilings only;
    ``shapes``: the GEMM rows and tensor-parallel degrees of the layouts a stage may use,
    :func:`_dense_gemm_seconds`; dense models only; ``rates``: :func:`kernel_rates` of the
    same arguments, when known). Provably safe for the analytic cost model."""
    layer, head, gemm_rate = rates or kernel_rates(job, island, calib, shapes)
    per_gpu = job.training.tokens / (nodes * island.gpus_per_node)
    return per_gpu * layer, per_gpu * head / gemm_rate


def compute_floor(job: JobSpec, island: Island, nodes: int,
                  calib: Calibration | None = None) -> float:
    """Seconds per iteration no plan on ``nodes`` nodes of ``island`` beats: every layer and
    the LM head at :func:`kernel_floor`'s rates."""
    layer, head = kernel_floor(job, island, nodes, calib)
    return job.model.layers * layer + head


def usable_nodes(nodes: int, sizes: Sequence[int]) -> int:
    """The most of ``nodes`` nodes that disjoint groups of the given ``sizes`` (each size any
    number of times) can cover: an unbounded subset sum, on the bits of one integer (bit ``t``
    set: some groups cover exactly ``t`` nodes), ``O(len(sizes) · log nodes)`` shifts."""
    mask, reach = (1 << (nodes + 1)) - 1, 1
    for s in sorted({s for s in sizes if 0 < s <= nodes}):
        shift = s
        while shift <= nodes:  # after shifts s, 2s, 4s, ...: every count of s groups up to here
            reach |= (reach << shift) & mask
            shift *= 2
    return reach.bit_length() - 1


def pipeline_floor(job: JobSpec, islands: Sequence[Island], n: int,
                   calib: Calibration | None = None,
                   usable: Sequence[int] | None = None,
                   rates: Sequence[tuple[float, float, float]] | None = None) -> float:
    """Seconds per iteration no plain 1F1B pipeline of ``n`` micro-batches over groups of
    ``islands`` beats (provably safe).

    ``islands[i]`` is the largest group a stage may have on island ``i`` (the whole island
    when any fraction of it may be a group) and ``usable[i]`` the most nodes of island ``i``
    its stages' groups can cover together (:func:`usable_nodes` of the group sizes a layout
    admits; default: the group's node count). All groups of an island have the same per-GPU
    figures (a group is the island's effective node repeated), so a layer costs
    ``c_i · G_i / g`` on a group of ``g`` nodes, ``c_i`` and ``h_i`` being one layer's and the
    LM head's seconds per iteration on the largest group of ``G_i`` nodes (:func:`kernel_floor`).

    With ``L`` layers and stage latencies ``τ``: a stage of ``x`` layers on ``g`` nodes of
    island ``i`` needs ``n τ >= (x c_i + h_i [it holds the head]) · G_i / g``, and the groups
    are disjoint (``Σ g <= U_i`` per island), so summing ``x <= (n τ g / G_i − h_i [head]) /
    c_i`` over the stages gives ``n max τ >= (L + min_i h_i / c_i) / Σ_i U_i / (G_i c_i)`` (the
    layers and the head share the GPUs); every stage lies on one group of at most ``G_i``
    nodes, so ``n Σ τ >= L min c + min h``. Hence ``T >= (n − 1) · max τ + Σ τ`` is at least
    their sum. Boundary transfers and the per-iteration terms only add to it. ``rates``: each
    island's :func:`kernel_rates`, when the caller keeps them.
    """
    known = rates if rates is not None else [None] * len(islands)
    parts = [kernel_floor(job, i, len(i.nodes), calib, rates=r) for i, r in zip(islands, known)]
    share = [1.0] * len(parts) if usable is None else \
        [u / len(i.nodes) for u, i in zip(usable, islands)]
    layers = job.model.layers
    spread = (layers + min(h / c for c, h in parts)) / sum(f / c for (c, _), f in zip(parts, share))
    alone = layers * min(c for c, _ in parts) + min(h for _, h in parts)
    return ((n - 1) * spread + alone) / n


def view_floor(run: "PlanningRun") -> float:
    """Seconds per iteration no plan of ``run``'s view beats: the fill and drain of a pipeline
    of ``run.n_micro`` micro-batches whose kernels run at the fastest rates the run's
    parallelizer prices them, on the groups a layout admits at the run's micro-batch
    (:func:`pipeline_floor` over each island's largest such group and
    the most nodes such groups cover, :func:`usable_nodes`; provably
    safe; infinite when no island admits a group). A view whose floor is not below what a
    run must beat is dismissed before its table is built: the whole-cluster view (its weakest
    GPUs' figures) once a plan of the islands is known, small ``n_micro``, whose fill and
    drain alone are too slow, and an ``n_micro`` whose micro-batch the data-parallel degrees
    of few group sizes divide, which leaves nodes idle."""
    largest, usable = [], []
    for island in run.islands.islands:
        sizes = run.cache.sizes(island.name, run.features)
        if sizes:
            largest.append(run.cache.group(island.name, max(sizes)))
            usable.append(usable_nodes(len(island.nodes), sizes))
    if not largest:
        return math.inf
    calib = kernel_calibration(run.cache.parallelizer)
    return pipeline_floor(run.job, largest, run.n_micro, calib, usable,
                          [_kernel_rates(run, group, calib) for group in largest])


def _kernel_rates(run: "PlanningRun", group: Island, calib: Calibration | None
                  ) -> tuple[float, float, float]:
    """:func:`kernel_rates` of ``group``, remembered by a parallelizer
    that remembers (the replica search's memo: every share and n_micro of an island set reads
    the same groups' rates)."""
    remember = getattr(run.cache.parallelizer, "remember", None)
    if remember is None:
        return kernel_rates(run.job, group, calib)
    training = run.job.training
    return remember(("kernel rates", training.seq_len, training.precision), group,
                    lambda: kernel_rates(run.job, group, calib))
