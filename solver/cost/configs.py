"""The configuration space of one stage: which (tp, cp, pp, dp, ep) × ZeRO × recomputation ×
offload the parallelizer evaluates, under the job's features, its framework's profile and the
user's constraints (:mod:`solver.cost.parallelizer` prices them)."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

import numpy as np

from solver.cost.runtime.frameworks import (a2a_overlap_problem, cp_allowed,
                                            expert_parallel_sizes, megatron_fsdp,
                                            megatron_interleaves, profile, tp_allowed,
                                            zero_choices)
from solver.cost.partial import PlanContext
from solver.cost.stage import RECOMPUTE_CODES, ConfigArrays, ModelSlice
from solver.spec.domain import (Constraints, FeaturePreset, Framework, Island, ModelSpec, Recompute,
                                Schedule)

_ALL_RC = (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)


@dataclass(frozen=True)
class FeatureSet:
    """What a parallelizer may use besides TP, PP and DP.

    Attributes
    ----------
    cp, ep, offload : bool
        Context parallelism, expert parallelism, activation offload.
    zero : tuple[int, ...]
        Allowed ZeRO stages.
    recompute : tuple[Recompute, ...]
        Allowed recomputation strategies.
    """

    cp: bool
    ep: bool
    zero: tuple[int, ...]
    recompute: tuple[Recompute, ...]
    offload: bool

    @classmethod
    def of(cls, preset: FeaturePreset) -> "FeatureSet":
        """Capabilities after the seed note's comparison table (TP/PP/DP always on).

        ``alpa``: TP/PP/DP. ``galvatron``: + CP, ZeRO, RC. ``aceso``: + RC (per operator;
        modelled as selective or full). ``mist``: + RC, offload, ZeRO (and gradient accumulation,
        which every preset has through micro-batching). ``metis``: TP/PP/DP, no RC, no ZeRO.
        ``full``: everything, including EP.
        """
        none = (Recompute.NONE,)
        table = {
            FeaturePreset.FULL: cls(True, True, (0, 1, 2, 3), _ALL_RC, True),
            FeaturePreset.ALPA: cls(False, False, (0,), none, False),
            FeaturePreset.GALVATRON: cls(True, False, (0, 1, 2, 3), _ALL_RC, False),
            FeaturePreset.ACESO: cls(False, False, (0,), _ALL_RC, False),
            FeaturePreset.MIST: cls(False, False, (0, 1, 2, 3), _ALL_RC, True),
            FeaturePreset.METIS: cls(False, False, (0,), none, False),
        }
        return table[preset]

    @classmethod
    def of_framework(cls, framework: Framework, pipelined: bool) -> "FeatureSet":
        """What ``framework`` runs on a stage of a pipelined (or single-stage) plan (before the
        ZeRO reduction of :func:`~solver.cost.runtime.frameworks.zero_choices`)."""
        prof = profile(framework)
        return cls(prof.cp, prof.ep, prof.zero_stages(pipelined), prof.recompute, prof.offload)

    def meet(self, other: "FeatureSet") -> "FeatureSet":
        """Features both sets allow."""
        return FeatureSet(self.cp and other.cp, self.ep and other.ep,
                          tuple(z for z in self.zero if z in other.zero),
                          tuple(r for r in self.recompute if r in other.recompute),
                          self.offload and other.offload)


def _powers_of_two(limit: int) -> list[int]:
    return [1 << i for i in range(limit.bit_length()) if (1 << i) <= limit]


def _tp_options(model: ModelSpec, gpus: int, framework: Framework | None = None) -> list[int]:
    """TP degrees that shard heads, hidden and MLP widths evenly; KV heads split, or replicate
    where the framework allows it (:func:`~solver.cost.runtime.frameworks.tp_allowed`; without a
    framework: either)."""
    widths = [model.hidden, model.ffn] + ([model.expert_ffn] if model.is_moe else [])
    kv_ok = (lambda t: model.kv_heads % t == 0 or t % model.kv_heads == 0) if framework is None \
        else (lambda t: tp_allowed(profile(framework), model.kv_heads, t))
    return [t for t in _powers_of_two(gpus)
            if model.heads % t == 0 and all(w % t == 0 for w in widths) and kv_ok(t)]


def tp_degrees(model: ModelSpec, gpus: int, framework: Framework | None = None) -> list[int]:
    """The TP degrees the parallelizer tries for ``model`` on groups of up to ``gpus`` GPUs
    (a node's): powers of two that shard heads and widths evenly, KV heads by ``framework``'s
    rule. Public for the planner's reasons (why ``[constraints] tp`` leaves nothing)."""
    return _tp_options(model, gpus, framework)


def _interleavable(slc: ModelSlice, ctx: PlanContext, pp: int) -> bool:
    """Whether the runtime runs ``pp`` internal stages under the context's schedule: always for
    plain 1F1B, by Megatron's rule (:func:`megatron_interleaves`) with virtual stages."""
    v = ctx.virtual_stages
    if ctx.schedule is not Schedule.INTERLEAVED or v == 1:
        return True
    return megatron_interleaves(slc.layers, pp, v, ctx.n_micro)


def _layouts(slc: ModelSlice, island: Island, ctx: PlanContext, feats: FeatureSet
             ) -> list[tuple[int, int, int, int, int, int]]:
    """All consistent ``(tp, cp, pp, dp, ep, expert_tp)`` for the island and context
    (``expert_tp`` 0: equal to ``tp``)."""
    model, gpus = slc.model, island.gpus
    cps = [c for c in _powers_of_two(gpus) if ctx.seq_len % (2 * c) == 0] if feats.cp else [1]
    out = []
    # A TP group never leaves a node: its per-layer collectives need NVLink (seed note, Sec. 2).
    for tp, cp in itertools.product(_tp_options(model, min(gpus, island.gpus_per_node),
                                                ctx.framework), cps):
        if gpus % (tp * cp):
            continue
        rest = gpus // (tp * cp)
        for pp in range(1, min(ctx.max_pp, slc.layers, rest) + 1):
            dp = rest // pp
            if rest % pp or ctx.micro_batch % dp or not _interleavable(slc, ctx, pp):
                continue
            grid = _expert_grids(model, tp, cp, dp, ctx) if feats.ep and model.is_moe else [(1, 0)]
            out.extend((tp, cp, pp, dp, ep, etp) for ep, etp in grid)
    return out


def _expert_grids(model: ModelSpec, tp: int, cp: int, dp: int, ctx: PlanContext
                  ) -> list[tuple[int, int]]:
    """``(ep, expert_tp)`` of a stage (``expert_tp`` 0: equal to ``tp``).

    With a framework, its expert grid (:func:`~solver.cost.runtime.runtime_rules.
    expert_parallel_sizes`) for every expert-TP degree dividing ``tp``: the runtimes take any
    ``--expert-tensor-parallel-size``, the search keeps the divisors of ``tp`` (an expert never
    split wider than the attention). Without a framework, EP dividing the experts and ``dp·cp``
    at expert-TP = TP.
    """
    if ctx.framework is None:
        return [(e, 0) for e in range(1, model.experts + 1)
                if model.experts % e == 0 and (dp * cp) % e == 0]
    prof = profile(ctx.framework)
    etps = [d for d in range(tp, 0, -1) if tp % d == 0] if prof.expert_grid else [tp]
    return [(e, 0 if etp == tp else etp)
            for etp in etps
            for e in expert_parallel_sizes(prof, model.experts, tp, cp, dp, ctx.precision,
                                           expert_tp=etp)]


def multi_mesh_cp(framework: Framework | None, cp: np.ndarray) -> np.ndarray:
    """Rows a stage of a plan of several meshes may use: context parallelism only where the
    framework runs it across meshes (:func:`~solver.cost.runtime.frameworks.cp_allowed`)."""
    if framework is None or cp_allowed(profile(framework), 2):
        return np.ones(cp.shape, dtype=bool)
    return cp == 1


def enumerate_configs(slc: ModelSlice, island: Island, ctx: PlanContext, feats: FeatureSet
                      ) -> ConfigArrays:
    """Every configuration of the space, as arrays (layouts x ZeRO x recompute x offload).

    With ``ctx.framework`` the features are met with its profile, row by row: a whole-model
    slice without internal pipelining is a single-stage plan, every other row is pipelined.
    A configuration without replicas (``dp·cp = 1``) is enumerated once, as ZeRO-0. FP8
    weights (``ctx.fp8_param_gather``) keep only ZeRO ≥ 1 where there are replicas.
    """
    feats = feats if ctx.framework is None else feats.meet(framework_features(ctx.framework))
    base = np.array(_layouts(slc, island, ctx, feats), dtype=np.int64).reshape(-1, 6)
    rc = np.array([RECOMPUTE_CODES.index(r) for r in feats.recompute], dtype=np.int64)
    off = np.array([False, True] if feats.offload else [False])
    grid = np.array(list(itertools.product(feats.zero, rc, off)), dtype=np.int64).reshape(-1, 3)
    b = np.repeat(base, len(grid), axis=0)
    g = np.tile(grid, (len(base), 1))
    tp, cp, pp, dp, ep, etp = b.T
    replicas = dp * cp > 1
    keep = replicas | (g[:, 0] == (feats.zero[0] if feats.zero else 0))
    if ctx.framework is not None:
        keep &= _zero_allowed(ctx.framework, g[:, 0], pp, slc.is_whole, feats.zero) | ~replicas
        if not slc.is_whole:  # a stage of a pipeline of several meshes
            keep &= multi_mesh_cp(ctx.framework, cp)
    if ctx.fp8_param_gather:  # FP8 weights need the distributed optimizer (validate_args)
        keep &= (g[:, 0] >= 1) | ~replicas
    zero = np.where(replicas, g[:, 0], 0)
    if ctx.constraints is not None:
        keep &= _constrained(ctx.constraints, b, zero, g, ctx.micro_batch // np.maximum(dp, 1))
        keep &= _at_the_ends(ctx.constraints, slc, tp, dp)
    out = ConfigArrays(tp=tp[keep], cp=cp[keep], ep=ep[keep], pp=pp[keep], dp=dp[keep],
                       zero=zero[keep], recompute=g[keep, 1], offload=g[keep, 2].astype(bool),
                       micro_batch=ctx.micro_batch // dp[keep], expert_tp=etp[keep])
    return _with_a2a_overlap(out, slc, ctx, feats)


def _with_a2a_overlap(cfg: ConfigArrays, slc: ModelSlice, ctx: PlanContext, feats: FeatureSet
                      ) -> ConfigArrays:
    """``cfg`` followed by a copy, with the MoE all-to-all overlap on, of every row whose
    runtime runs it (:func:`~solver.cost.runtime.runtime_rules.a2a_overlap_problem`): a
    whole-model slice (one mesh) without internal pipelining, or with it under the interleaved
    schedule. Not dominated: the overlap holds more activations (:mod:`solver.cost.a2a_overlap`).
    ``[constraints] a2a_overlap = false`` leaves it out."""
    if (ctx.framework is None or not feats.ep or not slc.model.is_moe
            or (ctx.constraints is not None and ctx.constraints.a2a_overlap is False)):
        return cfg
    prof = profile(ctx.framework)
    piped = (np.asarray(cfg.pp) > 1) | (not slc.is_whole)
    interleaved = ctx.schedule is Schedule.INTERLEAVED and slc.is_whole
    v = ctx.virtual_stages if interleaved else 1
    fsdp = np.broadcast_to(megatron_fsdp(ctx.framework, cfg), piped.shape)
    rows = np.zeros(len(cfg), dtype=bool)
    for key in set(zip(cfg.ep.tolist(), cfg.recompute.tolist(), piped.tolist(), fsdp.tolist())):
        e, r, p, z = key
        if a2a_overlap_problem(prof, True, e, RECOMPUTE_CODES[r], p, z, v) is None:
            rows |= (cfg.ep == e) & (cfg.recompute == r) & (piped == p) & (fsdp == z)
    if not rows.any():
        return cfg
    extra = cfg.take(rows)
    return cfg.joined(dataclasses.replace(extra, a2a_overlap=np.ones(len(extra), dtype=bool)))


def _at_the_ends(c: Constraints, slc: ModelSlice, tp: np.ndarray, dp: np.ndarray) -> np.ndarray:
    """Rows the planner's end-stage limits allow (``end_tp``, ``first_dp``, ``last_dp``): only a
    first stage (embedding, no head) or a last one (head, no embedding) is limited."""
    ok = np.ones(tp.shape, dtype=bool)
    first, last = slc.has_embedding and not slc.has_head, slc.has_head and not slc.has_embedding
    if (first or last) and c.end_tp is not None:
        ok &= np.isin(tp, c.end_tp)
    for on, allowed in ((first, c.first_dp), (last, c.last_dp)):
        if on and allowed is not None:
            ok &= np.isin(dp, allowed)
    return ok


def _constrained(c: Constraints, layout: np.ndarray, zero: np.ndarray, grid: np.ndarray,
                 micro: np.ndarray) -> np.ndarray:
    """Rows the user's constraints allow (``layout`` columns tp, cp, pp, dp, ep, expert_tp)."""
    ok = np.ones(len(zero), dtype=bool)
    etp = np.where(layout[:, 5] > 0, layout[:, 5], layout[:, 0])
    for allowed, column in ((c.tp, layout[:, 0]), (c.cp, layout[:, 1]), (c.ep, layout[:, 4]),
                            (c.expert_tp, etp), (c.micro_batch, micro)):
        if allowed is not None:
            ok &= np.isin(column, allowed)
    if c.zero is not None:  # without replicas every ZeRO stage is ZeRO-0
        ok &= np.isin(zero, c.zero) | (layout[:, 3] * layout[:, 1] == 1)
    if c.recompute is not None:
        ok &= np.isin(grid[:, 1], [RECOMPUTE_CODES.index(r) for r in c.recompute])
    if c.offload is False:
        ok &= grid[:, 2] == 0
    return ok


def framework_features(framework: Framework) -> FeatureSet:
    """The framework's features over pipelined and single-stage plans (ZeRO: the union)."""
    a, b = FeatureSet.of_framework(framework, True), FeatureSet.of_framework(framework, False)
    return FeatureSet(a.cp, a.ep, tuple(sorted(set(a.zero) | set(b.zero))), a.recompute,
                      a.offload)


def _zero_allowed(framework: Framework, zero: np.ndarray, pp: np.ndarray, whole: bool,
                  allowed: tuple[int, ...]) -> np.ndarray:
    """Rows whose ZeRO stage the framework runs at their pipelining (within ``allowed``)."""
    # ZeRO stages are 0-3: a lookup table, not np.isin (called on every stage-options batch).
    single = _stage_table(zero_choices(profile(framework), False, allowed))[zero]
    piped = _stage_table(zero_choices(profile(framework), True, allowed))[zero]
    return np.where((pp == 1) & whole, single, piped)


def _stage_table(stages) -> np.ndarray:
    """``table[z]``: whether ZeRO stage ``z`` (0-3) is among ``stages``."""
    table = np.zeros(4, dtype=bool)
    table[list(stages)] = True
    return table
