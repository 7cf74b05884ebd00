"""The four pruning rules of the seed note (eqs. 2–4 and the interface check), plus safe variants.

Each rule is one function. "Provably safe" means: the rule cannot remove every optimal plan of the
planner's own problem (same cost model, same composition objective). "Heuristic" means it can,
and ``tangram verify`` measures whether it did.

Lower bounds used by the safe variants (``lb``): a stage holding ``ℓ`` layers on island ``k`` needs
at least ``ℓ · w / C_k`` seconds per micro-batch, with ``w`` the forward+backward matmul FLOPs of
one layer on one micro-batch and ``C_k`` the island's peak FLOP/s at the job's precision (FP8
where its GPUs run it: :func:`peak_flops`); the cost model never beats peak (its GEMM
efficiency is below 1), so ``τ_k(ℓ) ≥ lb`` (checked by the tests on every entry, FP8 too).
Any plan satisfies ``T ≥ n · max(stage latencies, link times)``.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from solver.cost.memory import GRAD_BYTES, OPTIMIZER_BYTES, WEIGHT_BYTES, least_state_bytes
from solver.cost.reserve import usable_bytes
from solver.spec.domain import Island, ModelSpec, Precision, Pruning

STATE_BYTES_PER_PARAM = WEIGHT_BYTES + GRAD_BYTES + OPTIMIZER_BYTES


class Rule(enum.Flag):
    """Switchable pruning rules."""

    NONE = 0
    DEDUPE = enum.auto()          #: rule 1, eq. 2 — provably safe
    BALANCE = enum.auto()         #: rule 2, eq. 3 — heuristic
    MEMORY = enum.auto()          #: rule 3, eq. 4 — provably safe (our lower bound)
    INTERFACE = enum.auto()       #: rule 4 — heuristic
    BALANCE_SAFE = enum.auto()    #: rule 2 replaced by a lower bound on T — provably safe
    INTERFACE_SAFE = enum.auto()  #: rule 4 replaced by a lower bound on T — provably safe

    @classmethod
    def paper(cls) -> "Rule":
        """All four rules as the paper states them."""
        return cls.DEDUPE | cls.BALANCE | cls.MEMORY | cls.INTERFACE

    @classmethod
    def safe(cls) -> "Rule":
        """The provably safe set."""
        return cls.DEDUPE | cls.MEMORY | cls.BALANCE_SAFE | cls.INTERFACE_SAFE

    @classmethod
    def of(cls, pruning: Pruning) -> "Rule":
        """The rules a job's ``[planner] pruning`` names."""
        return cls.safe() if pruning is Pruning.SAFE else cls.paper()

    @property
    def heuristic(self) -> bool:
        """Whether a rule that may drop the optimum (2 or 4) is among them."""
        return bool(self & (Rule.BALANCE | Rule.INTERFACE))

    @property
    def label(self) -> str:
        """Short label for tables, e.g. ``1,2,3,4`` or ``1,2s,3,4s``."""
        names = {Rule.DEDUPE: "1", Rule.BALANCE: "2", Rule.BALANCE_SAFE: "2s",
                 Rule.MEMORY: "3", Rule.INTERFACE: "4", Rule.INTERFACE_SAFE: "4s"}
        return ",".join(v for k, v in names.items() if k in self) or "none"


def dedupe_slices(layers: int, length: int, dedupe: bool) -> list[tuple[int, int]]:
    """Rule 1 (eq. 2), provably safe: which slices ``[a, b)`` of one length to plan.

    Every Transformer layer has the same shape, so a slice's plan depends on its length and its
    position (embedding / LM head), never on which layers it holds: one representative per
    (length, position) suffices. Without the rule every ``(a, b)`` is planned (and the results are
    identical, which ``tangram verify`` checks). Returns representative ``(a, b)`` pairs.
    """
    starts = range(0, layers - length + 1)
    if not dedupe:
        return [(a, a + length) for a in starts]
    reps: dict[tuple[bool, bool], tuple[int, int]] = {}
    for a in starts:
        reps.setdefault((a == 0, a + length == layers), (a, a + length))
    return list(reps.values())


def balance_window(islands: tuple[Island, ...], island: Island, layers: int,
                   beta: float) -> tuple[int, int]:
    """Rule 2 (eq. 3), heuristic: lengths within a factor β of the compute-proportional share.

    ``island`` is a stage's group (:func:`solver.islands.group_island`; a whole island is the
    group of all its nodes). Its share ``L · C_g / ΣC`` counts every GPU of ``islands``, so the
    rule assumes all nodes are used; a plan that leaves a weak island idle gives the others more
    than their share, and the rule can drop it (the extreme-heterogeneity jobs show this).
    Returns the inclusive window ``[lo, hi]``.
    """
    share = layers * island.total_tflops / sum(i.total_tflops for i in islands)
    lo = max(1, math.ceil(share / beta - 1e-9))
    hi = min(layers, math.floor(share * beta + 1e-9))
    return lo, hi


def layer_work_flops(model: ModelSpec, micro_batch: int, seq_len: int) -> float:
    """Forward+backward matmul FLOPs of one layer on one micro-batch (``6 · params · tokens``)."""
    return 6.0 * (model.active_params_per_layer - model.norm_params) * micro_batch * seq_len


def precision_speedup(island: Island, precision: Precision) -> float:
    """How much faster than their 16-bit peak the GEMMs of ``island`` may run at
    ``precision``: the largest ratio over its GPU models (1 for BF16; 2 for FP8 on Hopper)."""
    if precision is Precision.BF16:  # the figure islands are rated at
        return 1.0
    return max(max(g.peak_tflops(precision), g.peak_tflops(Precision.BF16))
               / g.peak_tflops(Precision.BF16) for g in island.gpu_types)


def peak_flops(island: Island, precision: Precision = Precision.BF16) -> float:
    """FLOP/s of ``island`` at its GEMM peak: the 16-bit figure, raised where the job's
    ``precision`` runs faster on its GPUs (FP8 on Hopper: no stage's GEMMs beat it)."""
    return island.total_tflops * 1e12 * precision_speedup(island, precision)


def stage_time_lb(island: Island, length: int, work: float,
                  precision: Precision = Precision.BF16) -> float:
    """Lower bound on the per-micro-batch latency of ``length`` layers on ``island`` (s), for
    a job training at ``precision``."""
    return length * work / peak_flops(island, precision)


def bound_window(islands: tuple[Island, ...], island: Island, layers: int, work: float,
                 n_micro: int, upper: float, precision: Precision = Precision.BF16
                 ) -> tuple[int, int]:
    """Rule 2, safe variant: lengths that a plan better than ``upper`` could give a stage group.

    ``island`` is the stage's group. A length ``ℓ`` is dropped when ``n · ℓ·w/C_g > upper``
    (the stage alone is too slow: ``T >= n · max τ``) or when ``n · (L − ℓ)·w / (ΣC − C_g) >
    upper`` (every other GPU of the cluster together cannot absorb the rest fast enough: the
    slowest of the other stages holds at least their average). ``upper`` is the objective of a
    feasible plan, so no plan as good as it is dropped: provably safe.
    """
    own = peak_flops(island, precision)  # once: the loop below runs for every group
    others = sum(peak_flops(i, precision) for i in islands) - own
    ok = []
    for length in range(1, layers + 1):
        mine = n_micro * (length * work / own)  # n · stage_time_lb
        rest = n_micro * (layers - length) * work / others if others else (
            0.0 if length == layers else math.inf)
        if max(mine, rest) <= upper * (1 + 1e-12):
            ok.append(length)
    return (min(ok), max(ok)) if ok else (layers + 1, 0)


def job_state_bytes(job) -> float:
    """The job's fewest model-state bytes per parameter (its gradient buffers and weights)."""
    return least_state_bytes(job.training.grad_reduce_bf16, job.training.fp8_param_gather)


def memory_cap(model: ModelSpec, island: Island, epsilon: float, embedding: bool,
               head: bool, state_bytes: float = STATE_BYTES_PER_PARAM) -> int:
    """Rule 3 (eq. 4), provably safe: the longest slice whose model state could fit at all.

    Whatever the configuration, the slice's weights, gradients and Adam state (18 B/param) are
    spread over at most the island's ``N`` GPUs, so one GPU holds at least ``18 · P / N`` bytes;
    activations and their fragmentation only add to it. A length whose bound exceeds the usable
    bytes (:func:`~solver.cost.reserve.usable_bytes`: ``(1 − ε)`` of the device's memory less
    the runtime's reserves) cannot fit, and the parallelizer would return nothing for it. (The
    paper's eq. 4 counts only bf16 weights; the 1F1B in-flight activations are checked exactly
    by the parallelizer for each position.) ``state_bytes``: the job's fewest bytes per
    parameter (:func:`~solver.cost.memory.least_state_bytes`: less than 18 with bf16 gradients
    or FP8 weights).
    """
    budget = usable_bytes(island, epsilon) * island.gpus / state_bytes
    extra = (model.embedding_params if embedding else 0) + (model.head_params if head else 0)
    room = budget - extra
    return max(0, min(model.layers, math.floor(room / model.params_per_layer)))


@dataclass(frozen=True)
class LinkModel:
    """Pipeline-boundary transfer between islands.

    Attributes
    ----------
    bytes_per_micro : float
        Activations forward plus their gradients backward per micro-batch (``2 · b·s·h·2``).
    gbits_per_gpu : float | None
        Per-GPU bandwidth between islands (None: the smaller NIC of the pair).
    """

    bytes_per_micro: float
    gbits_per_gpu: float | None

    def time(self, a: Island, b: Island) -> float:
        """Seconds per micro-batch from ``a`` to ``b``: each GPU sends its shard of the boundary
        activations (sequence-parallel layouts shard them over every GPU of the stage), so
        ``min(N_a, N_b)`` streams run in parallel; resharding between different (tp, cp, dp)
        layouts only changes who receives which shard, not the bytes on the wire."""
        return self.rate(a, b) / min(a.gpus, b.gpus)

    def rate(self, a: Island, b: Island) -> float:
        """Seconds × GPUs per micro-batch: the transfer over one GPU's link (a stage boundary of
        ``G`` GPUs a side takes ``rate / G``). Inside one island the nodes' NICs carry it, between
        islands the cluster's inter-island bandwidth (or the smaller NIC of the pair)."""
        if a.name == b.name:
            gbits = a.nic_gbits
        else:
            gbits = self.gbits_per_gpu or min(a.nic_gbits, b.nic_gbits)
        return self.bytes_per_micro / (gbits / 8 * 1e9)


def interface_bans(links: dict[tuple[str, str], float], reference: float,
                   threshold: float = 0.5) -> frozenset[tuple[str, str]]:
    """Rule 4, heuristic: drop island pairs whose boundary transfer exceeds ``threshold`` times
    a balanced stage's compute time ``reference``. A slow link may still belong to the optimum
    (when the alternative is leaving a strong island out), so this can lose it."""
    return frozenset(p for p, c in links.items() if c > threshold * reference)


def interface_bans_safe(links: dict[tuple[str, str], float], n_micro: int,
                        upper: float) -> frozenset[tuple[str, str]]:
    """Rule 4, safe variant: a link is a pipeline stage of its own, so using it costs at least
    ``n · c``; pairs with ``n · c > upper`` cannot be in a plan as good as ``upper``."""
    return frozenset(p for p, c in links.items() if n_micro * c > upper * (1 + 1e-12))
