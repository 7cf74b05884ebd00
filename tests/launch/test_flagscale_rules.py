"""FlagScale's own rules judge the exports (:mod:`solver.launch.flagscale_check`), on every
shipped job's default plan, and each rule can fail.

Each shipped job is planned once: its FlagScale export must be accepted by the checker, read
back to the plan (layer split, layouts, recomputation, micro-batches, batch), and its hostfile
must list every stage's nodes in pipeline order with the stage's GPUs per node and GPU type;
its Megatron-LM launch, where Megatron-LM can run the plan, must read back to the plan too.
Jobs that plan in more than about 3 s on a loaded 2-core machine run with ``-m slow``.
"""

from __future__ import annotations

import copy

import pytest
import yaml

from solver.launch import NotExpressible, flagscale_hostfile, flagscale_yaml, megatron_launch
from solver.launch.flagscale_check import parse_hostfile, problems
from solver.spec.loaders import INSTANCES
from tests.launch.readback import flagscale_read, megatron_read, plan_truth, shipped_plan

#: Planned in minutes or in more than ~3 s on a loaded 2-core machine.
SLOW = {"fleet-8448-llama3-70b", "fleet-700-llama3-70b", "large-4096-llama3-70b", "deep-405b",
        "odd-7h100-16a100-llama3-70b", "odd-8h100-15a100-llama3-70b", "qwen3-h100-h200",
        "qwen3-three-gen-512", "small-8b-three-gen-512"}
#: Planned for minutes even with -m slow.
TOO_SLOW = {"fleet-8448-llama3-70b"}
JOBS = [pytest.param(p.stem, marks=pytest.mark.slow) if p.stem in SLOW else p.stem
        for p in sorted((INSTANCES / "jobs").glob("*.toml")) if p.stem not in TOO_SLOW]


def _hostfile_rows(plan) -> list[tuple[str, int, set[str]]]:
    """Every stage's nodes in pipeline order, with the stage's GPUs per node and the types the
    line may carry: the node's own, or (hetero mode) its island's, which is the weakest member's
    where an island merged types."""
    return [(n.node_id, s.plan.config.gpus // len(s.node_ids), {n.gpu.name, s.island.gpu.name})
            for s in plan.stages for n in (s.nodes or s.island.nodes)]


@pytest.mark.parametrize("name", JOBS)
def test_shipped_job_exports_as_its_runtimes_read_it(name):
    plan = shipped_plan(name)
    text, hostfile = flagscale_yaml(plan, "plan.hostfile"), flagscale_hostfile(plan)
    doc = yaml.safe_load(text)
    assert problems(doc, hostfile) == []
    assert flagscale_read(doc, hostfile) == plan_truth(plan)
    hosts, bad = parse_hostfile(hostfile)
    assert bad == []
    got = [(h.host, h.slots, h.type) for h in hosts]
    want = _hostfile_rows(plan)
    assert [g[:2] for g in got] == [w[:2] for w in want]
    # The type is the GPU's (a label -2, -3 where a type returns after another one).
    assert all(g[2] in w[2] or g[2].rsplit("-", 1)[0] in w[2] for g, w in zip(got, want))
    try:
        launch = megatron_launch(plan)
    except NotExpressible as exc:
        assert "\n" not in str(exc) and "flagscale" in str(exc)
        return
    assert megatron_read(launch) == plan_truth(plan)


@pytest.fixture(scope="module")
def valid():
    """A valid hetero export: the worked example (H100 mesh dp 8, A100 mesh dp 16)."""
    plan = shipped_plan("seed-llama3-70b")
    doc = yaml.safe_load(flagscale_yaml(plan, "plan.hostfile"))
    hostfile = flagscale_hostfile(plan)
    assert problems(doc, hostfile) == []
    return doc, hostfile


def _broken(valid, edit):
    doc, hostfile = copy.deepcopy(valid[0]), valid[1]
    system, model = doc["train"]["system"], doc["train"]["model"]
    hostfile = edit(system, system["hetero"], model) or hostfile
    return problems(doc, hostfile)


def _set(block, key, value):
    block[key] = value


#: (rule, FlagScale's or Megatron's message fragment the checker cites, the edit).
BREAKS = [
    ("meshes of five", "multiple of 5",
     lambda s, h, m: _set(h, "hetero_process_meshes", h["hetero_process_meshes"][:-1])),
    ("one cp, and 1", "cp = 1",
     lambda s, h, m: _set(h, "hetero_process_meshes", [8, 2, 1, 4, 1, 8, 2, 1, 8, 1])),
    ("pp is the meshes' sum", "sum of mesh pp",
     lambda s, h, m: _set(s, "pipeline_model_parallel_size", 3)),
    ("no standalone embedding", "standalone_embedding_stage",
     lambda s, h, m: _set(h, "standalone_embedding_stage", True)),
    ("tied embedding: first and last tp", "first and last meshes' tp",
     lambda s, h, m: (_set(m, "untie_embeddings_and_output_weights", False),
                      _set(h, "hetero_process_meshes", [8, 1, 1, 8, 1, 4, 1, 1, 32, 1]))[0]),
    ("tied embedding: partial reduce", "use_partial_reduce_for_shared_embedding",
     lambda s, h, m: _set(m, "untie_embeddings_and_output_weights", False)),
    ("no virtual stages in hetero", "virtual pipeline",
     lambda s, h, m: _set(s, "num_layers_per_virtual_pipeline_stage", 4)),
    ("split sums to the layers", "hetero_pipeline_layer_split",
     lambda s, h, m: _set(h, "hetero_pipeline_layer_split", [47, 32])),
    ("one device type per mesh", "one entry per mesh",
     lambda s, h, m: _set(h, "hetero_device_types", ["H100-SXM-80GB"])),
    ("current type among the types", "hetero_current_device_type",
     lambda s, h, m: _set(h, "hetero_current_device_type", "B200")),
    ("dp_0 x mbs divisible by every dp", "divisible by every mesh's dp",
     lambda s, h, m: (_set(m, "micro_batch_size", 1),
                      _set(h, "hetero_process_meshes", [8, 1, 1, 8, 1, 8, 1, 1, 16, 1]))[0]),
    ("tp divides the query groups", "query groups",
     lambda s, h, m: _set(m, "num_query_groups", 4)),
    ("vocabulary divisible by tp", "padded_vocab_size",
     lambda s, h, m: _set(m, "padded_vocab_size", 128257)),
    ("full recompute has a method", "needs a method",
     lambda s, h, m: _set(s, "recompute", {"recompute_granularity": "full"})),
    ("per-stage lists cover every micro-batch", None,
     lambda s, h, m: _set(s, "recompute", {
         "recompute_granularity": "full", "recompute_method": "uniform",
         "recompute_num_layers": 1,
         "recompute_granularity_per_stage_micro_batch": [[1, 4, 1]]})),
]


@pytest.mark.parametrize("rule,fragment,edit", BREAKS, ids=[b[0] for b in BREAKS])
def test_each_rule_can_fail(valid, rule, fragment, edit):
    found = _broken(valid, edit)
    if fragment is None:  # read_back raises on it; the checker leaves it to the runtime parse
        from solver.launch.flagscale_read import read_back
        doc = copy.deepcopy(valid[0])
        edit(doc["train"]["system"], doc["train"]["system"]["hetero"], doc["train"]["model"])
        with pytest.raises(ValueError, match="post_validate_args"):
            read_back(doc, valid[1])
        return
    assert any(fragment in p for p in found), (rule, found)


def test_hostfile_rules(valid):
    doc, hostfile = valid
    lines = hostfile.splitlines()
    # A missing node: the world is smaller than the meshes.
    assert any("world size" in p for p in problems(doc, "\n".join(lines[:-1])))
    # A node listed twice, an untyped one, a line FlagScale cannot parse.
    assert any("twice" in p for p in problems(doc, hostfile + lines[1] + "\n"))
    assert any("all or none" in p for p in problems(doc, hostfile + "x slots=8\n"))
    assert any("invalid entry" in p for p in problems(doc, hostfile + "x 8 gpus\n"))


def test_a_returning_device_type_needs_its_own_label(valid):
    # Meshes H100, A100, H100 labelled without the -2: FlagScale's rank mapper puts every
    # H100 rank first, so the A100 mesh would get H100 ranks.
    doc = copy.deepcopy(valid[0])
    het = doc["train"]["system"]["hetero"]
    het.update(hetero_process_meshes=[8, 1, 1, 8, 1, 8, 1, 1, 8, 1, 8, 1, 1, 8, 1],
               hetero_pipeline_layer_split=[30, 30, 20],
               hetero_device_types=["H100", "A100", "H100"], hetero_current_device_type="H100")
    doc["train"]["system"]["pipeline_model_parallel_size"] = 3
    doc["train"]["model"]["micro_batch_size"] = 1
    rows = [f"h{i} slots=8 type=H100" for i in range(8)] + \
        [f"a{i} slots=8 type=A100" for i in range(8)] + \
        [f"g{i} slots=8 type=H100" for i in range(8)]
    found = problems(doc, "\n".join(rows))
    assert any("mesh 1 (A100) gets ranks of ['H100']" in p for p in found)
    het.update(hetero_device_types=["H100", "A100", "H100-2"])
    rows[16:] = [f"g{i} slots=8 type=H100-2" for i in range(8)]
    assert problems(doc, "\n".join(rows)) == []


def test_the_gpt_style_job_exports_its_architecture():
    """GPT-3 175B on three generations: LayerNorm, learned positions, biases, GELU, tied."""
    plan = shipped_plan("gpt3-175b-three-gen-512")
    model = yaml.safe_load(flagscale_yaml(plan))["train"]["model"]
    assert (model["normalization"], model["position_embedding_type"]) == \
        ("LayerNorm", "learned_absolute")
    assert model["disable_bias_linear"] is False and model["swiglu"] is False
    assert model["untie_embeddings_and_output_weights"] is False
    assert model["max_position_embeddings"] == 2048 and "rotary_base" not in model


def _two_stage_plan(first, second):
    """Two stages of 20 layers, each on one 8-GPU node (``first``, ``second``: islands)."""
    from dataclasses import replace
    from solver.cost.stage import StageConfig
    from solver.spec.loaders import load_job, load_model
    from tests.launch.readback import build_plan, with_batch
    job = load_job(INSTANCES / "jobs" / "homog-a100-llama2-13b.toml")
    model = replace(load_model(INSTANCES / "models" / "llama2-13b.toml"), layers=40)
    c = StageConfig(tp=8, dp=1, micro_batch=1)
    return build_plan(with_batch(job, model, 8), [(first, 20, c), (second, 20, c)], 8)


def test_two_vendors_are_refused_by_both_exports():
    from solver.launch import megatron_args
    from solver.spec.loaders import load_catalog
    from tests.launch.readback import island
    cat = load_catalog()
    plan = _two_stage_plan(island("m", cat["MI300X"], 1), island("h", cat["H100-SXM-80GB"], 1))
    for export in (megatron_args, flagscale_yaml):
        with pytest.raises(NotExpressible, match="vendors"):
            export(plan)


def test_a_mesh_of_merged_gpu_types_runs_as_its_weakest_and_says_so():
    from solver.spec.domain import Island, Node
    from solver.spec.loaders import load_catalog
    from tests.launch.readback import island
    cat = load_catalog()
    a40, a80 = cat["A100-SXM-40GB"], cat["A100-SXM-80GB"]
    merged = Island("m", (Node("m-0", a80, 8, a80.nic_gbits), Node("m-1", a40, 8, a40.nic_gbits)))
    h = island("h", cat["H100-SXM-80GB"], 1)
    plan = _two_stage_plan(h, merged)
    text, hostfile = flagscale_yaml(plan, "p.hostfile"), flagscale_hostfile(plan)
    assert "mixes GPU types" not in text  # the stage uses m-0 only: one type
    both = Island("m", (Node("m-0", a80, 4, a80.nic_gbits), Node("m-1", a40, 4, a40.nic_gbits)))
    plan = _two_stage_plan(both, h)
    text, hostfile = flagscale_yaml(plan, "p.hostfile"), flagscale_hostfile(plan)
    assert "# mesh 0 mixes GPU types A100-SXM-40GB, A100-SXM-80GB" in text
    assert "m-0 slots=4 type=A100-SXM-40GB" in hostfile  # the weakest type's label
    assert problems(yaml.safe_load(text), hostfile) == []
