"""Hunt for a missed optimum: the node-group DP against brute force on seeded random tables.

Not part of the test suite (it runs for tens of minutes). Table ``seed`` is
``tests/compose/group_tables.seeded_problem(seed)``, the generator the property tests draw from,
so any disagreement is reproduced by its seed alone. Per table:

* the DP (``solver/compose/groups/group_dp.py``) plain and with an incumbent above the optimum (its
  passes prune against it) must reach brute force's optimum (``group_brute.py``), and its plan
  must pass ``group_problems`` and reprice to its objective;
* on the first ``--models`` seeds, CP-SAT (deterministic time, one worker) and the MILP (CBC,
  node limit) on the slot model (``formulations/groups_*.py``) must prove the same optimum;
* the share of tables whose allowed depths / largest allowed depth / stage limit change the
  optimum (they *bind*) is counted (with ``--every k``, the bounded DP and the shares run on
  every k-th seed only).

Usage::

    nice -n 19 python scripts/hunt_group_dp.py --count 100000 --workers 2 --every 10 --out hunt.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections import Counter
from multiprocessing import Pool
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "compose"))
sys.path.insert(0, str(ROOT))

from group_tables import binding, seeded_problem  # noqa: E402

from solver.compose.groups.group_brute import compose_groups_brute  # noqa: E402
from solver.compose.groups.group_dp import compose_groups_dp  # noqa: E402
from solver.compose.result import TooLargeError  # noqa: E402
from solver.compose.stage_table import group_objective, group_problems  # noqa: E402

REL = 1e-9  # DP and brute force price plans with the same function: only float summation
MODEL_REL = 1e-5  # CP-SAT works on integer-scaled data (formulations/scaling.py)
WORK_LIMIT = 60.0  # CP-SAT deterministic seconds: far above what these tables need
NODE_LIMIT = 200_000  # CBC branch-and-bound nodes: likewise


def _same(a: float | None, b: float | None, rel: float) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-12)


def check_dp(seed: int, bounded: bool = True, share: bool = True) -> tuple[dict, list[dict]]:
    """DP against brute force on table ``seed``: (flags, disagreements); ``bounded``: also the
    DP with an incumbent above the optimum; ``share``: also whether the depths bind."""
    table, restr, overlap, slack = seeded_problem(seed)
    try:
        brute = compose_groups_brute(table, restr, overlap)
    except TooLargeError:
        return {"too_large": True}, []
    bad = []
    dp = compose_groups_dp(table, restr, overlap)
    if not _same(dp.objective, brute.objective, REL):
        bad.append({"seed": seed, "check": "dp", "dp": dp.objective, "brute": brute.objective})
    elif dp.feasible:
        problems = group_problems(table, dp.stages, restr)
        priced = group_objective(table, dp.stages, overlap)[0]
        if problems or not _same(priced, dp.objective, REL):
            bad.append({"seed": seed, "check": "dp plan", "problems": problems,
                        "priced": priced, "dp": dp.objective})
    if bounded and brute.feasible:
        bar = brute.objective * slack + 1e-9
        cut = compose_groups_dp(table, restr, overlap, incumbent=bar)
        if not _same(cut.objective, brute.objective, REL):
            bad.append({"seed": seed, "check": "dp with incumbent", "incumbent": bar,
                        "dp": cut.objective, "brute": brute.objective})
    flags = binding(table, restr, overlap) if share else {}
    flags.update(feasible=brute.feasible, bounded=bounded and brute.feasible, shared=share,
                 restricted=share and restr is not None,
                 has_depths=share and restr is not None and restr.depths is not None,
                 has_limit=share and restr is not None and restr.max_stages is not None)
    return flags, bad


def check_models(seed: int, milp: str = "cbc") -> list[dict]:
    """CP-SAT and the MILP (CBC with a node limit, or HiGHS, one thread, in this process and
    without a limit) against brute force on table ``seed``: no wall clock decides."""
    from formulations.assignment_milp import MilpBackend
    from formulations.groups_cpsat import solve_groups_cpsat
    from formulations.groups_milp import solve_groups_milp
    table, restr, overlap, _ = seeded_problem(seed)
    brute = compose_groups_brute(table, restr, overlap)
    backend = MilpBackend(milp)
    limit = {"node_limit": NODE_LIMIT} if backend is MilpBackend.CBC else {}
    bad = []
    for name, result in (
            ("cpsat", solve_groups_cpsat(table, restr, overlap, math.inf,
                                         work_limit=WORK_LIMIT)),
            (f"milp-{milp}", solve_groups_milp(table, restr, overlap, math.inf,
                                               backend=backend, **limit))):
        if not result.optimal or not _same(result.objective, brute.objective, MODEL_REL):
            bad.append({"seed": seed, "check": name, "status": result.status,
                        "model": result.objective, "brute": brute.objective})
    return bad


def run_chunk(args: tuple[int, int, int, int, str]) -> tuple[Counter, list[dict]]:
    """Seeds ``[lo, hi)``; the bounded DP and the binding shares on every ``every``-th, the
    models below ``models``."""
    lo, hi, models, every, milp = args
    counts, bad = Counter(), []
    for seed in range(lo, hi):
        flags, found = check_dp(seed, seed % every == 0, seed % every == 0)
        counts["tables"] += 1
        counts.update(k for k, v in flags.items() if v is True)
        bad += found
        if seed < models:
            counts["model_tables"] += 1
            bad += check_models(seed, milp)
    return counts, bad


def hunt(start: int, count: int, models: int, workers: int, chunk: int, every: int,
         progress: Path | None, milp: str = "cbc") -> dict:
    """Every seed in ``[start, start + count)`` over ``workers`` processes."""
    t0, total, bad = time.time(), Counter(), []
    chunks = [(lo, min(lo + chunk, start + count), start + models, every, milp)
              for lo in range(start, start + count, chunk)]
    with Pool(workers) as pool:
        for counts, found in pool.imap_unordered(run_chunk, chunks):
            total.update(counts)
            bad += found
            if progress is not None:  # the figures so far, should the run be stopped
                progress.write_text(json.dumps(summary(start, count, models, workers, total,
                                                       bad, time.time() - t0), indent=2) + "\n")
    return summary(start, count, models, workers, total, bad, time.time() - t0)


def summary(start, count, models, workers, total: Counter, bad: list, elapsed: float) -> dict:
    """The figures docs/hunt.md reports."""
    tables = max(total["shared"], 1)
    share = {k: round(total[k] / tables, 4) for k in ("depths", "top_depth", "max_stages")}
    within = {"depths": round(total["depths"] / max(total["has_depths"], 1), 4),
              "top_depth": round(total["top_depth"] / max(total["has_depths"], 1), 4),
              "max_stages": round(total["max_stages"] / max(total["has_limit"], 1), 4)}
    return {"seeds": [start, start + count], "tables": total["tables"],
            "model_tables": total["model_tables"], "bounded_dp_tables": total["bounded"],
            "too_large": total["too_large"],
            "feasible": total["feasible"], "share_tables": total["shared"],
            "restricted": total["restricted"],
            "with_depths": total["has_depths"], "with_stage_limit": total["has_limit"],
            "binding_share_of_all": share, "binding_share_where_drawn": within,
            "disagreements": sorted(bad, key=lambda b: b["seed"]), "workers": workers,
            "elapsed_s": round(elapsed, 1), "work_limit": WORK_LIMIT, "node_limit": NODE_LIMIT}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--start", type=int, default=0, help="first seed")
    ap.add_argument("--count", type=int, default=100_000, help="tables (seeds) to check")
    ap.add_argument("--models", type=int, default=500,
                    help="also solve the first this many with CP-SAT and the MILP")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--chunk", type=int, default=250, help="seeds per task")
    ap.add_argument("--every", type=int, default=1,
                    help="the DP with an incumbent and the binding shares on every this-many-th "
                         "seed (they cost as much again as the DP against brute force)")
    ap.add_argument("--milp", choices=("cbc", "highs"), default="cbc",
                    help="the MILP backend of the model checks (HiGHS runs in this process: "
                         "no solver process to start per table)")
    ap.add_argument("--out", type=Path, help="write the summary JSON here")
    ap.add_argument("--progress", type=Path, help="rewrite this file after every chunk")
    args = ap.parse_args(argv)
    result = hunt(args.start, args.count, args.models, args.workers, args.chunk,
                  args.every, args.progress, args.milp)
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 1 if result["disagreements"] else 0


if __name__ == "__main__":
    sys.exit(main())
