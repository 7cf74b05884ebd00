"""NumPy twins of the node-group DP's small kernels (:mod:`solver.compose.kernels.group_kernel_jit`):
the same values bit for bit, for tables too small to pay for numba's start-up
(:mod:`solver.compose.kernels.kernel_switch`). The level step itself is in
:mod:`solver.compose.kernels.group_step_np`.

Every value is one IEEE operation on the same operands as in the compiled loops (a sum, a
``max``, a product), and minima are exact whatever their order, so sweeping whole rows instead
of walking the finite states changes no bit. Rows that no mark says hold states are never read
as values (their cells are whatever the level array held before).
"""

from __future__ import annotations

import numpy as np

_INF = np.inf


def level_latencies(lat: np.ndarray, it: np.ndarray, cap: np.ndarray, vcap: float,
                    held: np.ndarray, out: np.ndarray) -> None:
    """``out[j, d]`` = least latency over options of length ``d`` with per-iteration time
    ``<= vcap`` and capacity ``>= held[j]`` (``inf`` if none). ``lat``/``it``/``cap`` are
    ``(L + 1, O)`` with options ordered by decreasing capacity (integers).

    The compiled walk takes options from the most demanding level down and never gives one
    back: level ``j`` sees the first ``P[j, d]`` options, ``P`` the running maximum, from the
    top level down, of the count of options holding ``held[j]`` (a prefix, capacities
    descending), and its latency is the prefix minimum there. The counts come from one sorted
    search over every row laid end to end (negated capacities ascend within a row; a gap wider
    than their range separates the rows)."""
    levels, width = out.shape
    n_opt = lat.shape[1]
    if n_opt == 0:
        out[:] = _INF
        return
    usable = np.where(it[:width] <= vcap, lat[:width], _INF)
    prefix = np.empty((width, n_opt + 1))
    prefix[:, 0] = _INF  # no option taken
    np.minimum.accumulate(usable, axis=1, out=prefix[:, 1:])
    neg = -cap[:width].astype(np.int64)
    low = int(neg.min())
    gap = int(neg.max()) - low + 1
    row = np.arange(width) * gap
    ends = (neg - low + row[:, None]).ravel()
    wanted = np.clip(-held.astype(np.int64) - low, -1, gap - 1)[:, None] + row[None, :]
    counts = np.searchsorted(ends, wanted, side="right") - np.arange(width)[None, :] * n_opt
    taken = np.maximum.accumulate(counts[::-1], axis=0)[::-1]
    out[:] = prefix[np.arange(width)[None, :], taken]


def drop_dominated(x: np.ndarray, units: np.ndarray, ngroups: np.ndarray,
                   nmask: np.ndarray, live: np.ndarray) -> None:
    """Set to ``inf`` every open-block state ``X[k, mi, u, g, l]`` whose value is strictly above
    that of the same state with fewer nodes used (see the compiled twin): a state goes when it
    is above the least of the marked rows before it, all their states counted (a dropped state
    never lowered that least). Cells beyond an island's groups hold ``inf`` in a marked row
    (rows are filled when opened), so they are neither dropped nor lower a least."""
    k, mi, u = _marked_rows(live, units, nmask)
    again = (k[1:] == k[:-1]) & (mi[1:] == mi[:-1])  # the row after a row of the same block
    if not again.any():
        return
    rows = x[k, mi, u]
    for start, stop in _runs(again):
        block = rows[start:stop]
        before = np.minimum.accumulate(block[:-1], axis=0)
        block[1:][block[1:] > before] = _INF
    x[k, mi, u] = rows


def _marked_rows(live: np.ndarray, units: np.ndarray, nmask: np.ndarray) -> tuple:
    """``(k, mi, u)`` of the marked rows the compiled loops read (``1 <= u <= units[k]``,
    ``mi < nmask[k]``), ordered by block ``(k, mi)`` then ``u``."""
    big_k, big_m, big_u = live.shape
    span = np.arange(big_u)[None, None, :]
    read = (live != 0) & (np.arange(big_m)[None, :, None] < nmask[:, None, None]) & \
        (span >= 1) & (span <= units[:, None, None])
    return np.nonzero(read)


def _runs(again: np.ndarray) -> list:
    """``(start, stop)`` of the runs of two rows or more, ``again[i]``: row ``i + 1`` continues
    the run of row ``i``."""
    edges = np.flatnonzero(np.diff(np.concatenate(([False], again, [False])).astype(np.int8)))
    return [(int(a), int(b) + 1) for a, b in zip(edges[::2], edges[1::2])]


def prune(arr: np.ndarray, rest: np.ndarray, budget: float, scale: float = 0.0,
          t_bound: float = _INF) -> int:
    """NumPy twin of `group_kernel.prune`, whose docstring states the contract."""
    finite = arr != _INF
    cut = finite & ((arr + rest > budget) | (arr * (1.0 + scale) + rest > t_bound))
    removed = bool(cut.any())
    if removed:
        arr[cut] = _INF
    return int(bool((finite & ~cut).any())) | (2 if removed else 0)


def prune_rows(x: np.ndarray, live: np.ndarray, rest: np.ndarray, budget: float,
               scale: float = 0.0, t_bound: float = _INF) -> int:
    """:func:`prune` over the rows of ``x`` that ``live`` (its first three axes) marks; a row
    left without a state is unmarked."""
    marked = live != 0
    if not marked.any():
        return 0
    rows = x[marked]  # a copy: pruned, then written back
    finite = rows != _INF
    cut = finite & ((rows + rest > budget) | (rows * (1.0 + scale) + rest > t_bound))
    removed = bool(cut.any())
    if removed:
        rows[cut] = _INF
        x[marked] = rows
    kept = (finite & ~cut).reshape(rows.shape[0], -1).any(axis=1)
    if not kept.all():  # a marked row without a state (left so, or emptied) is unmarked
        emptied = np.zeros_like(marked)
        emptied[marked] = ~kept
        live[emptied] = 0
    return int(bool(kept.any())) | (2 if removed else 0)


def close_blocks(new_x: np.ndarray, new_w: np.ndarray, masks: np.ndarray, nmask: np.ndarray,
                 ngroups: np.ndarray, units: np.ndarray, new_live: np.ndarray,
                 new_rows: np.ndarray) -> None:
    """``W[mask ∪ k, k, g, l] = min_u X[k, mi, u, g, l]``: the open blocks, closed (a row
    written is marked in ``new_rows``, filled with ``inf`` first when it was not)."""
    k, mi, u = _marked_rows(new_live, units, nmask)
    if k.size == 0:
        return
    first = np.flatnonzero(np.concatenate(([True], (k[1:] != k[:-1]) | (mi[1:] != mi[:-1]))))
    least = np.minimum.reduceat(new_x[k, mi, u], first, axis=0)  # (block, g, l)
    k, mi = k[first], mi[first]
    b, gi = np.nonzero((least != _INF).any(axis=2) &
                       (np.arange(least.shape[1])[None, :] < ngroups[k][:, None]))
    if b.size == 0:
        return
    k = k[b]
    mask2 = masks[k, mi[b]] | (1 << k)
    old = np.where(new_rows[mask2, k, gi][:, None] != 0, new_w[mask2, k, gi], _INF)
    new_w[mask2, k, gi] = np.minimum(old, least[b, gi])
    new_rows[mask2, k, gi] = 1
