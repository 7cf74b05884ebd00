"""``tangram islands CLUSTER_OR_JOB [--json] [--exact]``: GPU islands of a cluster."""

from __future__ import annotations

import argparse
from pathlib import Path

from solver.cli.report import (SHOWN_DEFAULTS, emit_json, gpu_rows, gpu_types, island_rows,
                               islands_json, render_table)
from solver.islands import IslandSet, Thresholds, build_islands
from solver.spec.catalog import defaults_text
from solver.spec.domain import ClusterSpec, GPUSpec
from solver.spec.errors import InputError
from solver.spec.fields import read_toml
from solver.spec.loaders import INSTANCES, load_catalog, load_cluster, load_job


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``islands`` subcommand."""
    p = sub.add_parser("islands", help="group a cluster's nodes into homogeneous GPU islands")
    p.add_argument("target", metavar="CLUSTER_OR_JOB",
                   help="cluster or job TOML file, or a cluster name from instances/clusters")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--exact", action="store_true",
                   help="also solve the merge exactly with CP-SAT and report both")
    p.set_defaults(func=run)


def load_cluster_or_job(target: str) -> tuple[ClusterSpec, Thresholds]:
    """A cluster and the island thresholds from a cluster file, a job file or a cluster name."""
    path = Path(target)
    if not path.is_file():
        named = INSTANCES / "clusters" / f"{target}.toml"
        if not named.is_file():
            raise InputError(target, "<file>", "no such file, and no cluster of that name")
        path = named
    data = read_toml(path)
    if "cluster" in data and "nodes" not in data:
        job = load_job(path)
        return job.cluster, Thresholds.of(job.planner)
    return load_cluster(path, load_catalog()), Thresholds()


def gpu_lines(gpus: list[GPUSpec]) -> list[str]:
    """The GPU types' figures, and the defaults the starred ones took."""
    taken = [k for k in SHOWN_DEFAULTS if any(k in g.defaults for g in gpus)]
    lines = ["", "GPU types:", render_table(gpu_rows(gpus))]
    if taken:
        lines.append(f"*: not in the GPU's catalog entry, so the default "
                     f"({defaults_text(taken)})")
    return lines


def run(args: argparse.Namespace) -> int:
    """Print the islands (and merges) of the target."""
    cluster, th = load_cluster_or_job(args.target)
    result: IslandSet = build_islands(cluster, th)
    payload = islands_json(result)
    if args.exact:
        from formulations.island_merge import solve_island_merge
        exact = solve_island_merge(result.components, th)
        payload["exact"] = {"islands": exact.islands, "loss": round(exact.loss, 6),
                            "optimal": exact.optimal, "groups": [list(g) for g in exact.groups]}
    if args.json:
        emit_json(payload, args)
        return 0
    print(f"cluster {cluster.name}: {cluster.total_gpus} GPUs in {len(cluster.nodes)} nodes")
    print(render_table(island_rows(result.islands)))
    for m in result.merges:
        print(f"merged {' + '.join(m.members)} -> {m.into} (loss {m.loss:.1%})")
    print("\n".join(gpu_lines(gpu_types(result.islands))))
    if args.exact:
        e = payload["exact"]
        print(f"CP-SAT merge: {e['islands']} islands, compute loss {e['loss']:.2%}, "
              f"{'optimal' if e['optimal'] else 'not proven optimal'}")
    return 0
