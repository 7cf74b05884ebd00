"""The bounds the node-group DP cuts with before any pass, on stages known only by their least
latencies (:class:`LeastStages`), and their kernels (each compiled with numba in
:mod:`solver.compose.kernels.group_bounds_jit` and in NumPy in :mod:`solver.compose.kernels.group_bounds_np`,
the same values bit for bit; :mod:`solver.compose.kernels.kernel_switch` picks one per call).

* the capacity floor: the least bottleneck under which the islands' groups can hold every
  layer at all (an unbounded knapsack per island, :func:`knapsack_layers`);
* the cover bound ``F_m(L)``: the least summed latency of stages within a bottleneck ``m``
  covering every layer (:func:`cover_costs`; :func:`cover_costs_linear` where a stage's
  latency is linear in its length), which raises the floor against a bar.

:func:`~solver.compose.groups.group_dp.compose_groups_dp` computes them on each table it composes;
the floor table's relaxed check (:mod:`solver.planner.bounds.floor_table`) on a table of one latency
per layer and group, kept across ``n_micro`` and bars.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solver.compose.kernels import group_bounds_np as _np
from solver.compose.kernels.kernel_switch import (compiled_module, compiled_now, numpy_seconds,
                                          python_seconds, use_compiled)

__all__ = ["Slots", "LeastStages", "least_stages", "IterationLevels", "might_beat_with_iterations",
           "layers_within", "knapsack_layers", "cover_costs", "cover_costs_linear"]

_INF = float("inf")
_JIT = "solver.compose.kernels.group_bounds_jit"


def knapsack_layers(units: int, sizes: np.ndarray, value: np.ndarray) -> int:
    """Most of ``value`` (layers per group) that groups of ``sizes`` granules, each any
    number of times, give within ``units`` granules (an unbounded knapsack)."""
    if use_compiled(python_seconds(int(units) * sizes.size)):
        return int(compiled_module(_JIT).knapsack_layers(units, sizes, value))
    return _np.knapsack_layers(units, sizes, value)


def layers_within(units: np.ndarray, gu: np.ndarray, ngroups: np.ndarray,
                  longest: np.ndarray, depth: int) -> int:
    """Most layers the islands' stages hold when a stage on group ``g`` of island ``k``
    holds at most ``longest[k, g]`` layers: per island :func:`knapsack_layers` over its
    groups within its ``units[k]`` granules, at most ``depth`` stages' worth, summed."""
    if use_compiled(python_seconds(int(np.dot(units, ngroups)) + 10 * units.size)):
        return int(compiled_module(_JIT).layers_within(units, gu, ngroups, longest, depth))
    return _np.layers_within(units, gu, ngroups, longest, depth)


def cover_costs(tmin: np.ndarray, gu: np.ndarray, ngroups: np.ndarray, units: np.ndarray,
                cap: float) -> np.ndarray:
    """``F[l]``: a lower bound on the summed latency of any set of stages covering ``l`` layers
    with every stage within ``cap``: each island's groups within its nodes, each stage at its
    cheapest position with one micro-batch in flight (``tmin[k, g, d]``), islands not ordered,
    no links.

    Every plan's stages covering some ``l`` layers cost at least ``F[l]``: a per-island
    knapsack over (nodes, layers), then a min-plus combination over the islands.
    """
    if _cover_compiled(tmin, gu, ngroups, units, cap, linear=False):
        return compiled_module(_JIT).cover_costs(tmin, gu, ngroups, units, cap)
    return _np.cover_costs(tmin, gu, ngroups, units, cap)


def cover_costs_linear(tmin: np.ndarray, per_layer: np.ndarray, gu: np.ndarray,
                       ngroups: np.ndarray, units: np.ndarray, cap: float) -> np.ndarray:
    """:func:`cover_costs` of stages whose latency is linear in their length,
    ``tmin[k, g, d] = d · per_layer[k, g]`` (both given), in ``O(U · G · L)`` per island instead of
    ``O(U · G · L²)``: a stage of group ``g`` added to the states of ``u`` nodes reaches ``l'``
    layers at ``min over l' − D <= l < l'`` of ``f[u, l] + (l' − l) · a``, ``D`` its longest
    slice within ``cap``, which is ``l' · a`` plus a sliding-window minimum of
    ``f[u, l] − l · a`` (a monotone queue). The same values up to rounding."""
    if _cover_compiled(tmin, gu, ngroups, units, cap, linear=True):
        return compiled_module(_JIT).cover_costs_linear(tmin, per_layer, gu, ngroups, units,
                                                        cap)
    return _np.cover_costs_linear(tmin, per_layer, gu, ngroups, units, cap)


def _cover_compiled(tmin: np.ndarray, gu: np.ndarray, ngroups: np.ndarray, units: np.ndarray,
                    cap: float, linear: bool) -> bool:
    """Whether a cover bound runs compiled. Its NumPy twin counts what it swept (the rows it
    pulls depend on the longest slices within the cap); at most, per granule of each island a
    few NumPy calls over every group's row, layers times longest slice, and the min-plus
    combination (layers squared per island). The twin needs groups of at least one granule,
    and for the linear bound a finite cap (the compiled loops' order of operations on infinite
    rates is theirs alone)."""
    if compiled_now():
        return True
    used = np.arange(gu.shape[1])[None, :] < ngroups[:, None]
    if (gu[used] < 1).any() or (linear and not np.isfinite(cap)):
        return True
    width = tmin.shape[2]
    most = int(_np.longest_within(tmin, cap).max(initial=0))
    cells = 8 * int(np.dot(units, ngroups)) * width * most + 3 * gu.shape[0] * width ** 2
    return use_compiled(numpy_seconds(12 * int(units.sum()) + 20, cells), charge=False)


@dataclass(frozen=True)
class Slots:
    """The islands' node granules as the bounds see them: ``gu[k, g]`` granules of group ``g``
    of island ``k`` (``ngroups[k]`` of them), ``units[k]`` granules of island ``k`` and at most
    ``depth`` stages."""

    gu: np.ndarray
    ngroups: np.ndarray
    units: np.ndarray
    depth: int


class LeastStages:
    """Stages known only by their least latencies, and the bounds the group DP cuts with before
    its first pass (:func:`~solver.compose.groups.group_dp.compose_groups_dp`), computed once for many
    ``(n_micro, bar)``.

    ``tmin[k, g, d]``: no stage of ``d`` layers on group ``g`` of island ``k`` is faster, at
    any position and with any micro-batches in flight (``inf``: no such stage); ``slots``: the
    groups' and islands' node granules; ``values``: the caps the bottleneck is searched over
    (sorted, every finite ``tmin`` among them; default: exactly those); ``per_layer``: when
    given, ``tmin[k, g, d] = d · per_layer[k, g]``, whose cover bounds a faster kernel computes
    (:func:`cover_costs_linear`). The capacity floor and the cover bound at each cap depend on
    neither ``n_micro`` nor the bar, so they are kept.
    """

    def __init__(self, tmin: np.ndarray, slots: Slots, values: np.ndarray | None = None,
                 per_layer: np.ndarray | None = None):
        self.tmin, self.slots, self.per_layer = tmin, slots, per_layer
        self.values = np.unique(tmin[np.isfinite(tmin)]) if values is None else values
        self._capacity: float | None = None
        self._covers: dict[int, float] = {}
        # The least latency per layer of any stage: a lower bound on the summed latency per
        # layer of any plan (inf: no stage).
        self._rate = float((tmin[..., 1:] / np.arange(1, tmin.shape[2])).min()) \
            if self.values.size else _INF

    @property
    def layers(self) -> int:
        """``L``: the model's layers."""
        return self.tmin.shape[2] - 1

    def shorter(self, longest: np.ndarray) -> "LeastStages":
        """These stages with at most ``longest[k, g]`` layers on group ``g`` of island ``k``
        (a stage is then a stage of this one: every bound only rises)."""
        keep = np.arange(self.tmin.shape[2]) <= longest[:, :, None]
        tmin = np.where(keep, self.tmin, _INF)
        return LeastStages(tmin, self.slots, np.unique(tmin[np.isfinite(tmin)]), self.per_layer)

    def capacity_floor(self) -> float:
        """A lower bound on the bottleneck: the least cap ``C`` under which the islands could
        hold all ``L`` layers at all, each group's longest slice within ``C`` and each island's
        groups within its nodes (an unbounded knapsack per island). ``inf`` if no cap is
        enough."""
        if self._capacity is None:
            self._capacity = self._least_holding_cap()
        return self._capacity

    def _least_holding_cap(self) -> float:
        tmin, slots, values, big_l = self.tmin, self.slots, self.values, self.layers
        lengths = np.arange(big_l + 1)

        def layers_under(cap: float) -> int:
            longest = np.where(tmin <= cap, lengths, 0).max(axis=2)  # per island and group
            return layers_within(slots.units, slots.gu, slots.ngroups, longest, slots.depth)

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

    def covered(self, i: int) -> float:
        """``F_m(L)`` at the cap ``m = values[i]``: the least summed latency of stages within
        ``m`` covering all layers (:func:`cover_costs`)."""
        got = self._covers.get(i)
        if got is None:
            cap, slots = float(self.values[i]), self.slots
            got = self._covers[i] = float(
                cover_costs(self.tmin, slots.gu, slots.ngroups, slots.units, cap)[self.layers]
                if self.per_layer is None else
                cover_costs_linear(self.tmin, self.per_layer, slots.gu, slots.ngroups,
                                   slots.units, cap)[self.layers])
        return got

    def bottleneck_floor(self, n: int, t_budget: float) -> float:
        """The capacity floor, raised against ``t_budget`` when both are finite: no plan whose
        bottleneck ``m`` has ``(n−1)·floor + F_m(L) >= t_budget`` beats ``t_budget`` (``F_m``
        non-increasing in ``m``), repeated while the floor rises. No plan under ``t_budget``
        has a smaller bottleneck (``inf``: there is none)."""
        floor, values = self.capacity_floor(), self.values
        if not (np.isfinite(floor) and np.isfinite(t_budget)):
            return floor
        for _ in range(4):
            lo = self._first_useful(int(np.searchsorted(values, floor)),
                                    lambda i: (n - 1) * floor + self.covered(i) >= t_budget)
            if lo >= values.size:
                return _INF
            if values[lo] <= floor:
                return floor
            floor = float(values[lo])
        return floor

    def _first_useful(self, lo: int, useless) -> int:
        """The first cap index from ``lo`` that is not ``useless`` (``values.size``: none);
        ``useless`` holds below some index and fails from it on (``F_m`` non-increasing).
        The largest cap first (most searches end there: nothing is useful), then a galloping
        search up from ``lo``, where the answer mostly lies (``fleet-8448``: a median of one
        index above it): about three cover bounds each, not a bisection's twelve."""
        hi = self.values.size
        if lo >= hi or useless(hi - 1):
            return hi
        step, below = 1, lo - 1  # every index up to ``below`` is useless
        while below + step < hi - 1 and useless(below + step):
            below, step = below + step, 2 * step
        top = min(below + step, hi - 1)  # useful
        while below + 1 < top:
            mid = (below + top) // 2
            if useless(mid):
                below = mid
            else:
                top = mid
        return top

    def might_beat(self, n: int, bar: float) -> bool:
        """False when no plan of these stages beats ``bar`` seconds of pipeline: ``T >=
        (n−1)·floor + max(floor, L · least τ/d)`` with the raised bottleneck floor. Provably
        safe for every table whose stages take at least these latencies, on these groups or
        fewer, within the same nodes and at most ``slots.depth`` stages."""
        return self.pipe_floor(n, bar) < bar

    def pipe_floor(self, n: int, bar: float) -> float:
        """What every plan of these stages whose pipeline beats ``bar`` takes at least:
        ``(n−1)·floor + max(floor, L · least τ/d)``, the bottleneck floor raised against
        ``bar`` (``inf``: no plan beats it)."""
        floor = self.bottleneck_floor(n, bar)
        if not np.isfinite(floor):
            return _INF
        return (n - 1) * floor + max(floor, self._rate * self.layers)


class IterationLevels:
    """Stages by the largest per-iteration floor ``v`` of a plan: a plan whose largest floor
    is ``v`` has only stages whose floors are within ``v``, which bounds their lengths
    (:meth:`stages`). Built lazily, each level once: a walk
    (:func:`might_beat_with_iterations`) mostly reads a few.

    ``base``: every stage; ``values``: the distinct floors, ascending; ``floors[k, g, d]``:
    the floor of a stage of ``d`` layers on group ``g`` of island ``k`` (``inf``: none).
    """

    def __init__(self, base: LeastStages, floors: np.ndarray):
        self.base, self._floors = base, floors
        self.values = np.unique(floors[np.isfinite(floors) & np.isfinite(base.tmin)])
        self._levels: dict[int, LeastStages] = {}

    def stages(self, i: int) -> LeastStages:
        """The stages a plan of largest floor ``values[i]`` may use: on each group, the
        lengths up to the longest whose floor is within it (shorter ones above it stay: a
        relaxation)."""
        got = self._levels.get(i)
        if got is None:
            lengths = np.arange(self._floors.shape[2])
            longest = np.where(self._floors <= self.values[i], lengths, 0).max(axis=2)
            got = self._levels[i] = self.base.shorter(longest)
        return got


def might_beat_with_iterations(levels: IterationLevels, n: int, bar: float) -> bool:
    """False when no plan beats ``bar`` seconds with its per-iteration time counted. A plan of
    largest per-iteration floor ``v`` takes ``T >= T_pipe + v`` with its stages among
    ``levels.stages`` of ``v``: the bar is checked at each ``v`` on those stages
    (:meth:`LeastStages.might_beat` against ``bar − v``), from the largest ``v`` down; a ``v``
    at which even all stages leave no room is passed over, and the walk ends where even the
    least ``v`` leaves the stages too slow (at a smaller ``v`` the stages are fewer, no
    faster). Provably safe when every plan's largest per-iteration floor is one of the ``v``,
    its time at least that floor, and its stages among that level's."""
    values = levels.values
    if not values.size:
        return levels.base.might_beat(n, bar)
    room = bar - levels.base.pipe_floor(n, bar)  # the most v a plan beating bar can have
    for i in range(values.size - 1, -1, -1):
        v = float(values[i])
        if v >= room:
            continue
        stages = levels.stages(i)
        if stages.might_beat(n, bar - v):
            return True
        if not stages.might_beat(n, bar - float(values[0])):
            return False  # every smaller v: stages no faster, and at least the least v
    return False


def least_stages(per_layer: np.ndarray, gu: np.ndarray, ngroups: np.ndarray,
                 units: np.ndarray, layers: int) -> LeastStages:
    """:class:`LeastStages` of stages of ``d`` layers at least ``d · per_layer[k, g]`` long
    (``inf``: no group ``g`` on island ``k``), on groups of ``gu[k, :ngroups[k]]`` granules and
    islands of ``units[k]`` granules, as many stages as the smallest groups allow."""
    d = np.arange(layers + 1)
    with np.errstate(invalid="ignore"):  # inf · 0 where no group: no stage of no layers
        tmin = np.where(d > 0, per_layer[:, :, None] * d, np.inf)
    depth = min(layers, int(sum(units[k] // gu[k, :ngroups[k]].min()
                                for k in range(len(units)) if ngroups[k])))
    return LeastStages(tmin, Slots(gu, ngroups, units, depth), per_layer=per_layer)
