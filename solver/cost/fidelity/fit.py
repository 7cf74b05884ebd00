"""The one constant fitted on the development set: the in-training GEMM fraction of a GPU
generation.

``instances/calibration/README.md`` allows a constant fitted on the development set only when it
names one physical quantity, a script reproduces the fit and the README names the rows. This is
the Hopper one: the fraction of its stand-alone (max-achievable-matmul) speed an H100 keeps
inside a training step (sustained clocks under a 700 W step, SMs shared with communication
kernels), fitted on Megatron-LM's own H100 table (the ``mcore-h100-*`` rows, Megatron-Core,
BF16) and written as ``gemm_in_training`` on the catalog's Hopper entries of the same die and
clock class. The criterion is the sum of ``|log(predicted / measured)|`` over the rows (the
median-type fit: a row the rest of the model misses for another reason pulls it least); the
search is a grid of step 0.001 on [0.5, 1.0]. ``scripts/fit_in_training.py`` runs it.
"""

from __future__ import annotations

import dataclasses
import math

from solver.cost.fidelity.evaluate import evaluate_row
from solver.cost.fidelity.rows import RunRow, load_rows
from solver.spec.domain import GPUSpec
from solver.spec.loaders import load_catalog

#: Rows of the Hopper fit (README: Megatron-LM's H100 table).
HOPPER_ROWS = "mcore-h100-"
HOPPER_GPU = "H100-SXM-80GB"


def log_error(rows: list[RunRow], catalog: dict[str, GPUSpec], gpu: str, kappa: float
              ) -> float:
    """Sum of ``|log(predicted / measured)|`` over ``rows`` with ``gpu``'s fraction ``kappa``."""
    trial = dict(catalog)
    trial[gpu] = dataclasses.replace(catalog[gpu], gemm_in_training=kappa)
    total = 0.0
    for row in rows:
        got = evaluate_row(row, trial)
        total += abs(math.log(got.ratio))
    return total


def fit_in_training(prefix: str = HOPPER_ROWS, gpu: str = HOPPER_GPU,
                    lo: float = 0.5, hi: float = 1.0) -> tuple[float, float, list[str]]:
    """The fraction minimising :func:`log_error` on the rows whose id starts with ``prefix``
    (a coarse grid of 0.01, then 0.001 around its best), its error, and the rows used."""
    catalog = load_catalog()
    rows = [r for r in load_rows() if r.id.startswith(prefix)]

    def best(grid: list[float]) -> tuple[float, float]:
        return min(((log_error(rows, catalog, gpu, k), k) for k in grid))

    _, coarse = best([round(lo + 0.01 * i, 3) for i in range(int((hi - lo) / 0.01) + 1)])
    err, fine = best([round(coarse + 0.001 * i, 3) for i in range(-10, 11)
                      if lo <= coarse + 0.001 * i <= hi])
    return fine, err, [r.id for r in rows]
