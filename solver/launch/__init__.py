"""Launch: a validated plan as the runtime's own configuration.

Takes a :class:`~solver.planner.plan.Plan` (and its job) and hands on text a runtime reads:
FlagScale's experiment YAML and hostfile (:mod:`solver.launch.flagscale`) or Megatron-LM's
arguments and launch line (:mod:`solver.launch.megatron`); the model block of both comes from
the model's architecture fields (:mod:`solver.launch.model_flags`). A plan the runtime cannot
express raises :class:`~solver.launch.errors.NotExpressible` naming why;
:mod:`solver.launch.flagscale_check` judges a FlagScale export by FlagScale's own rules and
:mod:`solver.launch.flagscale_read` reads one back.
"""

from solver.launch.errors import NotExpressible
from solver.launch.flagscale import (flagscale_config, flagscale_experiment, flagscale_hostfile,
                                     flagscale_yaml)
from solver.launch.megatron import megatron_args, megatron_launch
from solver.launch.meshes import Mesh, meshes

__all__ = ["Mesh", "NotExpressible", "flagscale_config", "flagscale_experiment",
           "flagscale_hostfile", "flagscale_yaml", "megatron_args", "megatron_launch", "meshes"]
