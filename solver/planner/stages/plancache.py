"""A persistent cache of partial plans, so re-planning only calls the parallelizer where needed.

A partial plan depends on the model slice (layer shape, length, position), the island (GPU type,
size, node size, effective compute, HBM, bandwidths), the planning context (sequence length,
micro-batch, micro-batch count, in-flight count, ε, features, schedule) and the parallelizer
itself (its class, options and cost-model constants) and code. :func:`cache_key` collects all of
it, so a changed input never finds a stale entry: it finds another key.

:class:`CachingParallelizer` wraps any :class:`~solver.cost.parallelizer.Parallelizer` and implements
the same protocol, so ``plan_job(job, parallelizer=CachingParallelizer(inner, store))`` caches
without any planner change. It counts the inner calls (what re-planning costs) and the hits.
:class:`~solver.planner.stages.memo.MemoParallelizer` is its in-memory cousin for the many plans of
one search (the replica search's), keyed cheaply because its scope is one model on one
cluster.

On-disk format (``DirectoryStore``, versioned by :data:`CACHE_FORMAT`)::

    <dir>/v<CACHE_FORMAT>/<sha[:2]>/<sha>.json
    {"format": 1, "key": {...the full key...}, "columns": [...PLAN_COLUMNS...],
     "plans": [[<one row per partial plan>], ...]}

The file name is the SHA-256 of the canonical JSON of the key; the key is stored too and compared
on read, so even a hash collision cannot return another entry. Floats are written with Python's
shortest round-trip repr: a loaded plan is bit-for-bit the plan that was stored.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol

from solver.cost.efficiency import Calibration, intra_node_gbs
from solver.cost.parallelizer import (
    MemoryBreakdown,
    Parallelizer,
    PartialPlan,
    PlanContext,
    kernel_calibration,
    prices_interleaving_above_plain,
    stage_calibration,
)
from solver.cost.stage import ModelSlice, StageConfig
from solver.spec.domain import Island, ModelSpec, Recompute
from solver.spec.fields import write_atomic

#: Version of the entry format and of the key's meaning; bump when either changes.
CACHE_FORMAT = 7
#: Version of the cost model's semantics, bumped by hand when results change for the same inputs
#: in a way the code fingerprint below cannot see (e.g. a new data file the model reads).
COST_MODEL_VERSION = 4
#: Modules whose source decides a partial plan; their text is hashed into every key.
COST_MODEL_MODULES = ("solver.cost.parallelizer", "solver.cost.partial", "solver.cost.configs",
                      "solver.cost.stage_costs", "solver.cost.timing", "solver.cost.sync",
                      "solver.cost.memory", "solver.cost.efficiency", "solver.cost.stage",
                      "solver.cost.stage_options", "solver.cost.runtime.frameworks",
                      "solver.cost.recompute_layers", "solver.cost.runtime.runtime_rules",
                      "solver.cost.reserve", "solver.cost.fp8_casts",
                      "solver.cost.runtime.profile", "solver.spec.enums",
                      "solver.cost.a2a_overlap")


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/tangram``, else ``~/.cache/tangram``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tangram"


def code_fingerprint(modules: tuple[str, ...] = COST_MODEL_MODULES) -> str:
    """SHA-256 of the cost model's source files: editing the model invalidates the cache."""
    digest = hashlib.sha256(f"cost-model-v{COST_MODEL_VERSION}".encode())
    for name in modules:
        path = importlib.import_module(name).__file__
        digest.update(Path(path).read_bytes() if path else name.encode())
    return digest.hexdigest()


def parallelizer_identity(inner: Parallelizer) -> str:
    """Class and options of a parallelizer (a dataclass's repr lists every option).

    A parallelizer that is not a dataclass is identified by its class alone, unless it provides
    ``cache_identity() -> str``; one with hidden options must provide it.
    """
    ident = getattr(inner, "cache_identity", None)
    if callable(ident):
        return str(ident())
    cls = type(inner)
    name = f"{cls.__module__}.{cls.__qualname__}"
    return f"{name}:{inner!r}" if dataclasses.is_dataclass(inner) else name


#: The catalog figures of a GPU type the cost model's kernels read (a GPU name alone would let
#: an edited catalog entry return stale plans).
KERNEL_FIELDS = ("bf16_tflops", "fp16_tflops", "fp8_tflops", "bf16", "gemm_eff", "fp8_gemm_eff",
                 "gemm_half_balance", "gemm_latency_us", "gemm_in_training", "attention",
                 "attention_eff")


def island_signature(island: Island) -> dict[str, Any]:
    """Everything of an island the cost model reads (node ids and names excluded)."""
    intra = intra_node_gbs(island)
    kernels = [{f: getattr(g, f) for f in KERNEL_FIELDS}
               for g in sorted(island.gpu_types, key=lambda g: g.name)]
    return {"gpu": island.gpu.name, "gpus": island.gpus, "gpus_per_node": island.gpus_per_node,
            "nodes": len(island.nodes), "tflops_per_gpu": island.tflops_per_gpu,
            "hbm_gb": island.hbm_gb, "device_mib": island.device_mib,
            "hbm_bw_gbs": island.hbm_bw_gbs,
            "nvlink_gbs": island.nvlink_gbs, "intra_gbs": intra, "pcie_gbs": island.pcie_gbs,
            "nic_gbits": island.nic_gbits, "nvlink_domain": island.nvlink_domain,
            "kernels": kernels}


def slice_signature(slc: ModelSlice) -> dict[str, Any]:
    """The model's shape (not its name) and the slice's length and position."""
    shape = {k: v for k, v in dataclasses.asdict(slc.model).items() if k != "name"}
    return {"model": shape, "layers": slc.layers, "has_embedding": slc.has_embedding,
            "has_head": slc.has_head}


def context_signature(ctx: PlanContext) -> dict[str, Any]:
    """Every field of the planning context, enums by value."""
    return {f.name: _plain(getattr(ctx, f.name)) for f in dataclasses.fields(ctx)}


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (tuple, list)):
        return [_plain(x) for x in value]
    return value.value if hasattr(value, "value") else value


@dataclass(frozen=True)
class CacheKey:
    """A cache key: its canonical JSON text and that text's SHA-256.

    Attributes
    ----------
    text : str
        Canonical JSON (sorted keys, no spaces) of the key's parts.
    digest : str
        SHA-256 hex digest of ``text`` (the entry's file name).
    """

    text: str
    digest: str

    @classmethod
    def of(cls, parts: dict[str, Any]) -> "CacheKey":
        """Key of ``parts`` (a JSON-serializable dict)."""
        text = json.dumps(parts, sort_keys=True, separators=(",", ":"))
        return cls(text, hashlib.sha256(text.encode()).hexdigest())


def cache_key(slc: ModelSlice, island: Island, ctx: PlanContext, identity: str,
              fingerprint: str) -> CacheKey:
    """The key of one ``plan(slice, island, context)`` call of parallelizer ``identity``."""
    return CacheKey.of({"format": CACHE_FORMAT, "code": fingerprint, "parallelizer": identity,
                        "slice": slice_signature(slc), "island": island_signature(island),
                        "context": context_signature(ctx)})


#: Columns of a stored partial plan, in row order (entries list them; a reader checks them).
PLAN_COLUMNS = ("tp", "cp", "ep", "pp", "dp", "zero", "recompute", "offload", "micro_batch",
                "latency_s", "fwd_s", "bwd_s", "iteration_s", "memory_gb", "memory_params",
                "memory_grads", "memory_optimizer", "memory_activations", "layout",
                "stage_latencies", "max_in_flight", "recompute_layers", "expert_tp",
                "memory_fragmentation", "optimizer_s", "p2p_s", "a2a_overlap")
_RECOMPUTE = MappingProxyType({r.value: r for r in Recompute})


def plan_to_row(p: PartialPlan) -> list[Any]:
    """A partial plan as one JSON row of :data:`PLAN_COLUMNS` (rows, not objects: a cached
    entry holds the parallelizer's whole Pareto set, often a hundred plans)."""
    c, m = p.config, p.memory
    return [c.tp, c.cp, c.ep, c.pp, c.dp, c.zero, c.recompute.value, c.offload, c.micro_batch,
            p.latency_s, p.fwd_s, p.bwd_s, p.iteration_s, p.memory_gb, m.params, m.grads,
            m.optimizer, m.activations, list(p.layout), list(p.stage_latencies), p.max_in_flight,
            c.recompute_layers, c.expert_tp, m.fragmentation, p.optimizer_s, p.p2p_s,
            c.a2a_overlap]


def plan_from_row(row: list[Any]) -> PartialPlan:
    """Inverse of :func:`plan_to_row` (raises ValueError/KeyError/TypeError on bad data)."""
    (tp, cp, ep, pp, dp, zero, rc, offload, mb, lat, fwd, bwd, it, mem, m_p, m_g, m_o, m_a,
     layout, subs, held, k, etp, m_f, opt, p2p, a2a) = row
    config = StageConfig(tp=tp, cp=cp, ep=ep, pp=pp, dp=dp, zero=zero, recompute=_RECOMPUTE[rc],
                         offload=offload, micro_batch=mb, recompute_layers=k, expert_tp=etp,
                         a2a_overlap=a2a)
    return PartialPlan(config=config, latency_s=lat, fwd_s=fwd, bwd_s=bwd, iteration_s=it,
                       memory_gb=mem, memory=MemoryBreakdown(m_p, m_g, m_o, m_a, m_f),
                       layout=tuple(layout), stage_latencies=tuple(subs), max_in_flight=held,
                       optimizer_s=opt, p2p_s=p2p)


class PlanStore(Protocol):
    """Where cached partial plans live."""

    def load(self, key: CacheKey) -> list[PartialPlan] | None:
        """The stored plans of ``key`` (None on a miss)."""
        ...

    def save(self, key: CacheKey, plans: list[PartialPlan]) -> None:
        """Store ``plans`` under ``key``."""
        ...


@dataclass(frozen=True)
class MemoryStore:
    """An in-process store (tests, sweeps, the subset runs of one Pareto computation).

    Attributes
    ----------
    entries : dict[str, tuple[PartialPlan, ...]]
        Key text -> plans (frozen objects, so sharing them is safe; callers get a new list).
    """

    entries: dict[str, tuple[PartialPlan, ...]] = field(default_factory=dict)

    def load(self, key: CacheKey) -> list[PartialPlan] | None:
        """The stored plans of ``key`` (None on a miss)."""
        plans = self.entries.get(key.text)
        return None if plans is None else list(plans)

    def save(self, key: CacheKey, plans: list[PartialPlan]) -> None:
        """Store ``plans`` under ``key``."""
        self.entries[key.text] = tuple(plans)


@dataclass(frozen=True)
class DirectoryStore:
    """One JSON file per key under ``root`` (format in the module docstring).

    Attributes
    ----------
    root : Path
        Cache directory (created on first write).
    """

    root: Path

    def path(self, key: CacheKey) -> Path:
        """File of ``key``."""
        return Path(self.root) / f"v{CACHE_FORMAT}" / key.digest[:2] / f"{key.digest}.json"

    def load(self, key: CacheKey) -> list[PartialPlan] | None:
        """The stored plans, or None when absent, unreadable, of another format or another key
        (a damaged entry is a miss and is overwritten, never an error)."""
        try:
            data = json.loads(self.path(key).read_text(encoding="utf-8"))
            if data.get("format") != CACHE_FORMAT or data.get("key") != json.loads(key.text) \
                    or data.get("columns") != list(PLAN_COLUMNS):
                return None
            return [plan_from_row(r) for r in data["plans"]]
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None

    def save(self, key: CacheKey, plans: list[PartialPlan]) -> None:
        """Write the entry atomically (temporary file + rename), so concurrent planners never
        read a half-written file."""
        target = self.path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        payload = {"format": CACHE_FORMAT, "key": json.loads(key.text),
                   "columns": list(PLAN_COLUMNS), "plans": [plan_to_row(p) for p in plans]}
        # dumps (C encoder) then one write: json.dump encodes in Python, 5x slower here.
        write_atomic(target, json.dumps(payload, separators=(",", ":")))


class ForwardsInner:
    """What a wrapper of a parallelizer (attribute ``inner``) declares: its inner's
    declarations, since its answers are the inner's."""

    inner: Parallelizer

    @property
    def interleaving_priced_above_plain(self) -> bool:
        """The inner parallelizer's (the answers are its own)."""
        return prices_interleaving_above_plain(self.inner)

    @property
    def kernel_calibration(self) -> Calibration | None:
        """The inner parallelizer's (the answers are its own)."""
        return kernel_calibration(self.inner)

    @property
    def stage_calibration(self) -> Calibration | None:
        """The inner parallelizer's (the answers are its own)."""
        return stage_calibration(self.inner)


@dataclass
class CachingParallelizer(ForwardsInner):
    """A :class:`~solver.cost.parallelizer.Parallelizer` that answers from ``store`` when it can.

    Attributes
    ----------
    inner : Parallelizer
        The parallelizer called on a miss.
    store : PlanStore
        Where entries are kept.
    inner_calls : int
        Calls made to ``inner`` (misses).
    hits : int
        Calls answered from the store.
    """

    inner: Parallelizer
    store: PlanStore
    inner_calls: int = 0
    hits: int = 0
    _identity: str = field(default="", init=False, repr=False)
    _code: str = field(default="", init=False, repr=False)

    def __post_init__(self) -> None:
        # Computed once: hashing the sources per call would dominate a cache hit.
        self._identity = parallelizer_identity(self.inner)
        self._code = code_fingerprint()

    def plan(self, slice: ModelSlice, island: Island, context: PlanContext) -> list[PartialPlan]:
        """The inner parallelizer's answer, from the store when the same call was made before."""
        key = cache_key(slice, island, context, self._identity, self._code)
        stored = self.store.load(key)
        if stored is not None:
            self.hits += 1
            return stored
        plans = self.inner.plan(slice, island, context)
        self.inner_calls += 1
        self.store.save(key, plans)
        return plans

    def plan_stages(self, model: ModelSpec, lengths: list[int], has_embedding: bool,
                    has_head: bool, island: Island, context: PlanContext) -> list:
        """The inner ``plan_stages`` per length, from the store where the same entry was
        planned before; the misses are planned in one batched call."""
        keys = [cache_key(ModelSlice(model, d, has_embedding, has_head), island, context,
                          self._identity + ":stages", self._code) for d in lengths]
        out = [self.store.load(k) for k in keys]
        self.hits += sum(o is not None for o in out)
        todo = [i for i, o in enumerate(out) if o is None]
        if todo:
            from solver.planner.stages.candidates import stage_options
            found = stage_options(self.inner, model, [lengths[i] for i in todo], has_embedding,
                                  has_head, island, context)
            self.inner_calls += len(todo)
            for i, plans in zip(todo, found):
                out[i] = list(plans)
                self.store.save(keys[i], out[i])
        return out

    def cache_identity(self) -> str:
        """Caching does not change answers: identify as the inner parallelizer."""
        return self._identity


def open_store(directory: Path | str | None) -> DirectoryStore:
    """The directory store at ``directory`` (default: :func:`default_cache_dir`)."""
    return DirectoryStore(Path(directory) if directory else default_cache_dir())
