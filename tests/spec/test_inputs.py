"""Instance files: shipped ones load; every malformed kind gives the one-line error, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import SHIPPED_JOBS

from solver.cli.main import main
from solver.spec.errors import InputError
from solver.spec.loaders import INSTANCES, load_catalog, load_job, load_model

DATA = Path(__file__).resolve().parents[1] / "data"
GOOD_CLUSTER = """name = "c"
[[nodes]]
gpu = "H100-SXM-80GB"
count = 2
"""


def run_cli(argv, capsys):
    code = main(argv)
    err = capsys.readouterr().err.strip()
    return code, err


def test_catalog_has_required_gpus():
    names = set(load_catalog())
    for gpu in ["A100-SXM-40GB", "A100-SXM-80GB", "H100-SXM-80GB", "H100-NVL-94GB",
                "H100-PCIe-80GB", "H200-SXM-141GB", "B200", "L40S", "A10", "V100-SXM2-16GB",
                "V100-SXM2-32GB", "MI300X"]:
        assert gpu in names


def test_catalog_records_dense_not_sparse_tflops():
    cat = load_catalog()
    assert cat["H200-SXM-141GB"].bf16_tflops == pytest.approx(989, rel=0.01)
    assert cat["B200"].bf16_tflops == pytest.approx(2250, rel=0.01)


@pytest.mark.parametrize("path", sorted((INSTANCES / "models").glob("*.toml")), ids=lambda p: p.stem)
def test_shipped_models_load(path):
    model = load_model(path)
    assert model.layers > 0 and model.total_params > 1e9


def test_llama3_70b_parameter_count():
    # Published: 70.6B parameters.
    assert load_model(INSTANCES / "models" / "llama3-70b.toml").total_params == pytest.approx(70.55e9, rel=0.01)


def test_qwen3_moe_counts():
    # Published: 235B total, 22B active.
    m = load_model(INSTANCES / "models" / "qwen3-235b-a22b.toml")
    assert m.total_params == pytest.approx(235e9, rel=0.02)
    active = m.layers * m.active_params_per_layer + m.embedding_params + m.head_params
    assert active == pytest.approx(22e9, rel=0.05)


def test_hf_config_equals_toml():
    assert load_model(DATA / "qwen3-moe-config.json").params_per_layer == \
        load_model(INSTANCES / "models" / "qwen3-235b-a22b.toml").params_per_layer
    assert load_model(DATA / "llama-config.json").total_params == \
        load_model(INSTANCES / "models" / "llama3-70b.toml").total_params


@pytest.mark.parametrize("path", SHIPPED_JOBS, ids=lambda p: p.stem)
def test_shipped_jobs_load(path):
    job = load_job(path)
    assert job.cluster.total_gpus > 0


CLUSTER_CASES = [
    ("", "<file>", "empty"),
    ("name = [", "<file>", "invalid TOML"),
    ('name = "c"\n', "nodes", "missing"),
    ('name = "c"\nnodes = []\n', "nodes", "at least one"),
    (GOOD_CLUSTER + "colour = 1\n", "nodes[0].colour", "unknown key"),
    (GOOD_CLUSTER.replace('"H100-SXM-80GB"', '"H999"'), "nodes[0].gpu", "unknown GPU"),
    (GOOD_CLUSTER.replace("count = 2", "count = 0"), "nodes[0].count", ">= 1"),
    (GOOD_CLUSTER.replace("count = 2", 'count = "2"'), "nodes[0].count", "integer"),
    (GOOD_CLUSTER.replace("count = 2", "count = 1000000000"), "nodes[0].count", "<="),
    (GOOD_CLUSTER + "perf = 1.5\n", "nodes[0].perf", "<= 1"),
    (GOOD_CLUSTER + "perf = 0.0\n", "nodes[0].perf", "> 0"),
    (GOOD_CLUSTER + "nic_gbits = -5.0\n", "nodes[0].nic_gbits", "> 0"),
    (GOOD_CLUSTER + "perf = nan\n", "nodes[0].perf", "finite"),
]


@pytest.mark.parametrize("text,key,reason", CLUSTER_CASES)
def test_bad_cluster_one_line_error(tmp_path, capsys, text, key, reason):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    code, err = run_cli(["islands", str(path)], capsys)
    assert code == 2
    assert err.count("\n") == 0 and err.startswith(f"error: {path}: {key}: ")
    assert reason in err


MODEL = """layers = 2
hidden = 64
ffn = 128
heads = 4
kv_heads = 4
vocab = 100
"""


@pytest.mark.parametrize("text,key,reason", [
    (MODEL.replace("heads = 4\nkv", "heads = 5\nkv"), "heads", "do not divide hidden"),
    (MODEL.replace("kv_heads = 4", "kv_heads = 3"), "kv_heads", "do not divide heads"),
    (MODEL.replace("layers = 2", "layers = 1000000"), "layers", "<="),
    (MODEL.replace("layers = 2", "layers = 0"), "layers", ">="),
    (MODEL + "experts = 8\n", "top_k", "top_k must be"),
    (MODEL.replace("vocab = 100\n", ""), "vocab", "missing"),
    (MODEL + "gated_mlp = 1\n", "gated_mlp", "true or false"),
])
def test_bad_model(tmp_path, text, key, reason):
    path = tmp_path / "m.toml"
    path.write_text(text)
    with pytest.raises(InputError) as exc:
        load_model(path)
    assert exc.value.key == key and reason in exc.value.reason


def test_bad_hf_config(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"architectures": ["T5ForConditionalGeneration"]}')
    with pytest.raises(InputError, match="architectures"):
        load_model(path)
    path.write_text("{not json")
    with pytest.raises(InputError, match="invalid JSON"):
        load_model(path)


JOB = """model = "llama2-13b"
cluster = "seed-h100-a100"
[training]
global_batch = 64
seq_len = 2048
n_micro = 8
"""


@pytest.mark.parametrize("text,key,reason", [
    (JOB.replace('"llama2-13b"', '"gpt-9"'), "model", "unknown model"),
    (JOB.replace('"seed-h100-a100"', '"nowhere"'), "cluster", "unknown cluster"),
    (JOB.replace("n_micro = 8", "n_micro = 7"), "training.n_micro", "must divide"),
    (JOB.replace("n_micro = 8", 'n_micro = "many"'), "training.n_micro", "auto"),
    (JOB.replace("seq_len = 2048", "seq_len = -1"), "training.seq_len", ">="),
    (JOB + "[planner]\nsolver = \"gurobi\"\n", "planner.solver", "not one of"),
    (JOB + "[planner]\nbeta = 0.5\n", "planner.beta", ">= 1"),
    (JOB + "[planner]\nfeatures = \"all\"\n", "planner.features", "not one of"),
    (JOB + "[planner]\npruning = \"fast\"\n", "planner.pruning", "not one of"),
    (JOB.replace("[training]", "[trainin]"), "trainin", "unknown key"),
])
def test_bad_job(tmp_path, text, key, reason):
    path = tmp_path / "job.toml"
    path.write_text(text)
    with pytest.raises(InputError) as exc:
        load_job(path)
    assert exc.value.key == key, str(exc.value)
    assert reason in exc.value.reason


def test_inline_model_and_cluster_in_job(tmp_path):
    text = JOB.replace('model = "llama2-13b"', "model = { " + ", ".join(
        line.replace(" = ", " = ") for line in MODEL.strip().splitlines()) + " }")
    text = text.replace('cluster = "seed-h100-a100"',
                        'cluster = { nodes = [ { gpu = "A100-SXM-80GB", count = 2 } ] }')
    job = load_job(tmp_path / "j.toml" if (tmp_path / "j.toml").write_text(text) else None)
    assert job.model.hidden == 64 and job.cluster.total_gpus == 16


def test_missing_file_is_one_line(capsys):
    code, err = run_cli(["islands", "does/not/exist.toml"], capsys)
    assert code == 2 and err.startswith("error: does/not/exist.toml: <file>:")


def test_unknown_flag_is_one_line(capsys):
    code, err = run_cli(["islands", "seed-h100-a100", "--frobnicate"], capsys)
    assert code == 2 and err.startswith("error: <cli>:") and "\n" not in err
