"""A judge of FlagScale exports, written from FlagScale's and Megatron's own validation.

:func:`problems` reads a FlagScale experiment config (the parsed YAML) and its hostfile the way
FlagScale does and returns every rule they break, each rule naming where FlagScale (FlagOpen/
FlagScale at da4935e) or the Megatron-LM it runs (``core_v0.14.0``; FlagScale pins a
0.15.0rc5 with the same checks) enforces it. It shares no code with the exporter
(:mod:`solver.launch.flagscale`): the CLI runs it on every FlagScale export, and the tests run
it on every shipped job's plan. :mod:`solver.launch.flagscale_read` rebuilds what the config
tells the runtime to run, for the round-trip tests.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

__all__ = ["Host", "args_of", "meshes_of", "parse_hostfile", "problems", "stage_split"]

# flagscale/runner/utils.py, parse_hostfile: "worker0 slots=8 type=A100".
_HOST = re.compile(r"^(\S+)\s+slots=(\d+)(?:\s+type=(\S+))?")


@dataclass(frozen=True)
class Host:
    """One hostfile line: host, slots (GPUs it runs) and device type (None: untyped)."""

    host: str
    slots: int
    type: str | None


def parse_hostfile(text: str) -> tuple[list[Host], list[str]]:
    """The hosts of a hostfile and the problems FlagScale's ``parse_hostfile`` raises on."""
    hosts: list[Host] = []
    bad: list[str] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _HOST.search(line)
        if not match:
            bad.append(f"hostfile: invalid entry {line!r} (runner/utils.py parse_hostfile)")
            continue
        host = Host(match.group(1), int(match.group(2)), match.group(3))
        if any(h.host == host.host for h in hosts):
            bad.append(f"hostfile: host {host.host} listed twice (parse_hostfile)")
        hosts.append(host)
    if not hosts:
        bad.append("hostfile: no host (parse_hostfile)")
    if len({h.type is None for h in hosts}) > 1:
        bad.append("hostfile: some hosts typed, some not (parse_hostfile asserts all or none)")
    return hosts, bad


def _flat(block: Any) -> dict[str, Any]:
    """A block's keys as the runner passes them: nested blocks only group
    (runner/utils.py flatten_dict_to_args)."""
    out: dict[str, Any] = {}
    for key, value in (block or {}).items():
        if isinstance(value, dict):
            out.update(_flat(value))
        else:
            out[key] = value
    return out


def args_of(doc: dict[str, Any]) -> dict[str, Any]:
    """The Megatron arguments of a config: ``train.system``, ``model`` and ``data`` flattened
    (runner/runner_train.py ``_get_args_megatron``); False flags are not passed."""
    train = doc.get("train") or {}
    args: dict[str, Any] = {}
    for block in ("system", "model", "data"):
        args.update(_flat(train.get(block)))
    return {k: v for k, v in args.items() if v is not False}


def meshes_of(args: dict[str, Any]) -> list[list[int]]:
    flat = list(args.get("hetero_process_meshes") or [])
    return [flat[i:i + 5] for i in range(0, len(flat) - len(flat) % 5, 5)]


def problems(doc: dict[str, Any], hostfile: str | None) -> list[str]:
    """Every FlagScale/Megatron rule the config ``doc`` (with ``hostfile``'s text) breaks."""
    out: list[str] = []
    train = doc.get("train") or {}
    for block in ("system", "model", "data"):
        if not isinstance(train.get(block), dict):
            out.append(f"train.{block} missing (runner_train.py _get_args_megatron reads it)")
    if out:
        return out
    args = args_of(doc)
    hosts: list[Host] = []
    if hostfile is not None:
        hosts, bad = parse_hostfile(hostfile)
        out += bad
    hetero = bool(args.get("enable_hetero"))
    out += _hetero_rules(args, hosts) if hetero else _plain_rules(args, hosts)
    out += _model_rules(args, hetero)
    out += _expert_grid_rules(args, hosts, hetero)
    out += _batch_rules(args, hosts, hetero)
    out += _recompute_rules(args)
    out += _a2a_overlap_rules(args, hetero)
    return out


def _a2a_overlap_rules(args: dict[str, Any], hetero: bool) -> list[str]:
    """Megatron-Core's ``TransformerConfig.__post_init__`` checks of
    ``overlap_moe_expert_parallel_comm`` (core_v0.15.0), restated."""
    if not args.get("overlap_moe_expert_parallel_comm"):
        return []
    out = []
    if int(args.get("expert_model_parallel_size", 1)) <= 1 and not hetero:
        out.append("overlap_moe_expert_parallel_comm needs expert_model_parallel_size > 1")
    if args.get("moe_token_dispatcher_type") not in ("alltoall", "flex"):
        out.append("overlap_moe_expert_parallel_comm needs the alltoall or flex dispatcher")
    if args.get("recompute_granularity") == "full" or args.get("recompute_method"):
        out.append("overlap_moe_expert_parallel_comm runs without full recomputation and "
                   "without a recomputation method")
    if int(args.get("pipeline_model_parallel_size", 1)) > 1 and \
            not args.get("num_layers_per_virtual_pipeline_stage"):
        out.append("overlap_moe_expert_parallel_comm with pipeline stages needs virtual ones")
    return out


def _batch_rules(args: dict[str, Any], hosts: list[Host], hetero: bool) -> list[str]:
    """``num_layers`` is required (Megatron's ``_add_network_size_args`` / ``validate_args``),
    and the batch splits into whole micro-batches per data-parallel rank
    (``megatron/core/num_microbatches_calculator.py``,
    ``ConstantNumMicroBatchesCalculator``: global batch divisible by micro batch x dp; in hetero
    mode the first mesh's dp sets the count, pre_validate_args)."""
    out: list[str] = []
    if args.get("num_layers") is None:
        out.append("num_layers missing (validate_args requires it)")
    gb, mbs = args.get("global_batch_size"), args.get("micro_batch_size")
    if gb is None or mbs is None:  # validate_args fills the global batch as mbs x dp
        return out
    if hetero:
        ms = meshes_of(args)
        dp = ms[0][3] if ms else 0
    elif hosts:
        tp, pp, cp = (int(args.get(k, 1)) for k in ("tensor_model_parallel_size",
                                                    "pipeline_model_parallel_size",
                                                    "context_parallel_size"))
        dp = sum(h.slots for h in hosts) // (tp * pp * cp)
    else:
        return out
    if dp and int(gb) % (int(mbs) * dp):
        out.append(f"global_batch_size {gb} not divisible by micro_batch_size x dp "
                   f"({mbs} x {dp}; ConstantNumMicroBatchesCalculator)")
    return out


def _hetero_rules(args: dict[str, Any], hosts: list[Host]) -> list[str]:
    """flagscale/train/arguments.py FSTrainArguments.pre_validate_args, and
    flagscale/train/hetero/parallel_context.py (ParallelContext, RankMapper)."""
    out: list[str] = []
    flat = args.get("hetero_process_meshes") or []
    if len(flat) % 5:
        out.append("hetero_process_meshes length is not a multiple of 5 (pre_validate_args)")
    ms = meshes_of(args)
    if not ms:
        return out + ["hetero_process_meshes empty (pre_validate_args)"]
    dp0, mbs = ms[0][3], int(args.get("micro_batch_size", 0))
    if any((dp0 * mbs) % m[3] for m in ms):
        out.append(f"dp_0 x micro_batch_size {dp0 * mbs} not divisible by every mesh's dp "
                   "(pre_validate_args)")
    if len({m[1] for m in ms}) > 1 or ms[0][1] != 1 or args.get("context_parallel_size", 1) != 1:
        out.append("hetero mode needs cp = 1 in every mesh (pre_validate_args: all cp equal; "
                   "parallel_context.py ParallelContext.__init__: context_parallel_size == 1)")
    pp = int(args.get("pipeline_model_parallel_size", 1))
    if pp != sum(m[4] for m in ms):
        out.append(f"pipeline_model_parallel_size {pp} != sum of mesh pp (pre_validate_args)")
    if args.get("standalone_embedding_stage"):
        out.append("standalone_embedding_stage must be false (pre_validate_args)")
    out += _tied_rules(args, ms)
    for key in ("num_layers_per_virtual_pipeline_stage", "num_virtual_stages_per_pipeline_rank",
                "pipeline_model_parallel_layout"):
        if args.get(key) is not None:
            out.append(f"{key} with hetero on (pre_validate_args: 'virtual pipeline not "
                       "support now'; FlagScale's validate_args patch asserts enable_hetero "
                       "is False with virtual stages)")
    split = list(args.get("hetero_pipeline_layer_split") or [])
    if split and (sum(split) != args.get("num_layers") or len(split) != pp):
        out.append(f"hetero_pipeline_layer_split {split} must have pp entries summing to "
                   "num_layers (pre_validate_args)")
    types = list(args.get("hetero_device_types") or [])
    if len(types) != len(ms):
        out.append("hetero_device_types needs one entry per mesh (pre_validate_args)")
    if args.get("hetero_current_device_type") not in types:
        out.append("hetero_current_device_type not in hetero_device_types (pre_validate_args)")
    if hosts:
        out += _rank_rules(ms, types, hosts)
    return out


def _tied_rules(args: dict[str, Any], ms: list[list[int]]) -> list[str]:
    """A tied embedding across meshes (pre_validate_args): first and last tp equal; under the
    distributed optimizer, dp's that divide one another and the partial reduce."""
    if args.get("untie_embeddings_and_output_weights"):
        return []
    out = []
    if ms[0][0] != ms[-1][0]:
        out.append("tied embeddings need the first and last meshes' tp equal (pre_validate_args)")
    a, b = ms[0][3], ms[-1][3]
    if a != b and args.get("use_distributed_optimizer"):
        if a % b and b % a:
            out.append("tied embeddings: first and last dp must divide one another "
                       "(pre_validate_args)")
        if not args.get("use_partial_reduce_for_shared_embedding"):
            out.append("tied embeddings with different first/last dp need "
                       "use_partial_reduce_for_shared_embedding (pre_validate_args)")
    return out


def _rank_rules(ms: list[list[int]], types: list[str], hosts: list[Host]) -> list[str]:
    """World size and the device of every rank: torchrun's static rendezvous numbers ranks host
    by host in hostfile order (runner_train.py run: node_rank = hostfile position);
    RankMapper.build_rank_mapping sorts ranks by their type's first index in
    hetero_device_types, then rank; build_all_process_meshes gives meshes consecutive
    logical ranks and raises on a world-size mismatch."""
    world = sum(h.slots for h in hosts)
    need = sum(m[0] * m[1] * m[3] * m[4] for m in ms)
    if world != need:
        return [f"world size {world} (hostfile slots) != meshes' {need} "
                "(parallel_context.py build_all_process_meshes)"]
    if any(h.type not in types for h in hosts):
        return ["a host's type is not in hetero_device_types (RankMapper: types.index fails)"]
    ranks = [h.type for h in hosts for _ in range(h.slots)]
    logical = sorted(range(world), key=lambda r: (types.index(ranks[r]), r))
    out, start = [], 0
    for i, m in enumerate(ms):
        size = m[0] * m[1] * m[3] * m[4]
        got = {ranks[r] for r in logical[start:start + size]}
        if got != {types[i]}:
            out.append(f"mesh {i} ({types[i]}) gets ranks of {sorted(got)} (RankMapper order "
                       "of the hostfile)")
        start += size
    return out


def _plain_rules(args: dict[str, Any], hosts: list[Host]) -> list[str]:
    """Megatron-LM's validate_args and TransformerConfig.__post_init__ (one mesh)."""
    out: list[str] = []
    tp, pp = int(args.get("tensor_model_parallel_size", 1)), int(args.get(
        "pipeline_model_parallel_size", 1))
    cp, layers = int(args.get("context_parallel_size", 1)), int(args.get("num_layers", 0))
    if hosts:
        world = sum(h.slots for h in hosts)
        if world % (tp * pp * cp):
            out.append(f"world size {world} not divisible by tp x pp x cp (validate_args)")
    vpp = args.get("num_layers_per_virtual_pipeline_stage")
    first = args.get("decoder_first_pipeline_num_layers")
    last = args.get("decoder_last_pipeline_num_layers")
    layout = args.get("pipeline_model_parallel_layout")
    if vpp is not None and (first is not None or last is not None):
        out.append("virtual stages with first/last stage flags (validate_args)")
    if vpp is not None and (layers % pp or (layers // pp) % int(vpp)):
        out.append("num_layers / pp not divisible by layers per virtual stage (validate_args)")
    if layout is not None and (first is not None or last is not None or vpp is not None):
        out.append("pipeline_model_parallel_layout with other split flags (validate_args, "
                   "TransformerConfig.__post_init__)")
    try:
        per_stage = stage_split(args, pp)
        if sum(per_stage) != layers or min(per_stage) < 0:
            out.append(f"layer split {per_stage} does not cover {layers} layers "
                       "(TransformerConfig.__post_init__ / validate_layer_layout)")
    except ValueError as exc:
        out.append(str(exc))
    return out


def stage_split(args: dict[str, Any], pp: int) -> list[int]:
    """Per-stage decoder layers of a one-mesh config, as Megatron splits them."""
    layers = int(args.get("num_layers", 0))
    layout = args.get("pipeline_model_parallel_layout")
    if layout is not None:
        return _layout_layers(str(layout), pp)
    first = args.get("decoder_first_pipeline_num_layers")
    last = args.get("decoder_last_pipeline_num_layers")
    inner = pp - (first is not None) - (last is not None)
    rest = layers - (first or 0) - (last or 0)
    if inner and rest % inner:
        raise ValueError(f"middle stages cannot split {rest} layers evenly "
                         "(TransformerConfig.__post_init__)")
    even = [rest // inner] * inner if inner else []
    return ([int(first)] if first is not None else []) + even + \
        ([int(last)] if last is not None else [])


def _layout_layers(layout: str, pp: int) -> list[int]:
    """Decoder layers per pipeline rank of a layout string (PipelineParallelLayerLayout.
    parse_str_to_list: commas cosmetic, ``(..)*n`` and ``x*n`` unrolled, ``|`` splits)."""
    text = layout.replace(",", "")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        text = re.sub(pattern, lambda m: m.group(1) * int(m.group(2)), text)
    stages = text.split("|")
    if any(set(s) - set("ELtm") for s in stages):
        raise ValueError(f"layout {layout!r} has characters other than E, L, t, m")
    if len(stages) % pp:
        raise ValueError(f"layout of {len(stages)} stages for pp {pp} (validate_args)")
    flat = "".join(stages)
    if not flat.startswith("E") or not flat.endswith("L") or flat.count("E") != 1 \
            or flat.count("L") != 1:
        raise ValueError("layout must open with E and close with L once each "
                         "(validate_layer_layout)")
    v = len(stages) // pp
    return [sum(stages[c * pp + r].count("t") for c in range(v)) for r in range(pp)]


def _model_rules(args: dict[str, Any], hetero: bool) -> list[str]:
    """Megatron-Core TransformerConfig.__post_init__ and the vocab-parallel embedding, for the
    TP of every mesh; the micro-batch calculator for the batch."""
    out: list[str] = []
    tps = [m[0] for m in meshes_of(args)] if hetero else [int(args.get(
        "tensor_model_parallel_size", 1))]
    eps = [m[2] for m in meshes_of(args)] if hetero else [int(args.get(
        "expert_model_parallel_size", 1))]
    heads = int(args.get("num_attention_heads", 1))
    groups = int(args.get("num_query_groups", heads)) if args.get("group_query_attention") \
        else heads
    vocab = args.get("padded_vocab_size")
    for tp in tps:
        if heads % tp or groups % tp:
            out.append(f"tp {tp} must divide the {heads} heads and {groups} query groups "
                       "(TransformerConfig.__post_init__)")
        if vocab is not None and int(vocab) % tp:
            out.append(f"padded_vocab_size {vocab} not divisible by tp {tp} "
                       "(VocabUtility.vocab_range_from_global_vocab_size)")
    experts = args.get("num_experts")
    if experts is not None and any(int(experts) % ep for ep in eps):
        out.append("num_experts not divisible by expert_model_parallel_size (moe_layer.py)")
    if experts is None and any(ep > 1 for ep in eps):
        out.append("expert parallelism without experts (TransformerConfig.__post_init__)")
    if experts is not None and "disable_bias_linear" not in args:
        out.append("MoE with linear biases (TransformerConfig: 'Bias is not supported for MoE')")
    return out


def _expert_grid_rules(args: dict[str, Any], hosts: list[Host], hetero: bool) -> list[str]:
    """The expert grid of every mesh: Megatron-Core's ``initialize_model_parallel``
    (``megatron/core/parallel_state.py``) raises unless expert-TP x EP x PP divides the mesh's
    GPUs (FlagScale's ``ParallelContext.build_all_process_meshes`` builds one grid per mesh with
    ``expert_tensor_parallel_size_per_process_mesh``, whose length ``pre_validate_args``
    checks against the meshes)."""
    out: list[str] = []
    if hetero:
        ms = meshes_of(args)
        etps = args.get("expert_tensor_parallel_size_per_process_mesh")
        if etps is not None and len(etps) != len(ms):
            return [f"expert_tensor_parallel_size_per_process_mesh has {len(etps)} entries for "
                    f"{len(ms)} meshes (pre_validate_args)"]
        grids = [(tp * cp * dp, int(e) if e else tp, ep)
                 for (tp, cp, ep, dp, _), e in zip(ms, etps or [None] * len(ms))]
    else:
        tp = int(args.get("tensor_model_parallel_size", 1))
        pp = int(args.get("pipeline_model_parallel_size", 1))
        world = sum(h.slots for h in hosts)
        if not world:  # no hostfile: the GPUs per pipeline rank are unknown
            return out
        etp = args.get("expert_tensor_parallel_size")
        grids = [(world // pp, int(etp) if etp else tp, int(args.get(
            "expert_model_parallel_size", 1)))]
    for span, etp, ep in grids:
        if span % (etp * ep):
            out.append(f"expert-tp {etp} x ep {ep} does not divide the {span} GPUs per pipeline "
                       "rank (parallel_state.initialize_model_parallel)")
    return out


def _recompute_rules(args: dict[str, Any]) -> list[str]:
    """Megatron's TransformerConfig recompute checks and FlagScale's post_validate_args for the
    per-stage lists."""
    out: list[str] = []
    gran, method = args.get("recompute_granularity"), args.get("recompute_method")
    if gran == "full" and (method not in ("uniform", "block")
                           or args.get("recompute_num_layers") is None):
        out.append("full recomputation needs a method and recompute_num_layers "
                   "(TransformerConfig.__post_init__)")
    if gran == "selective" and method is not None:
        out.append("selective recomputation takes no method (validate_args)")
    keys = [k for k in args if k.endswith("_per_stage_micro_batch")]
    if keys and not args.get("hetero_process_meshes"):
        out.append("per-stage recomputation lists are parsed only with hetero_process_meshes "
                   "(FlagScale's initialize.py patch runs post_validate_args only then)")
    if keys and (gran != "full" or method is None):
        out.append("per-stage recomputation needs recompute_granularity full and a method "
                   "(post_validate_args)")
    return out
