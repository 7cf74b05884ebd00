"""Which twin of the planner's array kernels runs: NumPy, or numba-compiled.

Every kernel of the node-group DP (:mod:`solver.compose.kernels.group_kernel`), of its bounds
(:mod:`solver.compose.groups.group_bounds`) and of the stage options' Pareto filter
(:mod:`solver.cost.stage_options`) has two implementations of one algorithm that give the same
floats bit for bit (tests/compose/test_kernel_twins.py): compiled (numba) and NumPy. numba has
a price per process, paid before its first kernel runs, its kernels loaded from numba's cache:
measured on the 2-core host (2026-12-07, CPU time, fresh process, load about 1.8) importing
numba takes 0.16 s, readying its compiler's registries at the first call 0.14 s, loading the ten
kernels a plan uses 0.03 s: :data:`NUMBA_PRICE_S` = 0.33 s. After that its kernels are 5 to 50
times faster than the NumPy twins.

The rule is ski rental, the classic answer to "rent until the rent paid reaches the price of
buying": the NumPy twins run while the NumPy work of this process, the next call included,
stays within the price of numba; the call that would pass it, and every call after it, runs
compiled. The NumPy work is counted from sizes, not clocks, so the choice is deterministic: a
call states what its twin costs (:func:`numpy_seconds`: NumPy calls and array cells at the
host's measured rates :data:`NS_PER_CALL` and :data:`NS_PER_CELL`; a twin whose work depends on
the values counts it after it ran, :func:`count`, the call first checked against an upper
bound). A process never spends more than about twice what the better choice, made in
hindsight, would have (the NumPy work it does is at most the price); the worked example
(``instances/jobs/seed-llama3-70b.toml``: 1,900 kernel calls, counted 0.26 s, measured 0.21 s
of NumPy) never imports numba, and a large job pays the price once, early. A faster or slower
host changes both sides of the rule alike.

``TANGRAM_KERNELS=numpy`` or ``=compiled`` in the environment fixes the choice (to measure
either; anything else is the rule); :func:`forced` does so for a block of code (tests).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

__all__ = ["NUMBA_PRICE_S", "NS_PER_CALL", "NS_PER_CELL", "NS_PER_STEP", "numpy_seconds",
           "python_seconds", "compiled_now", "use_compiled", "count", "compiled_module", "forced",
           "spent_s"]

#: What numba costs a process before its first kernel runs, kernels cached (see above).
NUMBA_PRICE_S = 0.33
#: NumPy's cost per call of a small array operation (ufunc, reduction, fancy index), ns.
NS_PER_CALL = 2_000.0
#: NumPy's cost per array cell an operation reads or writes, ns (float64, small arrays).
NS_PER_CELL = 2.0
#: The cost of one step of a plain Python loop over Python ints (the integer knapsack), ns.
NS_PER_STEP = 100.0

_MODES = ("auto", "numpy", "compiled")


class _State:
    """The process's choice: ``mode`` (auto, numpy, compiled), the NumPy seconds spent so far
    and whether auto mode has switched to the compiled kernels for good."""

    mode = os.environ.get("TANGRAM_KERNELS", "auto").strip().lower() or "auto"
    spent = 0.0
    switched = False


def numpy_seconds(calls: float, cells: float) -> float:
    """The estimated cost of a NumPy twin making ``calls`` array operations over ``cells``
    array cells in all."""
    return (calls * NS_PER_CALL + cells * NS_PER_CELL) * 1e-9


def python_seconds(steps: float) -> float:
    """The estimated cost of a plain Python loop of ``steps`` steps."""
    return steps * NS_PER_STEP * 1e-9


def compiled_now() -> bool:
    """Whether every kernel runs compiled from now on (no estimate needed)."""
    return _State.mode == "compiled" or (_State.mode != "numpy" and _State.switched)


def use_compiled(seconds: float, charge: bool = True) -> bool:
    """Whether a kernel call runs compiled, its NumPy twin costing ``seconds`` (at most, where
    ``charge`` is False: the twin then counts what it did itself, :func:`count`). A call that
    runs on NumPy is counted against the price of numba (see the module docstring)."""
    if compiled_now():
        return True
    if _State.mode != "numpy" and _State.spent + seconds > NUMBA_PRICE_S:
        _State.switched = True
        return True
    if charge:
        _State.spent += seconds
    return False


def count(seconds: float) -> None:
    """Count ``seconds`` of NumPy kernel work against the price of numba (a twin whose work
    depends on the values, not only the shapes, counts it after it ran)."""
    _State.spent += seconds


def spent_s() -> float:
    """The NumPy kernel seconds (estimated) this process has spent so far."""
    return _State.spent


def compiled_module(name: str) -> ModuleType:
    """The module of compiled kernels ``name`` (importing it imports numba)."""
    return importlib.import_module(name)


@contextmanager
def forced(mode: str) -> Iterator[None]:
    """Run the block with every kernel on ``mode`` (``numpy``, ``compiled`` or ``auto``, the
    latter from a fresh budget); the previous choice is restored after it."""
    if mode not in _MODES:
        raise ValueError(f"kernel mode must be one of {_MODES}, got {mode!r}")
    saved = (_State.mode, _State.spent, _State.switched)
    _State.mode, _State.spent, _State.switched = mode, 0.0, False
    try:
        yield
    finally:
        _State.mode, _State.spent, _State.switched = saved
