"""``python -m solver.cost.fidelity``: the development-set report (see the package docstring).

Exit status 0, or 2 with one ``error: <file>: <key>: <what>`` line on bad input.
"""

from __future__ import annotations

import argparse
import json
import sys

from solver.cost.fidelity.evaluate import RowResult, Summary, evaluate_row, summarize
from solver.cost.fidelity.rows import DEV_SET, load_rows
from solver.spec.domain import PlannerOptions
from solver.spec.errors import InputError
from solver.spec.loaders import load_catalog


def _table(results: list[RowResult]) -> list[str]:
    head = (f"{'id':38} {'measured s':>11} {'predicted s':>11} {'ratio':>6} {'mem GB':>7} "
            f"{'fits':>4}  priced as / refused")
    lines = [head, "-" * len(head)]
    for r in results:
        if r.refused:
            lines.append(f"{r.id:38} {r.measured_s:11.3f} {'-':>11} {'-':>6} {'-':>7} "
                         f"{'-':>4}  refused: {r.refused}")
            continue
        lines.append(f"{r.id:38} {r.measured_s:11.3f} {r.predicted_s:11.3f} {r.ratio:6.3f} "
                     f"{r.memory_gb:7.1f} {'yes' if r.fits else 'NO':>4}  {r.priced_as}")
    return lines


#: Short column heads of ``--breakdown`` for :class:`~solver.cost.estimating.estimate.Breakdown`'s
#: fields (a field without one is headed by its name).
BREAKDOWN_HEADS = {"recompute": "recomp", "tp_comm": "tp", "cp_comm": "cp", "ep_comm": "ep",
                   "pp_bubble": "bubble", "dp_comm": "dp", "optimizer": "optim"}


def _breakdown(results: list[RowResult]) -> list[str]:
    """Predicted seconds per iteration by cause for every evaluated row, and ``missed``:
    measured minus predicted (what the run spent that the model does not charge)."""
    names = next((r.breakdown for r in results if r.breakdown), ())
    head = (f"{'id':38} " + " ".join(f"{BREAKDOWN_HEADS.get(k, k):>8}" for k, _ in names)
            + f" {'missed':>8}")
    lines = [head, "-" * len(head)]
    for r in results:
        if r.breakdown:
            lines.append(f"{r.id:38} " + " ".join(f"{v:8.3f}" for _, v in r.breakdown)
                         + f" {r.missed_s:8.3f}")
    return lines


def _summary(s: Summary) -> list[str]:
    lines = [f"rows {s.rows}, evaluated {s.evaluated}, refused {len(s.refused)}",
             f"median |error| {100 * s.median_abs_error:.1f}%, within ±15% "
             f"{100 * s.within_15:.0f}%, worst {s.worst_id} {100 * s.worst_abs_error:.1f}%",
             f"predicted not to fit: {', '.join(s.not_fitting) or 'none'}"]
    lines += [f"refused {i}: {reason}" for i, reason in s.refused]
    return lines


def main(argv: list[str] | None = None) -> int:
    """Run the report; the exit status."""
    ap = argparse.ArgumentParser(prog="python -m solver.cost.fidelity",
                                 description="cost model against published measured runs")
    ap.add_argument("--json", action="store_true", help="one JSON object: rows and summary")
    ap.add_argument("--csv", default=str(DEV_SET), help="rows in the development-set format")
    ap.add_argument("--epsilon", type=float, default=PlannerOptions().epsilon,
                    help="memory held back beyond the runtime's named reserves, as the "
                         "planner's [planner] epsilon (default: its default)")
    ap.add_argument("--breakdown", action="store_true",
                    help="also print each row's predicted seconds by cause and what the model "
                         "misses (measured minus predicted)")
    args = ap.parse_args(argv)
    try:
        catalog = load_catalog()
        results = [evaluate_row(r, catalog, args.epsilon) for r in load_rows(args.csv)]
    except InputError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    summary = summarize(results)
    if args.json:
        json.dump({"rows": [r.to_json() for r in results], "summary": summary.to_json()},
                  sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        extra = [""] + _breakdown(results) if args.breakdown else []
        sys.stdout.write("\n".join(_table(results) + extra + [""] + _summary(summary)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
