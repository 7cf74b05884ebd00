"""Loading the instance files (public formats) into validated domain objects.

Formats: GPU catalog ``instances/gpus.toml``, models ``instances/models/<name>.toml`` (or a
HuggingFace ``config.json``), clusters ``instances/clusters/<name>.toml`` and jobs
``instances/jobs/<name>.toml``. Every value is checked here, through :class:`~solver.spec.fields.Fields`.
"""

from __future__ import annotations

import dataclasses
import os
import re
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
    PlannerOptions,
    Pruning,
    Recompute,
    Schedule,
    SolverKind,
)
from solver.spec.catalog import (DEFAULTS, CatalogEntry, file_entries, gpus_entries,
                                  known_fields, omitted)
from solver.spec.errors import InputError
from solver.spec.fields import Fields, closest, read_json, read_toml
from solver.spec.hfconfig import model_from_hf_config
from solver.spec.model import ACTIVATIONS, NORMALIZATIONS, POSITION_EMBEDDINGS, check_model
from solver.spec.training import read_training

INSTANCES = Path(__file__).resolve().parents[2] / "instances"
CATALOG_PATH = INSTANCES / "gpus.toml"
MAX_GPUS = 1_000_000
MAX_LAYERS = 4096
#: Runtimes the planner makes plans for: FlagScale (each pipeline stage, a mesh, may have its own
#: layout) and Megatron-Core (one mesh: one layout, Megatron's layer split; what Megatron-LM's
#: arguments express). The others are priced by `tangram estimate` only.
PLANNED_FRAMEWORKS = (Framework.FLAGSCALE, Framework.MEGATRON_CORE)
#: A folder name of the HuggingFace hub cache (``snapshots/<commit>``): not a model's name.
_SNAPSHOT = re.compile(r"[0-9a-f]{40}")


def load_catalog(path: Path | str | None = None) -> dict[str, GPUSpec]:
    """The GPU catalog by name.

    With ``path``: that file alone, a whole catalog. Without: the shipped catalog
    (``instances/gpus.toml``) extended by the user catalog the environment variable
    ``TANGRAM_CATALOG`` names, if set: each of its entries adds a GPU or changes the fields it
    gives of the GPU of that name (:func:`extend_catalog`; formats: :mod:`solver.spec.catalog`).
    """
    if path is not None:
        return extend_catalog({}, file_entries(read_toml(path), str(path)))
    catalog = extend_catalog({}, file_entries(read_toml(CATALOG_PATH), str(CATALOG_PATH)),
                             shipped=True)
    user = os.environ.get("TANGRAM_CATALOG")
    return extend_catalog(catalog, file_entries(read_toml(user), user)) if user else catalog


def extend_catalog(catalog: dict[str, GPUSpec], entries: list[CatalogEntry],
                   shipped: bool = False) -> dict[str, GPUSpec]:
    """``catalog`` with ``entries`` laid over it: a new name adds a GPU (every required figure
    given; ``source`` required only of the shipped catalog), a known name keeps the fields the
    entry does not give. Omitted optional fields take :data:`~solver.spec.catalog.DEFAULTS`."""
    out = dict(catalog)
    for e in entries:
        base = known_fields(out[e.name]) if e.name in out else {}
        out[e.name] = _gpu(Fields({**base, **e.table}, e.file, e.key), e.name, shipped)
    return out


def _gpu(f: Fields, name: str, shipped: bool = False) -> GPUSpec:
    d = DEFAULTS
    spec = GPUSpec(
        name=name,
        bf16_tflops=f.get("bf16_tflops", float, lo=0, lo_open=True, hi=1e5),
        hbm_gb=f.get("hbm_gb", float, lo=0, lo_open=True, hi=1e5),
        hbm_bw_gbs=f.get("hbm_bw_gbs", float, lo=0, lo_open=True, hi=1e6),
        nvlink_gbs=f.get("nvlink_gbs", float, lo=0, hi=1e6),
        nic_gbits=f.get("nic_gbits", float, lo=0, lo_open=True, hi=1e6),
        tdp_w=f.get("tdp_w", float, lo=0, lo_open=True, hi=1e5),
        usd_per_hour=f.get("usd_per_hour", float, None, lo=0, hi=1e4),
        pcie_gbs=f.get("pcie_gbs", float, d["pcie_gbs"], lo=0, lo_open=True, hi=1e4),
        source=f.get("source", str, ... if shipped else ""),
        fp16_tflops=f.get("fp16_tflops", float, None, lo=0, lo_open=True, hi=1e5),
        fp8_tflops=f.get("fp8_tflops", float, None, lo=0, lo_open=True, hi=1e6),
        bf16=f.get("bf16", bool, d["bf16"]),
        gemm_eff=f.get("gemm_eff", float, d["gemm_eff"], lo=0, lo_open=True, hi=1.0),
        fp8_gemm_eff=f.get("fp8_gemm_eff", float, d["fp8_gemm_eff"], lo=0, lo_open=True, hi=1.0),
        gemm_half_balance=f.get("gemm_half_balance", float, None, lo=0, hi=100.0),
        gemm_latency_us=f.get("gemm_latency_us", float, None, lo=0, hi=1e4),
        gemm_in_training=f.get("gemm_in_training", float, None, lo=0, lo_open=True, hi=1.0),
        mxfp8=f.get("mxfp8", bool, False),
        memory_mib=f.get("memory_mib", float, None, lo=0, lo_open=True, hi=1e8),
        attention=f.get("attention", str, d["attention"], choices=("fa3", "fa2", "unfused")),
        attention_eff=f.get("attention_eff", float, d["attention_eff"], lo=0, lo_open=True,
                            hi=1.0),
        kernel_source=f.get("kernel_source", str, ""),
        vendor=f.get("vendor", str, d["vendor"]),
        # Absent: an HGX-style board of 8 where the GPU has NVLink, else none.
        nvlink_domain=f.get("nvlink_domain", int, 8 if f.data.get("nvlink_gbs") else 1,
                            lo=1, hi=4096),
        defaults=omitted(f.data), catalog_file=f.file,
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
    if path is None and _looks_like_path(value):
        raise InputError(file, key, f"no such file: {base / value} (a model is a catalog name, "
                                    "a model TOML or a HuggingFace config.json, relative to the "
                                    "job's folder, or an inline table)")
    if path is None:
        stems = sorted(p.stem for p in (INSTANCES / "models").glob("*.toml"))
        raise InputError(file, key, f"unknown model {value!r}{closest(value, stems)} "
                                    f"(catalog: {', '.join(stems)}; or a file path)")
    return load_model(path, base)


def _looks_like_path(value: str) -> bool:
    """A file name (``.json`` / ``.toml``) or a path, rather than a catalog name."""
    return value.endswith((".json", ".toml")) or "/" in value or os.sep in value


def load_model(path: Path | str, job_dir: Path | None = None) -> ModelSpec:
    """Read a model file: our TOML format, or a HuggingFace config.json (named by
    :func:`hf_model_name`; ``job_dir``: the folder of the job that names the file)."""
    path = Path(path)
    if path.suffix == ".json":
        data = read_json(path)
        spec = model_from_hf_config(data, str(path), path.stem)
        return dataclasses.replace(spec, name=hf_model_name(data, path, job_dir, spec))
    return _model(Fields(read_toml(path), str(path)), path.stem)


def hf_model_name(data: Any, path: Path, job_dir: Path | None, spec: ModelSpec) -> str:
    """The name of a model read from a HuggingFace config.json: its ``_name_or_path`` (the hub
    id's last part), else the file's stem unless that is ``config``, else the folder holding it
    when that folder is the model's own (not the job's folder, not a hub-cache snapshot hash),
    else the architecture and size (``llama-8.0b``)."""
    hub = data.get("_name_or_path")  # a dict with a known architecture: model_from_hf_config
    if isinstance(hub, str) and hub.strip("/ "):
        return hub.strip("/ ").rsplit("/", 1)[-1]
    if path.stem != "config":
        return path.stem
    folder = path.resolve().parent
    own = job_dir is None or folder != Path(job_dir).resolve()
    if own and folder.name and not _SNAPSHOT.fullmatch(folder.name):
        return folder.name
    kind = data.get("model_type") or data["architectures"][0].removesuffix("ForCausalLM")
    return f"{str(kind).lower()}-{spec.total_params / 1e9:.1f}b"


def _model(f: Fields, default_name: str) -> ModelSpec:
    spec = ModelSpec(
        name=f.get("name", str, default_name),
        layers=f.get("layers", int, lo=1, hi=MAX_LAYERS),
        hidden=f.get("hidden", int, lo=1, hi=10**6),
        ffn=f.get("ffn", int, lo=1, hi=10**7),
        heads=f.get("heads", int, lo=1, hi=10**5),
        kv_heads=f.get("kv_heads", int, lo=1, hi=10**5),
        vocab=f.get("vocab", int, lo=1, hi=10**8),
        tied_embeddings=f.get("tied_embeddings", bool, False),
        experts=f.get("experts", int, 0, lo=0, hi=10**5),
        top_k=f.get("top_k", int, 0, lo=0, hi=10**5),
        expert_ffn=f.get("expert_ffn", int, 0, lo=0, hi=10**7),
        shared_experts=f.get("shared_experts", int, 0, lo=0, hi=10**4),
        head_dim=f.get("head_dim", int, 0, lo=0, hi=10**5),
        **_architecture(f),
    )
    f.get("source", str, "")
    f.done()
    check_model(spec, f)
    return spec


def _architecture(f: Fields) -> dict[str, Any]:
    """The architecture keys of a model table (defaults: a Llama-style model). ``activation``
    and the older ``gated_mlp`` name one choice and must agree where both are given; ``bias``
    includes the QKV bias, so ``qkv_bias = false`` beside it is a contradiction."""
    gated = f.get("gated_mlp", bool, None)
    activation = f.get("activation", str, "", choices=("", *ACTIVATIONS))
    if gated is not None and activation:
        f.check("activation", (activation == "swiglu") == gated,
                f"activation {activation!r} contradicts gated_mlp = {str(gated).lower()} "
                "(swiglu is the gated MLP; gelu the classic one)")
    bias = f.get("bias", bool, False)
    qkv_bias = f.get("qkv_bias", bool, None)
    f.check("qkv_bias", qkv_bias is not False or not bias,
            "bias = true puts a bias on every linear layer, QKV included: qkv_bias cannot be "
            "false (Megatron-LM's validate_args sets add_qkv_bias with add_bias_linear)")
    return dict(
        gated_mlp=gated if gated is not None else activation != "gelu",
        normalization=f.get("normalization", str, "rmsnorm", choices=NORMALIZATIONS),
        norm_epsilon=f.get("norm_epsilon", float, 1e-5, lo=0, lo_open=True, hi=1.0),
        position_embedding=f.get("position_embedding", str, "rope", choices=POSITION_EMBEDDINGS),
        rotary_base=f.get("rotary_base", float, 10000.0, lo=0, lo_open=True, hi=1e12),
        bias=bias, qkv_bias=bool(qkv_bias or bias),
        max_positions=f.get("max_positions", int, 0, lo=0, hi=10**8),
        qk_norm=f.get("qk_norm", bool, False))


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
    catalog = _own_gpus(f, catalog)
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


def _own_gpus(f: Fields, catalog: dict[str, GPUSpec]) -> dict[str, GPUSpec]:
    """``catalog`` extended by the ``[[gpus]]`` entries of this job or cluster table, if any."""
    raw = f.get("gpus", list, None)
    return catalog if raw is None else extend_catalog(
        catalog, gpus_entries(raw, f.file, f.key("gpus")))


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
    f.only("name", "description", "model", "cluster", "training", "planner", "constraints",
           "gpus")
    f.get("description", str, "")
    catalog = _own_gpus(f, catalog)
    model = load_model_ref(f.get("model", object), str(path), "model", path.parent)
    cluster = load_cluster_ref(f.get("cluster", object), str(path), "cluster", path.parent, catalog)
    training = read_training(f.sub("training", required=True))
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
        expert_tp=_int_list(f, "expert_tp", 1, 1024),
        recompute=_enum_list(f, "recompute", Recompute),
        offload=f.get("offload", bool, None),
        a2a_overlap=f.get("a2a_overlap", bool, None),
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
        replicas=f.get("replicas", bool, d.replicas),
    )
    f.check("framework", opts.framework in PLANNED_FRAMEWORKS,
            f"the planner makes plans for {', '.join(x.value for x in PLANNED_FRAMEWORKS)} only "
            f"({opts.framework.value}: `tangram estimate` prices a layout of it)")
    f.done()
    return opts
