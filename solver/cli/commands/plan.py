"""``tangram plan JOB``: the heterogeneous plan of a job, validated, as text or JSON."""

from __future__ import annotations

import argparse

from solver.cli.report import emit_json, island_json, island_rows, render_table
from solver.planner.baselines import Baseline, plan_baseline
from solver.planner.plan import Plan, plan_json
from solver.planner.search import PlannerConfig
from solver.spec.domain import FeaturePreset, SolverKind
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
                   help="print the plan as FlagScale YAML or Megatron-LM arguments instead")
    p.add_argument("-o", "--output", metavar="FILE", help="with --emit: write to FILE")
    p.set_defaults(func=run)


def make_plan(args: argparse.Namespace) -> Plan:
    """The plan the flags ask for (validated)."""
    job = load_job(args.job)
    features = FeaturePreset(args.features) if args.features else None
    if args.baseline:
        return plan_baseline(job, Baseline(args.baseline), features=features)
    if args.time_limit is not None and not args.time_limit > 0:
        raise InputError("<cli>", "--time-limit", f"must be > 0 seconds, got {args.time_limit}")
    config = PlannerConfig(solver=SolverKind(args.solver) if args.solver else None,
                           features=features, time_limit_s=args.time_limit)
    from solver.studies.pareto import plan_with_targets
    parallelizer = None
    if args.cache:
        from solver.cost.parallelizer import AnalyticParallelizer
        from solver.planner.plancache import CachingParallelizer, open_store
        parallelizer = CachingParallelizer(AnalyticParallelizer(features or job.planner.features),
                                           open_store(args.cache))
    return plan_with_targets(job, config, parallelizer)


def run(args: argparse.Namespace) -> int:
    """Print the plan."""
    plan = make_plan(args)
    if args.emit:
        from solver.cli.commands.export import emit
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
        payload = plan_json(plan, [island_json(i) for i in plan.islands.islands])
        payload.update(extra)
        emit_json(payload, args)
        return 0
    print(render_plan(plan))
    if args.explain:
        print("\nper stage (per GPU unless marked):")
        print(render_table([{
            "stage": r.stage, "params B (all)": f"{r.params / 1e9:.2f}",
            "params M/GPU": f"{r.params_per_gpu / 1e6:.0f}",
            "TFLOP/micro-batch": f"{r.tflop_per_micro_batch:.1f}",
            "weights GB": f"{r.weights_gb:.2f}", "grads GB": f"{r.grads_gb:.2f}",
            "optimizer GB": f"{r.optimizer_gb:.2f}", "activations GB": f"{r.activations_gb:.2f}",
            "total GB": f"{r.total_gb:.2f}"} for r in reports]))
        extra.pop("explain")
    for key, value in extra.items():
        print(f"{key}: {value}")
    return 0


def compact_ids(ids: list[str]) -> str:
    """``a100-0..a100-3, h100-7``: consecutive node ids of one prefix as ranges."""
    runs: list[list] = []
    for node in ids:
        prefix, _, num = node.rpartition("-")
        if num.isdigit() and runs and runs[-1][0] == prefix and runs[-1][2] == int(num) - 1:
            runs[-1][2] = int(num)
        else:
            runs.append([prefix, int(num), int(num)] if num.isdigit() else [node, None, None])
    return ", ".join(r[0] if r[1] is None else f"{r[0]}-{r[1]}" if r[1] == r[2]
                     else f"{r[0]}-{r[1]}..{r[0]}-{r[2]}" for r in runs)


def _idle_lines(plan: Plan) -> list[str]:
    """One line per reason nodes stay idle (nothing when every node hosts a stage)."""
    by_reason: dict[str, list[str]] = {}
    for node, why in plan.idle:
        by_reason.setdefault(why, []).append(node)
    return [""] + [f"idle: {compact_ids(nodes)} ({len(nodes)} node{'s' * (len(nodes) > 1)}): "
                   f"{why}" for why, nodes in by_reason.items()] if by_reason else []


def render_plan(plan: Plan) -> str:
    """Readable plan: islands, stages, objective, solver."""
    job = plan.job
    lines = [f"job {job.name}: {job.model.name} on {job.cluster.name} "
             f"({job.cluster.total_gpus} GPUs), batch {job.training.global_batch} x "
             f"{job.training.seq_len} tokens", "", "islands:",
             render_table(island_rows(plan.islands.islands)), "", "stages:"]
    rows = []
    for s in plan.stages:
        c = s.plan.config
        rows.append({"island": s.island.name, "gpu": s.island.gpu.name,
                     "nodes": compact_ids(s.node_ids), "gpus": s.gpus,
                     "layers": f"[{s.start}, {s.end})", "tp": c.tp, "cp": c.cp, "ep": c.ep,
                     "pp": c.pp, "dp": c.dp, "zero": c.zero, "recompute": c.recompute.value,
                     "offload": "yes" if c.offload else "no", "mb/replica": c.micro_batch,
                     "latency ms": s.plan.latency_s * 1e3, "mem GB": s.plan.memory_gb})
    lines.append(render_table(rows))
    lines += _idle_lines(plan)
    if plan.view != "islands":
        lines += ["", f"view: the {plan.view} as one island at its weakest node's figures "
                      "(a heterogeneity-oblivious plan) beats every plan over the islands"]
    info = plan.solver
    proven = "proven optimal" if info.optimal else f"NOT proven optimal (gap {info.gap})"
    lines += ["", f"iteration time {plan.iteration_time_s:.3f} s "
              f"(pipeline {plan.pipeline_time_s:.3f} s + per-iteration {plan.iteration_extra_s:.3f} s)",
              f"throughput {plan.tokens_per_s:,.0f} tokens/s, bubble ratio {plan.bubble_ratio:.1%}, "
              f"n_micro {plan.n_micro}, schedule "
              + (f"interleaved 1F1B (v = {plan.virtual_stages} model chunks per GPU)"
                 if plan.virtual_stages > 1 else "1F1B"),
              f"solver {info.name}: {proven}; planned in {info.time_s:.2f} s with "
              f"{info.parallelizer_calls} parallelizer calls"]
    return "\n".join(lines)
