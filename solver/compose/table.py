"""The latency table: the seam between "inside an island" and "across islands".

Composition sees only numbers per (island, slice length, position) plus link times, never GPUs, so
every composition algorithm can be tested on tables alone. This module holds the table, the
pruning restrictions that mask it, the JSON loader (public format, below) and the dense NumPy view
the solvers share.

JSON format (public contract)::

    {"layers": L, "n_micro": n, "islands": ["A", "B"],
     "latency": {"A": [tau(1), ..., tau(L)],                      # same list for every position
                 "B": {"first": [...], "middle": [...], "last": [...], "only": [...]}},
     "link": {"A": {"B": 0.002}},                                  # optional, missing pairs are 0
     "use_all": false}                                             # optional

``null`` marks an infeasible (island, length, position). Entry ``i`` of a list is the latency of a
slice of ``i + 1`` layers, in seconds per micro-batch.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping, Sequence

import numpy as np

from solver.spec.errors import InputError
from solver.spec.fields import read_json

MAX_LAYERS = 100_000
MAX_ISLANDS = 64
MAX_MICRO = 10**9
_TOP_KEYS = ("layers", "n_micro", "islands", "latency", "link", "use_all")


class Position(enum.Enum):
    """Where a slice sits in the pipeline; first/last stages carry the embedding / LM head."""

    FIRST = "first"    #: holds layer 0 (embedding) but not layer L-1
    MIDDLE = "middle"  #: holds neither end
    LAST = "last"      #: holds layer L-1 (LM head) but not layer 0
    ONLY = "only"      #: a single stage holding the whole model


POSITIONS: tuple[Position, ...] = tuple(Position)


def slice_position(start: int, end: int, layers: int) -> Position:
    """Position of the half-open slice ``[start, end)`` in a model of ``layers`` layers."""
    if start == 0:
        return Position.ONLY if end == layers else Position.FIRST
    return Position.LAST if end == layers else Position.MIDDLE


def position_index(start: int, end: int, layers: int) -> int:
    """Index of the slice's position in :data:`POSITIONS` (the dense arrays' second axis)."""
    return POSITIONS.index(slice_position(start, end, layers))


@dataclass(frozen=True)
class LatencyTable:
    """Per-micro-batch latencies of every (island, slice length, position) and the link times.

    Attributes
    ----------
    layers : int
        Number of model layers ``L`` (1..100000).
    n_micro : int
        Micro-batches per iteration ``n`` (>= 1).
    islands : tuple[str, ...]
        Distinct island names; their index is the island index used by all solvers.
    latency : Mapping[str, Mapping[Position, tuple[float | None, ...]]]
        Per island and position, ``L`` latencies (seconds) for slice lengths 1..L; ``None`` marks
        an infeasible entry. A plain sequence given for an island means "same for all positions".
    link : Mapping[tuple[str, str], float]
        Seconds per micro-batch to send activations from the first island to the second when they
        are consecutive stages; missing pairs cost 0.
    use_all : bool
        When true every island must hold a slice.
    source : str
        File the table came from, for error messages only.
    """

    layers: int
    n_micro: int
    islands: tuple[str, ...]
    latency: Mapping[str, Any]
    link: Mapping[tuple[str, str], float] = field(default_factory=dict)
    use_all: bool = False
    source: str = field(default="<table>", compare=False, repr=False)

    def __post_init__(self) -> None:
        _validate(self)
        # Freeze the containers too, so a table can be shared between solvers safely.
        object.__setattr__(self, "islands", tuple(self.islands))
        lat = {name: MappingProxyType(_normalize_rows(self.latency[name])) for name in self.islands}
        object.__setattr__(self, "latency", MappingProxyType(lat))
        links = {(a, b): float(v) for (a, b), v in self.link.items()}
        object.__setattr__(self, "link", MappingProxyType(links))

    def tau(self, island: str, start: int, end: int) -> float | None:
        """Latency of ``island`` running layers ``[start, end)`` (None when infeasible)."""
        pos = slice_position(start, end, self.layers)
        return self.latency[island][pos][end - start - 1]

    def link_time(self, a: str, b: str) -> float:
        """Transfer time from island ``a`` to the next stage on island ``b`` (0 when absent)."""
        return self.link.get((a, b), 0.0)


def _normalize_rows(rows: Any) -> dict[Position, tuple[float | None, ...]]:
    if isinstance(rows, Mapping):
        return {p: _row(rows[p if p in rows else p.value]) for p in POSITIONS}
    row = _row(rows)
    return {p: row for p in POSITIONS}


def _row(values: Any) -> tuple[float | None, ...]:
    return tuple(None if v is None else float(v) for v in values)


def _validate(t: LatencyTable) -> None:
    """All checks of a table, in one place; raises InputError naming the offending key."""
    src = t.source
    _check_int(src, "layers", t.layers, 1, MAX_LAYERS)
    _check_int(src, "n_micro", t.n_micro, 1, MAX_MICRO)
    if not isinstance(t.use_all, bool):
        raise InputError(src, "use_all", "must be true or false")
    _check_islands(src, t.islands)
    if not isinstance(t.latency, Mapping):
        raise InputError(src, "latency", "must be an object mapping island names to latencies")
    for name in t.latency:
        if name not in t.islands:
            raise InputError(src, f"latency.{name}", f"unknown island (islands: {list(t.islands)})")
    for name in t.islands:
        if name not in t.latency:
            raise InputError(src, f"latency.{name}", "missing latencies for this island")
        _check_island_rows(src, f"latency.{name}", t.latency[name], t.layers)
    _check_links(src, t.link, t.islands)


def _check_int(src: str, key: str, value: Any, lo: int, hi: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InputError(src, key, f"must be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise InputError(src, key, f"must be in {lo}..{hi}, got {value}")


def _check_islands(src: str, islands: Any) -> None:
    if not isinstance(islands, (list, tuple)) or not islands:
        raise InputError(src, "islands", "must be a non-empty list of island names")
    if len(islands) > MAX_ISLANDS:
        raise InputError(src, "islands", f"at most {MAX_ISLANDS} islands, got {len(islands)}")
    for i, name in enumerate(islands):
        if not isinstance(name, str) or not name:
            raise InputError(src, f"islands[{i}]", f"must be a non-empty string, got {name!r}")
        if name in islands[:i]:
            raise InputError(src, f"islands[{i}]", f"duplicate island name {name!r}")


def _check_island_rows(src: str, key: str, rows: Any, layers: int) -> None:
    if isinstance(rows, Mapping):
        for pos in rows:
            if pos not in POSITIONS and pos not in [p.value for p in POSITIONS]:
                raise InputError(src, f"{key}.{pos}",
                                 "unknown position (first, middle, last, only)")
        for pos in POSITIONS:
            if pos not in rows and pos.value not in rows:
                raise InputError(src, f"{key}.{pos.value}", "missing position list")
            _check_row(src, f"{key}.{pos.value}", rows.get(pos, rows.get(pos.value)), layers)
    else:
        _check_row(src, key, rows, layers)


def _check_row(src: str, key: str, row: Any, layers: int) -> None:
    if not isinstance(row, (list, tuple)):
        raise InputError(src, key, "must be a list of latencies (or an object of 4 position lists)")
    if len(row) != layers:
        raise InputError(src, key,
                         f"must have {layers} entries (lengths 1..{layers}), got {len(row)}")
    for i, v in enumerate(row):
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise InputError(src, f"{key}[{i}]", f"must be a number or null, got {v!r}")
        if not math.isfinite(v) or v < 0:
            raise InputError(src, f"{key}[{i}]", f"must be finite and >= 0, got {v!r}")


def _check_links(src: str, link: Any, islands: tuple[str, ...]) -> None:
    if not isinstance(link, Mapping):
        raise InputError(src, "link", "must map (from, to) island pairs to seconds")
    for pair, v in link.items():
        if not (isinstance(pair, tuple) and len(pair) == 2):
            raise InputError(src, f"link.{pair}", "key must be a (from, to) pair")
        a, b = pair
        for end in (a, b):
            if end not in islands:
                raise InputError(src, f"link.{a}.{b}", f"unknown island {end!r}")
        if a == b:
            raise InputError(src, f"link.{a}.{b}", "an island is never followed by itself")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise InputError(src, f"link.{a}.{b}", f"must be a finite number >= 0, got {v!r}")


def table_from_dict(d: Any, source: str = "<dict>") -> LatencyTable:
    """Build a table from parsed JSON (format in the module docstring); errors name the key."""
    if not isinstance(d, dict):
        raise InputError(source, "<file>", "must be a JSON object")
    for key in d:
        if key not in _TOP_KEYS:
            raise InputError(source, str(key), f"unknown key (allowed: {', '.join(_TOP_KEYS)})")
    for key in ("layers", "n_micro", "islands", "latency"):
        if key not in d:
            raise InputError(source, key, "missing required key")
    return LatencyTable(layers=d["layers"], n_micro=d["n_micro"], islands=_islands(d, source),
                        latency=d["latency"], link=_links(d.get("link", {}), source),
                        use_all=d.get("use_all", False), source=source)


def _islands(d: dict, source: str) -> tuple:
    raw = d["islands"]
    if not isinstance(raw, list):
        raise InputError(source, "islands", "must be a list of island names")
    return tuple(raw)


def _links(raw: Any, source: str) -> dict[tuple[str, str], Any]:
    if not isinstance(raw, dict):
        raise InputError(source, "link", "must be an object {from: {to: seconds}}")
    out: dict[tuple[str, str], Any] = {}
    for a, row in raw.items():
        if not isinstance(row, dict):
            raise InputError(source, f"link.{a}", "must be an object {to: seconds}")
        out.update({(a, b): v for b, v in row.items()})
    return out


def load_table(path: Path | str) -> LatencyTable:
    """Read and validate a latency-table JSON file."""
    return table_from_dict(read_json(path), source=str(path))


#: Relative tolerance of budget checks (sums of float rates in different orders must agree).
BUDGET_RTOL = 1e-9


@dataclass(frozen=True)
class Budget:
    """A cap on an additive per-island rate (e.g. $/h or W) summed over the islands a plan uses.

    Attributes
    ----------
    rates : Mapping[str, float]
        Island -> its rate while it holds a slice (finite, >= 0); every island of the table.
    limit : float
        Largest allowed sum over the used islands (within :data:`BUDGET_RTOL`).
    """

    rates: Mapping[str, float]
    limit: float

    def allows(self, islands: Sequence[str]) -> bool:
        """Whether using exactly ``islands`` stays within the limit."""
        return sum(self.rates[name] for name in islands) <= self.limit * (1 + BUDGET_RTOL)

    def allowed_masks(self, islands: Sequence[str]) -> np.ndarray:
        """``allowed[mask]`` for every subset of ``islands`` as a bitmask (bit k = island k)."""
        rates = np.array([self.rates[name] for name in islands], dtype=float)
        masks = np.arange(1 << len(islands))
        bits = (masks[:, None] >> np.arange(len(islands))) & 1
        return bits @ rates <= self.limit * (1 + BUDGET_RTOL)


@dataclass(frozen=True)
class Restrictions:
    """The planner's pruning rules as masks on the table (each switchable by leaving it empty).

    Attributes
    ----------
    length_window : Mapping[str, tuple[int, int]]
        Balance rule: island -> inclusive (lo, hi) slice lengths it may take.
    memory_cap : Mapping[tuple[str, Position], int]
        Memory rule: (island, position) -> longest slice that fits in memory there.
    banned_links : frozenset[tuple[str, str]]
        Interface rule: ordered island pairs that may not be consecutive stages.
    max_stages : int | None
        At most this many pipeline stages (the planner composes one table per pipeline depth).
    budget : Budget | None
        The used islands' rates must add up to at most the budget's limit (multi-objective plans).
    """

    length_window: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    memory_cap: Mapping[tuple[str, Position], int] = field(default_factory=dict)
    banned_links: frozenset[tuple[str, str]] = frozenset()
    max_stages: int | None = None
    budget: Budget | None = None

    def check(self, table: LatencyTable) -> None:
        """Raise InputError when a restriction names an unknown island or a bad length."""
        src = "<restrictions>"
        for name, (lo, hi) in self.length_window.items():
            if name not in table.islands or not 1 <= lo <= hi:
                raise InputError(src, f"length_window.{name}", f"bad window ({lo}, {hi})")
        for (name, pos), cap in self.memory_cap.items():
            if name not in table.islands or not isinstance(pos, Position) or cap < 0:
                raise InputError(src, f"memory_cap.{name}", f"bad cap {cap} at {pos}")
        for a, b in self.banned_links:
            if a not in table.islands or b not in table.islands:
                raise InputError(src, f"banned_links.{a}.{b}", "unknown island")
        if self.max_stages is not None and self.max_stages < 1:
            raise InputError(src, "max_stages", f"must be >= 1, got {self.max_stages}")
        if self.budget is not None:
            _check_budget(src, self.budget, table)


def _check_budget(src: str, budget: Budget, table: LatencyTable) -> None:
    for name in table.islands:
        rate = budget.rates.get(name)
        if not isinstance(rate, (int, float)) or not math.isfinite(rate) or rate < 0:
            raise InputError(src, f"budget.rates.{name}", f"must be a finite rate >= 0, got {rate!r}")
    for name in budget.rates:
        if name not in table.islands:
            raise InputError(src, f"budget.rates.{name}", "unknown island")
    if not math.isfinite(budget.limit) or budget.limit < 0:
        raise InputError(src, "budget.limit", f"must be finite and >= 0, got {budget.limit!r}")


def dense_arrays(table: LatencyTable,
                 restrictions: Restrictions | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Latencies as ``tau[k, p, length]`` (p indexes ``POSITIONS``) and links as ``link[k, k2]``.

    Infeasible entries are ``inf`` (``tau[:, :, 0]`` is always ``inf``). Restrictions, if given,
    are applied as masks: lengths outside a window or above a memory cap and banned links become
    ``inf``. This is how the DP and the brute-force enumerator apply the pruning rules.
    """
    big_k, big_l = len(table.islands), table.layers
    tau = np.full((big_k, len(POSITIONS), big_l + 1), np.inf)
    for k, name in enumerate(table.islands):
        for p, pos in enumerate(POSITIONS):
            row = np.array([np.inf if v is None else v for v in table.latency[name][pos]])
            tau[k, p, 1:] = row
    link = np.zeros((big_k, big_k))
    index = {name: k for k, name in enumerate(table.islands)}
    for (a, b), v in table.link.items():
        link[index[a], index[b]] = v
    if restrictions is not None:
        _mask(tau, link, table, restrictions, index)
    return tau, link


def _mask(tau: np.ndarray, link: np.ndarray, table: LatencyTable, r: Restrictions,
          index: dict[str, int]) -> None:
    r.check(table)
    lengths = np.arange(table.layers + 1)
    for name, (lo, hi) in r.length_window.items():
        tau[index[name], :, (lengths < lo) | (lengths > hi)] = np.inf
    for (name, pos), cap in r.memory_cap.items():
        tau[index[name], POSITIONS.index(pos), lengths > cap] = np.inf
    for a, b in r.banned_links:
        link[index[a], index[b]] = np.inf
