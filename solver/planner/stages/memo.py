"""The in-memory memo of one search's parallelizer answers (:class:`MemoParallelizer`).

The replica search plans hundreds of replicas on one cluster; an island at a share, and a
group at a micro-batch, come back under many island sets, shares and ``n_micro``. The memo
keeps the inner parallelizer's answers, and what the search derives from one group at one
context (its floors, its group sizes: :meth:`MemoParallelizer.remember`), for the whole
search. The on-disk cache of partial plans across runs is :mod:`solver.planner.stages.plancache`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

from solver.cost.parallelizer import Parallelizer, PartialPlan, PlanContext
from solver.cost.stage import ModelSlice
from solver.cost.stage_options import shares_across_n
from solver.planner.stages.plancache import ForwardsInner, parallelizer_identity
from solver.spec.domain import Island, ModelSpec

__all__ = ["SHARED_MICRO", "MemoParallelizer"]

#: Capacities the memo keeps per stage option: options of every ``n_micro`` up to this many are
#: derived from one evaluation (the most ``n_micro`` the planner searches, MAX_AUTO_MICRO).
SHARED_MICRO = 128


@dataclass
class MemoParallelizer(ForwardsInner):
    """A :class:`~solver.cost.parallelizer.Parallelizer` that remembers every answer in memory
    for the many plans of one search: one model on one cluster. The replica search plans an
    island at a share once per replica set the island is in, and those calls repeat
    (:meth:`~solver.spec.constraints.Constraints.on_stages` keeps the island selection out of
    the context). Keys are cheap because the scope is narrow: the slice's length and position,
    the context, and the island by name, size and first and last node (names are unique in a
    cluster, and a node group is named after its island with nodes of names of its own).
    Answers are the inner parallelizer's, unchanged; a test checks that plans made through
    it are the plans made without.

    Attributes
    ----------
    inner : Parallelizer
        The parallelizer called on a miss.
    max_entries : int
        Answers kept; past it the oldest is forgotten (a fleet's search would otherwise hold
        gigabytes of options).
    inner_calls, hits : int
        Misses and calls answered from memory.
    """

    inner: Parallelizer
    max_entries: int = 30_000
    inner_calls: int = 0
    hits: int = 0
    _seen: dict = field(default_factory=dict, repr=False)

    def _recall(self, key: tuple, compute) -> Any:
        found = self._seen.get(key)
        if found is not None:
            self.hits += 1
            return found
        found = self._seen[key] = compute()
        self.inner_calls += 1
        if len(self._seen) > self.max_entries:
            del self._seen[next(iter(self._seen))]  # the oldest answer
        return found

    @staticmethod
    def _island(island: Island) -> tuple:
        return island.name, len(island.nodes), island.nodes[0].node_id, island.nodes[-1].node_id

    def remember(self, key: tuple, island: Island, compute: Callable[[], Any]) -> Any:
        """``compute()`` for ``key`` on ``island``, remembered like the answers: what the
        search derives from one group at one context (its floors) and asks again under other
        shares and ``n_micro``."""
        return self._recall(key + (self._island(island),), compute)

    def plan(self, slice: ModelSlice, island: Island, context: PlanContext) -> list[PartialPlan]:
        """The inner parallelizer's answer, remembered."""
        key = ("plan", slice.layers, slice.has_embedding, slice.has_head, self._island(island),
               context)
        return self._recall(key, lambda: self.inner.plan(slice, island, context))

    def plan_stages(self, model: ModelSpec, lengths: list[int], has_embedding: bool,
                    has_head: bool, island: Island, context: PlanContext) -> list:
        """The inner options per length (:func:`~solver.planner.stages.candidates.stage_options`),
        remembered per call; or, where the options depend on ``n_micro`` only through their
        capacities' cap (:func:`~solver.cost.stage_options.shares_across_n`), remembered per
        length for every ``n_micro`` up to :data:`SHARED_MICRO` at once
        (:meth:`_candidates`): the replica search asks for one island at one micro-batch
        size under many shares and ``n_micro``."""
        candidates = getattr(self.inner, "stage_candidates", None)
        if candidates is not None and context.n_micro <= SHARED_MICRO and \
                shares_across_n(context):
            return [o.capped(context.n_micro) for o in self._candidates(
                candidates, model, lengths, has_embedding, has_head, island, context)]
        from solver.planner.stages.candidates import stage_options
        return self._recall(("stages", tuple(lengths), has_embedding, has_head,
                             self._island(island), context),
                            lambda: stage_options(self.inner, model, lengths, has_embedding,
                                                  has_head, island, context))

    def _candidates(self, candidates, model: ModelSpec, lengths: list[int], has_embedding: bool,
                    has_head: bool, island: Island, context: PlanContext) -> list:
        """The inner candidates of every length at :data:`SHARED_MICRO` micro-batches (the
        context's in-flight count and internal depth are the stage's own, 1), the missing
        lengths in one call."""
        shared = dataclasses.replace(context, n_micro=SHARED_MICRO, in_flight=1, max_pp=1)
        base = ("candidates", has_embedding, has_head, self._island(island), shared)
        got = {d: self._seen.get(base + (d,)) for d in lengths}
        todo = [d for d, o in got.items() if o is None]
        if todo:
            self.inner_calls += 1
            for d, o in zip(todo, candidates(model, todo, has_embedding, has_head, island,
                                             shared)):
                got[d] = self._seen[base + (d,)] = o
            while len(self._seen) > self.max_entries:
                del self._seen[next(iter(self._seen))]  # the oldest answer
        else:
            self.hits += 1
        return [got[d] for d in lengths]

    def cache_identity(self) -> str:
        """Remembering does not change answers: identify as the inner parallelizer."""
        return parallelizer_identity(self.inner)
