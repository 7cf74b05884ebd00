"""Reading a FlagScale config back: what it tells FlagScale to run, stage by stage.

The round-trip tests compare this with the plan the config was exported from. The reading is
FlagScale's (FlagOpen/FlagScale at da4935e): the runner's flattening of ``train`` into Megatron
flags (:func:`solver.launch.flagscale_check.args_of`), ``pre_validate_args`` for the meshes
(mesh ``i`` runs ``dp_0 · micro_batch_size / dp_i`` sequences per rank), Megatron's split
flags for one mesh (:func:`~solver.launch.flagscale_check.stage_split`, with Megatron's
``data_parallel_size = world / (tp pp cp)``), and ``post_validate_args`` for the per-stage
recomputation lists (``[stages, n0, v0, n1, v1, ...]``).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any

from solver.launch.flagscale_check import args_of, meshes_of, parse_hostfile, stage_split

__all__ = ["ReadBack", "Stage", "read_back"]


@dataclass(frozen=True)
class Stage:
    """One pipeline stage as the config runs it.

    Attributes
    ----------
    layers : int
        Decoder layers.
    tp, cp, ep, dp : int
        Its mesh's layout.
    micro_batch : int
        Sequences per data-parallel rank per micro-batch.
    recompute : str
        ``none``, ``selective`` or ``full``.
    recompute_layers : int | None
        With ``full``: layers recomputed by the block method (None: all, the uniform method).
    device : str | None
        Its mesh's device type (hetero mode).
    expert_tp : int | None
        Its mesh's expert tensor-parallel degree (None: not set, equal to tp).
    """

    layers: int
    tp: int
    cp: int
    ep: int
    dp: int
    micro_batch: int
    recompute: str
    recompute_layers: int | None
    device: str | None
    expert_tp: int | None = None


@dataclass(frozen=True)
class ReadBack:
    """What a FlagScale config runs: stages, interleaving, the batch and whether the MoE
    all-to-alls overlap (``overlap_moe_expert_parallel_comm``)."""

    stages: tuple[Stage, ...]
    virtual_stages: int
    n_micro: int
    global_batch: int
    hetero: bool
    a2a_overlap: bool = False


def _stage_values(args: dict[str, Any], key: str, stages: int, n: int) -> list[int] | None:
    """One value per stage of a ``*_per_stage_micro_batch`` list: entries ``[count, n0, v0,
    n1, v1, ...]`` repeat for ``count`` stages; the n's sum to the micro-batches; the same
    value for every micro-batch is required here (what an export writes)."""
    raw = args.get(key)
    if raw is None:
        return None
    out: list[int] = []
    for entry in raw:
        entry = ast.literal_eval(entry) if isinstance(entry, str) else entry
        counts, values = entry[1::2], entry[2::2]
        if sum(counts) != n or len(set(values)) != 1:
            raise ValueError(f"{key} entry {entry}: micro-batch counts must sum to {n} "
                             "(post_validate_args)")
        out += [values[0]] * entry[0]
    if len(out) != stages:
        raise ValueError(f"{key} covers {len(out)} stages, not {stages} (post_validate_args)")
    return out


def read_back(doc: dict[str, Any], hostfile: str) -> ReadBack:
    """What the config runs with the nodes of ``hostfile`` (raises ValueError where it cannot
    be read)."""
    args = args_of(doc)
    world = sum(h.slots for h in parse_hostfile(hostfile)[0])
    gb, mbs = int(args["global_batch_size"]), int(args["micro_batch_size"])
    hetero = bool(args.get("enable_hetero"))
    if hetero:
        ms, types = meshes_of(args), list(args["hetero_device_types"])
        etps = args.get("expert_tensor_parallel_size_per_process_mesh") or [None] * len(ms)
        layouts = [(m + [e], t) for m, t, e in zip(ms, types, etps) for _ in range(m[4])]
        split = list(args["hetero_pipeline_layer_split"])
        v = 1
    else:
        tp, pp = int(args.get("tensor_model_parallel_size", 1)), int(args.get(
            "pipeline_model_parallel_size", 1))
        cp, ep = int(args.get("context_parallel_size", 1)), int(args.get(
            "expert_model_parallel_size", 1))
        split = stage_split(args, pp)
        layouts = [([tp, cp, ep, 0, 1, args.get("expert_tensor_parallel_size")], None)] * pp
        chunk = args.get("num_layers_per_virtual_pipeline_stage")
        v = split[0] // int(chunk) if chunk else 1
    # One mesh: Megatron's dp is what the world leaves (validate_args: world // (tp pp cp)).
    dp0 = layouts[0][0][3] or world // (layouts[0][0][0] * layouts[0][0][1] * len(split))
    n = gb // (mbs * dp0)
    rc = _recompute_of(args, len(split), n, v)
    stages = []
    for (m, dev), layers, (kind, k) in zip(layouts, split, rc):
        dp = m[3] or dp0
        stages.append(Stage(layers, m[0], m[1], m[2], dp, dp0 * mbs // dp, kind, k, dev,
                            None if m[5] is None else int(m[5])))
    return ReadBack(tuple(stages), v, n, gb, hetero,
                    bool(args.get("overlap_moe_expert_parallel_comm")))


def _recompute_of(args: dict[str, Any], stages: int, n: int,
                  v: int = 1) -> list[tuple[str, int | None]]:
    """Per stage (kind, layers recomputed per rank); Megatron's block count is per model chunk,
    so a rank of ``v`` chunks recomputes ``v`` times it."""
    gran = args.get("recompute_granularity")
    if gran is None:
        return [("none", None)] * stages
    if gran == "selective":
        return [("selective", None)] * stages
    on = _stage_values(args, "recompute_granularity_per_stage_micro_batch", stages, n)
    method = _stage_values(args, "recompute_method_per_stage_micro_batch", stages, n)
    count = _stage_values(args, "recompute_num_layers_per_stage_micro_batch", stages, n)
    base_block = args.get("recompute_method") == "block"
    k = int(args.get("recompute_num_layers", 1))
    out = []
    for i in range(stages):
        block = bool(method[i]) if method else base_block
        layers = count[i] if count else k
        full = (on[i] if on else 1) and layers != 0
        if not full:
            out.append(("none", None))
        elif block:
            out.append(("full", layers * v))
        elif layers != 1:
            raise ValueError(f"uniform recomputation in chunks of {layers} layers is not a "
                             "plan's choice")
        else:
            out.append(("full", None))
    return out
