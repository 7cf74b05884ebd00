"""``tangram pareto JOB [--json] [--plot FILE]``: Pareto fronts of speed vs cost and vs energy."""

from __future__ import annotations

import argparse

from solver.cli.report import emit_json, render_table
from solver.spec.loaders import load_job
from solver.studies.pareto import (
    Objective,
    SubsetPlan,
    fronts_json,
    pareto_front,
    subset_plans,
)


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``pareto`` subcommand."""
    p = sub.add_parser("pareto", help="Pareto fronts of iteration time vs cost and vs energy")
    p.add_argument("job", metavar="JOB", help="job TOML file")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--plot", metavar="FILE", help="write both fronts as a PNG figure")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Plan every island set, print the fronts."""
    job = load_job(args.job)
    points = subset_plans(job)
    if args.plot:
        plot_fronts(points, args.plot, job.name)
    if args.json:
        emit_json(fronts_json(points), args)
        return 0
    print(f"job {job.name}: {len(points)} island sets with a feasible plan")
    for obj in Objective:
        unit = "$/iter" if obj is Objective.COST else "kWh/iter"
        rows = [{"iteration s": p.iteration_time_s, "tokens/s": p.tokens_per_s,
                 unit: p.value(obj), "gpus": sum(i.gpus for i in dict.fromkeys(s.island for s in p.plan.stages)),
                 "islands": " > ".join(p.islands)} for p in pareto_front(points, obj)]
        print(f"\n{obj.value} front (fastest first):")
        print(render_table(rows))
    return 0


def plot_fronts(points: list[SubsetPlan], path: str, title: str) -> None:
    """Every island set (grey) and the front (line) for cost and energy, side by side."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, obj in zip(axes, Objective):
        scale = 1.0 if obj is Objective.COST else 1e3
        label = "$ per iteration" if obj is Objective.COST else "Wh per iteration"
        ax.scatter([p.iteration_time_s for p in points], [p.value(obj) * scale for p in points],
                   color="0.7", label="best plan of an island set")
        front = pareto_front(points, obj)
        ax.plot([p.iteration_time_s for p in front], [p.value(obj) * scale for p in front],
                "o-", drawstyle="steps-post", color="C0" if obj is Objective.COST else "C2",
                label="Pareto front (best attainable)")
        for p in front:
            ax.annotate("+".join(i.split("-", 1)[1].split("-")[0] for i in p.islands),
                        (p.iteration_time_s, p.value(obj) * scale), fontsize=7,
                        textcoords="offset points", xytext=(4, 4))
        ax.set_xlabel("iteration time (s)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{title}: speed vs {' and '.join(o.value for o in Objective)}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
