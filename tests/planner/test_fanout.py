"""The fan-out of the n_micro search: forked workers sharing one best, the same answer."""

from __future__ import annotations

import multiprocessing as mp

import pytest

from solver.planner.stages.fanout import SharedBest, fan_out

FORK = "fork" in mp.get_all_start_methods()


@pytest.mark.parametrize("forked", [False, True] if FORK else [False])
def test_the_shared_best_keeps_what_wins(forked):
    best = SharedBest(mp.get_context("fork") if forked else None)
    smaller = lambda value: lambda cur: cur is None or value < cur[0]  # noqa: E731
    assert best.get() is None
    assert best.offer(5.0, (8, 0), smaller(5.0))
    assert not best.offer(6.0, (4, 1), smaller(6.0))
    assert best.offer(2.5, (16, 1), smaller(2.5))
    assert best.get() == (2.5, (16, 1))


def _square_and_offer(item: int, best: SharedBest) -> int:
    best.offer(float(item), (item, 0), lambda cur: cur is None or item < cur[0])
    return item * item


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_results_come_back_in_item_order(workers):
    items = [5, 3, 8, 1, 9, 2, 7]
    assert fan_out(items, _square_and_offer, workers) == [25, 9, 64, 1, 81, 4, 49]


@pytest.mark.skipif(not FORK, reason="no fork on this platform")
def test_workers_see_each_others_best():
    """Item 0 offers 1.0 and waits; item 1 (the other worker) waits until it sees it."""
    ctx_event = mp.get_context("fork").Event()

    def work(item, best):
        if item == 0:
            best.offer(1.0, (0, 0), lambda cur: True)
            ctx_event.set()
            return None
        assert ctx_event.wait(30)
        return best.get()

    assert fan_out([0, 1], work, 2) == [None, (1.0, (0, 0))]


def _fails_on_two(item: int, best: SharedBest) -> int:
    if item == 2:
        raise ValueError(f"item {item}")
    return item


@pytest.mark.parametrize("workers", [1, 2])
def test_a_failing_item_raises_its_own_error(workers):
    """A worker's failure makes the caller run everything in order: the error is the one a
    single process raises."""
    with pytest.raises(ValueError, match="item 2"):
        fan_out([0, 1, 2, 3], _fails_on_two, workers)
    assert fan_out([0, 1, 3], _fails_on_two, workers) == [0, 1, 3]
