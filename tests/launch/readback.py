"""Test helpers: what a plan says a runtime must run, what an export tells it to run, and plans
built by hand.

:func:`plan_truth` reads the plan object itself (stages, their configurations, the schedule);
:func:`megatron_read` parses a Megatron-LM launch the way Megatron-LM reads it (its argparse
names, ``validate_args``' split rules, the layout grammar of ``PipelineParallelLayerLayout``,
torchrun's node ranks); :func:`flagscale_read` uses FlagScale's reading
(:func:`solver.launch.flagscale_check.read_back`). The round-trip tests require the two to be
equal. Neither reader calls the exporters' code.
"""

from __future__ import annotations

import functools
import re
import shlex
from dataclasses import replace

from solver.cost.parallelizer import PartialPlan
from solver.cost.stage import substage_layers
from solver.islands import IslandSet
from solver.planner.plan import Plan, SolverInfo, StagePlan
from solver.compose.table import Position
from solver.spec.domain import Island, Recompute

#: One pipeline stage as a runtime sees it: (layers, tp, cp, ep, dp, micro-batch, recompute,
#: recomputed layers by the block method or None, expert-TP in effect).
Row = tuple


def plan_truth(plan: Plan) -> dict:
    """Per pipeline stage (sub-stages expanded) what the plan runs, and the schedule."""
    rows = []
    for s in plan.stages:
        c = s.plan.config
        k = c.recompute_layers if c.recompute is Recompute.FULL else None
        for layers in substage_layers(s.end - s.start, c.pp):
            rows.append((int(layers), c.tp, c.cp, c.ep, c.dp, c.micro_batch, c.recompute.value,
                         k, c.etp))
    zero = {s.plan.config.zero for s in plan.stages if s.plan.config.dp * s.plan.config.cp > 1}
    return {"stages": rows, "v": plan.virtual_stages, "n_micro": plan.n_micro,
            "global_batch": plan.job.training.global_batch, "zero": tuple(sorted(zero))}


def zero_read(args: dict, rows: list[Row]) -> tuple[int, ...]:
    """The ZeRO stage a launch's optimizer arguments run (Megatron-LM's names: Megatron-FSDP's
    ``use_megatron_fsdp``, else the distributed optimizer's ZeRO-1, else plain data parallel),
    for the stages with replicas to shard over (none: ``()``)."""
    if not any(r[2] * r[4] > 1 for r in rows):
        return ()
    if args.get("use_megatron_fsdp"):
        return (3,)
    return (1,) if args.get("use_distributed_optimizer") else (0,)


def megatron_flags(text: str) -> tuple[dict[str, str | bool], list[int]]:
    """The ``--flag value`` pairs of a launch script (argparse names with ``_``) and the GPUs
    of each node in node-rank order (the header's node list)."""
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    words = shlex.split(" ".join(line.rstrip("\\") for line in lines))
    script = words.index("pretrain_gpt.py")
    flags: dict[str, str | bool] = {}
    key = None
    for word in words[script + 1:]:
        if word.startswith("--"):
            key = word[2:].replace("-", "_")
            flags[key] = True
        else:
            flags[key] = word
    nodes = [int(m.group(1)) for m in re.finditer(r"node_rank \d+: \S+ nproc_per_node=(\d+)",
                                                    text)]
    return flags, nodes


def _layout(text: str, pp: int) -> list[int]:
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        text = re.sub(pattern, lambda m: m.group(1) * int(m.group(2)), text.replace(",", ""))
    stages = text.split("|")
    assert text.startswith("E") and text.endswith("L") and len(stages) % pp == 0
    v = len(stages) // pp
    return [sum(stages[c * pp + r].count("t") for c in range(v)) for r in range(pp)]


def megatron_split(flags: dict, pp: int) -> list[int]:
    """Layers per pipeline rank as Megatron-LM splits them."""
    layers = int(flags["num_layers"])
    if "pipeline_model_parallel_layout" in flags:
        return _layout(flags["pipeline_model_parallel_layout"], pp)
    first = int(flags["decoder_first_pipeline_num_layers"]) \
        if "decoder_first_pipeline_num_layers" in flags else None
    last = int(flags["decoder_last_pipeline_num_layers"]) \
        if "decoder_last_pipeline_num_layers" in flags else None
    inner = pp - (first is not None) - (last is not None)
    rest = layers - (first or 0) - (last or 0)
    assert inner == 0 or rest % inner == 0
    even = [rest // inner] * inner if inner else []
    return ([first] if first is not None else []) + even + ([last] if last is not None else [])


def megatron_read(text: str) -> dict:
    """What a Megatron-LM launch runs, in :func:`plan_truth`'s form."""
    flags, nodes = megatron_flags(text)
    i = lambda key, default=1: int(flags.get(key, default))  # noqa: E731
    tp, pp, cp, ep = (i("tensor_model_parallel_size"), i("pipeline_model_parallel_size"),
                      i("context_parallel_size"), i("expert_model_parallel_size"))
    dp = sum(nodes) // (tp * pp * cp)  # validate_args: data_parallel_size = world // (tp pp cp)
    mbs, gb = i("micro_batch_size"), i("global_batch_size")
    gran, method = flags.get("recompute_granularity"), flags.get("recompute_method")
    if gran == "full" and method == "uniform":
        assert flags["recompute_num_layers"] == "1"  # chunks of one layer: every layer
        rc, k = "full", None
    chunk = flags.get("num_layers_per_virtual_pipeline_stage")
    split = megatron_split(flags, pp)
    v = split[0] // int(chunk) if chunk else 1
    if gran == "full" and method == "uniform":
        pass
    elif gran == "full":
        assert method == "block"  # the count is per model chunk (checkpointed_forward)
        rc, k = "full", i("recompute_num_layers") * v
    else:
        rc, k = gran or "none", None
    etp = i("expert_tensor_parallel_size", tp)  # argparse default None: tp (validate_args)
    rows = [(n, tp, cp, ep, dp, mbs, rc, k, etp) for n in split]
    return {"stages": rows, "v": v, "n_micro": gb // (mbs * dp), "global_batch": gb,
            "zero": zero_read(flags, rows)}


def flagscale_read(doc: dict, hostfile: str) -> dict:
    """What a FlagScale config runs, in :func:`plan_truth`'s form."""
    from solver.launch.flagscale_check import args_of
    from solver.launch.flagscale_read import read_back
    rb = read_back(doc, hostfile)
    rows = [(s.layers, s.tp, s.cp, s.ep, s.dp, s.micro_batch, s.recompute, s.recompute_layers,
             s.expert_tp or s.tp) for s in rb.stages]
    return {"stages": rows, "v": rb.virtual_stages, "n_micro": rb.n_micro,
            "global_batch": rb.global_batch, "zero": zero_read(args_of(doc), rows)}


def build_plan(job, stages, n_micro: int, v: int = 1) -> Plan:
    """A plan of ``stages`` = ``[(island, layers, StageConfig), ...]`` in pipeline order (each
    stage on the next unused nodes of its island), for ``job``; latencies are placeholders."""
    used: dict[str, int] = {}
    out, start = [], 0
    for i, (island, layers, c) in enumerate(stages):
        per = island.gpus_per_node
        count = c.gpus // per
        first = used.get(island.name, 0)
        nodes = island.nodes[first:first + count]
        assert len(nodes) == count and c.gpus % per == 0
        used[island.name] = first + count
        pos = Position.ONLY if len(stages) == 1 else Position.FIRST if i == 0 else \
            Position.LAST if i == len(stages) - 1 else Position.MIDDLE
        partial = PartialPlan(c, 1.0, 0.3, 0.7, 0.1, 10.0, None, (c.tp, c.cp, c.dp),
                              (1.0,) * c.pp)
        out.append(StagePlan(island, start, start + layers, pos, 1, partial, tuple(nodes)))
        start += layers
    assert start == job.model.layers
    islands = tuple(dict.fromkeys(s[0] for s in stages))
    return Plan(job, IslandSet(islands, islands, ()), tuple(out), (0.0,) * (len(out) - 1),
                n_micro, False, SolverInfo("hand", True, 0.0, 0), virtual_stages=v)


def with_batch(job, model, global_batch: int):
    """``job`` with ``model`` and ``global_batch``."""
    return replace(job, model=model, training=replace(job.training, global_batch=global_batch,
                                                      n_micro=None))


def island(name: str, gpu, nodes: int, per_node: int = 8) -> Island:
    """``nodes`` nodes of ``gpu`` named ``<name>-<i>``."""
    return Island.homogeneous(name, gpu, nodes * per_node, per_node)


@functools.lru_cache(maxsize=None)
def shipped_plan(name: str) -> Plan:
    """The default plan of shipped job ``name`` (planned once per test session)."""
    from solver.planner.stages.search import plan_job
    from solver.spec.loaders import INSTANCES, load_job
    return plan_job(load_job(INSTANCES / "jobs" / f"{name}.toml"))
