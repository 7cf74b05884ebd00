"""Step 1, the problem as the user states it: job, model, cluster and GPU catalog, validated.

Takes in the instance files (``instances/gpus.toml``, model TOML or HuggingFace ``config.json``,
cluster and job TOML) and hands on frozen domain objects (:class:`JobSpec` with its
:class:`ModelSpec`, :class:`ClusterSpec`, :class:`TrainingSpec`, :class:`PlannerOptions`).
Every value is checked here, once (:mod:`solver.spec.fields`); bad input raises
:class:`InputError`, a well-formed problem without answer :class:`InfeasibleError`.
"""

from solver.spec.domain import (ClusterSpec, FeaturePreset, GPUSpec, Island, JobSpec, Node,
                                NodeGroup, PlannerOptions, Recompute, Schedule, SolverKind,
                                TrainingSpec)
from solver.spec.errors import InfeasibleError, InputError
from solver.spec.loaders import (INSTANCES, load_catalog, load_cluster, load_job, load_model,
                                 load_model_ref)
from solver.spec.model import ModelSpec

__all__ = ["ClusterSpec", "FeaturePreset", "GPUSpec", "INSTANCES", "InfeasibleError",
           "InputError", "Island", "JobSpec", "ModelSpec", "Node", "NodeGroup",
           "PlannerOptions", "Recompute", "Schedule", "SolverKind", "TrainingSpec",
           "load_catalog", "load_cluster", "load_job", "load_model", "load_model_ref"]
