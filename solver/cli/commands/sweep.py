"""``tangram sweep JOB [--n-micro 1..128] [--json] [--plot FILE]``: the exact n_micro curve.

For every n in the range that divides the global batch the job is planned and composed exactly
(each plan validated). ``--json`` prints the public contract
``{"points": [{"n_micro", "iteration_time_s", "tokens_per_s", "bubble_ratio", "feasible"}],
"best": {...same keys...}}`` (infeasible points carry nulls). Text mode adds eq. (10)'s
predictions from the plan at the job's own n_micro (else the best plan). No feasible n: exit 3.
"""

from __future__ import annotations

import argparse
import json

from solver.cli.report import render_table
from solver.planner.stages.search import PlannerConfig
from solver.spec.domain import FeaturePreset, JobSpec, SolverKind
from solver.spec.errors import InfeasibleError, InputError
from solver.spec.loaders import load_job
from solver.studies.sweep import (
    MAX_AUTO_MICRO,
    NStarModel,
    SweepPoint,
    SweepResult,
    candidate_n_micro,
    eq10,
    sweep,
    sweep_json,
)


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``sweep`` subcommand."""
    p = sub.add_parser("sweep", help="exact plan at every n_micro: throughput and bubble curve")
    p.add_argument("job", metavar="JOB", help="job TOML file")
    p.add_argument("--n-micro", default=f"1..{MAX_AUTO_MICRO}", metavar="RANGE",
                   help=f"A..B (divisors of the global batch in it) or a comma list "
                        f"(default 1..{MAX_AUTO_MICRO})")
    p.add_argument("--solver", choices=[s.value for s in SolverKind if s is not SolverKind.BRUTE],
                   help="composition solver (default: the job's, dp)")
    p.add_argument("--features", choices=[f.value for f in FeaturePreset],
                   help="parallelizer feature preset (default: the job's, full)")
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="plan the n values in N processes (default 1)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--plot", metavar="FILE", help="write throughput and bubble ratio (PNG)")
    p.set_defaults(func=run)


def parse_n_micro(text: str, job: JobSpec) -> list[int]:
    """The n values of ``--n-micro``: ``A..B`` keeps the divisors of the global batch, a comma
    list must hold divisors only."""
    b = job.training.global_batch
    try:
        if ".." in text:
            lo, hi = (int(x) for x in text.split("..", 1))
            values = None
        else:
            values = sorted({int(x) for x in text.split(",")})
            lo, hi = values[0], values[-1]
    except ValueError:
        raise InputError("<cli>", "--n-micro", f"expected A..B or a comma list of integers, "
                                               f"got {text!r}") from None
    if lo < 1:
        raise InputError("<cli>", "--n-micro", f"n_micro counts micro-batches, so it is at "
                                               f"least 1 (got {lo} in {text!r})")
    if lo > hi:
        raise InputError("<cli>", "--n-micro", f"empty range {text!r} (A..B needs A <= B)")
    ns = candidate_n_micro(job, lo, hi) if values is None else values
    bad = [n for n in ns if b % n]
    if bad or not ns:
        raise InputError("<cli>", "--n-micro", f"no n in {text!r} divides global_batch {b}"
                         if not ns else f"{bad[0]} does not divide global_batch {b}")
    return ns


def run(args: argparse.Namespace) -> int:
    """Sweep and print."""
    if args.workers < 1:
        raise InputError("<cli>", "--workers", f"must be >= 1, got {args.workers}")
    job = load_job(args.job)
    config = PlannerConfig(solver=SolverKind(args.solver) if args.solver else None,
                           features=FeaturePreset(args.features) if args.features else None)
    result = sweep(job, config, parse_n_micro(args.n_micro, job), args.workers)
    if result.best is None:
        raise InfeasibleError(f"no n_micro in {args.n_micro} fits: {result.points[-1].reason}")
    if args.plot:
        _plot(job, result, args.plot)
    if args.json:
        print(json.dumps(sweep_json(result), indent=2))
    else:
        print(render_sweep(job, result))
        if args.plot:
            print(f"plot: {args.plot}")
    return 0


def reference_point(job: JobSpec, result: SweepResult) -> SweepPoint:
    """The plan eq. (10) extrapolates from: the job's own n_micro if swept and feasible, else
    the best point."""
    own = [p for p in result.points if p.n_micro == job.training.n_micro and p.feasible]
    return own[0] if own else result.best


def render_sweep(job: JobSpec, result: SweepResult) -> str:
    """The curve as a table beside eq. (10)'s predictions, and the best n."""
    ref = reference_point(job, result)
    ns = [p.n_micro for p in result.points]
    scaled = eq10(ref.plan, ns, NStarModel.SCALED)
    fixed = eq10(ref.plan, ns, NStarModel.FIXED_LAYOUT)
    rows = []
    for p, (_, t_scaled), (_, t_fixed) in zip(result.points, scaled.curve, fixed.curve):
        rows.append({"n_micro": p.n_micro, "micro-batch": job.training.global_batch // p.n_micro,
                     "iteration s": p.iteration_time_s if p.feasible else "-",
                     "tokens/s": p.tokens_per_s if p.feasible else "-",
                     "bubble": f"{p.bubble_ratio:.1%}" if p.feasible else "-",
                     "stages": len(p.plan.stages) if p.feasible else "-",
                     "eq10 scaled s": t_scaled,
                     "eq10 fixed s": "-" if t_fixed is None else t_fixed})
    best = result.best
    return "\n".join([
        f"job {job.name}: n_micro sweep, global batch {job.training.global_batch} x "
        f"{job.training.seq_len} tokens", "", render_table(rows), "",
        f"best n_micro {best.n_micro}: iteration {best.iteration_time_s:.3f} s, "
        f"{best.tokens_per_s:,.0f} tokens/s, bubble {best.bubble_ratio:.1%}",
        f"eq. (10) from the plan at n_micro {ref.n_micro}: n* = {scaled.n_star} with tau and c "
        f"scaled 1/n (eq10 scaled), n* = {fixed.n_star} with its layout re-costed (eq10 fixed)",
        f"planned {len(ns)} values of n_micro in {result.elapsed_s:.1f} s"])


def _plot(job: JobSpec, result: SweepResult, path: str) -> None:
    from solver.cli.plots import plot_sweep
    from solver.schedule.report import run_simulation
    pts = result.points
    simulated = [run_simulation(p.plan).tokens_per_s if p.feasible else None for p in pts]
    plot_sweep([p.n_micro for p in pts], [p.tokens_per_s for p in pts],
               [p.bubble_ratio for p in pts], path, simulated, result.best.n_micro,
               f"{job.name}: exact plan per n_micro")
