"""Every kind of malformed latency table is rejected with an InputError naming the key."""

from __future__ import annotations

import copy
import json

import pytest

from solver.compose.table import (
    LatencyTable,
    Position,
    Restrictions,
    dense_arrays,
    load_table,
    table_from_dict,
)
from solver.spec.errors import InputError

GOOD = {
    "layers": 3,
    "n_micro": 4,
    "islands": ["A", "B"],
    "latency": {"A": [1.0, 2.0, None],
                "B": {"first": [1, 2, 3], "middle": [1, 2, 3], "last": [2, 3, 4],
                      "only": [3, 4, 5]}},
    "link": {"A": {"B": 0.5}},
    "use_all": False,
}


def _with(path: tuple, value, delete: bool = False) -> dict:
    d = copy.deepcopy(GOOD)
    node = d
    for key in path[:-1]:
        node = node[key]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return d


CASES = [
    ("missing layers", _with(("layers",), None, delete=True), "layers"),
    ("missing latency", _with(("latency",), None, delete=True), "latency"),
    ("unknown top key", {**GOOD, "layer": 3}, "layer"),
    ("layers not int", _with(("layers",), 3.5), "layers"),
    ("layers bool", _with(("layers",), True), "layers"),
    ("layers zero", _with(("layers",), 0), "layers"),
    ("layers too many", _with(("layers",), 100_001), "layers"),
    ("n_micro zero", _with(("n_micro",), 0), "n_micro"),
    ("n_micro string", _with(("n_micro",), "4"), "n_micro"),
    ("use_all not bool", _with(("use_all",), 1), "use_all"),
    ("islands not list", _with(("islands",), "A"), "islands"),
    ("islands empty", _with(("islands",), []), "islands"),
    ("island name not str", _with(("islands",), ["A", 7]), "islands[1]"),
    ("duplicate island", _with(("islands",), ["A", "A"]), "islands[1]"),
    ("latency not object", _with(("latency",), [1, 2, 3]), "latency"),
    ("latency unknown island", _with(("latency", "C"), [1, 2, 3]), "latency.C"),
    ("latency missing island", _with(("latency", "B"), None, delete=True), "latency.B"),
    ("wrong list length", _with(("latency", "A"), [1.0, 2.0]), "latency.A"),
    ("latency not list", _with(("latency", "A"), 3.0), "latency.A"),
    ("NaN latency", _with(("latency", "A"), [1.0, float("nan"), 2.0]), "latency.A[1]"),
    ("inf latency", _with(("latency", "A"), [1.0, float("inf"), 2.0]), "latency.A[1]"),
    ("negative latency", _with(("latency", "A"), [1.0, -2.0, 2.0]), "latency.A[1]"),
    ("string latency", _with(("latency", "A"), [1.0, "2", 2.0]), "latency.A[1]"),
    ("bool latency", _with(("latency", "A"), [1.0, True, 2.0]), "latency.A[1]"),
    ("missing position", _with(("latency", "B", "only"), None, delete=True), "latency.B.only"),
    ("unknown position", _with(("latency", "B", "head"), [1, 2, 3]), "latency.B.head"),
    ("position list length", _with(("latency", "B", "last"), [1, 2]), "latency.B.last"),
    ("negative in position", _with(("latency", "B", "middle"), [1, -1, 3]), "latency.B.middle[1]"),
    ("link not object", _with(("link",), [["A", "B", 1]]), "link"),
    ("link row not object", _with(("link", "A"), 0.5), "link.A"),
    ("link unknown from", _with(("link", "C"), {"A": 1.0}), "link.C.A"),
    ("link unknown to", _with(("link", "A", "Z"), 1.0), "link.A.Z"),
    ("link self", _with(("link", "A", "A"), 1.0), "link.A.A"),
    ("link negative", _with(("link", "A", "B"), -0.1), "link.A.B"),
    ("link NaN", _with(("link", "A", "B"), float("nan")), "link.A.B"),
    ("link string", _with(("link", "A", "B"), "fast"), "link.A.B"),
]


@pytest.mark.parametrize("data, key", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_malformed_table_names_key(data, key):
    with pytest.raises(InputError) as info:
        table_from_dict(data, source="t.json")
    assert info.value.key == key
    assert info.value.file == "t.json"
    assert str(info.value).startswith(f"t.json: {key}: ")


def test_not_an_object():
    with pytest.raises(InputError) as info:
        table_from_dict([1, 2, 3], source="t.json")
    assert info.value.key == "<file>"


def test_good_table_loads_and_plain_list_means_all_positions():
    t = table_from_dict(GOOD)
    assert t.islands == ("A", "B")
    assert t.tau("A", 0, 2) == 2.0 and t.tau("A", 1, 3) == 2.0  # plain list: every position
    assert t.tau("A", 0, 3) is None
    assert t.tau("B", 0, 3) == 5.0 and t.tau("B", 1, 3) == 3.0 and t.tau("B", 0, 1) == 1.0
    assert t.link_time("A", "B") == 0.5 and t.link_time("B", "A") == 0.0


def test_file_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(InputError) as info:
        load_table(bad)
    assert info.value.key == "<file>" and info.value.file == str(bad)
    empty = tmp_path / "empty.json"
    empty.write_text("  ")
    with pytest.raises(InputError):
        load_table(empty)
    with pytest.raises(InputError):
        load_table(tmp_path / "missing.json")


def test_nan_literal_in_file_is_rejected(tmp_path):
    path = tmp_path / "nan.json"
    path.write_text(json.dumps(GOOD).replace("2.0, null", "NaN, null"))
    with pytest.raises(InputError) as info:
        load_table(path)
    assert info.value.key == "latency.A[1]"


def test_table_is_frozen():
    t = table_from_dict(GOOD)
    with pytest.raises(Exception):
        t.layers = 5  # type: ignore[misc]
    with pytest.raises(TypeError):
        t.latency["A"] = ()  # type: ignore[index]
    with pytest.raises(TypeError):
        t.latency["A"][Position.FIRST] = ()  # type: ignore[index]


@pytest.mark.parametrize("r, key", [
    (Restrictions(length_window={"Z": (1, 2)}), "length_window.Z"),
    (Restrictions(length_window={"A": (3, 2)}), "length_window.A"),
    (Restrictions(memory_cap={("A", "first"): 2}), "memory_cap.A"),
    (Restrictions(banned_links=frozenset({("A", "Q")})), "banned_links.A.Q"),
])
def test_bad_restrictions(r, key):
    with pytest.raises(InputError) as info:
        dense_arrays(table_from_dict(GOOD), r)
    assert info.value.key == key


def test_restrictions_mask_entries():
    t = table_from_dict(GOOD)
    r = Restrictions(length_window={"B": (2, 3)}, memory_cap={("B", Position.ONLY): 2},
                     banned_links=frozenset({("B", "A")}))
    tau, link = dense_arrays(t, r)
    assert tau[1, 0, 1] == float("inf") and tau[1, 0, 2] == 2.0  # window drops length 1
    assert tau[1, 3, 3] == float("inf")  # ONLY of 3 layers over the memory cap
    assert link[1, 0] == float("inf") and link[0, 1] == 0.5


def test_constructor_validates_too():
    with pytest.raises(InputError) as info:
        LatencyTable(layers=2, n_micro=1, islands=("A",), latency={"A": [1.0]})
    assert info.value.key == "latency.A"
