"""Plain-text tables and JSON payloads shared by the commands."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from solver.spec.domain import CrossEntropyKernel, GPUSpec, Island, JobSpec

if TYPE_CHECKING:  # only annotations: importing the islands step would import networkx
    from solver.islands import IslandSet


def render_table(rows: Sequence[dict[str, Any]]) -> str:
    """Left-aligned text table of homogeneous dict rows (keys are the header)."""
    if not rows:
        return "(none)"
    header = list(rows[0])
    cells = [[_fmt(r[h]) for h in header] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(header)]
    line = lambda vals: "  ".join(v.ljust(w) for v, w in zip(vals, widths)).rstrip()
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(c) for c in cells])


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    return str(value)


def island_json(isl: Island) -> dict[str, Any]:
    """One island as in ``tangram islands --json`` (effective per-GPU values)."""
    return {"name": isl.name, "gpu": isl.gpu.name, "nodes": [n.node_id for n in isl.nodes],
            "gpus": isl.gpus, "gpus_per_node": isl.gpus_per_node,
            "tflops_per_gpu": round(isl.tflops_per_gpu, 6), "hbm_gb": isl.hbm_gb,
            "total_tflops": round(isl.total_tflops, 6)}


def islands_json(result: IslandSet) -> dict[str, Any]:
    """The ``tangram islands --json`` object."""
    return {"islands": [island_json(i) for i in result.islands],
            "merges": [{"members": list(m.members), "into": m.into, "loss": round(m.loss, 6)}
                       for m in result.merges],
            "gpu_types": [gpu_json(g) for g in gpu_types(result.islands)]}


def gpu_types(islands: Sequence[Island]) -> list[GPUSpec]:
    """The GPU types of the islands' nodes, by name."""
    found = {n.gpu.name: n.gpu for i in islands for n in i.nodes}
    return [found[k] for k in sorted(found)]


#: The figures of a GPU type that ``tangram islands`` shows (the cost model's inputs).
GPU_FIGURES = ("bf16_tflops", "hbm_gb", "hbm_bw_gbs", "nvlink_gbs", "nic_gbits", "pcie_gbs",
               "gemm_eff", "fp8_gemm_eff", "attention", "attention_eff", "nvlink_domain")


def gpu_json(gpu: GPUSpec) -> dict[str, Any]:
    """One GPU type's figures, the optional fields its entry omitted (they took the documented
    defaults) and the catalog file it came from."""
    return {"name": gpu.name, **{k: getattr(gpu, k) for k in GPU_FIGURES},
            "defaults": list(gpu.defaults), "catalog_file": gpu.catalog_file}


def gpu_rows(gpus: Sequence[GPUSpec]) -> list[dict[str, Any]]:
    """Readable rows of GPU types: the cost model's kernel figures, ``*`` on those the catalog
    entry omitted (documented defaults), and the catalog the entry came from."""
    columns = {"bf16 TFLOP/s": "bf16_tflops", "HBM GB/s": "hbm_bw_gbs",
               "NVLink GB/s": "nvlink_gbs", "NVLink domain": "nvlink_domain",
               "gemm_eff": "gemm_eff", "attention": "attention", "attention_eff": "attention_eff"}
    return [{"gpu": g.name, **{head: _figure(g, k) for head, k in columns.items()},
             "GEMM curve": "pooled*" if "gemm_half_balance" in g.defaults else "own fit",
             "catalog": _catalog_name(g)} for g in gpus]


#: The defaults the columns of :func:`gpu_rows` may show (others are in ``--json``).
SHOWN_DEFAULTS = ("nvlink_domain", "gemm_eff", "attention", "attention_eff", "gemm_half_balance")


def _figure(gpu: GPUSpec, key: str) -> str:
    value = getattr(gpu, key)
    text = f"{value:g}" if isinstance(value, float) else str(value)
    return text + ("*" if key in gpu.defaults else "")


def _catalog_name(gpu: GPUSpec) -> str:
    from pathlib import Path

    from solver.spec.loaders import CATALOG_PATH
    if not gpu.catalog_file:
        return "-"
    return "shipped" if Path(gpu.catalog_file) == CATALOG_PATH else gpu.catalog_file


def job_line(job: JobSpec) -> str:
    """The first line of a readable plan: the job, model, cluster and batch, and the state
    types when the job departs from Megatron-LM's defaults."""
    t = job.training
    types = (", bf16 gradients" if t.grad_reduce_bf16 else "") + \
        (", FP8 weights" if t.fp8_param_gather else "") + \
        (", TE cross entropy" if t.cross_entropy is CrossEntropyKernel.TE else "")
    return (f"job {job.name}: {job.model.name} on {job.cluster.name} "
            f"({job.cluster.total_gpus} GPUs), batch {t.global_batch} x {t.seq_len} tokens"
            + types)


def job_json(job: JobSpec) -> dict[str, Any]:
    """What was planned, as the ``job`` object of ``tangram plan --json``: the job's name and
    file, the model, the cluster, the batch and the runtime, so that the plan file says what it
    is a plan of. ``n_micro`` is the job's setting (``"auto"`` or a number); the plan's own is
    ``objective.n_micro``."""
    t = job.training
    return {"name": job.name, "path": None if job.path is None else str(job.path),
            "model": job.model.name, "cluster": job.cluster.name,
            "gpus": job.cluster.total_gpus, "global_batch": t.global_batch, "seq_len": t.seq_len,
            "n_micro": "auto" if t.n_micro is None else t.n_micro,
            "framework": job.planner.framework.value, "precision": t.precision.value,
            "grad_reduce": "bf16" if t.grad_reduce_bf16 else "fp32",
            "fp8_param_gather": t.fp8_param_gather, "cross_entropy": t.cross_entropy.value}


def island_rows(islands: Sequence[Island]) -> list[dict[str, Any]]:
    """Readable table rows of islands."""
    return [{"island": i.name, "gpu": i.gpu.name, "nodes": len(i.nodes), "gpus": i.gpus,
             "TFLOP/s/gpu": i.tflops_per_gpu, "HBM GB": i.hbm_gb, "total TFLOP/s": i.total_tflops}
            for i in islands]


# Wall-clock measurements in JSON payloads: the only values that differ between two runs of the
# same input. ``--stable-json`` writes them as 0.0 so that outputs can be compared byte for byte.
WALL_CLOCK_KEYS = frozenset({"time_s", "replan_time_s", "planning_time_s", "wall_time_s"})


def without_wall_clock(payload: Any) -> Any:
    """``payload`` with every wall-clock value (keys in WALL_CLOCK_KEYS) replaced by 0.0."""
    if isinstance(payload, dict):
        return {k: (0.0 if k in WALL_CLOCK_KEYS and isinstance(v, (int, float)) else
                    without_wall_clock(v)) for k, v in payload.items()}
    if isinstance(payload, list):
        return [without_wall_clock(v) for v in payload]
    return payload


def emit_json(payload: Any, args: Any) -> None:
    """Print ``payload`` as indented JSON; ``args.stable_json`` zeroes wall-clock times."""
    import json
    import sys
    if getattr(args, "stable_json", False):
        payload = without_wall_clock(payload)
    sys.stdout.write(json.dumps(payload, indent=2) + "\n")


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


def recompute_label(c) -> str:
    """The recomputation of a stage: ``none``, ``selective``, ``full`` (every layer) or
    ``full k=5`` (the block method: the first 5 layers of each pipeline rank)."""
    if c.recompute_layers is None:
        return c.recompute.value
    return f"{c.recompute.value} k={c.recompute_layers}"


def stage_rows(plan) -> list[dict]:
    """One table row per pipeline stage of ``plan``."""
    rows = []
    moe = plan.job.model.is_moe
    for s in plan.stages:
        c = s.plan.config
        # MoE plans also show the expert tensor-parallel degree (the expert grid etp x ep) and
        # whether the all-to-alls overlap (--overlap-moe-expert-parallel-comm).
        experts = ({"ep": c.ep, "etp": c.etp, "a2a ovl": "yes" if c.a2a_overlap else "no"}
                   if moe else {"ep": c.ep})
        rows.append({"island": s.island.name, "gpu": s.island.gpu.name,
                     "nodes": compact_ids(s.node_ids), "gpus": s.gpus,
                     "layers": f"[{s.start}, {s.end})", "tp": c.tp, "cp": c.cp, **experts,
                     "pp": c.pp, "dp": c.dp, "zero": c.zero, "recompute": recompute_label(c),
                     "offload": "yes" if c.offload else "no", "mb/rank": c.micro_batch,
                     "latency ms": s.plan.latency_s * 1e3, "mem GB": s.plan.memory_gb})
    return rows


def idle_lines(idle) -> list[str]:
    """One line per reason nodes stay idle, after a blank line (nothing when none is idle)."""
    by_reason: dict[str, list[str]] = {}
    for node, why in idle:
        by_reason.setdefault(why, []).append(node)
    return [""] + [f"idle: {compact_ids(nodes)} ({len(nodes)} node{'s' * (len(nodes) > 1)}): "
                   f"{why}" for why, nodes in by_reason.items()] if by_reason else []
