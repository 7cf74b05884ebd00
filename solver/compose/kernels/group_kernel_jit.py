"""The node-group DP's kernels compiled with numba (:mod:`solver.compose.kernels.group_kernel` says
when they run instead of their NumPy twins in :mod:`solver.compose.kernels.group_kernel_np`).

Plain loops over the finite states: a pass touches each reachable state once per transition,
where array code sweeps every (nodes, group, layer) cell of a row it reads. The arithmetic is the
same IEEE double arithmetic as in Python, so the DP's backtracking, written in Python, recomputes
every value bit for bit. The array layouts are in :mod:`solver.compose.kernels.group_kernel`.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_FIRST, _MIDDLE, _LAST, _ONLY = 0, 1, 2, 3  # Position order


@njit(cache=True)
def level_latencies(lat: np.ndarray, it: np.ndarray, cap: np.ndarray, vcap: float,
                    held: np.ndarray, out: np.ndarray) -> None:
    """Compiled twin of `group_kernel.level_latencies`, whose docstring states the contract."""
    levels, width = out.shape
    n_opt = lat.shape[1]
    for d in range(width):
        best = np.inf
        o = 0
        # Levels need non-decreasing capacity; walk them from the most demanding down.
        for j in range(levels - 1, -1, -1):
            while o < n_opt and cap[d, o] >= held[j]:
                if it[d, o] <= vcap and lat[d, o] < best:
                    best = lat[d, o]
                o += 1
            out[j, d] = best


@njit(cache=True)
def _comb(a: float, b: float, sum_mode: bool) -> float:
    return a + b if sum_mode else max(a, b)


@njit(cache=True)
def level_step(j: int, w: np.ndarray, x: np.ndarray, tau: np.ndarray, dmax: np.ndarray,
               link: np.ndarray, gu: np.ndarray, ngroups: np.ndarray, units: np.ndarray,
               masks: np.ndarray, nmask: np.ndarray, allowed: np.ndarray, cap: float,
               sum_mode: bool, overlap: bool, new_w: np.ndarray, new_x: np.ndarray,
               best: np.ndarray, live: np.ndarray, new_live: np.ndarray, rows: np.ndarray,
               new_rows: np.ndarray) -> None:
    """Place one stage at level ``j`` from every state of ``w``/``x`` into ``new_w``/``new_x``
    (their marks all 0: no row holds a state, whatever the arrays hold). Complete plans
    improve ``best`` = ``[value, k, mask index, group, nodes]`` (strictly smaller values
    only). ``live[k, mi, u]`` and ``rows[mask, k2, g2]`` mark the rows of ``x`` and ``w`` that
    hold a state (others are skipped, never read); the rows written are marked in
    ``new_live`` and ``new_rows``, each filled with ``inf`` before its first state."""
    big_k = tau.shape[0]
    big_l = tau.shape[4] - 1
    wany = np.zeros(w.shape[0], dtype=np.bool_)
    for mask in range(w.shape[0]):
        wany[mask] = rows[mask].any()
    for k in range(big_k):
        for mi in range(nmask[k]):
            mask = masks[k, mi]
            if j == 0:
                if mask == 0:
                    _from_start(k, mi, tau, dmax, gu, ngroups, units, allowed, cap, sum_mode,
                                new_x, best, new_live)
                continue
            if wany[mask]:
                _from_blocks(j, k, mi, mask, w, tau, dmax, link, gu, ngroups, units, allowed,
                             cap, sum_mode, overlap, new_x, best, big_l, new_live, rows)
            _from_open(j, k, mi, mask, x, tau, dmax, link, gu, ngroups, units, allowed, cap,
                       sum_mode, overlap, new_x, best, big_l, live, new_live)
    _close_blocks(new_x, new_w, masks, nmask, ngroups, units, new_live, new_rows)


@njit(cache=True)
def _open(new_x: np.ndarray, new_live: np.ndarray, k: int, mi: int, u: int) -> None:
    """Mark the row ``new_x[k, mi, u]`` before states are written to it, filled with ``inf``
    first when it was not marked (an unmarked row holds whatever the array held before and is
    never read). Called once per row and source, outside the loops that write."""
    if not new_live[k, mi, u]:
        new_x[k, mi, u] = np.inf
        new_live[k, mi, u] = 1


@njit(cache=True)
def _offer(best: np.ndarray, value: float, k: int, mi: int, gi: int, u: int) -> None:
    """Keep the least value; among equal values the least ``(k, mi, gi, u)``, whatever the
    order of the offers."""
    if value < best[0] or (value == best[0] and (k, mi, gi, u) < (
            int(best[1]), int(best[2]), int(best[3]), int(best[4]))):
        best[0], best[1], best[2], best[3], best[4] = value, k, mi, gi, u


@njit(cache=True)
def _from_start(k, mi, tau, dmax, gu, ngroups, units, allowed, cap, sum_mode, new_x, best,
                new_live):
    """The pipeline's last stage (holds the LM head; the whole model when it is the only one)."""
    big_l = tau.shape[4] - 1
    for gi in range(ngroups[k]):
        g = gu[k, gi]
        if g > units[k]:
            continue
        top = min(dmax[k, gi, _LAST, 0], big_l - 1)
        if top >= 1:
            _open(new_x, new_live, k, mi, g)
        for d in range(1, top + 1):
            t = tau[k, gi, _LAST, 0, d]
            if t <= cap:
                v = _comb(0.0, t, sum_mode)
                if v < new_x[k, mi, g, gi, d]:
                    new_x[k, mi, g, gi, d] = v
                    new_live[k, mi, g] = 1
        t = tau[k, gi, _ONLY, 0, big_l]
        if t <= cap and allowed[1 << k]:
            _offer(best, _comb(0.0, t, sum_mode), k, mi, gi, g)


@njit(cache=True)
def _place(j, k, mi, gi, g_units, base, c, l, tau, dmax, allowed, mask, cap, sum_mode, new_x,
           best, big_l, new_live):
    """With overlap: a stage of group ``gi`` and every length in front of a state of value
    ``base`` at ``l`` layers, behind it a boundary of ``c`` seconds (the stage costs
    ``max(τ, c)``; without overlap :func:`_place_after` does this)."""
    top = min(dmax[k, gi, _MIDDLE, j], big_l - 1 - l)
    for d in range(1, top + 1):
        t = tau[k, gi, _MIDDLE, j, d]
        if t <= cap:
            v = _comb(base, max(t, c), sum_mode)
            if v < new_x[k, mi, g_units, gi, l + d]:
                new_x[k, mi, g_units, gi, l + d] = v
                new_live[k, mi, g_units] = 1
    t = tau[k, gi, _FIRST, j, big_l - l]
    if t <= cap and allowed[mask | (1 << k)]:
        _offer(best, _comb(base, max(t, c), sum_mode), k, mi, gi, g_units)


@njit(cache=True)
def _place_after(j, k, mi, gi, g_units, a, l, tau, dmax, allowed, mask, cap, sum_mode, new_x,
                 best, big_l, new_live):
    """:func:`_place` without overlap, the state and its boundary already combined into ``a``
    (the least over the states behind: combining with ``τ`` is monotone, so the least is kept
    bit for bit)."""
    top = min(dmax[k, gi, _MIDDLE, j], big_l - 1 - l)
    for d in range(1, top + 1):
        t = tau[k, gi, _MIDDLE, j, d]
        if t <= cap:
            v = _comb(a, t, sum_mode)
            if v < new_x[k, mi, g_units, gi, l + d]:
                new_x[k, mi, g_units, gi, l + d] = v
                new_live[k, mi, g_units] = 1
    t = tau[k, gi, _FIRST, j, big_l - l]
    if t <= cap and allowed[mask | (1 << k)]:
        _offer(best, _comb(a, t, sum_mode), k, mi, gi, g_units)


@njit(cache=True)
def _least_via(row: np.ndarray, c: float, sum_mode: bool, a: np.ndarray, big_l: int) -> None:
    """``a[l] = min(a[l], row[l] ⊕ c)`` over the lengths ``1 .. L − 1`` that hold a state (the
    least over the states behind and their boundaries, taken in any order: min is exact)."""
    for l in range(1, big_l):
        v = row[l]
        if v != np.inf:
            t = _comb(v, c, sum_mode)
            if t < a[l]:
                a[l] = t


@njit(cache=True)
def _any_finite(a: np.ndarray, big_l: int) -> bool:
    """Whether some length ``1 .. L − 1`` of ``a`` holds a state."""
    for l in range(1, big_l):
        if a[l] != np.inf:
            return True
    return False


@njit(cache=True)
def _from_blocks(j, k, mi, mask, w, tau, dmax, link, gu, ngroups, units, allowed, cap, sum_mode,
                 overlap, new_x, best, big_l, new_live, rows):
    """A new block of island ``k`` in front of a closed block of another island (``rows``:
    the ``(mask, island, group)`` rows of ``w`` that hold a state)."""
    big_k = tau.shape[0]
    if not overlap:  # the least state-plus-boundary first, then one sweep over the lengths
        a = np.empty(big_l + 1)
        for gi in range(ngroups[k]):
            if gu[k, gi] > units[k]:
                continue
            a[:] = np.inf
            for k2 in range(big_k):
                if (mask >> k2) & 1:
                    for g2 in range(ngroups[k2]):
                        c = link[k, gi, k2, g2]
                        if c <= cap and rows[mask, k2, g2] != 0:
                            _least_via(w[mask, k2, g2], c, sum_mode, a, big_l)
            if _any_finite(a, big_l):
                _open(new_x, new_live, k, mi, gu[k, gi])
            for l in range(1, big_l):
                if a[l] != np.inf:
                    _place_after(j, k, mi, gi, gu[k, gi], a[l], l, tau, dmax, allowed, mask,
                                 cap, sum_mode, new_x, best, big_l, new_live)
        return
    for k2 in range(big_k):
        if not (mask >> k2) & 1:
            continue
        for g2 in range(ngroups[k2]):
            if rows[mask, k2, g2] == 0:
                continue
            for l in range(1, big_l):
                wv = w[mask, k2, g2, l]
                if wv == np.inf:
                    continue
                for gi in range(ngroups[k]):
                    c = link[k, gi, k2, g2]
                    if c > cap or gu[k, gi] > units[k]:
                        continue
                    _open(new_x, new_live, k, mi, gu[k, gi])
                    _place(j, k, mi, gi, gu[k, gi], wv, c, l, tau, dmax, allowed, mask, cap,
                           sum_mode, new_x, best, big_l, new_live)


@njit(cache=True)
def _from_open(j, k, mi, mask, x, tau, dmax, link, gu, ngroups, units, allowed, cap, sum_mode,
               overlap, new_x, best, big_l, live, new_live):
    """One more stage in front of island ``k``'s open block."""
    a = np.empty(big_l + 1)
    for u in range(1, units[k] + 1):
        if not live[k, mi, u]:
            continue
        if not overlap:  # as in _from_blocks: the least over the group behind first
            for gi in range(ngroups[k]):
                if u + gu[k, gi] > units[k]:
                    continue
                a[:] = np.inf
                for gp in range(ngroups[k]):
                    c = link[k, gi, k, gp]
                    if c <= cap:
                        _least_via(x[k, mi, u, gp], c, sum_mode, a, big_l)
                if _any_finite(a, big_l):
                    _open(new_x, new_live, k, mi, u + gu[k, gi])
                for l in range(1, big_l):
                    if a[l] != np.inf:
                        _place_after(j, k, mi, gi, u + gu[k, gi], a[l], l, tau, dmax, allowed,
                                     mask, cap, sum_mode, new_x, best, big_l, new_live)
            continue
        for gp in range(ngroups[k]):
            for l in range(1, big_l):
                xv = x[k, mi, u, gp, l]
                if xv == np.inf:
                    continue
                for gi in range(ngroups[k]):
                    g = gu[k, gi]
                    c = link[k, gi, k, gp]
                    if u + g > units[k] or c > cap:
                        continue
                    _open(new_x, new_live, k, mi, u + g)
                    _place(j, k, mi, gi, u + g, xv, c, l, tau, dmax, allowed, mask, cap,
                           sum_mode, new_x, best, big_l, new_live)


@njit(cache=True)
def _close_blocks(new_x, new_w, masks, nmask, ngroups, units, new_live, new_rows):
    """``W[mask ∪ k, k, g, l] = min_u X[k, mi, u, g, l]``: the open blocks, closed (the rows
    written marked in ``new_rows``)."""
    big_k = new_x.shape[0]
    width = new_x.shape[4]
    for k in range(big_k):
        for mi in range(nmask[k]):
            mask2 = masks[k, mi] | (1 << k)
            for u in range(1, units[k] + 1):
                if not new_live[k, mi, u]:
                    continue
                for gi in range(ngroups[k]):
                    for l in range(width):
                        v = new_x[k, mi, u, gi, l]
                        if v == np.inf:
                            continue
                        if not new_rows[mask2, k, gi]:  # the row's first state: fill it
                            new_w[mask2, k, gi] = np.inf
                            new_rows[mask2, k, gi] = 1
                        if v < new_w[mask2, k, gi, l]:
                            new_w[mask2, k, gi, l] = v


@njit(cache=True)
def drop_dominated(x: np.ndarray, units: np.ndarray, ngroups: np.ndarray,
                   nmask: np.ndarray, live: np.ndarray) -> None:
    """Compiled twin of `group_kernel.drop_dominated`, whose docstring states the contract."""
    best = np.empty(x.shape[3:])
    for k in range(x.shape[0]):
        for mi in range(nmask[k]):
            best[:] = np.inf
            for u in range(1, units[k] + 1):
                if not live[k, mi, u]:
                    continue
                for gi in range(ngroups[k]):
                    for l in range(x.shape[4]):
                        v = x[k, mi, u, gi, l]
                        if v > best[gi, l]:
                            x[k, mi, u, gi, l] = np.inf
                        elif v < best[gi, l]:
                            best[gi, l] = v


@njit(cache=True)
def prune(arr: np.ndarray, rest: np.ndarray, budget: float, scale: float = 0.0,
          t_bound: float = np.inf) -> int:
    """Compiled twin of `group_kernel.prune`, whose docstring states the contract."""
    flat = arr.reshape(-1, arr.shape[-1])
    alive, removed = 0, 0
    for i in range(flat.shape[0]):
        for l in range(flat.shape[1]):
            v = flat[i, l]
            if v != np.inf:
                if v + rest[l] > budget or v * (1.0 + scale) + rest[l] > t_bound:
                    flat[i, l] = np.inf
                    removed = 2
                else:
                    alive = 1
    return alive | removed


@njit(cache=True)
def prune_rows(x: np.ndarray, live: np.ndarray, rest: np.ndarray, budget: float,
               scale: float = 0.0, t_bound: float = np.inf) -> int:
    """Compiled twin of `group_kernel.prune_rows`, whose docstring states the contract."""
    alive, removed = 0, 0
    for k in range(x.shape[0]):
        for mi in range(x.shape[1]):
            for u in range(x.shape[2]):
                if not live[k, mi, u]:
                    continue
                flags = prune(x[k, mi, u], rest, budget, scale, t_bound)
                removed |= flags & 2
                if flags & 1:
                    alive = 1
                else:
                    live[k, mi, u] = 0
    return alive | removed

