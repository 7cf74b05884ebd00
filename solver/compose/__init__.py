"""Step 4, exact composition of a latency table into one pipeline.

Takes in a :class:`LatencyTable` (per island, slice length and position, seconds per
micro-batch; link times between islands) and optional :class:`Restrictions` (the pruning rules
as masks, a stage limit, a budget). Hands on a :class:`CompositionResult`: the stages (island,
half-open layer range) minimizing ``T = (n-1)·max + Σ``, with its proof status. The exact DP
(:func:`compose_dp`) is the fast path; :func:`compose_brute` is the ground truth for tiny
tables; CP-SAT and MILP models of the same decision live in ``formulations/``. Composition
never sees a GPU: every algorithm can be tested on tables alone.
"""

from solver.compose.brute import compose_brute, compose_paper_recurrence
from solver.compose.dp import MAX_DP_ISLANDS, compose_dp, explain_infeasible
from solver.compose.result import (CompositionResult, SolveStatus, StageAssignment, TooLargeError,
                                   make_stages, objective_of, plan_problems)
from solver.compose.table import (POSITIONS, Budget, LatencyTable, Position, Restrictions,
                                  load_table, slice_position, table_from_dict)

__all__ = ["Budget", "CompositionResult", "LatencyTable", "MAX_DP_ISLANDS", "POSITIONS",
           "Position", "Restrictions", "SolveStatus", "StageAssignment", "TooLargeError",
           "compose_brute", "compose_dp", "compose_paper_recurrence", "explain_infeasible",
           "load_table", "make_stages", "objective_of", "plan_problems", "slice_position",
           "table_from_dict"]
