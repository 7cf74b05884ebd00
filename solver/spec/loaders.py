"""Loading the instance files (public formats) into validated domain objects.

Formats: GPU catalog ``instances/gpus.toml``, models ``instances/models/<name>.toml`` (or a
HuggingFace ``config.json``), clusters ``instances/clusters/<name>.toml`` and jobs
``instances/jobs/<name>.toml``. Every value is checked here, through :class:`~solver.spec.fields.Fields`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from solver.spec.domain import (
    ClusterSpec,
    Constraints,
    FeaturePreset,
    Framework,
    GPUSpec,
    JobSpec,
    ModelSpec,
    NodeGroup,
    Precision,
    PlannerOptions,
    Pruning,
    Recompute,
    Schedule,
    SolverKind,
    TrainingSpec,
)
from solver.spec.errors import InputError
from solver.spec.fields import Fields, closest, read_json, read_toml
from solver.spec.hfconfig import model_from_hf_config
from solver.spec.model import check_model

INSTANCES = Path(__file__).resolve().parents[2] / "instances"
CATALOG_PATH = INSTANCES / "gpus.toml"
MAX_GPUS = 1_000_000
MAX_LAYERS = 4096
#: Runtimes the planner makes plans for: FlagScale (each pipeline stage, a mesh, may have its own
#: layout) and Megatron-Core (one mesh: one layout, Megatron's layer split; what Megatron-LM's
#: arguments express). The others are priced by `tangram estimate` only.
PLANNED_FRAMEWORKS = (Framework.FLAGSCALE, Framework.MEGATRON_CORE)


def load_catalog(path: Path | str | None = None) -> dict[str, GPUSpec]:
    """Read the GPU catalog; every table is one GPU type.

    Without ``path``, the file named by the environment variable ``TANGRAM_CATALOG`` is read if
    set (a site's own catalog), else ``instances/gpus.toml``.
    """
    path = Path(path or os.environ.get("TANGRAM_CATALOG") or CATALOG_PATH)
    data = read_toml(path)
    if not data:
        raise InputError(str(path), "<file>", "catalog defines no GPU")
    return {name: _gpu(Fields(table, str(path), name), name) for name, table in data.items()}


def _gpu(f: Fields, name: str) -> GPUSpec:
    spec = GPUSpec(
        name=name,
        bf16_tflops=f.get("bf16_tflops", float, lo=0, lo_open=True, hi=1e5),
        hbm_gb=f.get("hbm_gb", float, lo=0, lo_open=True, hi=1e5),
        hbm_bw_gbs=f.get("hbm_bw_gbs", float, lo=0, lo_open=True, hi=1e6),
        nvlink_gbs=f.get("nvlink_gbs", float, lo=0, hi=1e6),
        nic_gbits=f.get("nic_gbits", float, lo=0, lo_open=True, hi=1e6),
        tdp_w=f.get("tdp_w", float, lo=0, lo_open=True, hi=1e5),
        usd_per_hour=f.get("usd_per_hour", float, None, lo=0, hi=1e4),
        pcie_gbs=f.get("pcie_gbs", float, 32.0, lo=0, lo_open=True, hi=1e4),
        source=f.get("source", str),
        fp16_tflops=f.get("fp16_tflops", float, None, lo=0, lo_open=True, hi=1e5),
        fp8_tflops=f.get("fp8_tflops", float, None, lo=0, lo_open=True, hi=1e6),
        bf16=f.get("bf16", bool, True),
        gemm_eff=f.get("gemm_eff", float, 0.80, lo=0, lo_open=True, hi=1.0),
        fp8_gemm_eff=f.get("fp8_gemm_eff", float, 0.70, lo=0, lo_open=True, hi=1.0),
        gemm_half_balance=f.get("gemm_half_balance", float, None, lo=0, hi=100.0),
        gemm_latency_us=f.get("gemm_latency_us", float, None, lo=0, hi=1e4),
        attention=f.get("attention", str, "fa2", choices=("fa3", "fa2", "unfused")),
        attention_eff=f.get("attention_eff", float, 0.50, lo=0, lo_open=True, hi=1.0),
        kernel_source=f.get("kernel_source", str, ""),
    )
    f.done()
    return spec


def _resolve(value: str, base: Path, folder: str, suffixes: tuple[str, ...]) -> Path | None:
    """A reference is a path relative to ``base`` or a catalog name under ``instances/<folder>``."""
    candidates = [base / value] + [INSTANCES / folder / f"{value}{s}" for s in suffixes]
    return next((c for c in candidates if c.is_file()), None)


def load_model_ref(value: Any, file: str, key: str, base: Path) -> ModelSpec:
    """A model given as a catalog name, a path (TOML or HuggingFace config.json) or an inline table."""
    if isinstance(value, dict):
        return _model(Fields(value, file, key), key)
    if not isinstance(value, str) or not value:
        raise InputError(file, key, "must be a model name, a file path or an inline table")
    path = _resolve(value, base, "models", (".toml", ".json"))
    if path is None:
        stems = sorted(p.stem for p in (INSTANCES / "models").glob("*.toml"))
        raise InputError(file, key, f"unknown model {value!r}{closest(value, stems)} "
                                    f"(catalog: {', '.join(stems)}; or a file path)")
    return load_model(path)


def load_model(path: Path | str) -> ModelSpec:
    """Read a model file: our TOML format, or a HuggingFace config.json."""
    path = Path(path)
    if path.suffix == ".json":
        return model_from_hf_config(read_json(path), str(path), path.parent.name or path.stem)
    return _model(Fields(read_toml(path), str(path)), path.stem)


def _model(f: Fields, default_name: str) -> ModelSpec:
    spec = ModelSpec(
        name=f.get("name", str, default_name),
        layers=f.get("layers", int, lo=1, hi=MAX_LAYERS),
        hidden=f.get("hidden", int, lo=1, hi=10**6),
        ffn=f.get("ffn", int, lo=1, hi=10**7),
        heads=f.get("heads", int, lo=1, hi=10**5),
        kv_heads=f.get("kv_heads", int, lo=1, hi=10**5),
        vocab=f.get("vocab", int, lo=1, hi=10**8),
        gated_mlp=f.get("gated_mlp", bool, True),
        tied_embeddings=f.get("tied_embeddings", bool, False),
        experts=f.get("experts", int, 0, lo=0, hi=10**5),
        top_k=f.get("top_k", int, 0, lo=0, hi=10**5),
        expert_ffn=f.get("expert_ffn", int, 0, lo=0, hi=10**7),
        shared_experts=f.get("shared_experts", int, 0, lo=0, hi=10**4),
        head_dim=f.get("head_dim", int, 0, lo=0, hi=10**5),
    )
    f.get("source", str, "")
    f.done()
    check_model(spec, f)
    return spec


def load_cluster_ref(value: Any, file: str, key: str, base: Path,
                     catalog: dict[str, GPUSpec]) -> ClusterSpec:
    """A cluster given as a catalog name, a path or an inline table."""
    if isinstance(value, dict):
        return _cluster(Fields(value, file, key), catalog, key)
    if not isinstance(value, str) or not value:
        raise InputError(file, key, "must be a cluster name, a file path or an inline table")
    path = _resolve(value, base, "clusters", (".toml",))
    if path is None:
        stems = sorted(p.stem for p in (INSTANCES / "clusters").glob("*.toml"))
        raise InputError(file, key, f"unknown cluster {value!r}{closest(value, stems)} "
                                    f"(catalog: {', '.join(stems)}; or a file path)")
    return load_cluster(path, catalog)


def load_cluster(path: Path | str, catalog: dict[str, GPUSpec] | None = None) -> ClusterSpec:
    """Read a cluster file."""
    path = Path(path)
    catalog = catalog if catalog is not None else load_catalog()
    return _cluster(Fields(read_toml(path), str(path)), catalog, path.stem)


def _cluster(f: Fields, catalog: dict[str, GPUSpec], default_name: str) -> ClusterSpec:
    name = f.get("name", str, default_name)
    inter = f.get("inter_island_gbits", float, None, lo=0, lo_open=True, hi=1e6)
    f.get("description", str, "")
    raw = f.get("nodes", list)
    f.check("nodes", bool(raw), "a cluster needs at least one [[nodes]] group")
    groups = tuple(_group(Fields(g, f.file, f"{f.key('nodes')}[{i}]"), catalog)
                   for i, g in enumerate(raw))
    f.done()
    _check_node_ids(groups, f)
    total = sum(g.count * g.gpus_per_node for g in groups)
    f.check("nodes", total <= MAX_GPUS, f"{total} GPUs exceed the supported {MAX_GPUS}")
    return ClusterSpec(name, groups, inter)


def _group(f: Fields, catalog: dict[str, GPUSpec]) -> NodeGroup:
    gpu_name = f.get("gpu", str)
    if gpu_name not in catalog:
        raise f.error("gpu", f"unknown GPU {gpu_name!r}{closest(gpu_name, catalog)} "
                             f"(catalog: {', '.join(sorted(catalog))})")
    gpu = catalog[gpu_name]
    group = NodeGroup(
        gpu=gpu,
        count=f.get("count", int, lo=1, hi=MAX_GPUS),
        gpus_per_node=f.get("gpus_per_node", int, 8, lo=1, hi=64),
        nic_gbits=f.get("nic_gbits", float, gpu.nic_gbits, lo=0, lo_open=True, hi=1e6),
        perf=f.get("perf", float, 1.0, lo=0, lo_open=True, hi=1.0),
        prefix=f.get("name", str, gpu_name),
    )
    f.done()
    return group


def _check_node_ids(groups: tuple[NodeGroup, ...], f: Fields) -> None:
    seen: dict[str, int] = {}
    for i, g in enumerate(groups):
        if g.prefix in seen:
            raise f.error(f"nodes[{i}].name", f"node id prefix {g.prefix!r} is already used by "
                          f"nodes[{seen[g.prefix]}]; give each group a distinct name")
        seen[g.prefix] = i


def load_job(path: Path | str, catalog: dict[str, GPUSpec] | None = None) -> JobSpec:
    """Read a job file: model and cluster references, training and planner tables."""
    path = Path(path)
    catalog = catalog if catalog is not None else load_catalog()
    f = Fields(read_toml(path), str(path))
    f.only("name", "description", "model", "cluster", "training", "planner", "constraints")
    f.get("description", str, "")
    model = load_model_ref(f.get("model", object), str(path), "model", path.parent)
    cluster = load_cluster_ref(f.get("cluster", object), str(path), "cluster", path.parent, catalog)
    training = _training(f.sub("training", required=True))
    planner_f = f.sub("planner")
    planner = _planner(planner_f) if planner_f else PlannerOptions()
    name = f.get("name", str, path.stem)
    constraints_f = f.sub("constraints")
    constraints = _constraints(constraints_f) if constraints_f else Constraints()
    f.done()
    return JobSpec(name, model, cluster, training, planner, path, constraints)


def _int_list(f: Fields, name: str, lo: int, hi: int) -> tuple[int, ...] | None:
    """A non-empty list of integers in ``lo..hi`` (None when absent)."""
    raw = f.get(name, list, None)
    if raw is None:
        return None
    f.check(name, bool(raw) and all(isinstance(x, int) and not isinstance(x, bool)
                                    and lo <= x <= hi for x in raw),
            f"must be a non-empty list of integers in {lo}..{hi}, got {raw!r}")
    return tuple(sorted(set(raw)))


def _enum_list(f: Fields, name: str, enum_type) -> tuple | None:
    raw = f.get(name, list, None)
    if raw is None:
        return None
    values = [e.value for e in enum_type]
    f.check(name, bool(raw) and all(x in values for x in raw),
            f"must be a non-empty list of {', '.join(map(repr, values))}, got {raw!r}")
    return tuple(enum_type(x) for x in dict.fromkeys(raw))


def _str_list(f: Fields, name: str) -> tuple[str, ...] | None:
    raw = f.get(name, list, None)
    if raw is None:
        return None
    f.check(name, bool(raw) and all(isinstance(x, str) and x for x in raw),
            f"must be a non-empty list of island names or GPU types, got {raw!r}")
    return tuple(raw)


def _constraints(f: Fields) -> Constraints:
    """The ``[constraints]`` table (every key optional)."""
    out = Constraints(
        tp=_int_list(f, "tp", 1, 1024), cp=_int_list(f, "cp", 1, 1024),
        ep=_int_list(f, "ep", 1, 4096), zero=_int_list(f, "zero", 0, 3),
        recompute=_enum_list(f, "recompute", Recompute),
        offload=f.get("offload", bool, None),
        micro_batch=_int_list(f, "micro_batch", 1, 10**6),
        schedule=_enum_list(f, "schedule", Schedule),
        virtual_stages=_int_list(f, "virtual_stages", 2, 4096),
        pp=_int_list(f, "pp", 1, MAX_LAYERS),
        max_stages=f.get("max_stages", int, None, lo=1, hi=MAX_LAYERS),
        islands=_str_list(f, "islands"), exclude_islands=_str_list(f, "exclude_islands"),
        max_replicas=f.get("max_replicas", int, None, lo=1, hi=4096))
    f.check("schedule", out.schedule is None or Schedule.GPIPE not in out.schedule,
            "the planner makes 1f1b and interleaved plans (gpipe is not searched)")
    f.done()
    return out


def _training(f: Fields) -> TrainingSpec:
    gb = f.get("global_batch", int, lo=1, hi=10**7)
    seq = f.get("seq_len", int, lo=1, hi=10**7)
    raw = f.get("n_micro", object, "auto")
    if raw == "auto":
        n = None
    elif isinstance(raw, int) and not isinstance(raw, bool) and 1 <= raw <= gb:
        n = raw
        f.check("n_micro", gb % n == 0, f"n_micro {n} must divide global_batch {gb}")
    else:
        raise f.error("n_micro", f"must be \"auto\" or an integer in 1..global_batch ({gb}), got {raw!r}")
    precision = f.get_enum("precision", Precision, Precision.BF16)
    f.done()
    return TrainingSpec(gb, seq, n, precision)


def _planner(f: Fields) -> PlannerOptions:
    d = PlannerOptions()
    opts = PlannerOptions(
        features=f.get_enum("features", FeaturePreset, d.features),
        beta=f.get("beta", float, d.beta, lo=1.0, hi=1e3),
        epsilon=f.get("epsilon", float, d.epsilon, lo=0.0, hi=0.9),
        tau_c=f.get("tau_c", float, d.tau_c, lo=0.0, hi=1.0),
        tau_m=f.get("tau_m", float, d.tau_m, lo=0.0, hi=1.0),
        tau_b=f.get("tau_b", float, d.tau_b, lo=0.0, hi=1.0),
        t_merge=f.get("t_merge", float, d.t_merge, lo=0.0, hi=1.0),
        solver=f.get_enum("solver", SolverKind, d.solver),
        overlap=f.get("overlap", bool, d.overlap),
        time_limit_s=f.get("time_limit_s", float, d.time_limit_s, lo=0, lo_open=True, hi=86400),
        max_usd_per_hour=f.get("max_usd_per_hour", float, None, lo=0, lo_open=True, hi=1e9),
        min_tokens_per_s=f.get("min_tokens_per_s", float, None, lo=0, lo_open=True, hi=1e15),
        framework=f.get_enum("framework", Framework, d.framework),
        pruning=f.get_enum("pruning", Pruning, d.pruning),
    )
    f.check("framework", opts.framework in PLANNED_FRAMEWORKS,
            f"the planner makes plans for {', '.join(x.value for x in PLANNED_FRAMEWORKS)} only "
            f"({opts.framework.value}: `tangram estimate` prices a layout of it)")
    f.done()
    return opts
