"""NumPy twins of the node-group DP's bounds (:mod:`solver.compose.kernels.group_bounds_jit`): the same
values bit for bit, for tables too small to pay for numba's start-up
(:mod:`solver.compose.kernels.kernel_switch`).

The cover knapsack is pulled instead of pushed: the row of ``u`` node granules is the least,
over the (island, group) pairs that fit, of the row ``u − g`` convolved with that group's stage
latencies (a window view over the padded rows), every island at once. Each value is the same
single addition on the same operands as in the compiled loops, and minima are exact, so no bit
differs; the linear bound takes the sliding window's minimum where the compiled monotone queue
takes it (the last of equal keys). Group sizes must be at least one granule and the linear
bound's cap finite (the front sends other calls to the compiled twin).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from numpy.lib.stride_tricks import as_strided

from solver.compose.kernels.kernel_switch import count, numpy_seconds

_INF = np.inf


def knapsack_layers(units: int, sizes: np.ndarray, value: np.ndarray) -> int:
    """Most of ``value`` (layers per group) that groups of ``sizes`` granules, each any
    number of times, give within ``units`` granules (an unbounded knapsack; integers, so a
    plain loop over Python ints)."""
    items = [(int(g), int(v)) for g, v in zip(sizes.tolist(), value.tolist())]
    best = [0] * (int(units) + 1)
    for u in range(1, int(units) + 1):
        top = best[u - 1]
        for g, v in items:
            if 0 < g <= u and best[u - g] + v > top:
                top = best[u - g] + v
        best[u] = top
    return best[int(units)]


def layers_within(units: np.ndarray, gu: np.ndarray, ngroups: np.ndarray,
                  longest: np.ndarray, depth: int) -> int:
    """Most layers the islands' stages hold when a stage on group ``g`` of island ``k``
    holds at most ``longest[k, g]`` layers (see the compiled twin)."""
    total = 0
    for k in range(units.size):
        ng = int(ngroups[k])
        got = knapsack_layers(int(units[k]), gu[k, :ng], longest[k, :ng])
        top = max([0, *longest[k, :ng].tolist()])
        total += min(got, depth * top)
    return total


def longest_within(tmin: np.ndarray, cap: float) -> np.ndarray:
    """``top[k, g]``: the longest length whose least latency is within ``cap`` (0: none)."""
    ok = tmin <= cap
    width = tmin.shape[2]
    return np.where(ok.any(axis=2), width - 1 - np.argmax(ok[:, :, ::-1], axis=2), 0)


def cover_costs(tmin: np.ndarray, gu: np.ndarray, ngroups: np.ndarray, units: np.ndarray,
                cap: float) -> np.ndarray:
    """``F[l]``: a lower bound on the summed latency of any set of stages covering ``l`` layers
    with every stage within ``cap`` (see the compiled twin)."""
    rows = _cover_rows(tmin, gu, ngroups, units, cap)
    total = _identity(tmin.shape[2])
    count(numpy_seconds(10 + 5 * gu.shape[0], 3 * gu.shape[0] * tmin.shape[2] ** 2))
    for k in range(gu.shape[0]):
        total = _min_plus(total, rows[k, :int(units[k]) + 1].min(axis=0))
    return total


def cover_costs_linear(tmin: np.ndarray, per_layer: np.ndarray, gu: np.ndarray,
                       ngroups: np.ndarray, units: np.ndarray, cap: float) -> np.ndarray:
    """:func:`cover_costs` of stages whose latency is ``d · per_layer[k, g]``, as the compiled
    twin computes it (a sliding-window minimum; its ties taken as the monotone queue takes
    them: the longest prefix)."""
    top = longest_within(tmin, cap)
    total = _identity(tmin.shape[2])
    fits = (np.arange(gu.shape[1])[None, :] < ngroups[:, None]) & (top > 0) & \
        (gu <= units[:, None])
    # Per granule of each island a dozen NumPy calls over its groups' windows, and the min-plus.
    count(numpy_seconds(12 * int(units.sum()) + 5 * gu.shape[0],
                        8 * tmin.shape[2] * int(np.dot(units, (fits * top).sum(axis=1))) +
                        3 * gu.shape[0] * tmin.shape[2] ** 2))
    for k in range(gu.shape[0]):
        ng = int(ngroups[k])
        total = _min_plus(total, _island_cover_linear(per_layer[k, :ng], gu[k, :ng],
                                                      int(units[k]), top[k, :ng],
                                                      tmin.shape[2]))
    return total


def _identity(width: int) -> np.ndarray:
    """No island yet: nothing covered at no cost."""
    out = np.full(width, _INF)
    out[0] = 0.0
    return out


def _min_plus(total: np.ndarray, island: np.ndarray) -> np.ndarray:
    """``out[m] = min over a + b = m of total[a] + island[b]`` (``m`` below the width): a
    window view pairs ``total`` reversed with ``island`` padded in front."""
    width = total.size
    padded = np.full(2 * width - 1, _INF)
    padded[width - 1:] = island
    (step,) = padded.strides
    pairs = as_strided(padded, (width, width), (step, step))  # [m, a']: island[m + a' − W + 1]
    return (total[::-1][None, :] + pairs).min(axis=1)


def _cover_rows(tmin: np.ndarray, gu: np.ndarray, ngroups: np.ndarray, units: np.ndarray,
                cap: float) -> np.ndarray:
    """``f[k, u, l]``: island ``k``'s least summed latency of stages covering ``l`` layers on
    exactly ``u`` granules. Row ``u`` of every island at once is the least, over the (island,
    group) pairs that fit, of row ``u − g`` convolved with the group's latencies within ``cap``
    and its longest slice: a window view over the rows padded in front, as wide as the longest
    slice among those pairs and as long as the layers those rows can reach."""
    big_k, _, width = tmin.shape
    top = longest_within(tmin, cap)
    pair_k, pair_g = np.nonzero((np.arange(tmin.shape[1])[None, :] < ngroups[:, None]) &
                                (top > 0) & (gu >= 1) & (gu <= units[:, None]))
    most = int(top[pair_k, pair_g].max()) if pair_k.size else 0
    rows = np.full((big_k, int(units.max(initial=0)) + 1, most + width), _INF)
    rows[:, 0, most] = 0.0  # rows[k, u, most + l] = f[k, u, l]
    if most == 0:
        return rows[:, :, most:]
    t = tmin[pair_k, pair_g, 1:most + 1]
    reach = top[pair_k, pair_g]
    after = np.where((np.arange(1, most + 1) <= reach[:, None]) & (t <= cap), t,
                     _INF)[:, ::-1]  # window offset e: length most − e
    s2 = rows.strides[2]
    plan, cells = _pulls(tuple(pair_k.tolist()), tuple(gu[pair_k, pair_g].tolist()),
                         tuple(reach.tolist()), tuple(units.tolist()), width)
    count(numpy_seconds(6 * len(plan), 3 * cells))
    for u, long, p, islands, src_u, wide, first, to in plan:
        src = rows[islands, src_u, most - wide:most - wide + long + wide]
        windows = np.ndarray((p.size, long, wide), buffer=src, offset=0,
                             strides=(src.strides[0], s2, s2))
        least = np.minimum.reduceat((windows + after[p, most - wide:][:, None, :]).min(axis=2),
                                    first, axis=0)
        rows[to, u, most:most + long] = least  # the row's first and only pull
    return rows[:, :, most:]


@lru_cache(maxsize=256)
def _pulls(ks: tuple, gs: tuple, rs: tuple, caps: tuple, width: int) -> tuple:
    """The pulls of :func:`_cover_rows` and the cells they sweep: per row ``u``, the pairs that
    fit (island ``ks``, size ``gs``, longest slice ``rs``), an island's pairs together,
    ``(u, long, pairs, their islands, their source rows, wide, where each island's pairs start,
    the islands written)``. A row reaches no further than the rows it is pulled from plus the
    pair's longest slice (``l < long``). Plain Python on the table's shape, not its values,
    kept for the next cap with the same longest slices."""
    last = [[0] + [-1] * max(caps) for _ in caps]  # the furthest layer row u may hold
    out, cells = [], 0
    for u in range(1, max(caps) + 1):
        fit = [i for i, (k, g) in enumerate(zip(ks, gs))
               if g <= u <= caps[k] and last[k][u - g] >= 0]  # pairs ordered by island
        if not fit:
            continue
        for i in fit:
            last[ks[i]][u] = min(width - 1, max(last[ks[i]][u], last[ks[i]][u - gs[i]] + rs[i]))
        long, wide = max(last[ks[i]][u] for i in fit) + 1, max(rs[i] for i in fit)
        first = [j for j, i in enumerate(fit) if j == 0 or ks[i] != ks[fit[j - 1]]]
        cells += len(fit) * long * wide
        out.append((u, long, np.array(fit), np.array([ks[i] for i in fit]),
                    np.array([u - gs[i] for i in fit]), wide, np.array(first),
                    np.array([ks[fit[j]] for j in first])))
    return tuple(out), cells


def _island_cover_linear(per_layer_k: np.ndarray, gu_k: np.ndarray, units: int,
                         top: np.ndarray, width: int) -> np.ndarray:
    """One island's least summed latency of stages covering each count of layers, for
    latencies ``d · per_layer_k[g]``, as the compiled twin's monotone queue computes it: row
    ``u + g`` at ``l'`` from row ``u`` at the ``l`` in the window ``[l' − D, l' − 1]`` of least
    ``f[u, l] − l·a`` (the last such ``l``), giving ``f[u, l] + (l' − l)·a``."""
    use = np.flatnonzero((top > 0) & (gu_k <= units))
    if use.size == 0 or units == 0:
        return _identity(width)
    use = use[np.argsort(gu_k[use], kind="stable")]
    size, reach, rate = gu_k[use], top[use], per_layer_k[use]
    most = int(reach.max())
    lengths = np.arange(width)
    e = np.arange(most)
    inside = e[None, :] >= (most - reach)[:, None]  # window offset e: l = l' − most + e
    rows = np.full((units + 1, width), _INF)
    rows[0, 0] = 0.0
    fits = np.searchsorted(size, np.arange(units + 1), side="right")
    for u in range(1, units + 1):
        m = fits[u]
        if m:
            rows[u] = _linear_pull(rows[u - size[:m]], rate[:m], inside[:m], lengths, most)
    return rows.min(axis=0)


def _linear_pull(src: np.ndarray, rate: np.ndarray, inside: np.ndarray, lengths: np.ndarray,
                 most: int) -> np.ndarray:
    """The least, over the groups, of each group's stage after its source row (``src[i]``,
    latency ``rate[i]`` a layer, windows ``inside[i]``), at every ``l' >= 1``."""
    m, width = src.shape
    finite = src < _INF
    shifted = np.where(finite, src - lengths * rate[:, None], _INF)
    padded = np.full((m, most + width), _INF)
    padded[:, most:] = shifted
    s0, s1 = padded.strides
    windows = as_strided(padded, (m, width, most), (s0, s1, s1))
    windows = np.where(inside[:, None, :], windows, _INF)
    last = most - 1 - np.argmin(windows[:, :, ::-1], axis=2)  # the last least offset
    q = lengths[None, :] - most + last                        # the l it stands for
    ok = np.take_along_axis(windows, last[:, :, None], axis=2)[:, :, 0] < _INF
    ok[:, 0] = False  # l' >= 1
    qs = np.where(ok, q, 0)
    value = np.take_along_axis(src, qs, axis=1) + (lengths[None, :] - qs) * rate[:, None]
    return np.where(ok, value, _INF).min(axis=0)
