"""The user's limits on the search: the ``[constraints]`` table of a job."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only
    from solver.spec.enums import Recompute, Schedule
    from solver.spec.hardware import Island


@dataclass(frozen=True)
class Constraints:
    """The user's limits on the search (``[constraints]`` of a job); None: unconstrained.

    Every solver honours them: the per-stage ones shape the stage table all solvers compose,
    ``max_stages`` and ``islands`` restrict the composition itself.

    Attributes
    ----------
    tp, cp, ep, zero : tuple[int, ...] | None
        Allowed degrees / ZeRO stages of every stage.
    expert_tp : tuple[int, ...] | None
        Allowed expert tensor-parallel degrees (MoE; the degree in effect, ``tp`` by default).
    recompute : tuple[Recompute, ...] | None
        Allowed recomputation.
    offload : bool | None
        False forbids activation offload.
    a2a_overlap : bool | None
        False forbids the MoE all-to-all overlap (Megatron-Core's
        ``--overlap-moe-expert-parallel-comm``, which needs torch >= 2.6).
    micro_batch : tuple[int, ...] | None
        Allowed sequences per micro-batch per data-parallel rank (Megatron's
        ``--micro-batch-size``).
    schedule : tuple[Schedule, ...] | None
        Allowed pipeline schedules (``1f1b``, ``interleaved``).
    virtual_stages : tuple[int, ...] | None
        Allowed model chunks per GPU of the interleaved schedule.
    pp : tuple[int, ...] | None
        Allowed pipeline depths: the plan's pipeline stages in all (Megatron's
        ``--pipeline-model-parallel-size``; sub-stages of an internal pipeline count).
    max_stages : int | None
        At most this many pipeline stages (sub-stages of an internal pipeline count).
    islands, exclude_islands : tuple[str, ...] | None
        Islands (by name, or by GPU type) to use only / to leave out.
    end_tp, first_dp, last_dp : tuple[int, ...] | None
        Set by the planner, not read from a job: allowed tp of the first and last stages of a
        pipeline of several stages, and allowed dp of each (a tied embedding's rule,
        :mod:`solver.planner.stages.tied`).
    max_replicas : int | None
        At most this many pipeline replicas across islands (``1``: one pipeline; None:
        unlimited, see :mod:`solver.planner.replica.replicas`).
    """

    tp: tuple[int, ...] | None = None
    cp: tuple[int, ...] | None = None
    ep: tuple[int, ...] | None = None
    zero: tuple[int, ...] | None = None
    expert_tp: tuple[int, ...] | None = None
    recompute: tuple["Recompute", ...] | None = None
    offload: bool | None = None
    a2a_overlap: bool | None = None
    micro_batch: tuple[int, ...] | None = None
    schedule: tuple["Schedule", ...] | None = None
    virtual_stages: tuple[int, ...] | None = None
    pp: tuple[int, ...] | None = None
    max_stages: int | None = None
    islands: tuple[str, ...] | None = None
    exclude_islands: tuple[str, ...] | None = None
    max_replicas: int | None = None
    end_tp: tuple[int, ...] | None = None
    first_dp: tuple[int, ...] | None = None
    last_dp: tuple[int, ...] | None = None

    def allows_island(self, island: "Island") -> bool:
        """Whether ``island`` may be used (matched by its name or its GPU type)."""
        names = {island.name, island.gpu.name}
        if self.islands is not None and not names & set(self.islands):
            return False
        return not (self.exclude_islands and names & set(self.exclude_islands))

    def on_stages(self) -> "Constraints":
        """The limits a stage's options depend on: these without the island selection and the
        replica count. Planning contexts carry them, so jobs that differ only in their islands
        (the replicas of :mod:`solver.planner.replica.replicas`) ask the parallelizer the same
        questions about the islands they share."""
        return replace(self, islands=None, exclude_islands=None, max_replicas=None)

    def allows_depth(self, depth: int) -> bool:
        """Whether a pipeline of ``depth`` stages in all is allowed (``pp`` and ``max_stages``)."""
        return (self.pp is None or depth in self.pp) and \
            (self.max_stages is None or depth <= self.max_stages)

    def allows_schedule(self, schedule: "Schedule") -> bool:
        """Whether plans with ``schedule`` may be made."""
        return self.schedule is None or schedule in self.schedule
