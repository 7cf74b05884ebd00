"""Reproduce the in-training GEMM fractions (``gemm_in_training`` of the catalog's Hopper, GB200
and GB300 entries) from the development set; see :mod:`solver.cost.fidelity.fit`.

Usage: ``python scripts/fit_in_training.py [GPU ...]`` (default: every fitted GPU; prints each
fraction, its error and the rows). Hopper's fit takes a few minutes.
"""

from __future__ import annotations

import sys

from solver.cost.fidelity.fit import IN_TRAINING_FITS, fit_in_training


def main(argv: list[str]) -> int:
    for prefix, gpu in IN_TRAINING_FITS:
        if argv and gpu not in argv:
            continue
        kappa, err, rows = fit_in_training(prefix, gpu)
        sys.stdout.write(f"{gpu} gemm_in_training = {kappa:.3f} "
                         f"(sum |log ratio| {err:.4f} over {len(rows)} rows: {', '.join(rows)})\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
