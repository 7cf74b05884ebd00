"""Exact composition over node-group stages: the DP behind the planner.

Problem (:mod:`solver.compose.stage_table`): choose an ordered sequence of stages, each a group
of ``g`` nodes of one island running a contiguous slice of layers with one of its options, such
that every layer is covered once, each island's stages are consecutive (one block per island),
an island's groups fit in its nodes, and every option holds the micro-batches its global
position keeps in flight (stage ``i`` of ``P``: ``min(P − i, n)``); minimize
``T = (n − 1)·max(τ, c) + Σ τ + Σ c + max v``.

How (exact). The per-iteration term is handled by a descending sweep over an iteration cap
``V`` (options above it are dropped; each step is exact, the sweep stops once the pipeline time
alone reaches the best total). For a fixed ``V`` the pipeline time ``(n − 1)·M + S`` is handled
by the bottleneck cap ``C`` of :mod:`solver.compose.dp`: one pass gives ``S(C)``, the least sum
over plans whose every stage and link is ``<= C``; ``S`` never increases with ``C``, so a
branch-and-bound over the sorted caps, started at the least achievable bottleneck ``M*`` (one
min-max pass) and pruned with a lower bound on ``S``, finds the optimum.

One pass walks the pipeline from its end, one stage per level ``j`` (``j`` = stages already
placed behind, which fixes the stage's in-flight count ``min(j + 1, n)`` and its position:
``j = 0`` holds the LM head). States:

* ``W[j][mask, k][g, l]`` — the last ``l`` layers on ``j`` stages over the islands of ``mask``,
  whose front block is island ``k`` with a front stage of ``g`` nodes (needed for the link to the
  block placed before it);
* ``X[j][k][mask, u, g, l]`` — the same, with island ``k``'s block still open after using ``u``
  nodes, its front stage on ``g`` nodes (``mask`` = the closed islands behind it).

Placing a stage of ``g'`` nodes and ``d`` layers in front moves ``X[u, g] → X[u + g', g']``
through the link between the two groups; a closed block (``W``) opens the next island's block
through the link between the islands. The link is minimized over the previous group *before*
the slice-length convolution, so the previous group costs memory, not time. Complexity per
pass: ``O(J · Σ_k 2^(K−1) · U_k · L · Σ_g D_g)`` elementwise operations (``J`` the depth bound,
``U_k`` island ``k``'s nodes, ``D_g`` the lengths of a ``g``-node stage under the cap) and
``O(J · Σ_k 2^(K−1) · U_k · G_k · L)`` memory for the stored levels, used to backtrack the plan.

Ties (deterministic): among plans of equal ``T`` the search keeps the first found with the
smaller bottleneck; backtracking prefers, at every step, the lowest island index, the smallest
group, then the shortest slice.
"""

from __future__ import annotations

import enum
import heapq
import math
from dataclasses import dataclass, replace
from time import perf_counter

import numpy as np

from solver.compose.group_kernel import cover_costs, level_latencies, level_step, prune
from solver.compose.result import TooLargeError
from solver.compose.stage_table import (GroupRestrictions, GroupResult, GroupStage, StageTable,
                                        group_objective, in_flight_counts)
from solver.compose.table import Position, slice_position

_INF = np.inf
MAX_GROUP_ISLANDS = 10
MAX_LEVEL_FLOATS = 4e7  # DP values of one level (320 MB of float64 at the limit)
_POS = {p: i for i, p in enumerate(Position)}


class Mode(enum.Enum):
    """What one pass minimizes."""

    SUM = "sum"  #: total of stage latencies and link times
    MAX = "max"  #: the bottleneck


@dataclass(frozen=True)
class _Prep:
    """Padded index arrays of a table (independent of the caps)."""

    table: StageTable
    overlap: bool
    depth: int              # most stages a plan may have (J)
    gu: np.ndarray          # (K, G) group sizes in node granules (0: padding)
    ngroups: np.ndarray     # (K,)
    units: np.ndarray       # (K,) U_k: the island's nodes in granules
    masks: np.ndarray       # (K, Mk) masks not containing k, ascending (padded)
    nmask: np.ndarray       # (K,)
    allowed: np.ndarray     # (2^K,) allowed final island sets
    link: np.ndarray        # (K, G, K, G) boundary seconds, inf where banned or absent
    sorted_opts: dict       # (k, gi, pos) -> (lat, it, cap, column order) by capacity, desc.

    @property
    def caps(self) -> tuple[int, ...]:
        """``U_k`` per island."""
        return tuple(int(u) for u in self.units)

    @property
    def group_units(self) -> tuple[tuple[int, ...], ...]:
        """Group sizes in granules per island."""
        return tuple(tuple(int(g) for g in self.gu[k, :self.ngroups[k]])
                     for k in range(len(self.units)))

    def masks_without(self, k: int) -> np.ndarray:
        """Masks not containing island ``k``, ascending."""
        return self.masks[k, :self.nmask[k]]


def _prepare(table: StageTable, restr: GroupRestrictions | None, overlap: bool) -> _Prep:
    big_k, names = len(table.islands), table.names()
    if big_k > MAX_GROUP_ISLANDS:
        raise TooLargeError(f"node-group composition handles at most {MAX_GROUP_ISLANDS} "
                            f"islands, got {big_k}")
    gran = [math.gcd(*i.groups) for i in table.islands]
    units = np.array([i.nodes // u for i, u in zip(table.islands, gran)], dtype=np.int64)
    big_g = max(len(i.groups) for i in table.islands)
    gu = np.zeros((big_k, big_g), dtype=np.int64)
    for k, (isl, u) in enumerate(zip(table.islands, gran)):
        gu[k, :len(isl.groups)] = [g // u for g in isl.groups]
    ngroups = np.array([len(i.groups) for i in table.islands], dtype=np.int64)
    depth = min(table.layers, int(sum(units[k] // gu[k, 0] for k in range(big_k))))
    if restr is not None and restr.max_stages is not None:
        depth = min(depth, restr.max_stages)
    all_masks = np.arange(1 << big_k)
    without = [all_masks[(all_masks >> k) & 1 == 0] for k in range(big_k)]
    masks = np.zeros((big_k, max(w.size for w in without)), dtype=np.int64)
    for k, w in enumerate(without):
        masks[k, :w.size] = w
    allowed = np.ones(1 << big_k, dtype=bool)
    if restr is not None and restr.budget is not None:
        allowed &= restr.budget.allowed_masks(names)
    if table.use_all:
        allowed &= all_masks == (1 << big_k) - 1
    level = sum(w.size * (units[k] + 1) * big_g * (table.layers + 1) for k, w in enumerate(without))
    if level > MAX_LEVEL_FLOATS:
        raise TooLargeError(f"node-group DP would hold {level:.1e} values per level (limit "
                            f"{MAX_LEVEL_FLOATS:.0e}): prune islands or coarsen node groups")
    link = _link_array(table, restr, big_g)
    opts = {}
    for (k, g, pos), o in table.options.items():
        order = np.argsort(-o.capacity, axis=1, kind="stable")
        opts[(k, table.islands[k].groups.index(g), _POS[pos])] = (
            np.take_along_axis(o.latency, order, 1), np.take_along_axis(o.iteration, order, 1),
            np.take_along_axis(o.capacity, order, 1), order)
    return _Prep(table, overlap, depth, gu, ngroups, units, masks,
                 np.array([w.size for w in without], dtype=np.int64), allowed, link, opts)


def _link_array(table: StageTable, restr: GroupRestrictions | None, big_g: int) -> np.ndarray:
    """``link[k, g, k2, g2]``: seconds from group ``g`` of ``k`` to group ``g2`` of ``k2``."""
    big_k, names = len(table.islands), table.names()
    banned = {(names.index(a), names.index(b)) for a, b in (restr.banned_links if restr else ())}
    link = np.full((big_k, big_g, big_k, big_g), _INF)
    for k, isl in enumerate(table.islands):
        for gi, g in enumerate(isl.groups):
            for k2, isl2 in enumerate(table.islands):
                if (k, k2) in banned:
                    continue
                for g2i, g2 in enumerate(isl2.groups):
                    link[k, gi, k2, g2i] = table.link(k, g, k2, g2)
    return link


@dataclass(frozen=True)
class _Kernels:
    """Latencies under an iteration cap: ``tau[k, g, p, j, d]`` and the longest finite length
    ``dmax[k, g, p, j]`` (the bottleneck cap is applied inside the passes)."""

    tau: np.ndarray
    dmax: np.ndarray
    vcap: float
    tmin: np.ndarray  # (K, G, L+1): cheapest position at level 0 (a lower bound per stage)


def level_in_flight(depth: int, n_micro: int) -> np.ndarray:
    """1F1B: the stage with ``j`` stages behind it holds ``min(j + 1, n)`` micro-batches."""
    return np.minimum(np.arange(depth) + 1, n_micro).astype(np.int64)


def _kernels(prep: _Prep, vcap: float) -> _Kernels:
    t = prep.table
    big_k, big_g = prep.gu.shape
    held = level_in_flight(prep.depth, t.n_micro)
    tau = np.full((big_k, big_g, 4, prep.depth, t.layers + 1), _INF)
    for (k, gi, p), (lat, it, cap, _) in prep.sorted_opts.items():
        level_latencies(lat, it, cap, vcap, held, tau[k, gi, p])
    finite = np.isfinite(tau)
    last = tau.shape[-1] - 1 - np.argmax(finite[..., ::-1], axis=-1)
    dmax = np.where(finite.any(axis=-1), last, 0).astype(np.int64)
    return _Kernels(tau, dmax, vcap, np.ascontiguousarray(tau[:, :, :, 0, :].min(axis=2)))


def _cover(prep: _Prep, kern: _Kernels, dmax: np.ndarray, cap: float) -> np.ndarray:
    """``F[l]``: least summed latency of stages within ``cap`` covering ``l`` layers
    (:func:`~solver.compose.group_kernel.cover_costs`; a lower bound for every plan)."""
    return cover_costs(kern.tmin, prep.gu, prep.ngroups, prep.units, cap)


def _lengths_under(kern: _Kernels, cap: float) -> np.ndarray:
    """``dmax[k, g, p, j]``: the longest slice whose latency is within ``cap`` (0 if none), so
    the passes never scan lengths beyond it."""
    if not np.isfinite(cap):
        return kern.dmax
    ok = kern.tau <= cap
    last = ok.shape[-1] - 1 - np.argmax(ok[..., ::-1], axis=-1)
    return np.where(ok.any(axis=-1), last, 0).astype(np.int64)


def _kern(kern: _Kernels, k: int, gi: int, j: int, complete: bool) -> np.ndarray:
    """The latencies of a stage placed at level ``j``: LAST/ONLY at ``j = 0``, else
    MIDDLE/FIRST (row over lengths)."""
    if j == 0:
        pos = Position.ONLY if complete else Position.LAST
    else:
        pos = Position.FIRST if complete else Position.MIDDLE
    return kern.tau[k, gi, _POS[pos], j]


@dataclass
class _Pass:
    """Stored levels of one pass (for backtracking) and its best complete plan."""

    kern: _Kernels
    cap: float
    mode: Mode
    w_levels: list        # level j -> (2^K, K, G, L+1)
    x_levels: list        # level j -> (K, Mk, U+1, G, L+1)
    value: float
    final: tuple | None   # (j, k, mask index, gi, u) of the best complete plan
    pruned: bool = False  # some state was dropped by the budget (not by a found plan)


def _run_pass(prep: _Prep, kern: _Kernels, cap: float, mode: Mode, budget: float = _INF,
              rate: float = 0.0, t_bound: float = _INF) -> _Pass:
    """One DP pass over the levels (see the module docstring).

    With a ``budget`` (SUM mode), a state whose sum plus ``rate`` per uncovered layer (a lower
    bound on what the rest costs) exceeds it is dropped: no plan through it stays within budget.
    With ``t_bound``, a state of sum ``s`` over ``j`` placed stages is dropped when
    ``(n − 1)·s/j + s + rest > t_bound``: the bottleneck is at least the mean of the placed
    stages and links, so no plan through it has ``T_pipe`` below ``t_bound``.
    """
    t = prep.table
    big_k, big_g = prep.gu.shape
    big_l = t.layers
    w_shape = (1 << big_k, big_k, big_g, big_l + 1)
    x_shape = (big_k, prep.masks.shape[1], int(prep.units.max()) + 1, big_g, big_l + 1)
    w, x = np.full(w_shape, _INF), np.full(x_shape, _INF)
    ps = _Pass(kern, cap, mode, [w], [x], _INF, None)
    sum_mode = mode is Mode.SUM
    dmax = _lengths_under(kern, cap)
    rest = (big_l - np.arange(big_l + 1)) * rate
    if sum_mode and (np.isfinite(budget) or np.isfinite(t_bound)):
        rest = np.maximum(rest, _cover(prep, kern, dmax, cap)[::-1])
    elif not sum_mode:
        rest = np.zeros(big_l + 1)
    for j in range(prep.depth):
        new_w, new_x = np.full(w_shape, _INF), np.full(x_shape, _INF)
        best = np.array([_INF, -1, -1, -1, -1])
        level_step(j, w, x, kern.tau, dmax, prep.link, prep.gu, prep.ngroups, prep.units,
                   prep.masks, prep.nmask, prep.allowed, cap, sum_mode, prep.overlap, new_w,
                   new_x, best)
        if best[0] < ps.value and best[0] <= budget:
            ps.value = float(best[0])
            ps.final = (j, int(best[1]), int(best[2]), int(best[3]), int(best[4]))
        elif best[0] > budget and np.isfinite(best[0]):
            ps.pruned = True  # a complete plan over the budget was dropped
        # A complete plan bounds the pass too: a state that cannot beat it strictly is dropped
        # (values only grow along a path, by at least ``rate`` per layer).
        bound = min(budget, ps.value)
        scale = (t.n_micro - 1) / (j + 1) if sum_mode else 0.0
        flags = prune(new_x, rest, bound, scale, t_bound) | \
            prune(new_w, rest, bound, scale, t_bound)
        alive = flags & 1
        ps.pruned = ps.pruned or bool(flags & 2 and budget < ps.value)
        w, x = new_w, new_x
        ps.w_levels.append(w)
        ps.x_levels.append(x)
        if not alive:
            break
    return ps


# ---------------------------------------------------------------------------------------------
# Backtracking: every value is recomputed with the same floating-point operations as the pass
# (rounding is monotone, so a minimum taken before or after adding a constant is the same
# number), and equality identifies the predecessor exactly.


def _sources(prep: _Prep, ps: _Pass, j: int, k: int, mi: int, gi: int, u: int, l_end: int,
             complete: bool):
    """Every way the cell (level-``j`` stage of island ``k``, group ``gi``, ending at ``u``
    node granules and ``l_end`` layers) is reached: yields ``(value, d, kind, detail)``,
    shortest slice first, then the lowest island and group."""
    overlap, cap = prep.overlap, ps.cap
    sum_mode = ps.mode is Mode.SUM
    comb = (lambda a, b: a + b) if sum_mode else max
    gu = int(prep.gu[k, gi])
    tau = _kern(ps.kern, k, gi, j, complete)
    xk, w = ps.x_levels[j][k, mi], ps.w_levels[j]
    mask = int(prep.masks[k, mi])
    for d in range(1, l_end + 1):
        if not tau[d] <= cap:
            continue
        l = l_end - d

        def via(value: float, c: float) -> float:
            return comb(value, max(tau[d], c)) if overlap else comb(comb(value, c), tau[d])
        if u - gu >= 1:
            for gp in range(int(prep.ngroups[k])):
                c = prep.link[k, gi, k, gp]
                if c <= cap and np.isfinite(xk[u - gu, gp, l]):
                    yield float(via(float(xk[u - gu, gp, l]), float(c))), d, "x", gp
        if u != gu:
            continue
        if j == 0:
            if l == 0 and mask == 0:
                yield float(comb(0.0, float(tau[d]))), d, "start", None
            continue
        for k2 in range(len(prep.units)):
            if not mask >> k2 & 1:
                continue
            for g2 in range(int(prep.ngroups[k2])):
                c = prep.link[k, gi, k2, g2]
                if c <= cap and np.isfinite(w[mask, k2, g2, l]):
                    yield float(via(float(w[mask, k2, g2, l]), float(c))), d, "block", (k2, g2)


def _cell(prep: _Prep, ps: _Pass, j: int, k: int, mi: int, gi: int, u: int, l_end: int,
          complete: bool) -> float:
    return min((v for v, *_ in _sources(prep, ps, j, k, mi, gi, u, l_end, complete)),
               default=_INF)


def _backtrack(prep: _Prep, ps: _Pass) -> list[tuple[int, int, int, int]]:
    """Stages ``(island, group index, start, end)`` of the pass's best plan, front to back."""
    big_l = prep.table.layers
    j, k, mi, gi, u = ps.final
    target, l_end, complete = ps.value, big_l, True
    out = []
    while True:
        d, kind, detail = next((d, kind, detail) for value, d, kind, detail
                               in _sources(prep, ps, j, k, mi, gi, u, l_end, complete)
                               if value == target)
        out.append((k, gi, big_l - l_end, big_l - l_end + d))
        l = l_end - d
        if kind == "start":
            return out
        if kind == "x":
            u -= int(prep.gu[k, gi])
            gi = detail
            target = float(ps.x_levels[j][k, mi, u, gi, l])
        else:
            k2, g2 = detail
            mask2 = int(prep.masks[k, mi]) & ~(1 << k2)
            mi = int(np.searchsorted(prep.masks_without(k2), mask2))
            target = float(ps.w_levels[j][mask2 | (1 << k2), k2, g2, l])
            k, gi = k2, g2
            u = next(v for v in range(int(prep.units[k]) + 1)
                     if _cell(prep, ps, j - 1, k, mi, gi, v, l, False) == target)
        j, l_end, complete = j - 1, l, False


# ---------------------------------------------------------------------------------------------
# Decoding and the searches over the two caps.


def _decode(prep: _Prep, raw: list, cap: float, vcap: float) -> tuple[GroupStage, ...]:
    t = prep.table
    held = in_flight_counts(len(raw), t.n_micro)
    out = []
    for (k, gi, a, b), h in zip(raw, held):
        g = t.islands[k].groups[gi]
        key = (k, g, slice_position(a, b, t.layers))
        opts = t.options[key]
        ok = ((opts.latency[b - a] <= cap) & (opts.iteration[b - a] <= vcap)
              & (opts.capacity[b - a] >= h))
        o = int(np.argmin(np.where(ok, opts.latency[b - a], _INF)))
        out.append(GroupStage(t.islands[k].name, k, g, a, b, o, float(opts.latency[b - a, o]),
                              float(opts.iteration[b - a, o]), h))
    return tuple(out)


def _bottleneck(table: StageTable, stages, overlap: bool) -> float:
    links = [table.link(a.k, a.nodes, b.k, b.nodes) for a, b in zip(stages, stages[1:])]
    taus = [s.latency for s in stages]
    if overlap:
        return max(max(t, c) for t, c in zip(taus, links + [0.0]))
    return max(taus + links)


def _cap_values(prep: _Prep, kern: _Kernels, floor: float) -> np.ndarray:
    """Sorted distinct latencies and link times ``>= floor``: the values a bottleneck takes."""
    vals = np.concatenate([kern.tau[np.isfinite(kern.tau)], prep.link[np.isfinite(prep.link)]])
    allv = np.unique(vals)
    return allv[allv >= floor]


def _capacity_floor(prep: _Prep, kern: _Kernels, values: np.ndarray) -> float:
    """A lower bound on the bottleneck: the least cap ``C`` under which the islands could hold
    all ``L`` layers at all, each group's longest slice within ``C`` at any position with one
    micro-batch in flight (a stage of a real plan is no shorter-lived) and each island's groups
    within its nodes (an unbounded knapsack per island). ``inf`` if no cap is enough."""
    big_l = prep.table.layers
    best = np.where(np.isfinite(kern.tau[:, :, :, 0, :]), kern.tau[:, :, :, 0, :], _INF).min(axis=2)
    lengths = np.arange(big_l + 1)

    def layers_under(cap: float) -> int:
        total = 0
        for k in range(len(prep.units)):
            longest = [int(lengths[best[k, gi] <= cap].max(initial=0))
                       for gi in range(int(prep.ngroups[k]))]
            total += _knapsack(int(prep.units[k]), prep.gu[k, :prep.ngroups[k]], longest,
                               prep.depth)
        return total

    lo, hi = 0, values.size - 1
    if values.size == 0 or layers_under(float(values[hi])) < big_l:
        return _INF
    while lo < hi:
        mid = (lo + hi) // 2
        if layers_under(float(values[mid])) >= big_l:
            hi = mid
        else:
            lo = mid + 1
    return float(values[lo])


def _raise_floor(prep: _Prep, kern: _Kernels, values: np.ndarray, floor: float,
                 t_budget: float) -> float:
    """A higher bottleneck floor: no plan whose bottleneck ``m`` has ``(n−1)·floor +
    F_m(L) >= t_budget`` can beat ``t_budget`` (``F_m`` the cover bound of stages within
    ``m``, non-increasing in ``m``); repeated while the floor rises. ``inf``: nothing can."""
    n, big_l = prep.table.n_micro, prep.table.layers
    for _ in range(4):
        def useless(i: int) -> bool:
            cap = float(values[i])
            return (n - 1) * floor + _cover(prep, kern, None, cap)[big_l] >= t_budget
        lo, hi = int(np.searchsorted(values, floor)), values.size
        if lo >= hi:
            return _INF
        while lo < hi:  # first index that is not useless
            mid = (lo + hi) // 2
            if useless(mid):
                lo = mid + 1
            else:
                hi = mid
        if lo >= values.size:
            return _INF
        if values[lo] <= floor:
            return floor
        floor = float(values[lo])
    return floor


def _knapsack(units: int, sizes, value, most: int) -> int:
    """Most layers of stages whose group sizes (node granules) add up to at most ``units``."""
    best = [0] * (units + 1)
    for u in range(1, units + 1):
        best[u] = max([best[u - 1]] + [best[u - int(g)] + v for g, v in zip(sizes, value)
                                        if 0 < g <= u])
    return min(best[units], most * max(value, default=0))


def _rate_floor(kern: _Kernels) -> float:
    """``min τ/d`` over every entry: a stage of ``d`` layers costs at least ``d`` times it."""
    d = np.arange(kern.tau.shape[-1])
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(np.isfinite(kern.tau) & (d > 0), kern.tau / np.maximum(d, 1), _INF)
    return float(r.min()) if r.size else _INF


def _evaluate(prep: _Prep, kern: _Kernels, cap: float, budget: float, rate: float,
              t_bound: float = _INF):
    """``(S, bottleneck, stages)`` of the least-sum plan under the caps, or None when no plan's
    sum is within ``budget``.

    Without a budget, passes run under growing trial budgets from the lower bound ``L·rate``
    (×1.5 each): a pass that finds a plan within its trial budget is exact (every better plan
    is within it too), and a pass that finds none is cheap, its states pruned early.
    """
    vcap = kern.vcap
    trial = max(rate * prep.table.layers, 1e-12) * 1.5
    while True:
        ps = _run_pass(prep, kern, cap, Mode.SUM, min(budget, trial), rate, t_bound)
        if ps.final is not None or trial >= budget or not ps.pruned:
            break  # a plan; or the real budget was used; or the trial budget cut nothing
        trial *= 1.5
    if ps.final is None:
        return None
    stages = _decode(prep, _backtrack(prep, ps), cap, vcap)
    return ps.value, _bottleneck(prep.table, stages, prep.overlap), stages


def _search_caps(prep: _Prep, vcap: float, t_budget: float = _INF):
    """Best ``(T_pipe, stages)`` with every option's per-iteration time ``<= vcap`` and
    ``T_pipe < t_budget`` (None if there is none): branch-and-bound over the bottleneck cap.

    Intervals of cap indices ``(a, b)`` carry ``S(C_a)`` (``inf`` when it exceeded the budget)
    and a lower bound on ``S(C_b)``; caps inside have ``T >= (n−1)·C_{a+1} + S(C_b)``.
    """
    n = prep.table.n_micro
    kern = _kernels(prep, vcap)
    rate = _rate_floor(kern)
    values = _cap_values(prep, kern, 0.0)
    floor = _capacity_floor(prep, kern, values)
    if np.isfinite(floor) and np.isfinite(t_budget):
        floor = _raise_floor(prep, kern, values, floor, t_budget)
    s_lb = max(floor, rate * prep.table.layers)
    if not np.isfinite(floor) or (n - 1) * floor + s_lb >= t_budget:
        return None
    values = values[values >= floor]
    best = [t_budget, _INF, None]
    stack = [(-1, _INF, values.size, s_lb)]
    while stack:
        a, s_a, b, s_b = stack.pop()
        if b - a <= 1 or s_a <= s_b or (n - 1) * values[a + 1] + s_b >= best[0]:
            continue
        mid = a + 1 if a < 0 else (a + b) // 2
        # Plans of interest here have their bottleneck above C_a: T >= (n−1)·C_{a+1} + S.
        found = _evaluate(prep, kern, float(values[mid]), best[0] - (n - 1) * values[a + 1],
                          rate, best[0])
        if found is None:  # S(C_mid) is over budget, and so is S at every smaller cap
            stack.append((mid, _INF, b, s_b))
            continue
        s_m, m_m, plan_m = found
        if ((n - 1) * m_m + s_m, m_m) < (best[0], best[1]):
            best = [(n - 1) * m_m + s_m, m_m, plan_m]
        jm = int(np.searchsorted(values, m_m))
        stack.append((mid, s_m, b, s_b))
        if jm > a:
            stack.append((a, s_a, jm, s_m))
    return None if best[2] is None else (best[0], best[2])


def _search_iteration(prep: _Prep, values: np.ndarray, incumbent: float = _INF):
    """Best ``(T, stages)`` over iteration caps: ``T* = min_V pipe(V) + V`` (the optimal plan's
    largest per-iteration time ``v`` has ``pipe(v) + v <= T*``), ``pipe`` non-increasing in
    ``V``, so a branch-and-bound over the sorted values like the one over bottleneck caps.

    An interval ``(a, b)`` of value indices carries ``pipe(V_b)``; every plan that beats the
    ends has its largest per-iteration time in ``(V_a, V_b]``, so ``T >= pipe(V_b) + V_{a+1}``
    (its priority: intervals are expanded lowest bound first) and a solve at ``V_mid`` needs
    ``pipe < best − V_{a+1}``. A plan found at ``V_mid`` with largest per-iteration time ``v``
    makes ``pipe`` flat on ``[v, V_mid]``. Only plans below ``incumbent`` are sought.
    """
    top = _search_caps(prep, float(values[-1]), incumbent - float(values[0]))
    if top is None:
        return None
    pipe, stages = top
    top_it = max(s.iteration for s in stages)
    best = [pipe + top_it, stages] if pipe + top_it < incumbent else [incumbent, None]
    heap = [(pipe + float(values[0]), -1, int(np.searchsorted(values, top_it)), pipe)]
    while heap:
        bound, a, b, p_b = heapq.heappop(heap)
        if b - a <= 1 or bound >= best[0]:
            continue
        mid = (a + b) // 2
        found = _search_caps(prep, float(values[mid]), best[0] - float(values[a + 1]))
        if found is None:  # nothing at V_mid beats the best, nor at any smaller cap
            heapq.heappush(heap, (p_b + float(values[mid + 1]), mid, b, p_b))
            continue
        p_m, st_m = found
        it_m = max(s.iteration for s in st_m)
        if p_m + it_m < best[0]:
            best = [p_m + it_m, st_m]
        heapq.heappush(heap, (p_b + float(values[mid + 1]), mid, b, p_b))
        jm = int(np.searchsorted(values, it_m))
        heapq.heappush(heap, (p_m + float(values[a + 1]), a, jm, p_m))
    return None if best[1] is None else (best[0], best[1])


SHALLOW_DEPTH = 8  # stages of the first, cheap search whose plan bounds the full one


def _shallow_first(table, restrictions, overlap, prep, iters):
    """The best plan of at most :data:`SHALLOW_DEPTH` stages first (a cheap search: few
    levels), then the full search for anything strictly better: its passes drop every state
    that cannot beat that plan. Exact: the answer is the better of the two."""
    shallow = replace(restrictions or GroupRestrictions(), max_stages=SHALLOW_DEPTH)
    first = _search_iteration(_prepare(table, shallow, overlap), iters)
    if first is None:
        return _search_iteration(prep, iters)
    better = _search_iteration(prep, iters, first[0])
    return better if better is not None else first


def compose_groups_dp(table: StageTable, restrictions: GroupRestrictions | None = None,
                      overlap: bool = False, incumbent: float = _INF) -> GroupResult:
    """Exact optimal composition of ``table`` over node-group stages.

    Parameters
    ----------
    incumbent : float
        Only plans faster than this are sought (a plan the caller already has).

    Returns
    -------
    GroupResult
        ``solver="dp"``: proven optimal; or no stages with status ``infeasible`` (nothing fits)
        or ``dominated`` (proven: nothing beats ``incumbent``).

    Raises
    ------
    TooLargeError
        More than ``MAX_GROUP_ISLANDS`` islands or more stored values than ``MAX_LEVEL_FLOATS``.

    Notes
    -----
    Passes: a bisection over iteration caps (:func:`_search_iteration`), at each one min-max pass
    and a bisection over bottleneck caps (:func:`_search_caps`); passes drop states whose sum
    cannot beat the incumbent. Cost of one pass: see the module docstring.
    """
    t0 = perf_counter()
    prep = _prepare(table, restrictions, overlap)
    iters = np.unique(np.concatenate([o.iteration[np.isfinite(o.latency)]
                                      for o in table.options.values()] + [np.array([])]))
    if not iters.size:
        found = None
    elif prep.depth > SHALLOW_DEPTH and not np.isfinite(incumbent):
        found = _shallow_first(table, restrictions, overlap, prep, iters)
    else:
        found = _search_iteration(prep, iters, incumbent)
    best = None if found is None else found[1]
    elapsed = perf_counter() - t0
    if best is None:
        status = "dominated" if np.isfinite(incumbent) else "infeasible"
        return GroupResult((), None, "dp", status == "dominated", status, elapsed)
    total = group_objective(table, best, overlap)[0]
    return GroupResult(best, total, "dp", True, "optimal", elapsed, total, 0.0)
