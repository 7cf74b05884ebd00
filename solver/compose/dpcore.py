"""Vectorized core of the exact composition DP: one min-sum (or min-max) pass under a cap.

State ``F_p[mask, k, l]``: layers ``[0, l)`` are placed on the ``p = |mask|`` islands of ``mask``
and island ``k`` (not in ``mask``) is committed to take the next slice, starting at layer ``l``.
Committing the *next* island when a slice is placed is what makes the link (and, with overlap,
``max(τ, c)``) cost of a stage known when the stage is placed, so one pass is exact.

A transition places ``k`` on ``[l, l + d)`` and either ends the pipeline (``l + d = L``; position
LAST, or ONLY from the empty state) or commits a next island ``k2 ∉ mask ∪ {k}`` (position MIDDLE,
or FIRST from the empty state). Every entry above the cap is masked to ``inf``, so one pass gives
the least total (``Mode.SUM``) or least bottleneck (``Mode.MAX``) among plans whose every stage
and link is within the cap.

Cost of one pass: time ``O(K · 2^(K-1) · L · D)`` elementwise NumPy work (``D ≤ L`` the range of
slice lengths finite under the cap; ``×K`` with overlap, whose stage cost depends on the next
island), memory ``O(K · 2^K · L)`` floats for the stored layers (kept for backtracking).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

_INF = np.inf
_CHUNK = 1 << 21  # elements per temporary (P, J, L+1, D) block: bounds memory at ~16 MB


class Mode(enum.Enum):
    """What one DP pass minimizes over plans within the cap."""

    SUM = "sum"  #: total of stage latencies and link times
    MAX = "max"  #: the bottleneck (largest stage latency or link time)


@dataclass(frozen=True)
class _Layer:
    """Transitions from states with ``p`` islands used to states with ``p + 1``.

    Pairs are listed target-major: for each target mask ``T`` (ascending) and each member ``k``
    of ``T`` (ascending), pair ``(T \\ {k}, k)`` — so the ``p + 1`` pairs feeding one target are
    contiguous and a reshape + min merges them.
    """

    targets: np.ndarray  # masks with p+1 islands, ascending
    src: np.ndarray      # per pair: row of T \ {k} among masks with p islands
    k: np.ndarray        # per pair: the island whose slice is placed


@dataclass(frozen=True)
class _Kernels:
    """Entries masked by the cap. ``step[0]``/``step[1]``: (K, J, L+1) slice costs from the empty
    state (FIRST) / later states (MIDDLE), ``J = K`` next islands with overlap (cost already
    ``max(τ, c)``), ``J = 1`` without (link added after). ``end[0]``/``end[1]``: (K, L+1) ONLY /
    LAST latencies reversed so that index ``l`` is the slice ``[l, L)``."""

    step: tuple[np.ndarray, np.ndarray]
    end: tuple[np.ndarray, np.ndarray]
    link: np.ndarray


@dataclass(frozen=True)
class Run:
    """One pass: stored layers for backtracking and the best final value (inf if none)."""

    kern: _Kernels
    comb: np.ufunc
    states: tuple[np.ndarray, ...]
    ends: tuple[np.ndarray, ...]
    value: float


class DPCore:
    """Index structures for ``K`` islands and ``L`` layers; ``run`` does one capped pass.

    Parameters
    ----------
    tau : np.ndarray
        ``tau[k, p, length]`` with restrictions already masked to ``inf``.
    link : np.ndarray
        ``link[k, k2]``, banned pairs ``inf``.
    use_all, overlap : bool
        Problem variant.
    max_stages : int | None
        At most this many stages (passes stop after that many islands are placed).
    allowed : np.ndarray | None
        ``allowed[mask]``: whether a plan may end having used exactly the islands of ``mask``
        (a budget on the used islands); None allows every set.
    """

    def __init__(self, tau: np.ndarray, link: np.ndarray, use_all: bool, overlap: bool,
                 max_stages: int | None = None, allowed: np.ndarray | None = None) -> None:
        self.tau, self.link, self.use_all, self.overlap = tau, link, use_all, overlap
        self.allowed = allowed
        self.n_islands, self.layers = tau.shape[0], tau.shape[2] - 1
        big_k = self.n_islands
        masks = np.arange(1 << big_k)
        count = sum((masks >> k) & 1 for k in range(big_k))
        self.by_count = [masks[count == p] for p in range(big_k + 1)]
        self.row_of = np.zeros(1 << big_k, dtype=np.int64)
        for group in self.by_count:
            self.row_of[group] = np.arange(group.size)
        depth = min(big_k, self.layers, max_stages or big_k)
        self.steps = [self._layer(p) for p in range(depth)]

    def _layer(self, p: int) -> _Layer:
        targets = self.by_count[p + 1]
        bits = (targets[:, None] >> np.arange(self.n_islands)) & 1
        rows, ks = np.nonzero(bits)
        src = self.row_of[targets[rows] ^ (1 << ks)]
        return _Layer(targets, src, ks)

    def kernels(self, cap: float) -> _Kernels:
        """Entries of the table masked to ``inf`` above ``cap``."""
        t = np.where(self.tau <= cap, self.tau, _INF)
        c = np.where(self.link <= cap, self.link, _INF)
        first, mid, last, only = (t[:, i, :] for i in range(4))
        if self.overlap:
            step = tuple(np.maximum(x[:, None, :], c[:, :, None]) for x in (first, mid))
        else:
            step = (first[:, None, :], mid[:, None, :])
        return _Kernels(step, (only[:, ::-1].copy(), last[:, ::-1].copy()), c)

    def run(self, cap: float, mode: Mode) -> Run:
        """One DP pass over plans whose every entry is ``<= cap``."""
        comb = np.add if mode is Mode.SUM else np.maximum
        kern = self.kernels(cap)
        big_l = self.layers
        state = np.full((1, self.n_islands, big_l + 1), _INF)
        state[0, :, 0] = 0.0  # identity of both + and max, since every entry is >= 0
        states, ends = [state], []
        for p, lay in enumerate(self.steps):
            rows = states[p][lay.src, lay.k]  # (P, L+1): value at the slice start l
            final = comb(rows, kern.end[p > 0][lay.k]).min(axis=1)
            ends.append(self._only_allowed(final, lay, p))
            if p + 1 == len(self.steps) or not np.isfinite(rows).any():
                break
            states.append(self._advance(rows, lay, kern, p, comb))
        return Run(kern, comb, tuple(states), tuple(ends), self._best(ends)[0])

    def _only_allowed(self, values: np.ndarray, lay: _Layer, p: int) -> np.ndarray:
        """Final values with plans ending on a disallowed island set masked to ``inf``."""
        if self.allowed is None:
            return values
        # Pairs are target-major with p + 1 pairs per target mask (see _Layer).
        owner = lay.targets[np.arange(values.size) // (p + 1)]
        return np.where(self.allowed[owner], values, _INF)

    def _advance(self, rows: np.ndarray, lay: _Layer, kern: _Kernels, p: int,
                 comb: np.ufunc) -> np.ndarray:
        big_k, width = self.n_islands, self.layers + 1
        placed = _minplus(rows, kern.step[p > 0][lay.k], comb)  # (P, J, L+1)
        placed[:, :, -1] = _INF  # a slice ending at L is the last stage: handled by `ends`
        if not self.overlap:
            placed = comb(placed, kern.link[lay.k][:, :, None])  # (P, K, L+1)
        return placed.reshape(lay.targets.size, p + 1, big_k, width).min(axis=1)

    def _best(self, ends: list | tuple) -> tuple[float, int, int]:
        """Best final value and its (layer, pair): fewest stages first, then pair order."""
        best = (_INF, -1, -1)
        for p, values in enumerate(ends):
            if self.use_all and p != self.n_islands - 1:
                continue
            i = int(np.argmin(values))
            if values[i] < best[0]:
                best = (float(values[i]), p, i)
        return best

    def backtrack(self, run: Run) -> list[tuple[int, int, int]] | None:
        """Stages ``(island index, start, end)`` of the pass's best plan (None if infeasible).

        The tie rule of :mod:`solver.compose.ties`: among the plans reaching the pass's best
        value, compare stages from the last to the first, each by the lowest island index and
        then the earliest start. Every state reaching the value with the stages chosen so far
        is kept (a frontier), so the choice is over all tied plans, not one path's.
        """
        frontier = self._finals(run)
        if not frontier:
            return None
        plan, end = [], self.layers
        while True:
            k, start = min((f[2], f[3]) for f in frontier)
            plan.append((k, start, end))
            if start == 0:
                return plan[::-1]
            end = start
            frontier = list(dict.fromkeys(
                pred for f in frontier if (f[2], f[3]) == (k, start)
                for pred in self._predecessors(run, *f)))

    def _finals(self, run: Run) -> list[tuple[int, int, int, int]]:
        """States ``(p, row, k, start)`` whose last stage ``k`` on ``[start, L)`` ends a plan
        reaching the pass's best value (the allowed island sets and ``use_all`` honoured)."""
        value = self._best(run.ends)[0]
        out: list[tuple[int, int, int, int]] = []
        if not np.isfinite(value):
            return out
        for p, lay in enumerate(self.steps[:len(run.ends)]):
            if self.use_all and p != self.n_islands - 1:
                continue
            rows = run.comb(run.states[p][lay.src, lay.k], run.kern.end[p > 0][lay.k])
            if self.allowed is not None:
                owner = lay.targets[np.arange(lay.k.size) // (p + 1)]
                rows = np.where(self.allowed[owner][:, None], rows, _INF)
            for i, start in zip(*np.nonzero(rows == value)):
                out.append((p, int(lay.src[i]), int(lay.k[i]), int(start)))
        return out

    def _predecessors(self, run: Run, p: int, row: int, k: int, start: int
                      ) -> list[tuple[int, int, int, int]]:
        """Every state ``(p - 1, row0, k0, start0)`` whose slice ``[start0, start)`` on ``k0``
        leads to state ``(p, row, k, start)`` at exactly its value."""
        mask = int(self.by_count[p][row])
        target = run.states[p][row, k, start]
        back = start - np.arange(start)  # slice lengths for predecessor starts 0..start-1
        out = []
        for k0 in (j for j in range(self.n_islands) if mask >> j & 1):
            row0 = int(self.row_of[mask ^ (1 << k0)])
            prev = run.states[p - 1][row0, k0, :start]
            step = run.kern.step[p > 1][k0]
            if self.overlap:
                values = run.comb(prev, step[k, back])
            else:
                values = run.comb(run.comb(prev, step[0, back]), run.kern.link[k0, k])
            out += [(p - 1, row0, k0, int(h)) for h in np.flatnonzero(values == target)]
        if not out:
            raise RuntimeError("DP backtracking lost the optimal path")  # would be a bug
        return out


def _minplus(rows: np.ndarray, kern: np.ndarray, comb: np.ufunc) -> np.ndarray:
    """``out[i, j, l] = min_d comb(rows[i, l - d], kern[i, j, d])`` over lengths ``d >= 1``.

    Only the band of lengths with some finite kernel entry is scanned, through a strided
    window view (no copy); rows are processed in chunks to bound the temporary's size.
    """
    n_rows, n_next, width = kern.shape
    out = np.full((n_rows, n_next, width), _INF)
    finite = np.flatnonzero(np.isfinite(kern).any(axis=(0, 1)))
    alive = np.flatnonzero(np.isfinite(rows).any(axis=1))
    if not finite.size or not alive.size:
        return out
    lo, hi = int(finite[0]), int(finite[-1])
    band = hi - lo + 1
    chunk = max(1, _CHUNK // (n_next * width * band))
    for s in range(0, alive.size, chunk):
        idx = alive[s:s + chunk]
        padded = np.concatenate([np.full((idx.size, hi), _INF), rows[idx]], axis=1)
        window = sliding_window_view(padded, band, axis=1)[:, :width, :]  # [i, l, j] = rows[l+j-hi]
        rev = kern[idx][:, :, hi - np.arange(band)]  # [i, j', j] = kern at length hi - j
        out[idx] = comb(window[:, None, :, :], rev[:, :, None, :]).min(axis=3)
    return out
