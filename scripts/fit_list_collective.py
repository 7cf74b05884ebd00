"""Reproduce the host seconds per rank of 2021 DeepSpeed's list-based ZeRO-3 collectives
(``Calibration.list_collective_rank_s``) from the development set; see
:mod:`solver.cost.fidelity.fit`.

Usage: ``python scripts/fit_list_collective.py`` (prints the constant, its error and the rows).
"""

from __future__ import annotations

import sys

from solver.cost.fidelity.fit import fit_list_collective


def main() -> int:
    rank_s, err, rows = fit_list_collective()
    sys.stdout.write(f"list_collective_rank_s = {rank_s * 1e6:.1f} us "
                     f"(max |log ratio| {err:.4f} over {len(rows)} rows: {', '.join(rows)})\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
