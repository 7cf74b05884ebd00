"""Reproduce the Hopper in-training GEMM fraction (``gemm_in_training`` of the catalog's Hopper
entries) from the development set; see :mod:`solver.cost.fidelity.fit`.

Usage: ``python scripts/fit_in_training.py`` (prints the fraction, its error and the rows).
"""

from __future__ import annotations

import sys

from solver.cost.fidelity.fit import HOPPER_GPU, fit_in_training


def main() -> int:
    kappa, err, rows = fit_in_training()
    sys.stdout.write(f"{HOPPER_GPU} gemm_in_training = {kappa:.3f} "
                     f"(sum |log ratio| {err:.4f} over {len(rows)} rows: {', '.join(rows)})\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
