"""NumPy twin of the node-group DP's level step
(:func:`solver.compose.kernels.group_kernel_jit.level_step`): the same states, values and best complete
plan bit for bit, for tables too small to pay for numba's start-up
(:mod:`solver.compose.kernels.kernel_switch`).

The step gathers *sources* over every island ``k`` and mask index ``mi`` at once: rows of
values over the layers covered, each with the group ``g`` of the stage placed in front, the node
granules its new row ends at and the boundary ``c`` behind that stage. Without overlap a source
is the least, over the states behind, of state ⊕ boundary (``c = −inf``: ``max(τ, c) = τ``),
as the compiled loops take it; with overlap every state and boundary is a source of its own. A
finite state ``base[l]`` of a source moves to ``l + d`` layers at ``base[l] ⊕ max(τ[d], c)``:
the moves are laid out as flat arrays (the ones the compiled loops walk) and the least per new
cell is kept; the sources of one row merge by their minimum. Each value is the same single IEEE
operation on the same operands as in the compiled loops and minima are exact, so no bit
differs. A row is marked only where it gets a state (the compiled step also marks rows it opens
and leaves empty; they hold no state, and the prune after every step unmarks them). Rows are
read only where marked, and marked rows hold ``inf`` beyond their island's groups (a row is
filled with ``inf`` when it is opened).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from solver.compose.kernels.group_kernel_np import close_blocks
from solver.compose.kernels.kernel_switch import count, numpy_seconds

_INF = np.inf
_FIRST, _MIDDLE, _LAST, _ONLY = 0, 1, 2, 3  # Position order
STEP_CALLS = 60  # NumPy calls a level step makes (about; the island and mask count does not matter)


class _Src(NamedTuple):
    """Rows placing a stage of group ``gi`` of island ``k`` (mask index ``mi``) in front of
    ``base`` (layers ``1 .. L − 1``) behind a boundary ``c``, the new row ending at ``u``."""

    base: np.ndarray  # (S, L − 1)
    c: np.ndarray     # (S,)
    k: np.ndarray     # (S,) int, and likewise below
    mi: np.ndarray
    gi: np.ndarray
    u: np.ndarray


class _Step(NamedTuple):
    """What a level step reads besides the states (the compiled twin's arguments), and the
    groups that fit each island: ``front[k, g]``."""

    j: int
    tau: np.ndarray
    dmax: np.ndarray
    link: np.ndarray
    gu: np.ndarray
    ngroups: np.ndarray
    units: np.ndarray
    masks: np.ndarray
    allowed: np.ndarray
    cap: float
    comb: np.ufunc
    overlap: bool
    front: np.ndarray


def level_step(j: int, w: np.ndarray, x: np.ndarray, tau: np.ndarray, dmax: np.ndarray,
               link: np.ndarray, gu: np.ndarray, ngroups: np.ndarray, units: np.ndarray,
               masks: np.ndarray, nmask: np.ndarray, allowed: np.ndarray, cap: float,
               sum_mode: bool, overlap: bool, new_w: np.ndarray, new_x: np.ndarray,
               best: np.ndarray, live: np.ndarray, new_live: np.ndarray, rows: np.ndarray,
               new_rows: np.ndarray) -> None:
    """Place one stage at level ``j`` from every state of ``w``/``x`` into ``new_w``/``new_x``;
    complete plans improve ``best`` = ``[value, k, mask index, group, nodes]`` (the least value,
    then the least ``(k, mi, g, u)``). Arguments and marks as in the compiled twin."""
    big_g = gu.shape[1]
    front = (np.arange(big_g)[None, :] < ngroups[:, None]) & (gu <= units[:, None])
    step = _Step(j, tau, dmax, link, gu, ngroups, units, masks, allowed, float(cap),
                 np.add if sum_mode else np.maximum, bool(overlap), front)
    used = np.arange(masks.shape[1])[None, :] < nmask[:, None]  # (k, mi) pairs
    if j == 0:
        offer = _from_start(step, used & (masks == 0), new_x, new_live)
        cells = 20 * tau.shape[0] * big_g * x.shape[4]
    else:
        offer, cells = _one_more(step, used, w, x, live, rows, new_x, new_live)
    if offer is not None:
        _offer(best, *offer)
    close_blocks(new_x, new_w, masks, nmask, ngroups, units, new_live, new_rows)
    count(numpy_seconds(STEP_CALLS, cells))


def _one_more(step: _Step, used: np.ndarray, w: np.ndarray, x: np.ndarray, live: np.ndarray,
              rows: np.ndarray, new_x: np.ndarray, new_live: np.ndarray) -> tuple:
    """A stage in front of every state (level ``j >= 1``), written to ``new_x``; returns the
    best complete plan's offer (None: none) and the cells the twin swept: the states gathered,
    each source row a dozen times, each move (a state and a length) eight times."""
    big_g, width = x.shape[3], x.shape[4]
    found = [s for s in (_from_blocks(step, used, w, rows), _from_open(step, used, x, live))
             if s is not None]
    gathered = 3 * big_g * width * (big_g * int(np.count_nonzero(live)) +
                                    int(np.count_nonzero(rows)))
    if not found:
        return None, gathered
    src = found[0] if len(found) == 1 else _Src(*(np.concatenate(p) for p in zip(*found)))
    if src.k.size == 0:
        return None, gathered
    out, moves = _middle(step, src)
    _write(new_x, new_live, src, out)
    return _first(step, src), gathered + 8 * moves + 14 * src.base.size


def _offer(best: np.ndarray, value: float, k: int, mi: int, gi: int, u: int) -> None:
    """The compiled twin's offer: keep the least value, among equal values the least key."""
    if value < best[0] or (value == best[0] and (k, mi, gi, u) < (
            int(best[1]), int(best[2]), int(best[3]), int(best[4]))):
        best[0], best[1], best[2], best[3], best[4] = value, k, mi, gi, u


def _least_offer(value: np.ndarray, ok: np.ndarray, src: _Src) -> tuple | None:
    """The least ``(value, k, mi, gi, u)`` over the sources' entries ``ok`` (None: none); the
    order of offers does not change the compiled twin's best either."""
    if not ok.any():
        return None
    least = np.where(ok, value, _INF).min()
    hit = np.flatnonzero((ok & (value == least)).reshape(ok.shape[0], -1).any(axis=1))
    s = hit[np.lexsort((src.u[hit], src.gi[hit], src.mi[hit], src.k[hit]))[0]]
    return float(least), int(src.k[s]), int(src.mi[s]), int(src.gi[s]), int(src.u[s])


def _from_start(step: _Step, start: np.ndarray, new_x: np.ndarray, new_live: np.ndarray):
    """The pipeline's last stage (the whole model when it is the only one) of every island
    (``start[k, mi]``: the empty mask): written to ``new_x``; returns the best one-stage plan's
    offer (None: none)."""
    big_l = step.tau.shape[4] - 1
    pair_k, pair_mi = np.nonzero(start)
    p, gi = np.nonzero(step.front[pair_k])
    k = pair_k[p]
    u = step.gu[k, gi]
    top = np.minimum(step.dmax[k, gi, _LAST, 0], big_l - 1)
    t = step.tau[k, gi, _LAST, 0, 1:big_l]
    ok = (np.arange(1, big_l)[None, :] <= top[:, None]) & (t <= step.cap)
    src = _Src(np.zeros((k.size, 1)), np.full(k.size, -_INF), k, pair_mi[p], gi, u)
    _write(new_x, new_live, src, np.where(ok, step.comb(0.0, t), _INF))
    whole = step.tau[k, gi, _ONLY, 0, big_l]
    return _least_offer(step.comb(0.0, whole), (whole <= step.cap) & step.allowed[1 << k], src)


def _from_blocks(step: _Step, used: np.ndarray, w: np.ndarray, rows: np.ndarray):
    """Sources of a new block of island ``k`` in front of a closed block of other islands: the
    ``(island, group)`` rows of ``w[mask]`` that hold states (None: none)."""
    big_k, big_g = step.gu.shape
    inside = (step.masks[:, :, None] >> np.arange(big_k)) & 1 != 0  # (k, mi, k2)
    groups = np.arange(big_g)[None, :] < step.ngroups[:, None]     # (k2, g2)
    held = (rows[step.masks] != 0) & inside[..., None] & groups & used[..., None, None]
    k, mi, k2, g2 = np.nonzero(held)  # ordered by (k, mi)
    if k.size == 0:
        return None
    big_l = w.shape[3] - 1
    states = w[step.masks[k, mi], k2, g2, 1:big_l]                # (n, L − 1)
    c = step.link[k[:, None], np.arange(big_g)[None, :], k2[:, None], g2[:, None]]  # (n, g)
    crossed = (c <= step.cap) & step.front[k]
    if step.overlap:
        n, gi = np.nonzero(crossed)
        return _Src(states[n], c[n, gi], k[n], mi[n], gi, step.gu[k[n], gi])
    via = step.comb(states[:, None, :], np.where(crossed, c, _INF)[:, :, None])
    first = np.flatnonzero(np.r_[True, (k[1:] != k[:-1]) | (mi[1:] != mi[:-1])])
    least = np.minimum.reduceat(via, first, axis=0)               # (block, g, L − 1)
    k, mi = k[first], mi[first]
    b, gi = np.nonzero(step.front[k])
    return _Src(least[b, gi], np.full(b.size, -_INF), k[b], mi[b], gi, step.gu[k[b], gi])


def _from_open(step: _Step, used: np.ndarray, x: np.ndarray, live: np.ndarray):
    """Sources of one more stage in front of each island's open blocks (None: none)."""
    big_k, big_g = step.gu.shape
    span = np.arange(x.shape[2])[None, None, :]
    open_rows = (live != 0) & used[..., None] & (span >= 1) & (span <= step.units[:, None, None])
    k, mi, u = np.nonzero(open_rows)
    if k.size == 0:
        return None
    big_l = x.shape[4] - 1
    states = x[k, mi, u, :, 1:big_l]                              # (r, g behind, L − 1)
    ar = np.arange(big_k)
    c = step.link[ar, :, ar, :]                                   # (k, g in front, g behind)
    crossed = (c <= step.cap) & (np.arange(big_g)[None, None, :] < step.ngroups[:, None, None])
    ends = u[:, None] + step.gu[k]                                # (r, g in front)
    fits = step.front[k] & (ends <= step.units[k][:, None])
    if step.overlap:
        r, gi, gb = np.nonzero(fits[:, :, None] & crossed[k])
        return _Src(states[r, gb], c[k[r], gi, gb], k[r], mi[r], gi, ends[r, gi])
    bound = np.where(crossed, c, _INF)[k]                         # (r, g in front, g behind)
    least = step.comb(states[:, None, :, :], bound[..., None]).min(axis=2)
    r, gi = np.nonzero(fits)
    return _Src(least[r, gi], np.full(r.size, -_INF), k[r], mi[r], gi, ends[r, gi])


def _middle(step: _Step, src: _Src) -> tuple[np.ndarray, int]:
    """``out[s, l' − 1]``: the least ``base[l] ⊕ max(τ[d], c)`` over ``l + d = l'`` (``l, d >=
    1``, ``l' <= L − 1``) of a middle stage of each source's group at level ``step.j``, ``τ``
    within the cap and the longest length ``dmax``: every finite state of the sources and each
    length it may take, as flat arrays (the transitions the compiled loops walk), then their
    least per target cell; also returns how many (state, length) moves it made."""
    big_l = step.tau.shape[4] - 1
    n, width = src.base.shape
    out = np.full(n * width, _INF)
    cells = np.flatnonzero(src.base != _INF)  # cell s·width + l0: state s at l = l0 + 1
    s, l0 = np.divmod(cells, width)
    most = np.minimum(step.dmax[src.k, src.gi, _MIDDLE, step.j], big_l - 2)
    span = np.clip(np.minimum(most[s], width - 1 - l0), 0, None)  # d = 1 .. span
    total = int(span.sum())
    if total == 0:
        return out.reshape(n, width), 0
    # Run i of the flat arrays holds cell i's lengths: element e is d = e − start_i + 1.
    shift = 1 - (np.cumsum(span) - span)
    e = np.arange(total)
    t = step.tau[src.k, src.gi, _MIDDLE, step.j]  # (S, L + 1)
    after = np.where(t <= step.cap, np.maximum(t, src.c[:, None]), _INF).ravel()
    value = step.comb(np.repeat(src.base.ravel()[cells], span),
                      after[np.repeat(s * (big_l + 1) + shift, span) + e])
    np.minimum.at(out, np.repeat(cells + shift, span) + e, value)
    return out.reshape(n, width), total


def _first(step: _Step, src: _Src):
    """The best complete plan closed by a first stage in front of the sources (None: none)."""
    big_l = step.tau.shape[4] - 1
    t = step.tau[src.k, src.gi, _FIRST, step.j, big_l - 1:0:-1]  # length L − l, l = 1 .. L − 1
    closes = step.allowed[step.masks[src.k, src.mi] | (1 << src.k)]
    ok = (src.base != _INF) & (t <= step.cap) & closes[:, None]
    return _least_offer(step.comb(src.base, np.maximum(t, src.c[:, None])), ok, src)


def _write(new_x: np.ndarray, new_live: np.ndarray, src: _Src, values: np.ndarray) -> None:
    """``new_x[k, mi, u, gi, 1 + l] = min(…, values[s, l])`` over the sources ``s`` (those of
    one row merged by their minimum); a row gets marked, filled with ``inf`` first when it was
    not, only where it gets a state."""
    _, big_m, big_u, big_g, _ = new_x.shape
    key = ((src.k * big_m + src.mi) * big_u + src.u) * big_g + src.gi
    order = np.argsort(key, kind="stable")
    key = key[order]
    first = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    if first.size < key.size:
        values = np.minimum.reduceat(values[order], first, axis=0)
        order = order[first]
    else:
        values = values[order]
    has = (values != _INF).any(axis=1)
    if not has.any():
        return
    pick = order[has]
    values = values[has]
    k, mi, u, gi = src.k[pick], src.mi[pick], src.u[pick], src.gi[pick]
    fresh = new_live[k, mi, u] == 0
    new_x[k[fresh], mi[fresh], u[fresh]] = _INF  # (a row opened twice: filled twice)
    new_live[k, mi, u] = 1
    width = values.shape[1]
    new_x[k, mi, u, gi, 1:width + 1] = np.minimum(new_x[k, mi, u, gi, 1:width + 1], values)
