"""Reading a ``tangram estimate`` CONFIG file (public format) into an :class:`EstimateSetup`.

Format (TOML)::

    model = "llama3-70b"          # catalog name, file path or inline table
    gpu = "H100-SXM-80GB"         # GPU catalog name
    gpus = 64
    gpus_per_node = 8             # optional (8)
    nic_gbits = 400               # optional (the catalog's value)
    epsilon = 0.0                 # optional: share of device memory held back beyond the
                                  #   runtime's reserves (0.0)
    framework = "megatron-core"   # optional: flagscale | megatron-core | megatron-2021 |
                                  #   deepspeed | fsdp (what runs and what overlaps)
    description = "..."           # optional

    [training]
    global_batch = 512            # sequences per iteration
    seq_len = 8192
    precision = "bf16"            # optional: bf16 | fp16 | fp8 | fp8-cs | fp8-mx (FP8 where
                                  #   the GPU has it)
    grad_reduce = "fp32"          # optional: fp32 (Megatron-LM's default) | bf16 gradient
                                  #   buffers (--grad-reduce-in-bf16)
    fp8_param_gather = false      # optional: FP8 weights as the parameters (--fp8-param-gather;
                                  #   an FP8 precision and zero >= 1)
    cross_entropy = "unfused"     # optional: unfused (Megatron-LM's default) | te (Transformer
                                  #   Engine's fused loss; megatron-core and flagscale)

    [parallel]
    tp = 8
    pp = 4
    dp = 2
    cp = 1                        # optional (1)
    ep = 1                        # optional (1); with expert_tp, up to tp*cp*dp/expert_tp
    # expert_tp = 1               # optional (tp), MoE only: expert tensor parallelism
    zero = 1                      # optional (0)
    recompute = "none"            # none | selective | full
    offload = false
    a2a_overlap = false           # optional (false), MoE: overlap the all-to-alls with another
                                  #   micro-batch's compute (--overlap-moe-expert-parallel-comm;
                                  #   megatron-core and flagscale, ep > 1, no full
                                  #   recomputation; with pp > 1 interleaved only)
    schedule = "interleaved"      # 1f1b | gpipe | interleaved
    virtual_stages = 5            # with "interleaved" (required there), or "auto" with any
                                  #   schedule: the fastest fitting v (1 = plain 1F1B)
    micro_batch = 1               # optional: sequences per micro-batch per replica (auto if absent)
    attention = "flash"           # optional: flash | unfused (Megatron-LM 2021)

``tp * pp * dp * cp`` must equal ``gpus``; every value is checked through
:class:`~solver.spec.fields.Fields` and a bad one raises :class:`~solver.spec.errors.InputError`,
as does a configuration the framework cannot run (its profile, :mod:`solver.cost.runtime.frameworks`).
"""

from __future__ import annotations

from pathlib import Path

import dataclasses

from solver.cost.efficiency import DEFAULT_CALIBRATION, AttentionKernel, Calibration
from solver.cost.estimating.estimate import EstimateSetup, chunk_options
from solver.cost.runtime.frameworks import (interleaving_allowed, loss_kernel_problem, profile,
                                            violations)
from solver.cost.stage import StageConfig
from solver.spec.domain import Framework, GPUSpec, Island, ModelSpec, Precision, Recompute, Schedule
from solver.spec.errors import InputError
from solver.spec.fields import Fields, closest, read_toml
from solver.spec.loaders import MAX_GPUS, load_catalog, load_model_ref
from solver.spec.training import read_state_types


def load_estimate_setup(path: Path | str, catalog: dict[str, GPUSpec] | None = None
                        ) -> tuple[EstimateSetup, Calibration]:
    """The setup described by the CONFIG file (with its gradient buffers and FP8 weights), and
    the calibration it runs under (its attention kernel)."""
    path = Path(path)
    catalog = catalog if catalog is not None else load_catalog()
    f = Fields(read_toml(path), str(path))
    f.get("description", str, "")
    model = load_model_ref(f.get("model", object), str(path), "model", path.parent)
    island = _island(f, catalog)
    epsilon = f.get("epsilon", float, EstimateSetup.epsilon, lo=0.0, hi=0.9)
    framework = f.get_enum("framework", Framework, Framework.MEGATRON_CORE)
    tf = f.sub("training", required=True)
    global_batch = tf.get("global_batch", int, lo=1, hi=10**7)
    seq_len = tf.get("seq_len", int, lo=1, hi=10**7)
    precision = tf.get_enum("precision", Precision, Precision.BF16)
    grads_bf16, fp8_params, loss = read_state_types(tf, precision)
    tf.done()
    pf = f.sub("parallel", required=True)
    setup, attention = _parallel(pf, model, island, global_batch, seq_len, epsilon)
    setup = dataclasses.replace(setup, framework=framework, precision=precision,
                                grad_reduce_bf16=grads_bf16, fp8_param_gather=fp8_params,
                                cross_entropy=loss)
    _check_framework(pf, setup)
    why = loss_kernel_problem(profile(framework), loss)
    tf.check("cross_entropy", why is None, why or "")
    # Megatron-LM's validate_args: --fp8-param-gather needs the distributed optimizer or an FSDP.
    tf.check("fp8_param_gather", not fp8_params or setup.parallel.zero >= 1,
             "FP8 weights (--fp8-param-gather) need the distributed optimizer or FSDP (zero >= 1)")
    pf.done()
    f.done()
    return setup, dataclasses.replace(DEFAULT_CALIBRATION, attention=attention)


def _check_framework(f: Fields, setup: EstimateSetup) -> None:
    """The configuration is one the framework runs."""
    prof = profile(setup.framework)
    # "auto" tries every v of chunk_options (plain 1F1B only where it runs).
    v = (setup.virtual_stages if setup.schedule is Schedule.INTERLEAVED
         else max(c for _, c in chunk_options(setup)) if setup.auto_virtual_stages else 1)
    found = violations([setup.parallel], prof, setup.parallel.pp > 1, model=setup.model,
                       precision=setup.precision, stage_gpus=[setup.island.gpu_types],
                       virtual_stages=v)
    if found:
        raise InputError(f.file, f.prefix, found[0].removeprefix("stage 0: "))
    # One homogeneous island is one mesh: FlagScale runs it as plain Megatron-LM, interleaved.
    f.check("schedule", interleaving_allowed(prof, meshes=1)
            or setup.schedule is not Schedule.INTERLEAVED,
            f"{setup.framework.value} has no interleaved schedule")


def _island(f: Fields, catalog: dict[str, GPUSpec]) -> Island:
    name = f.get("gpu", str)
    if name not in catalog:
        raise f.error("gpu", f"unknown GPU {name!r}{closest(name, catalog)} "
                             f"(catalog: {', '.join(sorted(catalog))})")
    gpu = catalog[name]
    gpus = f.get("gpus", int, lo=1, hi=MAX_GPUS)
    per_node = f.get("gpus_per_node", int, 8, lo=1, hi=64)
    nic = f.get("nic_gbits", float, gpu.nic_gbits, lo=0, lo_open=True, hi=1e6)
    return Island.homogeneous(f"{gpus}x{name}", gpu, gpus, per_node, nic)


def _parallel(f: Fields, model: ModelSpec, island: Island, global_batch: int, seq_len: int,
              epsilon: float) -> tuple[EstimateSetup, AttentionKernel]:
    cfg = StageConfig(
        tp=f.get("tp", int, lo=1, hi=MAX_GPUS), pp=f.get("pp", int, lo=1, hi=MAX_GPUS),
        dp=f.get("dp", int, lo=1, hi=MAX_GPUS), cp=f.get("cp", int, 1, lo=1, hi=MAX_GPUS),
        ep=f.get("ep", int, 1, lo=1, hi=MAX_GPUS), zero=f.get("zero", int, 0, lo=0, hi=3),
        recompute=f.get_enum("recompute", Recompute, Recompute.NONE),
        offload=f.get("offload", bool, False),
        micro_batch=f.get("micro_batch", int, 1, lo=1, hi=10**7),
        expert_tp=f.get("expert_tp", int, None, lo=1, hi=MAX_GPUS),
        a2a_overlap=f.get("a2a_overlap", bool, False))
    _check_total(f, cfg, island.gpus)
    auto = not f.has("micro_batch")
    schedule = f.get_enum("schedule", Schedule, Schedule.ONE_F_ONE_B)
    interleaved = schedule is Schedule.INTERLEAVED
    auto_v = f.has("virtual_stages") and f.data.get("virtual_stages") == "auto"
    if auto_v:
        f.get("virtual_stages", str)
    f.check("virtual_stages", interleaved or auto_v or not f.has("virtual_stages"),
            'virtual_stages needs schedule = "interleaved" (or the value "auto")')
    f.check("virtual_stages", not interleaved or f.has("virtual_stages"),
            'schedule = "interleaved" needs virtual_stages (model chunks per GPU, or "auto")')
    v = 2 if auto_v else f.get("virtual_stages", int, 1, lo=1, hi=4096)
    attention = f.get_enum("attention", AttentionKernel, AttentionKernel.FLASH)
    _check_shapes(f, model, cfg, seq_len)
    _check_batch(f, cfg, global_batch, auto)
    # Megatron-Core accepts uneven first/last stages (``--decoder-first/last-pipeline-num-
    # layers``), so an explicit v only needs a chunk per stage: pp * v <= layers.
    f.check("virtual_stages", auto_v or not interleaved
            or (cfg.pp > 1 and cfg.pp * v <= model.layers),
            f"interleaving needs pp > 1 and pp * virtual_stages <= layers ({model.layers}), "
            f"got pp {cfg.pp} x {v}")
    if interleaved and not auto:
        n_micro = global_batch // (cfg.dp * cfg.micro_batch)
        f.check("micro_batch", n_micro % cfg.pp == 0,
                f"the interleaved schedule needs the {n_micro} micro-batches divisible by "
                f"pp = {cfg.pp}")
    setup = EstimateSetup(model, island, global_batch, seq_len, cfg, auto, schedule, v, epsilon,
                          auto_virtual_stages=auto_v)
    return setup, attention


def _check_shapes(f: Fields, m: ModelSpec, cfg: StageConfig, seq_len: int) -> None:
    widths = [m.hidden, m.ffn] + ([m.expert_ffn] if m.is_moe else [])
    f.check("tp", m.heads % cfg.tp == 0 and all(w % cfg.tp == 0 for w in widths),
            f"tp {cfg.tp} must divide heads ({m.heads}), hidden and MLP widths")
    f.check("tp", m.kv_heads % cfg.tp == 0 or cfg.tp % m.kv_heads == 0,
            f"tp {cfg.tp} and kv_heads {m.kv_heads} must divide one another")
    f.check("pp", cfg.pp <= m.layers, f"pp {cfg.pp} exceeds the model's {m.layers} layers")
    f.check("cp", seq_len % cfg.cp == 0, f"cp {cfg.cp} must divide seq_len {seq_len}")
    if not m.is_moe:
        f.check("ep", cfg.ep == 1, "ep > 1 needs an MoE model")
        f.check("expert_tp", cfg.expert_tp is None, "expert_tp needs an MoE model")
        return
    span = cfg.tp * cfg.cp * cfg.dp
    f.check("expert_tp", span % cfg.etp == 0 and m.expert_ffn % cfg.etp == 0,
            f"expert_tp {cfg.etp} must divide tp * cp * dp ({span}) and the expert width "
            f"({m.expert_ffn})")
    f.check("ep", m.experts % cfg.ep == 0 and (span // cfg.etp) % cfg.ep == 0,
            f"ep {cfg.ep} must divide the experts ({m.experts}) and tp * cp * dp / expert_tp "
            f"({span} / {cfg.etp}; Megatron-Core's expert grid)")


def _check_batch(f: Fields, cfg: StageConfig, global_batch: int, auto: bool) -> None:
    f.check("dp", global_batch % cfg.dp == 0,
            f"dp {cfg.dp} must divide training.global_batch {global_batch}")
    per_replica = global_batch // cfg.dp
    f.check("micro_batch", auto or per_replica % cfg.micro_batch == 0,
            f"micro_batch {cfg.micro_batch} must divide global_batch / dp = {per_replica}")


def _check_total(f: Fields, cfg: StageConfig, gpus: int) -> None:
    if cfg.gpus != gpus:
        raise InputError(f.file, f.prefix,
                         f"tp * pp * dp * cp = {cfg.tp} * {cfg.pp} * {cfg.dp} * {cfg.cp} = "
                         f"{cfg.gpus} must equal gpus = {gpus}")
