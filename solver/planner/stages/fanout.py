"""Work over a list in forked processes that share the best value found so far.

The n_micro search (:func:`solver.planner.stages.search.plan_job`) plans every ``n`` against the best
plan of the others: a plan found at one ``n`` is the bound the next searches must beat. With
several processes each takes the next item in the list's order and reads and offers one shared
best, so a plan found by one process tightens the other's bounds at once. Which process plans
what, and when, changes only how much each search can cut; the caller's rule for what beats the
best (its tie rule included) decides the answer, so the result is the one process's result.

Processes are forked (they inherit the parent's modules, compiled kernels and data; nothing is
pickled on the way in); where ``fork`` is not available, and for one worker, everything runs in
this process, in order. A worker that fails makes the caller run every item here, in order, so
the error (or result) is the one the single-process run gives.
"""

from __future__ import annotations

import math
import multiprocessing as mp
from contextlib import nullcontext
from typing import Callable, Sequence, TypeVar

__all__ = ["SharedBest", "fan_out"]

T = TypeVar("T")
R = TypeVar("R")
Key = tuple[int, int]


class SharedBest:
    """The best ``(value, key)`` found so far (None before any), read and offered under a lock.

    Parameters
    ----------
    ctx : multiprocessing context or None
        The context of the processes that share it (None: this process only).
    """

    def __init__(self, ctx=None) -> None:
        start = [math.inf, 0.0, 0.0]
        self._cell = ctx.Array("d", start) if ctx is not None else start
        self._lock = self._cell.get_lock() if ctx is not None else nullcontext()

    def get(self) -> tuple[float, Key] | None:
        """The best value and its key (None: nothing found yet)."""
        with self._lock:
            value, a, b = self._cell[:]
        return None if value == math.inf else (value, (int(a), int(b)))

    def offer(self, value: float, key: Key,
              wins: Callable[[tuple[float, Key] | None], bool]) -> bool:
        """Make ``(value, key)`` the best if ``wins(current best)``; whether it did."""
        with self._lock:
            v, a, b = self._cell[:]
            if not wins(None if v == math.inf else (v, (int(a), int(b)))):
                return False
            self._cell[:] = [value, float(key[0]), float(key[1])]
            return True


def fan_out(items: Sequence[T], work: Callable[[T, SharedBest], R], workers: int) -> list[R]:
    """``[work(item, best) for item in items]`` with one shared ``best``, computed by up to
    ``workers`` forked processes that take the items in order (results in item order)."""
    if workers > 1 and len(items) > 1 and "fork" in mp.get_all_start_methods():
        done = _forked(items, work, min(workers, len(items)))
        if done is not None:
            return done
    best = SharedBest()
    return [work(item, best) for item in items]


def _forked(items: Sequence[T], work: Callable[[T, SharedBest], R], workers: int):
    """The results by forked workers, or None when one of them failed."""
    ctx = mp.get_context("fork")
    best, claimed = SharedBest(ctx), ctx.Value("i", 0)
    pipes, procs = [], []
    for _ in range(workers):
        recv, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_worker, args=(items, work, best, claimed, send), daemon=True)
        proc.start()
        send.close()  # the child holds the sending end; EOF tells us it died
        pipes.append(recv)
        procs.append(proc)
    results: dict[int, R] = {}
    failed = False
    for recv in pipes:
        try:
            ok, payload = recv.recv()
        except EOFError:
            ok, payload = False, None
        failed = failed or not ok
        results.update(payload if ok else {})
    for proc in procs:
        proc.join()
    return None if failed or len(results) != len(items) else [results[i] for i in range(len(items))]


def _worker(items, work, best, claimed, send) -> None:
    """Take the next unclaimed item until none is left; send ``(True, results)`` or
    ``(False, None)`` when ``work`` raised (the parent then runs everything itself)."""
    out: dict[int, object] = {}
    try:
        while True:
            with claimed.get_lock():
                i = claimed.value
                claimed.value = i + 1
            if i >= len(items):
                break
            out[i] = work(items[i], best)
        send.send((True, out))
    except BaseException:  # noqa: BLE001 — reported to the parent, which reruns it in order
        send.send((False, None))
    finally:
        send.close()
