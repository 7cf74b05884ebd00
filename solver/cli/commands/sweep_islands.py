"""``tangram sweep-islands JOB --tau-c LOW..HIGH [--steps N] [--json] [--plot FILE]``.

Islands and planned throughput as the compute threshold τ_C varies (the seed note's suggestion E).
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from solver.cli.report import emit_json, render_table
from solver.spec.domain import JobSpec
from solver.spec.errors import InputError
from solver.spec.loaders import load_job
from solver.studies.island_sweep import (
    SweepPoint,
    changes,
    compute_gaps,
    parse_range,
    sample_values,
    sweep_json,
    sweep_tau_c,
)


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``sweep-islands`` subcommand."""
    p = sub.add_parser("sweep-islands", help="islands and throughput as the threshold tau_C varies")
    p.add_argument("job", metavar="JOB", help="job TOML file")
    p.add_argument("--tau-c", default="0.05..0.4", metavar="LOW..HIGH",
                   help="range of tau_C (default 0.05..0.4)")
    p.add_argument("--steps", type=int, default=15, help="evenly spaced samples (default 15); "
                   "every compute gap inside the range is added")
    for name in ("tau-m", "tau-b", "t-merge"):
        p.add_argument(f"--{name}", type=float, metavar="X",
                       help=f"override the job's {name.replace('-', '_')} for the sweep")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--plot", metavar="FILE", help="write the curve as a PNG figure")
    p.set_defaults(func=run)


def _job(args: argparse.Namespace) -> JobSpec:
    """The job with the threshold overrides of the command line."""
    job = load_job(args.job)
    over = {k: getattr(args, k) for k in ("tau_m", "tau_b", "t_merge")
            if getattr(args, k) is not None}
    for key, value in over.items():
        if not 0.0 <= value <= 1.0:
            raise InputError("<cli>", f"--{key.replace('_', '-')}",
                             f"must be in [0, 1], got {value}")
    return replace(job, planner=replace(job.planner, **over))


def run(args: argparse.Namespace) -> int:
    """Sweep and print."""
    job = _job(args)
    lo, hi = parse_range(args.tau_c)
    gaps = compute_gaps(job.cluster, lo, hi)
    points = sweep_tau_c(job, sample_values(lo, hi, args.steps, gaps))
    if args.plot:
        plot_sweep(points, args.plot, job)
    if args.json:
        emit_json(sweep_json(job, points, gaps), args)
        return 0
    print(render_sweep(job, points, gaps))
    return 0


def render_sweep(job: JobSpec, points: list[SweepPoint], gaps: list) -> str:
    """Table of the sweep plus the compute gaps and where the islands change."""
    rows = [{"tau_c": f"{p.tau_c:.4f}", "islands": len(p.islands),
             "composition": " | ".join(f"{i.gpu.name}x{i.gpus}" for i in p.islands),
             "compute lost": f"{p.compute_loss:.1%}",
             "tokens/s": "-" if p.plan is None else f"{p.plan.tokens_per_s:,.0f}",
             "iteration s": "-" if p.plan is None else f"{p.plan.iteration_time_s:.3f}"}
            for p in points]
    o = job.planner
    lines = [f"job {job.name}: tau_m {o.tau_m:g}, tau_b {o.tau_b:g}, t_merge {o.t_merge:g}",
             render_table(rows), ""]
    lines.append("compute gaps in range: " + (", ".join(
        f"{g.tau_c:.4f} ({g.kinds[0]} vs {g.kinds[1]})" for g in gaps) or "none"))
    found = changes(points)
    lines.append("islands change at tau_c = " + (", ".join(f"{c:.4f}" for c in found)
                                                or "nowhere in the range"))
    return "\n".join(lines)


def plot_sweep(points: list[SweepPoint], path: str, job: JobSpec) -> None:
    """Throughput (left axis) and island count (right axis) against τ_C, as steps."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    taus = [p.tau_c for p in points]
    tput = [float("nan") if p.plan is None else p.plan.tokens_per_s / 1e3 for p in points]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.step(taus, tput, where="post", color="C0", marker="o", ms=3, label="planned throughput")
    ax.set_xlabel("τ_C (relative compute threshold)")
    ax.set_ylabel("k tokens/s", color="C0")
    ax.grid(alpha=0.3)
    ax2 = ax.twinx()
    ax2.step(taus, [len(p.islands) for p in points], where="post", color="C3", ls="--",
             label="islands")
    ax2.set_ylabel("islands", color="C3")
    ax2.set_ylim(0, max(len(p.islands) for p in points) + 1)
    ax2.yaxis.set_major_locator(MaxNLocator(integer=True))
    for c in changes(points):
        ax.axvline(c, color="0.6", lw=0.8, ls=":")
    o = job.planner
    ax.set_title(f"{job.name} (τ_M {o.tau_m:g}, τ_B {o.tau_b:g}, t_merge {o.t_merge:g})",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
