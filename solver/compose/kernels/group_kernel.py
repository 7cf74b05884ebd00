"""Inner loops of the node-group DP (:mod:`solver.compose.groups.group_dp`), each with two twins that
give the same values bit for bit: compiled with numba (:mod:`solver.compose.kernels.group_kernel_jit`)
and NumPy (:mod:`solver.compose.kernels.group_kernel_np`, :mod:`solver.compose.kernels.group_step_np`).
:mod:`solver.compose.kernels.kernel_switch` picks one per call from the work the call states: NumPy
until the process's NumPy work reaches numba's start-up price, compiled from then on.

Array layouts (all padded, ``inf`` where absent):

* ``tau[k, g, p, j, d]`` — latency of a stage of group ``g`` of island ``k`` at position ``p``
  (index into :class:`~solver.compose.table.Position`), level ``j``, length ``d``;
* ``link[k, g, k2, g2]`` — boundary from group ``g`` of island ``k`` to the stage behind it,
  group ``g2`` of island ``k2`` (``k2 = k``: inside the island);
* ``W[mask, k, g, l]`` and ``X[k, mi, u, g, l]`` — the DP states of one level (see the DP's
  module docstring), with marks over their rows (``rows[mask, k, g]``, ``live[k, mi, u]``):
  only a marked row holds states and is read. A row is filled with ``inf`` when it is first
  written, so a level array is never cleared as a whole (a pass writes few of its rows).
"""

from __future__ import annotations

import numpy as np

from solver.compose.kernels import group_kernel_np as _np
from solver.compose.kernels import group_step_np as _np_step
from solver.compose.kernels.kernel_switch import (compiled_module, compiled_now, numpy_seconds,
                                          use_compiled)

__all__ = ["level_latencies", "level_step", "drop_dominated", "prune", "prune_rows"]

_JIT = "solver.compose.kernels.group_kernel_jit"


def level_latencies(lat: np.ndarray, it: np.ndarray, cap: np.ndarray, vcap: float,
                    held: np.ndarray, out: np.ndarray) -> None:
    """``out[j, d]`` = least latency over options of length ``d`` with per-iteration time
    ``<= vcap`` and capacity ``>= held[j]`` (``inf`` if none). ``lat``/``it``/``cap`` are
    ``(L + 1, O)`` with options ordered by decreasing capacity."""
    if use_compiled(numpy_seconds(16, 8 * lat.size + 4 * out.size)):
        compiled_module(_JIT).level_latencies(lat, it, cap, vcap, held, out)
    else:
        _np.level_latencies(lat, it, cap, vcap, held, out)


def level_step(j: int, w: np.ndarray, x: np.ndarray, tau: np.ndarray, dmax: np.ndarray,
               link: np.ndarray, gu: np.ndarray, ngroups: np.ndarray, units: np.ndarray,
               masks: np.ndarray, nmask: np.ndarray, allowed: np.ndarray, cap: float,
               sum_mode: bool, overlap: bool, new_w: np.ndarray, new_x: np.ndarray,
               best: np.ndarray, live: np.ndarray, new_live: np.ndarray, rows: np.ndarray,
               new_rows: np.ndarray) -> None:
    """Place one stage at level ``j`` from every state of ``w``/``x`` into ``new_w``/``new_x``
    (their marks all 0: no row holds a state, whatever the arrays hold). Complete plans
    improve ``best`` = ``[value, k, mask index, group, nodes]`` (strictly smaller values
    only; among equal values the least ``(k, mask index, group, nodes)``). ``live[k, mi, u]``
    and ``rows[mask, k2, g2]`` mark the rows of ``x`` and ``w`` that hold a state (others are
    skipped, never read); the rows written are marked in ``new_live`` and ``new_rows``, each
    filled with ``inf`` before its first state."""
    args = (j, w, x, tau, dmax, link, gu, ngroups, units, masks, nmask, allowed, cap, sum_mode,
            overlap, new_w, new_x, best, live, new_live, rows, new_rows)
    if compiled_now() or use_compiled(_step_seconds(j, x, tau, dmax, live, rows, overlap),
                                      charge=False):
        compiled_module(_JIT).level_step(*args)
    else:
        _np_step.level_step(*args)


def _step_seconds(j: int, x: np.ndarray, tau: np.ndarray, dmax: np.ndarray, live: np.ndarray,
                  rows: np.ndarray, overlap: bool) -> float:
    """The most :func:`~solver.compose.kernels.group_step_np.level_step` may cost (it counts what it
    did itself: that depends on how many states are finite): every marked row full of states,
    each taking every length up to the longest middle stage of the level."""
    big_k, n_masks, _, big_g, width = x.shape
    marked = int(np.count_nonzero(live)) * big_g + int(np.count_nonzero(rows))
    sources = (marked + big_k * n_masks) * big_g * (big_g if overlap else 1)
    longest = int(dmax[:, :, 1, min(j, dmax.shape[3] - 1)].max(initial=0)) + 1
    return numpy_seconds(_np_step.STEP_CALLS,
                         3 * marked * big_g * width + sources * width * (14 + 8 * longest))


def drop_dominated(x: np.ndarray, units: np.ndarray, ngroups: np.ndarray,
                   nmask: np.ndarray, live: np.ndarray) -> None:
    """Set to ``inf`` every open-block state ``X[k, mi, u, g, l]`` whose value is strictly above
    that of the same state with fewer nodes used: whatever completes the one with more nodes
    completes the other at the same cost (same front group, level and layers; budgets and the
    use-all rule look at islands, not nodes). Provably safe; equal values are kept for the tie
    rule. Only the rows ``live`` marks are read."""
    if compiled_now() or use_compiled(_drop_seconds(x, live)):
        compiled_module(_JIT).drop_dominated(x, units, ngroups, nmask, live)
    else:
        _np.drop_dominated(x, units, ngroups, nmask, live)


def prune(arr: np.ndarray, rest: np.ndarray, budget: float, scale: float = 0.0,
          t_bound: float = np.inf) -> int:
    """Set states to ``inf`` (last axis ``l``) whose value ``v`` gives ``v + rest[l] > budget``
    or ``v·(1 + scale) + rest[l] > t_bound``; returns ``1`` if a finite state is left plus
    ``2`` if any was removed."""
    if use_compiled(numpy_seconds(10, arr.size * 8)):
        return int(compiled_module(_JIT).prune(arr, rest, budget, scale, t_bound))
    return _np.prune(arr, rest, budget, scale, t_bound)


def prune_rows(x: np.ndarray, live: np.ndarray, rest: np.ndarray, budget: float,
               scale: float = 0.0, t_bound: float = np.inf) -> int:
    """:func:`prune` over the rows of ``x`` that ``live[k, mi, u]`` marks (the others hold no
    state); a row left without a state is unmarked."""
    if compiled_now() or use_compiled(_prune_seconds(x, live)):
        return int(compiled_module(_JIT).prune_rows(x, live, rest, budget, scale, t_bound))
    return _np.prune_rows(x, live, rest, budget, scale, t_bound)


def _drop_seconds(x: np.ndarray, live: np.ndarray) -> float:
    """What :func:`~solver.compose.kernels.group_kernel_np.drop_dominated` costs: a few NumPy calls per
    marked row, its cells three times."""
    marked = int(np.count_nonzero(live))
    return numpy_seconds(10 + marked, 3 * marked * (x.size // live.size))


def _prune_seconds(x: np.ndarray, live: np.ndarray) -> float:
    """What :func:`~solver.compose.kernels.group_kernel_np.prune_rows` costs: the marks and the marked
    rows' cells three times."""
    marked = int(np.count_nonzero(live))
    return numpy_seconds(8, live.size + 3 * marked * (x.size // live.size))
