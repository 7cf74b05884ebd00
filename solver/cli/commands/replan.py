"""``tangram replan PLAN.json --job JOB [--fail NODE_ID...] [--add NODES.toml] [--cache DIR]``.

Re-plans after failed or added nodes, calling the parallelizer only where the partial-plan cache
misses, then searches pipeline replicas across the changed cluster's islands as ``tangram plan``
does; prints the new plan with the throughput change and the re-planning time.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from solver.cli.commands.plan import (as_one_replica, add_replica_flags, render_plan,
                                      replica_options)
from solver.cli.replicated import render_replicated
from solver.cli.report import emit_json, island_json
from solver.cost.parallelizer import AnalyticParallelizer
from solver.planner.plan import Plan
from solver.planner.replica.replica_plan import replicated_json
from solver.planner.stages.plancache import CachingParallelizer, open_store
from solver.spec.fields import read_json
from solver.spec.loaders import load_catalog, load_job
from solver.studies.replan import ClusterChange, Replanned, load_added_nodes, replan


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``replan`` subcommand."""
    p = sub.add_parser("replan", help="re-plan after node failures or additions (cached)")
    p.add_argument("plan", metavar="PLAN.json", help="the previous plan (tangram plan --json)")
    p.add_argument("--job", required=True, metavar="JOB", help="the job TOML the plan was made for")
    p.add_argument("--fail", nargs="+", default=[], metavar="NODE_ID",
                   help="ids of all nodes out of service (e.g. a100-3); the previous plan is "
                        "always the plan of the job's own cluster")
    p.add_argument("--add", metavar="NODES.toml", help="new [[nodes]] groups (cluster format)")
    p.add_argument("--cache", metavar="DIR",
                   help="partial-plan cache directory (default: $XDG_CACHE_HOME/tangram)")
    p.add_argument("--json", action="store_true", help="print JSON")
    add_replica_flags(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Re-plan and print."""
    catalog = load_catalog()
    job = load_job(args.job, catalog)
    if args.replicas:  # as [planner] replicas = true
        job = replace(job, planner=replace(job.planner, replicas=True))
    added = load_added_nodes(args.add, catalog) if args.add else None
    par = CachingParallelizer(AnalyticParallelizer(job.planner.features), open_store(args.cache))
    change = ClusterChange(tuple(args.fail), added, args.add or "<nodes>")
    result = replan(job, read_json(args.plan), change, par, source=args.plan,
                    options=replica_options(args))
    if args.json:
        emit_json(replan_json(result), args)
    else:
        print(render_replan(result))
    return 0


def replan_json(r: Replanned) -> dict:
    """The ``tangram replan --json`` object: ``plan`` is the ``tangram plan --json`` object of
    the changed cluster (with ``replicas`` when the replica search ran); ``calls`` are the
    single-pipeline planning's, ``replica_search_calls`` the replica search's."""
    several = _replicas(r.plan) > 1  # as tangram plan: the replicas' islands, else the plan's
    islands = [island_json(i) for i in (r.replicas.islands if several else
                                        r.single.islands.islands)]
    plan = replicated_json(r.replicas or as_one_replica(r.single), islands)
    return {"plan": plan, "previous_tokens_per_s": round(r.previous.tokens_per_s, 3),
            "tokens_per_s": round(r.plan.tokens_per_s, 3), "change": round(r.change, 6),
            "replan_time_s": round(r.time_s, 4), "parallelizer_calls": r.parallelizer_calls,
            "cache_hits": r.cache_hits, "calls": r.parallelizer_calls + r.cache_hits,
            "replica_search_calls": r.replica_calls,
            "previous_pipelines": _replicas(r.previous), "pipelines": _replicas(r.plan)}


def _replicas(plan) -> int:
    """Pipeline replicas of a plan (1 for a single pipeline)."""
    return 1 if isinstance(plan, Plan) else len(plan.replicas)


def render_replan(r: Replanned) -> str:
    """The new plan, then the change and the cost of re-planning."""
    shape = "" if _replicas(r.previous) == _replicas(r.plan) == 1 else \
        f", {_replicas(r.previous)} -> {_replicas(r.plan)} pipeline replicas"
    text = render_plan(r.plan) if isinstance(r.plan, Plan) else render_replicated(r.plan)
    lines = [text]
    if r.replicas is not None and len(r.replicas.replicas) == 1:
        lines.append(f"replicas: one pipeline ({r.replicas.note})")
    searched = "" if r.replicas is None else \
        f"; replica search {r.replica_calls} calls (in memory, not cached)"
    return "\n".join(lines + [
        "", f"throughput {r.previous.tokens_per_s:,.0f} -> {r.plan.tokens_per_s:,.0f} tokens/s "
            f"({r.change:+.1%}{shape})",
        # The plan's own line counts every call the planner made; these are the same calls.
        f"re-planned in {r.time_s:.2f} s: {r.parallelizer_calls + r.cache_hits} parallelizer "
        f"calls, {r.parallelizer_calls} computed, {r.cache_hits} from the cache{searched}"])
