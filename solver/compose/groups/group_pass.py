"""One DP pass over node-group stages, and its backtracking (used by :mod:`solver.compose.groups.group_dp`).

A pass walks the pipeline from its end, one stage per level, over the states ``W`` (closed
blocks) and ``X`` (an island's block still open) described in :mod:`solver.compose.groups.group_dp`,
under a bottleneck cap; backtracking recomputes every value with the same floating-point
operations and follows equality to the predecessor. The planner's tie rule lives here: at every
step the lowest island index, the smallest group, then the shortest slice.
"""

from __future__ import annotations

import enum
import math
import mmap
from dataclasses import dataclass, field

import numpy as np

from solver.compose.groups.group_bounds import cover_costs
from solver.compose.kernels.group_kernel import drop_dominated, level_latencies, level_step, prune_rows
from solver.compose.result import TooLargeError
from solver.compose.stage_table import GroupRestrictions, GroupStage, StageTable, in_flight_counts
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
    ends: np.ndarray        # (J,) whether a plan may end with j + 1 stages (allowed depths)
    pool: list = field(default_factory=list, compare=False, repr=False)
    # Level arrays reused pass after pass: only the latest pass is ever backtracked (its levels
    # are read before the next pass starts).

    def level_arrays(self, i: int, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """The ``i``-th level array of the current pass and its row marks over its first three
        axes (``live[k, mi, u]`` of an open-block array, ``rows[mask, k, g]`` of a closed-block
        one), all 0: no row holds a state. The array is not cleared: the kernels fill a row
        with ``inf`` when they first write it, and nothing reads an unmarked row."""
        while len(self.pool) <= i:
            self.pool.append({})
        got = self.pool[i].get(shape)
        if got is None:
            got = self.pool[i][shape] = (_untouched(shape), np.zeros(shape[:3], np.uint8))
        else:
            got[1].fill(0)
        return got

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


def _untouched(shape: tuple[int, ...]) -> np.ndarray:
    """An uninitialized float array of ``shape`` in anonymous memory, whose pages the system
    maps only when first written. A level array is large (``fleet-8448``'s seven-island
    replicas: 25 MB) and a pass writes a few of its rows, so only those pages are ever mapped;
    NumPy's own large arrays are advised as huge pages, each first write into which clears
    2 MB (measured: 6% of a replica search)."""
    count = int(np.prod(shape))
    return np.frombuffer(mmap.mmap(-1, max(8 * count, 8)), np.float64, count).reshape(shape)


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
    if restr is not None:
        depth = restr.depth_bound(depth)
    # ends[j]: a complete plan of j + 1 stages may be taken (the user's allowed depths).
    ends = np.array([restr is None or restr.allows_depth(j + 1) for j in range(depth)],
                    dtype=bool)
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
                 np.array([w.size for w in without], dtype=np.int64), allowed, link, opts, ends)


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
    (:func:`~solver.compose.groups.group_bounds.cover_costs`; a lower bound for every plan)."""
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
    w_marks: list         # level j -> (2^K, K, G): rows of w_levels[j] holding states
    x_marks: list         # level j -> (K, Mk, U+1): rows of x_levels[j] holding states
    value: float
    final: tuple | None   # (j, k, mask index, gi, u) of the best complete plan
    pruned: bool = False  # some state was dropped by the budget (not by a found plan)


def _rest_bound(prep: _Prep, kern: _Kernels, dmax: np.ndarray, cap: float, mode: Mode,
                rate: float, limit: float) -> np.ndarray:
    """``rest[l]``: a lower bound on what covering the ``L − l`` layers still open adds to a
    state's value (0 for the bottleneck pass; ``rate`` per layer, and the cover bound when a
    finite ``limit`` will use it)."""
    big_l = prep.table.layers
    if mode is not Mode.SUM:
        return np.zeros(big_l + 1)
    rest = (big_l - np.arange(big_l + 1)) * rate
    if np.isfinite(limit):
        rest = np.maximum(rest, _cover(prep, kern, dmax, cap)[::-1])
    return rest


def _take(ps: "_Pass", prep: _Prep, j: int, best: np.ndarray, budget: float) -> None:
    """Record level ``j``'s best complete plan in ``ps`` if it improves it within ``budget``;
    complete plans of a depth the user does not allow are not plans."""
    if not prep.ends[j]:
        return
    if best[0] < ps.value and best[0] <= budget:
        ps.value = float(best[0])
        ps.final = (j, int(best[1]), int(best[2]), int(best[3]), int(best[4]))
    elif best[0] > budget and np.isfinite(best[0]):
        ps.pruned = True  # a complete plan over the budget was dropped


def _run_pass(prep: _Prep, kern: _Kernels, cap: float, mode: Mode, budget: float = _INF,
              rate: float = 0.0, t_bound: float = _INF) -> _Pass:
    """One DP pass over the levels (see the module docstring).

    With a ``budget`` (SUM mode), a state whose sum plus ``rate`` per uncovered layer (a lower
    bound on what the rest costs) exceeds it is dropped: no plan through it stays within budget.
    With ``t_bound``, a state of sum ``s`` at level ``j`` is dropped when
    ``(n − 1)·s/m + s + rest > t_bound``, ``m`` the number of terms ``s`` adds up: ``j + 1``
    stage costs ``max(τ, c)`` with overlap, else ``j + 1`` latencies and the ``j`` links between
    them (``m = 2j + 1``). The bottleneck is at least their mean, so no plan through the state
    has ``T_pipe`` below ``t_bound``.
    """
    t = prep.table
    big_k, big_g = prep.gu.shape
    big_l = t.layers
    w_shape = (1 << big_k, big_k, big_g, big_l + 1)
    x_shape = (big_k, prep.masks.shape[1], int(prep.units.max()) + 1, big_g, big_l + 1)
    # Level arrays come from the prep's pool: a new pass reuses the previous pass's arrays,
    # which nobody reads any more (only the latest pass is backtracked, before the next runs).
    (w, rows), (x, live) = prep.level_arrays(0, w_shape), prep.level_arrays(1, x_shape)
    ps = _Pass(kern, cap, mode, [w], [x], [rows], [live], _INF, None)
    sum_mode = mode is Mode.SUM
    dmax = _lengths_under(kern, cap)
    rest = _rest_bound(prep, kern, dmax, cap, mode, rate, min(budget, t_bound))
    for j in range(prep.depth):
        new_w, new_rows = prep.level_arrays(2 * j + 2, w_shape)
        new_x, new_live = prep.level_arrays(2 * j + 3, x_shape)
        best = np.array([_INF, -1, -1, -1, -1])
        level_step(j, w, x, kern.tau, dmax, prep.link, prep.gu, prep.ngroups, prep.units,
                   prep.masks, prep.nmask, prep.allowed, cap, sum_mode, prep.overlap, new_w,
                   new_x, best, live, new_live, rows, new_rows)
        drop_dominated(new_x, prep.units, prep.ngroups, prep.nmask, new_live)
        _take(ps, prep, j, best, budget)
        # A complete plan bounds the pass too: a state that cannot beat it strictly is dropped
        # (values only grow along a path, by at least ``rate`` per layer).
        bound = min(budget, ps.value)
        terms = j + 1 if prep.overlap else 2 * j + 1
        scale = (t.n_micro - 1) / terms if sum_mode else 0.0
        flags = prune_rows(new_x, new_live, rest, bound, scale, t_bound) | \
            prune_rows(new_w, new_rows, rest, bound, scale, t_bound)
        alive = flags & 1
        ps.pruned = ps.pruned or bool(flags & 2 and budget < ps.value)
        w, x, live, rows = new_w, new_x, new_live, new_rows
        ps.w_levels.append(w)
        ps.x_levels.append(x)
        ps.w_marks.append(rows)
        ps.x_marks.append(live)
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
    xlive, wrows = ps.x_marks[j][k, mi], ps.w_marks[j]  # unmarked rows hold no state
    mask = int(prep.masks[k, mi])
    for d in range(1, l_end + 1):
        if not tau[d] <= cap:
            continue
        l = l_end - d

        def via(value: float, c: float) -> float:
            return comb(value, max(tau[d], c)) if overlap else comb(comb(value, c), tau[d])
        if u - gu >= 1 and xlive[u - gu]:
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
                if c <= cap and wrows[mask, k2, g2] and np.isfinite(w[mask, k2, g2, l]):
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
