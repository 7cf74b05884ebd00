"""GPUs of one's own: a user catalog (``TANGRAM_CATALOG``, or ``[[gpus]]`` in a job or cluster
file) adds to the shipped catalog or changes it entry by entry; ``source`` is optional there;
omitted kernel fields take the documented defaults, which ``tangram islands`` shows."""

from __future__ import annotations

import dataclasses
import json

import pytest

from solver.cli.main import main
from solver.spec.catalog import DEFAULTS, file_entries
from solver.spec.errors import InputError
from solver.spec.loaders import extend_catalog, load_catalog, load_cluster, load_job

NEW_GPU = ('name = "Site-X"\nbf16_tflops = 500.0\nhbm_gb = 64.0\nhbm_bw_gbs = 2000.0\n'
           'nvlink_gbs = 400.0\nnic_gbits = 200.0\ntdp_w = 500.0\n')
NODES = '[[nodes]]\ngpu = "Site-X"\ncount = 2\n[[nodes]]\ngpu = "H100-SXM-80GB"\ncount = 1\n'


@pytest.fixture()
def shipped(monkeypatch):
    monkeypatch.delenv("TANGRAM_CATALOG", raising=False)
    return load_catalog()


def _user_catalog(tmp_path, monkeypatch, text: str):
    path = tmp_path / "site-gpus.toml"
    path.write_text(text)
    monkeypatch.setenv("TANGRAM_CATALOG", str(path))
    return path


def test_user_catalog_adds_a_gpu_and_keeps_the_shipped_ones(tmp_path, monkeypatch, shipped):
    _user_catalog(tmp_path, monkeypatch, "[[gpus]]\n" + NEW_GPU)
    got = load_catalog()
    assert set(got) == set(shipped) | {"Site-X"}
    assert all(got[k] == shipped[k] for k in shipped)
    x = got["Site-X"]
    assert (x.bf16_tflops, x.hbm_gb, x.source) == (500.0, 64.0, "")  # source: optional


def test_user_entry_of_a_shipped_name_changes_only_the_fields_it_gives(tmp_path, monkeypatch,
                                                                       shipped):
    """The shipped ``[NAME]`` layout works in a user catalog too."""
    _user_catalog(tmp_path, monkeypatch, '["H100-SXM-80GB"]\nusd_per_hour = 2.1\n')
    got = load_catalog()
    assert got["H100-SXM-80GB"] == dataclasses.replace(shipped["H100-SXM-80GB"],
                                                       usd_per_hour=2.1)
    assert got["A100-SXM-80GB"] == shipped["A100-SXM-80GB"]


def test_omitted_kernel_fields_take_the_documented_defaults(tmp_path, monkeypatch, shipped):
    _user_catalog(tmp_path, monkeypatch, "[[gpus]]\n" + NEW_GPU)
    x = load_catalog()["Site-X"]
    assert (x.gemm_eff, x.fp8_gemm_eff, x.attention, x.attention_eff, x.pcie_gbs) == tuple(
        DEFAULTS[k] for k in ("gemm_eff", "fp8_gemm_eff", "attention", "attention_eff",
                              "pcie_gbs"))
    assert x.gemm_half_balance is None and x.gemm_latency_us is None  # the pooled GEMM curve
    assert x.nvlink_domain == 8  # it has NVLink
    assert {"gemm_eff", "attention", "attention_eff", "gemm_half_balance"} <= set(x.defaults)
    assert "gemm_eff" not in shipped["H100-SXM-80GB"].defaults  # the shipped entry gives it


def test_a_changed_field_moves_the_defaults_that_follow_it(shipped):
    """Site-X's NVLink domain was a default (8, it has NVLink); without NVLink it is 1."""
    first = extend_catalog(shipped, file_entries({"gpus": [_table(NEW_GPU)]}, "a.toml"))
    again = extend_catalog(first, file_entries({"Site-X": {"nvlink_gbs": 0.0}}, "b.toml"))
    assert (first["Site-X"].nvlink_domain, again["Site-X"].nvlink_domain) == (8, 1)
    assert again["Site-X"].bf16_tflops == 500.0 and again["Site-X"].catalog_file == "b.toml"


def _table(text: str) -> dict:
    import tomllib
    return tomllib.loads(text)


def test_source_is_required_of_the_shipped_catalog_only(shipped):
    entries = file_entries({"gpus": [_table(NEW_GPU)]}, "x.toml")
    assert extend_catalog({}, entries)["Site-X"].source == ""
    with pytest.raises(InputError, match=r"gpus\[0\]\.source: missing required key"):
        extend_catalog({}, entries, shipped=True)


def test_cluster_and_job_files_define_their_own_gpus(tmp_path, shipped):
    cluster = tmp_path / "site.toml"
    cluster.write_text("[[gpus]]\n" + NEW_GPU + NODES)
    assert [g.gpu.name for g in load_cluster(cluster).groups] == ["Site-X", "H100-SXM-80GB"]
    job = tmp_path / "job.toml"
    job.write_text('model = "llama3-8b"\ncluster = "c.toml"\n[training]\nglobal_batch = 16\n'
                   'seq_len = 1024\n[[gpus]]\n' + NEW_GPU)
    (tmp_path / "c.toml").write_text(NODES)
    assert load_job(job).cluster.groups[0].gpu.bf16_tflops == 500.0
    inline = tmp_path / "inline.toml"
    inline.write_text('model = "llama3-8b"\n[training]\nglobal_batch = 16\nseq_len = 1024\n'
                      '[cluster]\nname = "c"\n[[cluster.gpus]]\n' + NEW_GPU +
                      NODES.replace("[[nodes]]", "[[cluster.nodes]]"))
    assert load_job(inline).cluster.groups[0].gpu.name == "Site-X"


def test_islands_shows_the_defaults_a_gpu_took(tmp_path, capsys, shipped):
    cluster = tmp_path / "site.toml"
    cluster.write_text("[[gpus]]\n" + NEW_GPU + NODES)
    assert main(["islands", str(cluster)]) == 0
    text = capsys.readouterr().out
    row = next(line for line in text.splitlines() if line.startswith("Site-X "))
    assert "0.8*" in row and "fa2*" in row and "0.5*" in row and "pooled*" in row
    h100 = next(line for line in text.splitlines() if line.startswith("H100-SXM-80GB "))
    assert "*" not in h100.replace("pooled*", "")
    assert "gemm_eff = 0.8" in text and "attention = fa2" in text
    assert main(["islands", str(cluster), "--json"]) == 0
    types = {g["name"]: g for g in json.loads(capsys.readouterr().out)["gpu_types"]}
    assert types["Site-X"]["gemm_eff"] == 0.8 and "gemm_eff" in types["Site-X"]["defaults"]
    assert types["Site-X"]["catalog_file"] == str(cluster)


@pytest.mark.parametrize("entry,key,reason", [
    ("[[gpus]]\nbf16_tflops = 1.0\n", "gpus[0].name", "needs a name"),
    ("[[gpus]]\n" + NEW_GPU + "[[gpus]]\n" + NEW_GPU, "gpus[1].name", "defined twice"),
    ("[[gpus]]\n" + NEW_GPU + "gem_eff = 0.7\n", "gpus[0].gem_eff", "did you mean gemm_eff?"),
    ('gpus = "H100"\n', "gpus", "must be a list"),
])
def test_bad_user_entries_are_named(tmp_path, capsys, entry, key, reason, shipped):
    cluster = tmp_path / "site.toml"
    cluster.write_text(entry + NODES)
    assert main(["islands", str(cluster)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {cluster}: {key}: ") and reason in err
