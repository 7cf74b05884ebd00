"""FlagScale: the experiment YAML of a plan, and its hostfile.

Key names and semantics as FlagScale reads them (FlagOpen/FlagScale at da4935e, 2025-11-13):

* The runner (``flagscale/runner/runner_train.py``): ``_get_args_megatron`` turns
  ``train.system``, ``train.model`` and ``train.data`` into Megatron flags
  (``flagscale/runner/utils.py``, ``flatten_dict_to_args``: nested blocks only group), so the
  model block uses Megatron's names (:mod:`solver.launch.model_flags`). ``SSHTrainRunner``
  reads the hostfile named by ``experiment.runner.hostfile`` (``parse_hostfile``: lines
  ``<host> slots=<n> type=<device>``, all typed or none), gives the ``r``-th host node rank
  ``r`` and passes its ``type`` as ``--hetero-current-device-type`` (``_run_each``): the YAML's
  ``hetero_current_device_type`` is only the default for a run without a hostfile.
* Heterogeneous mode (``flagscale/train/arguments.py``, ``pre_validate_args``, and
  ``flagscale/train/hetero/parallel_context.py``): ``hetero_process_meshes`` is one flat list
  of ``[tp, cp, ep, dp, pp]`` per mesh in pipeline order; ``hetero_pipeline_layer_split`` the
  layers of every pipeline stage; ``hetero_device_types`` one per mesh.
  ``RankMapper.build_rank_mapping`` orders ranks by the index of their device type in
  ``hetero_device_types`` (its first occurrence), then by rank, and
  ``ParallelContext.build_all_process_meshes`` gives the meshes consecutive logical ranks in
  order: so the hostfile lists the meshes' nodes in mesh order, and a device type that returns
  after another one gets a label of its own (``H100-SXM-80GB-2``), else its ranks would be
  taken by the earlier mesh of that type. A mesh whose island merged GPU types of one vendor
  runs under its weakest type's label (a label, not a hardware check:
  :func:`solver.cost.runtime.runtime_rules.mixed_kinds_note`), and the YAML says so; two vendors are
  refused (:func:`~solver.cost.runtime.runtime_rules.vendor_problem`). ``micro_batch_size`` is the
  first mesh's per-rank micro-batch (mesh ``i`` runs ``dp_0 · mbs / dp_i``).
* A plan of one mesh runs without the ``hetero`` block: plain Megatron-LM, which has context
  parallelism and interleaving (``num_layers_per_virtual_pipeline_stage``; FlagScale asserts it
  is unset in hetero mode) and the same split flags as :mod:`solver.launch.megatron` -- unless
  its stages recompute differently: FlagScale parses the per-stage lists below only when
  ``hetero_process_meshes`` is set (its ``initialize.py`` patch runs ``post_validate_args``
  only then), so such a plan is written in hetero mode, as one mesh.
* Per-stage recomputation (FlagScale's Megatron-LM patch, ``_add_training_args`` and
  ``TransformerBlock.forward``; validated by ``post_validate_args``): with
  ``recompute_granularity: full``, ``recompute_granularity_per_stage_micro_batch`` /
  ``recompute_method_per_stage_micro_batch`` / ``recompute_num_layers_per_stage_micro_batch``
  hold one ``[stages, n_micro, value]`` entry per pipeline stage: granularity 1 on / 0 off,
  method 0 uniform / 1 block, the number of layers (0: none).
* ``overlap_moe_expert_parallel_comm`` (Megatron-LM's ``_add_moe_args`` at the pin) for a plan
  with the MoE all-to-all overlap, and ``CUDA_DEVICE_MAX_CONNECTIONS`` above 1 with it
  (:data:`~solver.launch.meshes.A2A_OVERLAP_NOTE`).
"""

from __future__ import annotations

from typing import Any

from solver.cost.runtime.runtime_rules import mixed_kinds_note
from solver.launch.megatron import layer_split_flags, recompute_flags
from solver.launch.meshes import (A2A_OVERLAP_NOTE, Mesh, NotExpressible, max_connections,
                                  meshes, micro_batch_size, model_flags, optimizer_flags,
                                  precision_flags, slots, vendor_check)
from solver.launch.yaml_out import dump
from solver.planner.plan import Plan
from solver.spec.domain import Framework, Recompute

__all__ = ["device_labels", "flagscale_config", "flagscale_hostfile", "flagscale_yaml",
           "flagscale_experiment", "MISSING"]

#: OmegaConf's marker of a value the user must supply (the launch stops naming the key).
MISSING = "???"


def flagscale_config(plan: Plan) -> dict[str, Any]:
    """The ``train`` document (``system``, ``model`` and ``data`` blocks) for ``plan``."""
    ms = meshes(plan)
    hetero = _hetero_mode(ms)
    _check(plan, ms, hetero)
    first = ms[0]
    system: dict[str, Any] = {
        "tensor_model_parallel_size": first.tp,
        "pipeline_model_parallel_size": sum(m.pp for m in ms),
        "context_parallel_size": first.cp,
        "expert_model_parallel_size": first.ep,
        "sequence_parallel": any(m.tp > 1 for m in ms),
        "use_flash_attn": True, "transformer_impl": "transformer_engine",
        "use_mcore_models": True,
        **optimizer_flags(plan, Framework.FLAGSCALE),
        "precision": precision_flags(plan),
    }
    if plan.job.model.is_moe and not hetero:  # the expert grid (Megatron-Core parallel_state)
        system["expert_tensor_parallel_size"] = first.expert_tp
    if first.a2a_overlap:
        system["overlap_moe_expert_parallel_comm"] = True
    recompute = _recompute(plan, ms)
    if recompute:
        system["recompute"] = recompute
    if hetero:
        system["hetero"] = _hetero(plan, ms)
    else:
        system.update(layer_split_flags(list(first.layers), plan.virtual_stages))
    model = {**model_flags(plan, [m.tp for m in ms]),
             "micro_batch_size": micro_batch_size(plan, first.dp),
             "global_batch_size": plan.job.training.global_batch,
             "train_samples": MISSING, "optimizer": {"lr": MISSING}}
    data = {"data_path": MISSING, "split": "1",
            "tokenizer": {"tokenizer_type": MISSING, "tokenizer_path": MISSING}}
    return {"system": system, "model": model, "data": data}


def flagscale_experiment(plan: Plan, hostfile: str) -> dict[str, Any]:
    """The whole FlagScale config (``experiment`` and the inline ``train`` document);
    ``hostfile``: the path the runner reads the nodes from."""
    name = plan.job.name
    return {
        "defaults": ["_self_"],
        "experiment": {
            "exp_name": name, "exp_dir": f"./outputs/{name}",
            "task": {"type": "train", "backend": "megatron",
                     "entrypoint": "./flagscale/train/train_gpt.py"},
            "runner": {"backend": "torchrun", "rdzv_backend": "static", "hostfile": hostfile},
            "envs": {"CUDA_DEVICE_MAX_CONNECTIONS": _connections(meshes(plan))},
        },
        "action": "run",
        "hydra": {"run": {"dir": "${experiment.exp_dir}/hydra"}},
        "train": flagscale_config(plan),
    }


def _connections(ms: list[Mesh]) -> int:
    """``CUDA_DEVICE_MAX_CONNECTIONS``: 1, which Megatron-LM asserts with TP or CP on Hopper
    (``validate_args``), unless the meshes overlap the MoE all-to-alls
    (:func:`~solver.launch.meshes.max_connections`)."""
    return max_connections(ms) if any(m.a2a_overlap for m in ms) else 1


def flagscale_yaml(plan: Plan, hostfile: str | None = None) -> str:
    """:func:`flagscale_experiment` as YAML text. Without ``hostfile`` (printing to stdout)
    the runner is pointed at ``<job>.hostfile`` and the hostfile's lines follow as comments."""
    ms = meshes(plan)
    name = hostfile or f"{plan.job.name}.hostfile"
    head = [f"# FlagScale config written by tangram for job {plan.job.name}: {len(ms)} "
            f"mesh{'es' if len(ms) > 1 else ''}, {sum(m.gpus for m in ms)} GPUs, "
            f"{plan.tokens_per_s:,.0f} tokens/s planned.",
            f"# Nodes: {name} (one line per node in rank order; replace the node ids by host "
            "names). Values ??? are yours to set.",
            "# Run: python run.py --config-path <dir> --config-name <this file's name> "
            "action=run"]
    if any(m.a2a_overlap for m in ms):
        head.append(f"# {A2A_OVERLAP_NOTE} {_connections(ms)} (envs below).")
    for i, m in enumerate(ms):  # a mesh of several GPU types runs as its weakest (said here)
        note = mixed_kinds_note({n.gpu for n in m.nodes})
        if note:
            head.append(f"# mesh {i} {note}.")
    if hostfile is None:
        head += [f"# {name}:"] + [f"#   {line}" for line in
                                    flagscale_hostfile(plan).splitlines() if line]
    return "\n".join(head) + "\n" + dump(flagscale_experiment(plan, name))


def device_labels(ms: list[Mesh]) -> list[str]:
    """The device type of every mesh: its GPU type, with ``-2``, ``-3``... on a run of meshes
    of a type that returns after another type (FlagScale's rank mapper orders ranks by a
    type's first place in ``hetero_device_types``, so a returning type needs its own name)."""
    out: list[str] = []
    runs: dict[str, int] = {}
    for i, m in enumerate(ms):
        if i and ms[i - 1].device == m.device:
            out.append(out[-1])
            continue
        runs[m.device] = runs.get(m.device, 0) + 1
        out.append(m.device if runs[m.device] == 1 else f"{m.device}-{runs[m.device]}")
    return out


def flagscale_hostfile(plan: Plan) -> str:
    """The hostfile: one line per node in rank order, ``<node> slots=<GPUs> type=<device>``
    (hetero mode: the mesh's device type; one plain mesh: each node's own GPU type, which only
    selects ``device_type_specific`` settings)."""
    ms = meshes(plan)
    hetero = _hetero_mode(ms)
    lines = [f"# hostfile for job {plan.job.name}: nodes in rank order, mesh by mesh"]
    for m, label in zip(ms, device_labels(ms)):
        per = slots(m)
        lines += [f"{n.node_id} slots={per} type={label if hetero else n.gpu.name}"
                  for n in m.nodes]
    return "\n".join(lines) + "\n"


def _hetero_mode(ms: list[Mesh]) -> bool:
    """Hetero mode for several meshes, or one whose stages recompute differently (FlagScale
    reads per-stage recomputation only with ``hetero_process_meshes``)."""
    return len(ms) > 1 or len(set(_stage_recompute(ms))) > 1


def _stage_recompute(ms: list[Mesh]) -> list[tuple[Recompute, int | None]]:
    return [(r, k) for m in ms for r, k in zip(m.recompute, m.recompute_layers or
                                                (None,) * m.pp)]


def _check(plan: Plan, ms: list[Mesh], hetero: bool) -> None:
    vendor_check(plan)
    if not hetero:
        return
    if any(m.a2a_overlap for m in ms):
        raise NotExpressible("the MoE all-to-all overlap with pipeline stages needs virtual "
                             "ones, which hetero mode rejects (pre_validate_args)")
    if len(ms) == 1 and (plan.virtual_stages > 1 or ms[0].cp > 1):
        raise NotExpressible("the stages recompute differently, which FlagScale reads only in "
                             "hetero mode (initialize.py patch: post_validate_args runs with "
                             "hetero_process_meshes), and hetero mode has no interleaving or "
                             "context parallelism")
    if plan.virtual_stages > 1:
        raise NotExpressible("FlagScale rejects virtual pipeline stages with hetero meshes "
                             "(flagscale/train/arguments.py, pre_validate_args)")
    if any(m.cp > 1 for m in ms):
        raise NotExpressible("FlagScale's hetero mode asserts context parallelism is 1 "
                             "(flagscale/train/hetero/parallel_context.py, ParallelContext)")
    a, b = ms[0], ms[-1]
    if plan.job.model.tied_embeddings and a.tp != b.tp:
        raise NotExpressible(f"a tied embedding needs the first and last meshes to share tp "
                             f"({a.tp} vs {b.tp}; pre_validate_args)")
    if plan.job.model.tied_embeddings and a.dp % b.dp and b.dp % a.dp and \
            optimizer_flags(plan, Framework.FLAGSCALE)["use_distributed_optimizer"]:
        raise NotExpressible(f"a tied embedding under the distributed optimizer needs the "
                             f"first and last meshes' dp to divide one another ({a.dp} vs "
                             f"{b.dp}; pre_validate_args)")
    mbs = micro_batch_size(plan, ms[0].dp)
    bad = [m.dp for m in ms if (ms[0].dp * mbs) % m.dp]
    if bad:
        raise NotExpressible(f"FlagScale needs dp_0 x micro_batch_size ({ms[0].dp} x {mbs}) "
                             f"divisible by every mesh's dp (not {bad})")


def _hetero(plan: Plan, ms: list[Mesh]) -> dict[str, Any]:
    labels = device_labels(ms)
    out: dict[str, Any] = {
        "enable_hetero": True,
        "hetero_process_meshes": [x for m in ms for x in (m.tp, m.cp, m.ep, m.dp, m.pp)],
        "hetero_pipeline_layer_split": [x for m in ms for x in m.layers],
        "hetero_device_types": labels,
        "hetero_current_device_type": labels[0],
        "standalone_embedding_stage": False,
    }
    if plan.job.model.tied_embeddings and ms[0].dp != ms[-1].dp:
        out["use_partial_reduce_for_shared_embedding"] = True
    if plan.job.model.is_moe:  # ParallelContext.build_all_process_meshes reads it per mesh
        out["expert_tensor_parallel_size_per_process_mesh"] = [m.expert_tp for m in ms]
    return out


def _recompute(plan: Plan, ms: list[Mesh]) -> dict[str, Any]:
    """One setting when every stage recomputes alike; else FlagScale's per-stage lists (full
    granularity only)."""
    stages = _stage_recompute(ms)
    if len(set(stages)) == 1:
        return recompute_flags(*stages[0], plan.virtual_stages)
    if any(r is Recompute.SELECTIVE for r, _ in stages):
        raise NotExpressible("FlagScale's per-stage recomputation is full or none "
                             "(selective recomputation only for every stage)")
    n = plan.n_micro

    def entry(value: int) -> list[int]:
        return [1, n, value]

    on = [r is Recompute.FULL for r, _ in stages]
    return {"recompute_granularity": "full", "recompute_method": "uniform",
            "recompute_num_layers": 1,
            "recompute_granularity_per_stage_micro_batch": [entry(int(x)) for x in on],
            "recompute_method_per_stage_micro_batch": [
                entry(int(o and k is not None)) for o, (_, k) in zip(on, stages)],
            "recompute_num_layers_per_stage_micro_batch": [
                entry(0 if not o else 1 if k is None else k) for o, (_, k) in zip(on, stages)]}
