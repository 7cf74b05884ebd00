"""The node-group DP's bounds (:mod:`solver.compose.groups.group_bounds`) compiled with numba:
:mod:`solver.compose.groups.group_bounds` says when they run instead of their NumPy twins in
:mod:`solver.compose.kernels.group_bounds_np`.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def knapsack_layers(units: int, sizes: np.ndarray, value: np.ndarray) -> int:
    """Compiled twin of `group_bounds.knapsack_layers`, whose docstring states the contract."""
    best = np.zeros(units + 1, dtype=np.int64)
    for u in range(1, units + 1):
        top = best[u - 1]
        for i in range(sizes.size):
            g = sizes[i]
            if 0 < g <= u and best[u - g] + value[i] > top:
                top = best[u - g] + value[i]
        best[u] = top
    return best[units]


@njit(cache=True)
def layers_within(units: np.ndarray, gu: np.ndarray, ngroups: np.ndarray,
                  longest: np.ndarray, depth: int) -> int:
    """Compiled twin of `group_bounds.layers_within`, whose docstring states the contract."""
    total = 0
    for k in range(units.size):
        ng = ngroups[k]
        got = knapsack_layers(units[k], gu[k, :ng], longest[k, :ng])
        top = 0
        for gi in range(ng):
            top = max(top, longest[k, gi])
        total += min(got, depth * top)
    return total


@njit(cache=True, inline="always")
def _longest(tmin: np.ndarray, k: int, ngroups: int, cap: float) -> np.ndarray:
    """Per group of island ``k``, the longest slice within ``cap`` (0: none)."""
    top = np.zeros(ngroups, dtype=np.int64)
    for gi in range(ngroups):
        for d in range(tmin.shape[2]):
            if tmin[k, gi, d] <= cap:
                top[gi] = d
    return top


@njit(cache=True, inline="always")
def _min_plus(total: np.ndarray, island: np.ndarray) -> np.ndarray:
    """``out[l] = min over a + b = l of total[a] + island[b]``: the islands met so far and one
    more, their layers added (islands are not ordered in the cover bound)."""
    width = total.size
    merged = np.full(width, np.inf)
    for a in range(width):
        if total[a] == np.inf:
            continue
        for b in range(width - a):
            if island[b] != np.inf and total[a] + island[b] < merged[a + b]:
                merged[a + b] = total[a] + island[b]
    return merged


@njit(cache=True)
def cover_costs(tmin: np.ndarray, gu: np.ndarray, ngroups: np.ndarray, units: np.ndarray,
                cap: float) -> np.ndarray:
    """Compiled twin of `group_bounds.cover_costs`, whose docstring states the contract."""
    return _cover(tmin, tmin[:, :, 0], gu, ngroups, units, cap, False)


@njit(cache=True)
def cover_costs_linear(tmin: np.ndarray, per_layer: np.ndarray, gu: np.ndarray,
                       ngroups: np.ndarray, units: np.ndarray, cap: float) -> np.ndarray:
    """Compiled twin of `group_bounds.cover_costs_linear`, whose docstring states the contract."""
    return _cover(tmin, per_layer, gu, ngroups, units, cap, True)


@njit(cache=True)
def _cover(tmin: np.ndarray, per_layer: np.ndarray, gu: np.ndarray, ngroups: np.ndarray,
           units: np.ndarray, cap: float, linear: bool) -> np.ndarray:
    """The cover bound: per island the least latency of its stages covering each count of
    layers (:func:`_island_cover` or, ``linear``, :func:`_island_cover_linear`), combined over
    the islands (:func:`_min_plus`)."""
    width = tmin.shape[2]
    total = np.full(width, np.inf)
    total[0] = 0.0
    for k in range(gu.shape[0]):
        top = _longest(tmin, k, ngroups[k], cap)
        if linear:
            best_k = _island_cover_linear(per_layer[k], gu[k], ngroups[k], units[k], top, width)
        else:
            best_k = _island_cover(tmin[k], gu[k], ngroups[k], units[k], top, cap)
        total = _min_plus(total, best_k)
    return total


@njit(cache=True, inline="always")
def _island_cover(tmin_k: np.ndarray, gu_k: np.ndarray, ngroups: int, units: int,
                  top: np.ndarray, cap: float) -> np.ndarray:
    """One island's knapsack over (nodes, layers): the least summed latency of its stages
    covering each count of layers within its nodes."""
    width = tmin_k.shape[1]
    f = np.full((units + 1, width), np.inf)
    f[0, 0] = 0.0
    best = np.full(width, np.inf)
    for u in range(units + 1):
        for l in range(width):
            base = f[u, l]
            if base == np.inf:
                continue
            if base < best[l]:
                best[l] = base
            for gi in range(ngroups):
                g = gu_k[gi]
                if u + g > units:
                    continue
                for d in range(1, min(top[gi], width - 1 - l) + 1):
                    t = tmin_k[gi, d]
                    if t <= cap and base + t < f[u + g, l + d]:
                        f[u + g, l + d] = base + t
    return best


@njit(cache=True, inline="always")
def _island_cover_linear(per_layer_k: np.ndarray, gu_k: np.ndarray, ngroups: int, units: int,
                         top: np.ndarray, width: int) -> np.ndarray:
    """:func:`_island_cover` where a stage of ``d`` layers on group ``g`` takes
    ``d · per_layer_k[g]``: each group's transitions as a sliding-window minimum."""
    f = np.full((units + 1, width), np.inf)
    f[0, 0] = 0.0
    best = np.full(width, np.inf)
    queue = np.empty(width, dtype=np.int64)
    shifted = np.empty(width)
    for u in range(units + 1):
        for l in range(width):
            if f[u, l] < best[l]:
                best[l] = f[u, l]
        for gi in range(ngroups):
            g, a, most = gu_k[gi], per_layer_k[gi], top[gi]
            if u + g > units or most == 0:
                continue
            head, tail = 0, 0
            for lp in range(1, width):
                l = lp - 1  # enters the window [lp − most, lp − 1]
                if f[u, l] < np.inf:
                    shifted[l] = f[u, l] - l * a
                    while tail > head and shifted[queue[tail - 1]] >= shifted[l]:
                        tail -= 1
                    queue[tail] = l
                    tail += 1
                while tail > head and queue[head] < lp - most:
                    head += 1
                if tail > head:
                    c = f[u, queue[head]] + (lp - queue[head]) * a
                    if c < f[u + g, lp]:
                        f[u + g, lp] = c
    return best
