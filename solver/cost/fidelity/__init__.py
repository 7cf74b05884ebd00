"""Fidelity report: the cost model on the development set of published, measured runs.

``python -m solver.cost.fidelity [--json] [--csv FILE]`` evaluates every row of
``instances/calibration/published-runs-dev.csv`` with its own layout and framework through the
cost model ``tangram estimate`` uses (:mod:`solver.cost.estimating.estimate`), and prints per row the
predicted and measured seconds per iteration, their ratio, the predicted memory and whether it
fits, then the summary the targets are stated in (median |error|, share within ±15 %, worst row,
rows predicted not to fit, rows refused with the reason). :mod:`~solver.cost.fidelity.rows`
reads the set, :mod:`~solver.cost.fidelity.evaluate` prices it.
"""

from solver.cost.fidelity.evaluate import RowResult, Summary, evaluate_row, summarize
from solver.cost.fidelity.rows import DEV_SET, RunRow, load_rows

__all__ = ["DEV_SET", "RowResult", "RunRow", "Summary", "evaluate_row", "load_rows",
           "summarize"]
