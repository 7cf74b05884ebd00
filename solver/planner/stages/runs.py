"""One planning run: a view of the cluster at one ``n_micro``, its options and its candidate cache.

The planner (:mod:`solver.planner.stages.search`) plans every ``n_micro`` through the runs of its views:
Algorithm 1's islands, and the whole cluster as one island at its weakest members' figures.
This module holds what a run is made of (:class:`PlannerConfig`, :class:`PlanningRun`, the
result of its composition :class:`Composed`) and how runs start (:func:`start_run`,
:func:`views`), after the job's ``[constraints]`` on islands.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property

from solver.compose.stage_table import GroupResult
from solver.cost.parallelizer import (AnalyticParallelizer, FeatureSet, Parallelizer, PlanContext,
                                      framework_features)
from solver.cost.runtime.frameworks import precision_problem, state_types
from solver.islands import (IslandSet, Thresholds, build_islands, vendor_cluster, vendors,
                            whole_cluster_views)
from solver.planner.stages.candidates import CandidateTable, GroupCache
from solver.planner.pruning import LinkModel, Rule
from solver.planner.check.validate import link_model
from solver.spec.domain import FeaturePreset, JobSpec, SolverKind
from solver.spec.errors import InputError

__all__ = ["REL_TIE", "VIEW_ISLANDS", "VIEW_WHOLE", "PlannerConfig", "PlanningRun", "Composed",
           "resolved", "start_run", "job_islands", "default_islands", "runnable_views", "views"]

REL_TIE = 1e-12  # relative tolerance under which two iteration times tie (smaller n wins)
VIEW_ISLANDS, VIEW_WHOLE = "islands", "whole cluster"


@dataclass(frozen=True)
class PlannerConfig:
    """How to plan (defaults come from the job's ``[planner]`` table).

    Attributes
    ----------
    rules : Rule | None
        Pruning rules to apply (None: the job's ``[planner] pruning``).
    solver : SolverKind | None
        Composition solver (None: the job's).
    features : FeaturePreset | None
        Parallelizer features (None: the job's).
    time_limit_s : float | None
        CP-SAT / MILP time limit per solve (None: the job's).
    interface_threshold : float
        Rule 4: ban links slower than this fraction of a balanced stage.
    whole_cluster : bool
        Also plan the whole cluster as one island at its weakest members' figures.
    workers : int
        Processes that search the ``n_micro`` values (1: this process; the same plan).
    """

    rules: Rule | None = None
    solver: SolverKind | None = None
    features: FeaturePreset | None = None
    time_limit_s: float | None = None
    interface_threshold: float = 0.5
    whole_cluster: bool = True
    workers: int = 1


@dataclass
class PlanningRun:
    """State of one planning run: one view of the cluster at one ``n_micro``.

    Attributes
    ----------
    job, config : JobSpec, PlannerConfig
        What is planned and how (the rules resolved: :func:`resolved`).
    islands : IslandSet
        The islands of this view.
    cache : GroupCache
        Partial plans (shared between runs of one ``n_micro``).
    links : LinkModel
        Boundary transfers.
    n_micro : int
        Micro-batches per iteration.
    view : str
        ``"islands"`` or ``"whole cluster"``.
    """

    job: JobSpec
    config: PlannerConfig
    islands: IslandSet
    cache: GroupCache
    links: LinkModel
    n_micro: int
    view: str = VIEW_ISLANDS

    def __post_init__(self) -> None:
        # A run always knows its pruning rules (a config may leave them to the job's).
        self.config = resolved(self.config, self.job)

    @cached_property
    def features(self) -> FeatureSet:
        """The features the parallelizer may use (found once: the search reads them for every
        entry)."""
        return FeatureSet.of(self.config.features or self.job.planner.features).meet(
            framework_features(self.job.planner.framework))


@dataclass(frozen=True)
class Composed:
    """The best composition of one run: result, the candidates behind it, proof status."""

    result: GroupResult
    candidates: CandidateTable
    optimal: bool

    @property
    def total(self) -> float:
        """Iteration time (inf when dominated)."""
        return math.inf if self.result.objective is None else float(self.result.objective)


def resolved(config: PlannerConfig, job: JobSpec) -> PlannerConfig:
    """``config`` with its pruning rules fixed: the job's ``[planner] pruning`` unless given."""
    if config.rules is not None:
        return config
    return replace(config, rules=Rule.of(job.planner.pruning))


def start_run(job: JobSpec, config: PlannerConfig, n_micro: int | None = None,
              parallelizer: Parallelizer | None = None, islands: IslandSet | None = None,
              view: str = VIEW_ISLANDS, cache: GroupCache | None = None,
              groups: dict | None = None) -> PlanningRun:
    """Islands (Algorithm 1 unless given), the link model and a candidate cache for ``job``
    (``groups``: node groups built already, :attr:`GroupCache.groups`; they hold for any n)."""
    n = n_micro or job.training.n_micro
    if n is None:
        raise ValueError("n_micro must be fixed here; plan_job searches it")
    config = resolved(config, job)
    features = config.features or job.planner.features
    isl = _allowed_islands(job, islands or default_islands(job))
    micro = job.training.global_batch // n
    by_name = {i.name: i for i in isl.islands}
    if cache is None:
        ctx = PlanContext(job.training.seq_len, micro, n, 1, job.planner.epsilon, 1, features,
                          framework=job.planner.framework, precision=job.training.precision,
                          constraints=job.constraints.on_stages(), **state_types(job))
        cache = GroupCache(job.model, by_name, parallelizer or AnalyticParallelizer(features), ctx,
                           dedupe=Rule.DEDUPE in config.rules,
                           groups={} if groups is None else groups)
    else:
        cache = replace(cache, islands={**cache.islands, **by_name}, entries=cache.entries,
                        calls=0, mismatches=0)
    return PlanningRun(job, config, isl, cache, link_model(job, micro), n, view)


def default_islands(job: JobSpec) -> IslandSet:
    """The islands of a run started without a view (``tangram verify``, the bench): of the
    runtime's runnable island sets (:func:`runnable_views`: one vendor, the job's precision),
    the one of most GEMM throughput (TFLOP/s × the GPUs' large-GEMM efficiency). The planner
    itself tries every view (:func:`views`)."""
    parts = [v for v, name in runnable_views(job, cluster_islands(job), whole=False)]
    return max(parts, key=lambda v: sum(n.gpus * n.tflops * n.gpu.gemm_eff
                                        for i in v.islands for n in i.nodes))


def cluster_islands(job: JobSpec) -> IslandSet:
    """Algorithm 1's islands of the job's cluster (they depend on the cluster and the
    planner's thresholds only, so jobs on one cluster may share them)."""
    return build_islands(job.cluster, Thresholds.of(job.planner))


def job_islands(job: JobSpec) -> IslandSet:
    """Algorithm 1's islands of the job's cluster, after its ``[constraints]``."""
    return _allowed_islands(job, cluster_islands(job))


def _allowed_islands(job: JobSpec, isl: IslandSet) -> IslandSet:
    """``isl`` without the islands ``[constraints]`` leaves out (one-line error when a named
    island does not exist, or none is left)."""
    c = job.constraints
    if c.islands is None and c.exclude_islands is None:
        return isl
    known = {i.name for i in isl.islands} | {i.gpu.name for i in isl.islands}
    for key, names in (("islands", c.islands), ("exclude_islands", c.exclude_islands)):
        unknown = sorted(set(names or ()) - known)
        if unknown:  # ``isl`` may be one vendor's part (:func:`runnable_views`)
            whole = cluster_islands(job).islands
            known |= {i.name for i in whole} | {i.gpu.name for i in whole}
            unknown = sorted(set(names or ()) - known)
        if unknown:
            raise InputError(str(job.path or job.name), f"constraints.{key}",
                             f"no island or GPU type {unknown[0]!r} (islands: "
                             f"{', '.join(sorted(i.name for i in isl.islands))})")
    kept = tuple(i for i in isl.islands if c.allows_island(i))
    if not kept:
        raise InputError(str(job.path or job.name), "constraints.islands",
                         "leaves no island to plan on")
    return replace(isl, islands=kept)


def views(job: JobSpec, config: PlannerConfig, n: int, parallelizer: Parallelizer,
          groups: dict | None = None, islands: IslandSet | None = None) -> list[PlanningRun]:
    """The runs of one ``n_micro``: Algorithm 1's islands (``islands``, when built already:
    :func:`cluster_islands`), then the whole cluster (``groups``: see :func:`start_run`); one
    pair per GPU vendor, of the islands whose GPUs run the job's precision
    (:func:`runnable_views`)."""
    runs: list[PlanningRun] = []
    for isl, view in runnable_views(job, islands or cluster_islands(job), config.whole_cluster):
        # Groups of equal figures share their options across views (the cache is keyed so).
        runs.append(start_run(job, config, n, parallelizer, isl, view, groups=groups,
                              cache=runs[0].cache if runs else None))
    return runs


def runnable_views(job: JobSpec, isl: IslandSet, whole: bool = True
                   ) -> list[tuple[IslandSet, str]]:
    """The island sets a plan of ``job`` may use, each with its view name: per GPU vendor (a
    job's meshes share one communicator: :func:`~solver.cost.runtime.frameworks.vendor_problem`), the
    islands whose GPUs all run the job's precision
    (:func:`~solver.cost.runtime.frameworks.precision_problem`), then, with ``whole`` and more than
    one such island, the vendor's runnable nodes as one island. One-line error when no GPU of
    the cluster runs the precision."""
    precision = job.training.precision
    runs_it = (lambda gpu: precision_problem(gpu, precision) is None)
    restricted = job.constraints.islands is not None or job.constraints.exclude_islands is not None
    out = []
    isl = _allowed_islands(job, isl)
    for vendor in vendors(job.cluster):
        kept = tuple(i for i in isl.islands if i.nodes[0].gpu.vendor == vendor
                     and all(runs_it(x.gpu) for x in i.nodes))
        if not kept:
            continue
        out.append((replace(isl, islands=kept), VIEW_ISLANDS))
        if whole and len(kept) > 1 and not restricted:
            out += [(w, VIEW_WHOLE) for w in whole_cluster_views(
                vendor_cluster(job.cluster, vendor), runs_it)]
    if not out:
        gpus = sorted({n.gpu.name for n in job.cluster.nodes})
        raise InputError(str(job.path or job.name), "training.precision",
                         precision_problem(next(n.gpu for n in job.cluster.nodes),
                                           precision) or f"no GPU of {gpus} runs it")
    return out
