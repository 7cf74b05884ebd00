"""The slice-to-island assignment model, written once for both CP-SAT and the PuLP MILP.

Formulation (by slice *length*, not by layer range). A stage's latency depends only on its island,
its length and its position (first/middle/last/only), and link costs only on which island follows
which; the layer ranges then follow from the order. So:

* ``s[k, d, p]`` = 1 when island ``k`` takes a slice of ``d`` layers at position ``p`` (only for
  non-null entries; ONLY needs ``d = L``, FIRST/LAST ``d <= L-1``, MIDDLE ``d <= L-2``);
* ``z[k, k2]`` = 1 when ``k2``'s stage directly follows ``k``'s; an order variable ``u_k``
  (Miller–Tucker–Zemlin) rules out cycles, so the used islands form one chain first → last;
* ``M`` the bottleneck; minimize ``(n-1)·M + Σ τ·s + Σ c·z`` (overlap: ``(n-1)·M + Σ e_k`` with
  ``e_k >= τ_k`` and ``e_k >= c_{k,k2}·z_{k,k2}``).

This has ``≤ 4·K·L + K²`` binaries instead of ``K·L²/2`` for an (island, start, end) model, and the
same optimum. Each backend supplies a small :class:`Backend` (variable factory, constraint sink,
coefficient conversion); the solver objects themselves never leave the backend module.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

from solver.compose.result import StageAssignment, TooLargeError, make_stages
from solver.compose.table import POSITIONS, LatencyTable, Position, Restrictions

MAX_CHOICE_VARS = 200_000  # s variables (4·K·L); beyond this use the DP
BUDGET_UNITS = 1_000_000  # budget rates are modelled in micro-units ($/h, W, ...)


class Backend(Protocol):
    """What the shared builder needs from a modelling library."""

    def new_bool(self, name: str) -> Any: ...
    def new_value(self, name: str, hi: float) -> Any: ...
    def coeff(self, seconds: float) -> float: ...
    def total(self, terms: Sequence[Any]) -> Any: ...
    def add(self, constraint: Any, name: str) -> None: ...
    def add_max(self, target: Any, exprs: Sequence[Any], name: str) -> None: ...


@dataclass(frozen=True)
class Choice:
    """A feasible (island, length, position) entry of the table: island index ``k``."""

    k: int
    length: int
    position: Position
    tau: float


@dataclass(frozen=True)
class AssignmentModel:
    """Handles of a built model: choice variables (same order as ``choices``) and successors."""

    choices: tuple[Choice, ...]
    s: tuple[Any, ...]
    z: dict[tuple[int, int], Any]
    objective: Any


def feasible_choices(table: LatencyTable) -> tuple[Choice, ...]:
    """Every non-null (island, length, position) usable in an L-layer pipeline."""
    big_l = table.layers
    if 4 * len(table.islands) * big_l > MAX_CHOICE_VARS:
        raise TooLargeError(f"the assignment model would have {4 * len(table.islands) * big_l} "
                            f"choice variables (limit {MAX_CHOICE_VARS}); use the DP")
    # Longest usable length per position: ONLY holds everything, FIRST/LAST leave >= 1 layer,
    # MIDDLE leaves >= 1 layer on each side.
    span = {Position.ONLY: (big_l, big_l), Position.FIRST: (1, big_l - 1),
            Position.LAST: (1, big_l - 1), Position.MIDDLE: (1, big_l - 2)}
    out = []
    for k, name in enumerate(table.islands):
        for pos in POSITIONS:
            lo, hi = span[pos]
            for d in range(lo, hi + 1):
                tau = table.latency[name][pos][d - 1]
                if tau is not None:
                    out.append(Choice(k, d, pos, tau))
    return tuple(out)


def trivially_infeasible(table: LatencyTable, choices: Sequence[Choice]) -> bool:
    """True when no entry can hold layer 0 or layer L-1, or use_all meets an unusable island.

    Checked before modelling so that no backend ever sees a constraint without variables.
    """
    heads = {Position.FIRST, Position.ONLY}
    tails = {Position.LAST, Position.ONLY}
    if not any(c.position in heads for c in choices):
        return True
    if not any(c.position in tails for c in choices):
        return True
    return table.use_all and len({c.k for c in choices}) < len(table.islands)


def build_model(be: Backend, table: LatencyTable, restrictions: Restrictions | None,
                overlap: bool) -> AssignmentModel | None:
    """Variables, constraints and objective on backend ``be`` (None if trivially infeasible)."""
    if restrictions is not None:
        restrictions.check(table)
    choices = feasible_choices(table)
    if trivially_infeasible(table, choices):
        return None
    s = tuple(be.new_bool(f"s_{c.k}_{c.length}_{c.position.value}") for c in choices)
    big_k = len(table.islands)
    z = {(a, b): be.new_bool(f"z_{a}_{b}") for a in range(big_k) for b in range(big_k) if a != b}
    roles = _roles(be, choices, s, big_k)
    add_cover_layers(be, choices, s, table.layers)
    add_island_once(be, roles["used"], table.use_all, {c.k for c in choices})
    add_pipeline_ends(be, roles)
    add_stage_order(be, z, roles, big_k)
    if restrictions is not None:
        add_balance_window(be, choices, s, table, restrictions)
        add_memory_cap(be, choices, s, table, restrictions)
        add_interface_ban(be, z, table, restrictions)
        add_stage_limit(be, roles["used"], restrictions)
        add_budget(be, roles["used"], table, restrictions, {c.k for c in choices})
    lat = add_island_latency(be, choices, s, big_k)
    links = {(a, b): be.coeff(table.link_time(table.islands[a], table.islands[b])) * v
             for (a, b), v in z.items()
             if table.link_time(table.islands[a], table.islands[b]) > 0}
    objective = add_bottleneck(be, lat, links, table, overlap)
    return AssignmentModel(choices, s, z, objective)


def _roles(be: Backend, choices: Sequence[Choice], s: Sequence[Any], big_k: int) -> dict:
    """Per island, linear expressions: used, holds layer 0 (head), holds layer L-1 (tail)."""
    terms: dict[str, dict[int, list]] = {r: defaultdict(list) for r in ("used", "head", "tail")}
    for c, v in zip(choices, s):
        terms["used"][c.k].append(v)
        if c.position in (Position.FIRST, Position.ONLY):
            terms["head"][c.k].append(v)
        if c.position in (Position.LAST, Position.ONLY):
            terms["tail"][c.k].append(v)
    return {r: [be.total(t[k]) for k in range(big_k)] for r, t in terms.items()}


def add_cover_layers(be: Backend, choices: Sequence[Choice], s: Sequence[Any], layers: int) -> None:
    """The chosen slices' lengths add up to the model: every layer is covered exactly once."""
    be.add(be.total([c.length * v for c, v in zip(choices, s)]) == layers, "cover_layers")


def add_island_once(be: Backend, used: Sequence[Any], use_all: bool, present: set[int]) -> None:
    """Each island holds at most one slice (exactly one when use_all)."""
    for k, u in enumerate(used):
        if k in present:  # an island without any feasible entry is unused anyway
            be.add(u == 1 if use_all else u <= 1, f"island_once_{k}")


def add_pipeline_ends(be: Backend, roles: dict) -> None:
    """Exactly one stage holds the embedding (layer 0) and exactly one the LM head (layer L-1)."""
    be.add(be.total(roles["head"]) == 1, "one_first_stage")
    be.add(be.total(roles["tail"]) == 1, "one_last_stage")


def add_stage_order(be: Backend, z: dict, roles: dict, big_k: int) -> None:
    """Used islands form one chain: each has one successor unless last, one predecessor unless
    first, and order numbers increase along the chain (no detached cycles)."""
    used, head, tail = roles["used"], roles["head"], roles["tail"]
    order = [be.new_value(f"order_{k}", big_k - 1) for k in range(big_k)]
    for k in range(big_k):
        succ = [z[k, b] for b in range(big_k) if b != k]
        pred = [z[a, k] for a in range(big_k) if a != k]
        be.add(be.total(succ) == used[k] - tail[k], f"successor_{k}")
        be.add(be.total(pred) == used[k] - head[k], f"predecessor_{k}")
    for (a, b), v in z.items():
        be.add(order[b] >= order[a] + 1 - big_k * (1 - v), f"chain_order_{a}_{b}")


def add_balance_window(be: Backend, choices: Sequence[Choice], s: Sequence[Any],
                       table: LatencyTable, r: Restrictions) -> None:
    """Balance rule: an island only takes slice lengths inside its allowed window."""
    for c, v in zip(choices, s):
        lo, hi = r.length_window.get(table.islands[c.k], (1, table.layers))
        if not lo <= c.length <= hi:
            be.add(v == 0, f"balance_{c.k}_{c.length}_{c.position.value}")


def add_memory_cap(be: Backend, choices: Sequence[Choice], s: Sequence[Any],
                   table: LatencyTable, r: Restrictions) -> None:
    """Memory rule: a slice longer than what fits on the island at its position is forbidden."""
    for c, v in zip(choices, s):
        cap = r.memory_cap.get((table.islands[c.k], c.position))
        if cap is not None and c.length > cap:
            be.add(v == 0, f"memory_{c.k}_{c.length}_{c.position.value}")


def add_interface_ban(be: Backend, z: dict, table: LatencyTable, r: Restrictions) -> None:
    """Interface rule: a banned island pair is never consecutive in the pipeline."""
    index = {name: k for k, name in enumerate(table.islands)}
    for a, b in sorted(r.banned_links):
        if a != b:
            be.add(z[index[a], index[b]] == 0, f"ban_{index[a]}_{index[b]}")


def add_stage_limit(be: Backend, used: Sequence[Any], r: Restrictions) -> None:
    """Pipeline depth: at most ``max_stages`` islands hold a slice."""
    if r.max_stages is not None:
        be.add(be.total(used) <= r.max_stages, "stage_limit")


def add_budget(be: Backend, used: Sequence[Any], table: LatencyTable, r: Restrictions,
               present: set[int]) -> None:
    """Budget: the rates of the used islands ($/h, W, ...) add up to at most the limit.

    Rates are integers in units of ``1 / BUDGET_UNITS`` (CP-SAT needs integer coefficients); the
    right-hand side gets ``K/2 + 1`` units of slack for the per-term rounding, so a set whose
    exact sum equals the limit is never cut off (tolerance ``(K/2 + 1) / BUDGET_UNITS``).
    """
    if r.budget is None:
        return
    terms = [round(r.budget.rates[table.islands[k]] * BUDGET_UNITS) * used[k]
             for k in sorted(present)]
    slack = len(table.islands) // 2 + 1
    limit = round(r.budget.limit * BUDGET_UNITS) + slack
    if terms:  # no island has a feasible entry: nothing to constrain
        be.add(be.total(terms) <= limit, "budget")


def add_island_latency(be: Backend, choices: Sequence[Choice], s: Sequence[Any],
                       big_k: int) -> list[Any]:
    """Per island, the latency of its slice at its position (0 when unused)."""
    per: dict[int, list] = defaultdict(list)
    top: dict[int, float] = defaultdict(float)
    for c, v in zip(choices, s):
        per[c.k].append(be.coeff(c.tau) * v)
        top[c.k] = max(top[c.k], be.coeff(c.tau))
    lat = []
    for k in range(big_k):
        var = be.new_value(f"lat_{k}", top[k])
        be.add(var == be.total(per[k]), f"latency_{k}")
        lat.append(var)
    return lat


def add_bottleneck(be: Backend, lat: list[Any], links: dict[tuple[int, int], Any],
                   table: LatencyTable, overlap: bool) -> Any:
    """The slowest stage (or link) paces the pipeline: returns the objective ``(n-1)·M + Σ``."""
    entries = [v for rows in table.latency.values() for row in rows.values() for v in row
               if v is not None] + list(table.link.values())
    top = be.coeff(max(entries, default=0.0))
    bottleneck = be.new_value("bottleneck", top)
    if not overlap:
        be.add_max(bottleneck, list(lat) + list(links.values()), "bottleneck")
        return (table.n_micro - 1) * bottleneck + be.total(lat) + be.total(list(links.values()))
    stage_costs = []
    for k, lat_k in enumerate(lat):
        e_k = be.new_value(f"stage_cost_{k}", top)  # eq. 9: transfer overlapped with compute
        be.add_max(e_k, [lat_k] + [v for (a, _), v in links.items() if a == k], f"overlap_{k}")
        stage_costs.append(e_k)
    be.add_max(bottleneck, stage_costs, "bottleneck")
    return (table.n_micro - 1) * bottleneck + be.total(stage_costs)


def decode(table: LatencyTable, model: AssignmentModel, chosen: Sequence[bool],
           follows: dict[tuple[int, int], bool]) -> tuple[StageAssignment, ...]:
    """Stages in pipeline order: start at the head island, follow successors, lay out lengths."""
    picked = {c.k: c for c, on in zip(model.choices, chosen) if on}
    succ = {a: b for (a, b), on in follows.items() if on}
    k = next(k for k, c in picked.items() if c.position in (Position.FIRST, Position.ONLY))
    plan, start = [], 0
    while True:
        length = picked[k].length
        plan.append((table.islands[k], start, start + length))
        start += length
        if k not in succ:
            break
        k = succ[k]
    if len(plan) != len(picked) or start != table.layers:
        raise RuntimeError(f"decoded plan is not a single chain: {plan}")  # would be a model bug
    return make_stages(table, plan)
