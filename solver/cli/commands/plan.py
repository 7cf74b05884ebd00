"""``tangram plan JOB``: the heterogeneous plan of a job, validated, as text or JSON."""

from __future__ import annotations

import argparse
import os
from dataclasses import replace

from solver.cli.report import (emit_json, idle_lines, island_json, island_rows, job_json,
                               job_line, render_table, stage_rows)
from solver.planner.baselines import Baseline, plan_baseline
from solver.planner.notices import plan_warnings
from solver.planner.plan import Plan, plan_json
from solver.planner.replica.replica_plan import ReplicatedPlan, replicated_json
from solver.planner.replica.replicas import (ReplicaOptions, plan_replicas, replica_search_runs,
                                     why_no_replica_search)
from solver.planner.stages.search import PlannerConfig
from solver.spec.domain import FeaturePreset, JobSpec, SolverKind
from solver.spec.errors import InputError
from solver.spec.loaders import load_job


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``plan`` subcommand."""
    p = sub.add_parser("plan", help="plan a job: islands, stages, configuration, throughput")
    p.add_argument("job", metavar="JOB", help="job TOML file")
    p.add_argument("--solver", choices=[s.value for s in SolverKind if s is not SolverKind.BRUTE],
                   help="composition solver (default: the job's, dp)")
    p.add_argument("--features", choices=[f.value for f in FeaturePreset],
                   help="parallelizer feature preset (default: the job's, full)")
    p.add_argument("--baseline", choices=[b.value for b in Baseline],
                   help="plan a comparison baseline instead")
    p.add_argument("--time-limit", type=float, help="CP-SAT/MILP time limit per solve (s)")
    p.add_argument("--cache", metavar="DIR",
                   help="keep partial plans in DIR (default: no cache) so a later "
                        "`tangram replan --cache DIR` only re-plans what changed")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--simulate", action="store_true",
                   help="also simulate the 1F1B schedule and report its iteration time")
    p.add_argument("--plot", metavar="FILE", help="write a Gantt chart of the schedule (PNG)")
    p.add_argument("--explain", action="store_true",
                   help="also show per stage: parameters, FLOPs per micro-batch, memory by part")
    p.add_argument("--emit", choices=("flagscale", "megatron"),
                   help="print the plan as FlagScale YAML or a Megatron-LM launch instead "
                        "(with --json: the plan's JSON holds it under \"export\")")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="with --emit: write to FILE (flagscale: and its hostfile beside it, "
                        "FILE with the suffix .hostfile)")
    add_replica_flags(p)
    p.set_defaults(func=run)


def add_replica_flags(p: argparse.ArgumentParser) -> None:
    """``--replicas``, ``--replica-time-limit`` and ``--workers`` (``plan`` and ``replan``)."""
    p.add_argument("--replicas", action="store_true",
                   help="also search plans of several pipeline replicas across islands, as "
                        "[planner] replicas = true does (a research option: the plan says "
                        "which runtime could train it)")
    p.add_argument("--replica-time-limit", type=float, metavar="S",
                   help="time limit of the search over pipeline replicas across islands "
                        "(default 60 s; the plan says when it stops before a proof)")
    p.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1), metavar="N",
                   help="processes for the n_micro search and the replica search (default: "
                        "min(2, CPUs); same plan)")


def planner_config(args: argparse.Namespace) -> PlannerConfig:
    """The planner options the flags set (None: the job's)."""
    if args.workers < 1:
        raise InputError("<cli>", "--workers", f"must be >= 1, got {args.workers}")
    if args.time_limit is not None and not args.time_limit > 0:
        raise InputError("<cli>", "--time-limit", f"must be > 0 seconds, got {args.time_limit}")
    return PlannerConfig(solver=SolverKind(args.solver) if args.solver else None,
                         features=FeaturePreset(args.features) if args.features else None,
                         time_limit_s=args.time_limit, workers=args.workers)


def make_plan(args: argparse.Namespace, job: JobSpec | None = None) -> Plan:
    """The plan the flags ask for (validated); ``job``: the job file's, when loaded already."""
    job = job or load_job(args.job)
    features = FeaturePreset(args.features) if args.features else None
    if args.baseline:
        return plan_baseline(job, Baseline(args.baseline), features=features)
    config = planner_config(args)
    from solver.studies.pareto import plan_with_targets
    parallelizer = None
    if args.cache:
        from solver.cost.parallelizer import AnalyticParallelizer
        from solver.planner.stages.plancache import CachingParallelizer, open_store
        parallelizer = CachingParallelizer(AnalyticParallelizer(features or job.planner.features),
                                           open_store(args.cache))
    return plan_with_targets(job, config, parallelizer)


def replica_options(args: argparse.Namespace) -> ReplicaOptions:
    """The replica search's options the flags set."""
    if args.workers < 1:
        raise InputError("<cli>", "--workers", f"must be >= 1, got {args.workers}")
    limit = args.replica_time_limit
    if limit is not None and not limit > 0:
        raise InputError("<cli>", "--replica-time-limit", f"must be > 0 seconds, got {limit}")
    return ReplicaOptions(workers=args.workers) if limit is None else \
        ReplicaOptions(time_limit_s=limit, workers=args.workers)


def plan_and_replicas(args: argparse.Namespace) -> tuple[Plan, ReplicatedPlan | None]:
    """The single-pipeline plan and the replica search where it runs (not for a baseline, nor
    where :func:`~solver.planner.replica.replicas.replica_search_runs` says no). Without ``--cache``
    (whose store the single pipeline's full search fills for ``replan``) the replica search
    plans the single pipeline itself, bounded by its first replicas (the same plan, found
    sooner); the plan returned is then the winning replica's when one replica wins."""
    job = load_job(args.job)
    if getattr(args, "replicas", False):
        job = replace(job, planner=replace(job.planner, replicas=True))
    if args.baseline or not replica_search_runs(job):
        return make_plan(args, job), None
    config, options = planner_config(args), replica_options(args)
    if args.cache:
        plan = make_plan(args, job)
        return plan, plan_replicas(job, plan, config, options=options)
    rp = plan_replicas(job, None, config, options=options)
    return rp.replicas[0].plan, rp


def run(args: argparse.Namespace) -> int:
    """Print the plan."""
    if args.output and not args.emit:
        raise InputError("<cli>", "-o", "writes the export: give --emit flagscale|megatron")
    plan, rp = plan_and_replicas(args)
    if rp is not None and len(rp.replicas) > 1:
        from solver.cli.replicated import run_replicated
        return run_replicated(args, rp)
    if args.emit and not args.json:
        from solver.cli.commands.export import emit, text_alone
        text_alone(args)
        return emit(plan, args.emit, args.output)
    extra = {}
    if args.simulate or args.plot:
        from solver.schedule.report import run_simulation, simulate_plan
        sim = run_simulation(plan)
        extra = simulate_plan(plan, sim)
        if args.plot:
            from solver.cli.plots import plot_plan_schedule
            extra["plot"] = str(plot_plan_schedule(sim, args.plot))
    if args.explain:
        import dataclasses
        from solver.planner.explain import explain
        reports = explain(plan)
        extra["explain"] = [dataclasses.asdict(r) for r in reports]
    if args.json:
        islands = [island_json(i) for i in plan.islands.islands]
        payload = plan_json(plan, islands) if args.baseline else \
            replicated_json(rp or as_one_replica(plan), islands)
        payload.update(extra, job=job_json(plan.job))
        if args.emit:  # the export beside the plan, or one line why not (exit 3)
            from solver.cli.commands.export import export_json
            export = export_json(plan, args.emit, args.output)
            if export is None:
                return 3
            payload["export"] = export
        emit_json(payload, args)
        return 0
    print(render_plan(plan))
    if rp is not None:
        print(f"replicas: one pipeline ({rp.note}; {rp.solver.time_s:.2f} s of planning in "
              "all)")
    if args.explain:
        print(render_explain(reports))
        extra.pop("explain")
    for key, value in extra.items():
        print(f"{key}: {value}")
    return 0


def as_one_replica(plan: Plan) -> ReplicatedPlan:
    """A plan made without the replica search, as one replica: ``--json`` keeps the replica
    keys (``replicas``, ``allreduce_s``, ``runtime``, ``replica_search``) with one pipeline's
    values."""
    return ReplicatedPlan.single(plan, plan.solver, why_no_replica_search(plan.job),
                                 searched=False)


def render_explain(reports: list) -> str:
    """The ``--explain`` table: per stage, parameters, FLOPs and memory by part."""
    return "\nper stage (per GPU unless marked):\n" + render_table([{
        "stage": r.stage, "params B (all)": f"{r.params / 1e9:.2f}",
        "params M/GPU": f"{r.params_per_gpu / 1e6:.0f}",
        "TFLOP/micro-batch": f"{r.tflop_per_micro_batch:.1f}",
        "weights GB": f"{r.weights_gb:.2f}", "grads GB": f"{r.grads_gb:.2f}",
        "optimizer GB": f"{r.optimizer_gb:.2f}", "activations GB": f"{r.activations_gb:.2f}",
        "fragmentation GB": f"{r.fragmentation_gb:.2f}", "total GB": f"{r.total_gb:.2f}"}
        for r in reports])


def render_plan(plan: Plan) -> str:
    """Readable plan: islands, stages, objective, solver."""
    job = plan.job
    lines = [job_line(job), "", "islands:",
             render_table(island_rows(plan.islands.islands)), "", "stages:"]
    lines.append(render_table(stage_rows(plan)))
    lines += idle_lines(plan.idle)
    warns = [f"warning: {w}" for w in plan_warnings(plan)]
    lines += ([""] if warns and not plan.idle else []) + warns
    if plan.view != "islands":
        lines += ["", f"view: the {plan.view} as one island at its weakest node's figures "
                      "(a heterogeneity-oblivious plan) beats every plan over the islands"]
    info = plan.solver
    proven = info.proof
    lines += ["", f"iteration time {plan.iteration_time_s:.3f} s "
              f"(pipeline {plan.pipeline_time_s:.3f} s + per-iteration {plan.iteration_extra_s:.3f} s)",
              f"throughput {plan.tokens_per_s:,.0f} tokens/s, bubble ratio {plan.bubble_ratio:.1%}, "
              f"n_micro {plan.n_micro}, schedule "
              + (f"interleaved 1F1B (v = {plan.virtual_stages} model chunks per GPU)"
                 if plan.virtual_stages > 1 else "1F1B"),
              f"solver {info.name}: {proven}; planned in {info.time_s:.2f} s with "
              f"{info.parallelizer_calls} parallelizer calls"]
    return "\n".join(lines)
