"""``tangram plan --json`` against its published schema (``docs/plan.schema.json``, JSON
Schema draft 2020-12), checked by the ``jsonschema`` library: every shipped job's plan, a
baseline's, and the ``job`` object that says what was planned."""

from __future__ import annotations

import json
import tomllib

import pytest

from solver.cli.main import main
from tests.conftest import ROOT, SHIPPED_JOBS

jsonschema = pytest.importorskip("jsonschema")

SCHEMA = json.loads((ROOT / "docs" / "plan.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
# Jobs whose whole `tangram plan` took over 2.6 s of CPU on the 2-core host (2026-12-07; the
# others 1.4-2.4 s, about 1.2 s of it start-up): run with -m slow.
SLOW = {"deep-405b", "fleet-700-llama3-70b", "fleet-8448-llama3-70b", "large-4096-llama3-70b",
        "odd-7h100-16a100-llama3-70b", "odd-8h100-15a100-llama3-70b", "qwen3-three-gen-512",
        "replicas-odd-3h100-5a100", "small-8b-three-gen-512"}
JOBS = [pytest.param(p, id=p.stem, marks=[pytest.mark.slow] if p.stem in SLOW else [])
        for p in SHIPPED_JOBS]


def _plan_json(capsys, argv) -> dict:
    code = main(["plan", *argv, "--json", "--stable-json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out)


def test_the_schema_is_a_valid_draft_2020_12_schema():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"


@pytest.mark.parametrize("path", JOBS)
def test_every_shipped_plan_matches_the_schema(path, capsys):
    payload = _plan_json(capsys, [str(path)])
    VALIDATOR.validate(payload)
    job = payload["job"]  # what the job file says, read here without the planner's loader
    raw = tomllib.loads(path.read_text())
    assert (job["name"], job["path"]) == (raw.get("name", path.stem), str(path))
    assert (job["global_batch"], job["seq_len"]) == (raw["training"]["global_batch"],
                                                      raw["training"]["seq_len"])
    assert job["n_micro"] == raw["training"].get("n_micro", "auto")
    assert job["framework"] == raw.get("planner", {}).get("framework", "flagscale")
    assert job["framework"] == payload["framework"]


def test_a_baseline_plan_matches_the_schema(capsys):
    path = ROOT / "instances" / "jobs" / "seed-llama3-70b.toml"
    payload = _plan_json(capsys, [str(path), "--baseline", "oblivious"])
    VALIDATOR.validate(payload)
    assert payload["job"]["model"] == "llama3-70b"


def test_the_schema_rejects_a_plan_without_what_it_requires(capsys):
    """The schema is not vacuous: without ``job``, with a stage lacking ``tp``, or with a layer
    range of three numbers, the plan fails validation."""
    path = ROOT / "instances" / "jobs" / "seed-llama3-70b.toml"
    payload = _plan_json(capsys, [str(path)])
    broken = [{k: v for k, v in payload.items() if k != "job"},
              {**payload, "stages": [{k: v for k, v in payload["stages"][0].items()
                                      if k != "tp"}]},
              {**payload, "stages": [{**payload["stages"][0], "layers": [0, 1, 2]}]}]
    for bad in broken:
        assert not VALIDATOR.is_valid(bad)
    assert VALIDATOR.is_valid({**payload, "a_key_added_later": 1})
