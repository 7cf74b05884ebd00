"""Launch: a validated plan as the runtime's own configuration.

Takes a :class:`~solver.planner.plan.Plan` (and its job) and hands on text a runtime reads:
FlagScale's heterogeneous-training YAML (:mod:`solver.launch.flagscale`) or Megatron-LM's
command-line arguments (:mod:`solver.launch.megatron`). A plan the runtime cannot express raises
:class:`~solver.launch.meshes.NotExpressible` naming why.
"""

from solver.launch.flagscale import flagscale_config, flagscale_yaml
from solver.launch.megatron import megatron_args
from solver.launch.meshes import Mesh, NotExpressible, meshes

__all__ = ["Mesh", "NotExpressible", "flagscale_config", "flagscale_yaml", "megatron_args",
           "meshes"]
