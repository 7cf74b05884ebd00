"""``tangram plan`` output for a plan of several pipeline replicas across islands."""

from __future__ import annotations

import argparse
import sys

from solver.cli.report import (emit_json, idle_lines, island_json, island_rows, job_json,
                               job_line, render_table, stage_rows)
from solver.planner.replica.replica_plan import ReplicatedPlan, not_exportable, replicated_json


def run_replicated(args: argparse.Namespace, rp: ReplicatedPlan) -> int:
    """Print (or refuse to export) a replicated plan."""
    if args.emit:
        print(f"cannot export to {args.emit}: {_refusal(rp)}", file=sys.stderr)
        return 3
    extra = _extras(args, rp)
    if args.json:
        payload = replicated_json(rp, [island_json(i) for i in rp.islands])
        payload.update(extra, job=job_json(rp.job))
        emit_json(payload, args)
        return 0
    print(render_replicated(rp))
    for key, value in extra.items():
        print(f"{key}: {value}")
    return 0


def _refusal(rp: ReplicatedPlan) -> str:
    """Why ``--emit`` refuses the replicas (one line): no runtime trains them, or (identical
    replicas with equal shares) the export as one pipeline with dp x R is not written."""
    runtime = rp.runtime
    if not runtime.runs_on:
        return not_exportable(rp.shares, runtime.why)
    return (f"the plan trains {len(rp.replicas)} identical pipeline replicas, which "
            f"{' and '.join(runtime.runs_on)} could run as one pipeline with every stage's dp "
            f"x {len(rp.replicas)}, but the export writes one replica's pipeline only (plan "
            "without [planner] replicas = true for an exportable plan)")


def _extras(args: argparse.Namespace, rp: ReplicatedPlan) -> dict:
    """``--simulate`` / ``--plot`` / ``--explain`` for every replica (the plot: the slowest)."""
    extra: dict = {}
    slowest = max(rp.replicas, key=lambda r: r.plan.iteration_time_s)
    if args.simulate or args.plot:
        from solver.schedule.report import run_simulation, simulate_plan
        for k, r in enumerate(rp.replicas):
            sim = run_simulation(r.plan)
            extra[f"replica {k}"] = simulate_plan(r.plan, sim)
            if args.plot and r is slowest:
                from solver.cli.plots import plot_plan_schedule
                extra["plot"] = f"{plot_plan_schedule(sim, args.plot)} (replica {k}, the slowest)"
    if args.explain:
        import dataclasses
        from solver.planner.explain import explain
        for k, r in enumerate(rp.replicas):
            extra[f"explain replica {k}"] = [dataclasses.asdict(x) for x in explain(r.plan)]
    return extra


def render_replicated(rp: ReplicatedPlan) -> str:
    """Readable plan: islands, each replica's share and stages, the objective, the search."""
    job = rp.job
    lines = [job_line(job), "", "islands:",
             render_table(island_rows(rp.islands))]
    for k, r in enumerate(rp.replicas):
        p = r.plan
        lines += ["", f"replica {k}: {r.share} sequences on {', '.join(i.name for i in r.islands)}"
                      f" — iteration {p.iteration_time_s:.3f} s (pipeline {p.pipeline_time_s:.3f} s"
                      f" + per-iteration {p.iteration_extra_s:.3f} s), n_micro {p.n_micro}, "
                      f"bubble {p.bubble_ratio:.1%}",
                  render_table(stage_rows(p))]
    lines += idle_lines(rp.idle)
    info = rp.solver
    proven = info.proof if info.optimal else \
        f"NOT proven optimal (bound {info.bound:.4g} s, gap {info.gap:.1%})"
    lines += ["", f"iteration time {rp.iteration_time_s:.3f} s (slowest replica "
                  f"{rp.iteration_time_s - rp.allreduce_s:.3f} s + exchange across replicas "
                  f"{rp.allreduce_s:.3f} s)",
              f"throughput {rp.tokens_per_s:,.0f} tokens/s with {len(rp.replicas)} replicas, "
              f"shares {'/'.join(map(str, rp.shares))} sequences (unit {rp.share_unit})",
              f"exchange across replicas: {rp.exchange}" + (
                  "" if rp.exchange != "full-gradient all-reduce" else
                  " (their shard layouts differ: each replica's whole gradient crosses an "
                  "inter-island link)"),
              "runtime: " + (", ".join(rp.runtime.runs_on) or "none") + f" ({rp.runtime.why})",
              f"solver {info.name}: {proven}; {rp.note}; planned in {info.time_s:.2f} s with "
              f"{info.parallelizer_calls} parallelizer calls"]
    return "\n".join(lines)
