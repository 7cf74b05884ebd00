"""The constants fitted on the development set: the in-training GEMM fraction of a GPU
generation (:func:`fit_in_training`, for each GPU in :data:`IN_TRAINING_FITS`) and the host
seconds per rank of 2021 DeepSpeed's list-based ZeRO-3 collectives (:func:`fit_list_collective`).

``instances/calibration/README.md`` allows a constant fitted on the development set only when it
names one physical quantity, a script reproduces the fit and the README names the rows. This is
the Hopper one: the fraction of its stand-alone (max-achievable-matmul) speed an H100 keeps
inside a training step (sustained clocks under a 700 W step, SMs shared with communication
kernels), fitted on Megatron-LM's own H100 table (the ``mcore-h100-*`` rows, Megatron-Core,
BF16) and written as ``gemm_in_training`` on the catalog's Hopper entries of the same die and
clock class. The criterion is the sum of ``|log(predicted / measured)|`` over the rows (the
median-type fit: a row the rest of the model misses for another reason pulls it least); the
search is a grid of step 0.001 on [0.5, 1.0]. ``scripts/fit_in_training.py`` runs it. The same
fit, on the same criterion, gives GB200 and GB300 their own fractions from their Megatron-Bridge
rows (every evaluated row of the GPU; the refused DeepSeek-V3 rows carry no ratio): different
dies at different power limits (1,200 W and 1,400 W), whose identical layouts run 19–22% apart.

The list-collective constant (``Calibration.list_collective_rank_s``) is fitted on the four
``sc21-zero3-*`` rows, the only runs of that DeepSpeed, by the minimax of ``|log(predicted /
measured)|``, the criterion of the other 2021-era fit (SC'21 Table 1,
``python -m solver.cost.calibrate.calibration --fit``); grid of 1 us on [0, 40] us, then 0.1 us.
``scripts/fit_list_collective.py`` runs it.
"""

from __future__ import annotations

import dataclasses
import math

from solver.cost.fidelity.evaluate import calibration_of, evaluate_row, refusal
from solver.cost.fidelity.rows import RunRow, load_rows
from solver.spec.domain import GPUSpec
from solver.spec.loaders import load_catalog

#: Rows of the Hopper fit (README: Megatron-LM's H100 table).
HOPPER_ROWS = "mcore-h100-"
HOPPER_GPU = "H100-SXM-80GB"
#: Every in-training fit: (row id prefix, catalog GPU it is fitted for).
IN_TRAINING_FITS = ((HOPPER_ROWS, HOPPER_GPU), ("bridge-gb200-", "GB200"),
                    ("bridge-gb300-", "GB300"))


def log_error(rows: list[RunRow], catalog: dict[str, GPUSpec], gpu: str, kappa: float
              ) -> float:
    """Sum of ``|log(predicted / measured)|`` over ``rows`` with ``gpu``'s fraction ``kappa``
    (refused rows have no ratio and add nothing)."""
    trial = dict(catalog)
    trial[gpu] = dataclasses.replace(catalog[gpu], gemm_in_training=kappa)
    ratios = (evaluate_row(row, trial).ratio for row in rows)
    return sum(abs(math.log(r)) for r in ratios if r is not None)


def fit_in_training(prefix: str = HOPPER_ROWS, gpu: str = HOPPER_GPU,
                    lo: float = 0.5, hi: float = 1.0) -> tuple[float, float, list[str]]:
    """The fraction minimising :func:`log_error` on the rows whose id starts with ``prefix``
    (a coarse grid of 0.01, then 0.001 around its best), its error, and the rows used."""
    catalog = load_catalog()
    rows = [r for r in load_rows() if r.id.startswith(prefix) and not refusal(r, catalog)]
    fine, err = _grid_min(lambda k: log_error(rows, catalog, gpu, k), lo, hi, 0.01, 3)
    return fine, err, [r.id for r in rows]


def _grid_min(error, lo: float, hi: float, step: float, digits: int) -> tuple[float, float]:
    """(argument, value) minimising ``error`` over a grid of ``step`` on ``[lo, hi]``, then of
    ``step / 10`` within one coarse step of the coarse best (rounded to ``digits``)."""
    def best(grid: list[float]) -> tuple[float, float]:
        return min((error(x), x) for x in grid)

    count = int(round((hi - lo) / step)) + 1
    _, coarse = best([round(lo + step * i, digits) for i in range(count)])
    err, fine = best([round(coarse + step / 10 * i, digits) for i in range(-10, 11)
                      if lo <= coarse + step / 10 * i <= hi])
    return fine, err


#: Rows of the list-collective fit (README: SC'21 Table 2's DeepSpeed ZeRO-3 runs).
LIST_COLLECTIVE_ROWS = "sc21-zero3-"


def worst_log_error(rows: list[RunRow], catalog: dict[str, GPUSpec], rank_s: float) -> float:
    """Largest ``|log(predicted / measured)|`` over ``rows`` with ``rank_s`` host seconds per
    rank of a list-based collective."""
    def calib(row: RunRow):
        return dataclasses.replace(calibration_of(row), list_collective_rank_s=rank_s)
    return max(abs(math.log(evaluate_row(r, catalog, calibration=calib(r)).ratio)) for r in rows)


def fit_list_collective(prefix: str = LIST_COLLECTIVE_ROWS, hi_us: float = 40.0
                        ) -> tuple[float, float, list[str]]:
    """Host seconds per rank minimising :func:`worst_log_error` on the rows whose id starts
    with ``prefix`` (a grid of 1 us, then 0.1 us around its best), its error, and the rows."""
    catalog = load_catalog()
    rows = [r for r in load_rows() if r.id.startswith(prefix)]
    fine, err = _grid_min(lambda us: worst_log_error(rows, catalog, us * 1e-6), 0.0, hi_us,
                          1.0, 1)
    return fine * 1e-6, err, [r.id for r in rows]
