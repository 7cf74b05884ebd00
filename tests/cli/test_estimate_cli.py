"""``tangram estimate``: the JSON contract, plain output, and bad configs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from solver.cli.commands import estimate as estimate_cmd

from solver import cli
from solver.spec.errors import InputError
from solver.spec.loaders import INSTANCES

EXAMPLES = sorted((INSTANCES / "estimate").glob("*.toml"))
TOP_KEYS = {"iteration_time_s", "tokens_per_s", "tflops_per_gpu", "mfu", "micro_batch", "fits",
            "memory_gb", "breakdown", "communication", "virtual_stages", "mfu_fp8"}
COMM_KEYS = {"tp", "cp", "ep", "dp", "pp"}
MEMORY_KEYS = {"params", "grads", "optimizer", "activations", "fragmentation", "total"}
BREAKDOWN_KEYS = {"compute", "recompute", "tp_comm", "cp_comm", "ep_comm", "pp_bubble", "dp_comm",
                  "optimizer", "offload"}
GOOD = """model = "llama2-13b"
gpu = "A100-SXM-80GB"
gpus = 16

[training]
global_batch = 64
seq_len = 4096

[parallel]
tp = 4
pp = 2
dp = 2
recompute = "selective"
"""


def run(argv, capsys):
    parser = argparse.ArgumentParser()
    estimate_cmd.register(parser.add_subparsers())
    args = parser.parse_args(["estimate", *argv])
    code = args.func(args)
    return code, capsys.readouterr().out


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "est.toml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_json_contract_on_examples(path, capsys):
    code, out = run([str(path), "--json"], capsys)
    assert code == 0
    data = json.loads(out)
    assert set(data) == TOP_KEYS
    assert set(data["memory_gb"]) == MEMORY_KEYS and set(data["breakdown"]) == BREAKDOWN_KEYS
    assert isinstance(data["fits"], bool) and isinstance(data["micro_batch"], int)
    assert sum(data["breakdown"].values()) == pytest.approx(data["iteration_time_s"])
    mem = data["memory_gb"]
    assert mem["total"] == pytest.approx(sum(v for k, v in mem.items() if k != "total"))
    assert 0 < data["mfu"] < 1
    assert data["tokens_per_s"] * data["iteration_time_s"] > 0
    comm = data["communication"]
    assert set(comm) == COMM_KEYS
    assert all(0 <= t["exposed_s"] <= t["total_s"] + 1e-12 for t in comm.values())
    assert comm["tp"]["exposed_s"] == pytest.approx(data["breakdown"]["tp_comm"])


def _json(tmp_path, capsys, text):
    code, out = run([write(tmp_path, text), "--json"], capsys)
    assert code == 0
    return json.loads(out)


def test_megatron_core_hides_what_megatron_2021_exposes(tmp_path, capsys):
    core = _json(tmp_path, capsys, GOOD)
    old = _json(tmp_path, capsys, 'framework = "megatron-2021"\n' + GOOD)
    # Same traffic; Megatron-LM 2021 overlaps nothing (exposed = total), Megatron-Core hides
    # part of its TP and data-parallel traffic.
    for name in ("tp", "dp"):
        assert old["communication"][name]["exposed_s"] == pytest.approx(
            old["communication"][name]["total_s"])
        assert core["communication"][name]["exposed_s"] < core["communication"][name]["total_s"]
    assert core["iteration_time_s"] < old["iteration_time_s"]


def test_fp8_on_h100_not_on_a100(tmp_path, capsys):
    h100 = GOOD.replace('"A100-SXM-80GB"', '"H100-SXM-80GB"')
    fp8 = h100.replace("seq_len = 4096", 'seq_len = 4096\nprecision = "fp8"')
    assert _json(tmp_path, capsys, fp8)["iteration_time_s"] < \
        _json(tmp_path, capsys, h100)["iteration_time_s"]
    a100_fp8 = GOOD.replace("seq_len = 4096", 'seq_len = 4096\nprecision = "fp8"')
    assert _json(tmp_path, capsys, a100_fp8)["iteration_time_s"] == pytest.approx(
        _json(tmp_path, capsys, GOOD)["iteration_time_s"])  # A100 has no FP8: runs BF16


def test_virtual_stages_auto_is_the_best_fixed_choice(tmp_path, capsys):
    base = GOOD.replace("pp = 2", "pp = 2\nschedule = \"interleaved\"")
    auto = _json(tmp_path, capsys, base.replace('recompute = "selective"',
                                                 'recompute = "selective"\nvirtual_stages = "auto"'))
    fixed = [_json(tmp_path, capsys, GOOD)["iteration_time_s"]]
    for v in (2, 4, 5, 10, 20):  # llama2-13b: 40 layers; pp 2 x v must divide them
        fixed.append(_json(tmp_path, capsys, base.replace(
            'recompute = "selective"', f'recompute = "selective"\nvirtual_stages = {v}'))
            ["iteration_time_s"])
    assert auto["iteration_time_s"] == pytest.approx(min(fixed))


def test_framework_refuses_what_it_cannot_run(tmp_path, capsys):
    bad = 'framework = "deepspeed"\n' + GOOD.replace("dp = 2", "dp = 2\nzero = 2")
    with pytest.raises(InputError, match="parallel: deepspeed runs ZeRO"):
        run([write(tmp_path, bad)], capsys)
    bad = 'framework = "flagscale"\n' + GOOD.replace('recompute = "selective"',
                                                      'recompute = "selective"\ncp = 1')
    with pytest.raises(InputError, match="no selective recomputation"):
        run([write(tmp_path, bad)], capsys)


def test_plain_output(tmp_path, capsys):
    code, out = run([write(tmp_path, GOOD)], capsys)
    assert code == 0
    assert "iteration time" in out and "MFU" in out and "pp_bubble" in out


def test_fp8_mfu_says_which_peak(tmp_path, capsys):
    """Under FP8 the MFU is of the 16-bit peak and the FP8 share is printed beside it: on an
    H100 SXM (989 dense BF16, 1,979 dense FP8 TFLOP/s) the second is 989/1979 of the first."""
    import re
    fp8 = GOOD.replace('gpu = "A100-SXM-80GB"', 'gpu = "H100-SXM-80GB"').replace(
        "seq_len = 4096", 'seq_len = 4096\nprecision = "fp8"')
    _, out = run([write(tmp_path, fp8)], capsys)
    got = re.search(r"MFU ([\d.]+)% of the 16-bit peak; ([\d.]+)% of the FP8 peak", out)
    assert got, out
    assert float(got[2]) == pytest.approx(float(got[1]) * 989 / 1979, abs=0.06)
    _, plain = run([write(tmp_path, GOOD)], capsys)
    assert "FP8 peak" not in plain
    data = _json(tmp_path, capsys, fp8)
    assert data["mfu_fp8"] == pytest.approx(data["tflops_per_gpu"] / 1979)
    assert data["mfu"] == pytest.approx(data["tflops_per_gpu"] / 989)
    assert _json(tmp_path, capsys, GOOD)["mfu_fp8"] is None


def test_auto_micro_batch_and_fixed(tmp_path, capsys):
    _, auto = run([write(tmp_path, GOOD), "--json"], capsys)
    fixed_text = GOOD.replace('recompute = "selective"', 'recompute = "selective"\nmicro_batch = 2')
    _, fixed = run([write(tmp_path, fixed_text), "--json"], capsys)
    a, f = json.loads(auto), json.loads(fixed)
    assert f["micro_batch"] == 2
    assert a["iteration_time_s"] <= f["iteration_time_s"] + 1e-12 or not f["fits"]


@pytest.mark.parametrize("old,new,key", [
    ("dp = 2", "dp = 4", "parallel"),                       # 4 * 2 * 4 != 16
    ("tp = 4", "tp = 3", "parallel"),
    ("tp = 4\npp = 2\ndp = 2", "tp = 16\npp = 1\ndp = 1", "parallel.tp"),  # 16 does not divide 40 heads
    ('recompute = "selective"', 'recompute = "some"', "parallel.recompute"),
    ('recompute = "selective"', 'recompute = "none"\nfoo = 1', "parallel.foo"),
    ('recompute = "selective"', 'schedule = "interleaved"', "parallel.virtual_stages"),
    ('recompute = "selective"', 'virtual_stages = 2', "parallel.virtual_stages"),
    ('recompute = "selective"', 'ep = 2', "parallel.ep"),
    ('recompute = "selective"', 'micro_batch = 5', "parallel.micro_batch"),
    ('recompute = "selective"', 'zero = 4', "parallel.zero"),
    ("gpus = 16", "gpus = 0", "gpus"),
    ('gpu = "A100-SXM-80GB"', 'gpu = "Z100"', "gpu"),
    ("seq_len = 4096", "seq_len = \"long\"", "training.seq_len"),
    ('model = "llama2-13b"', 'model = "no-such-model"', "model"),
])
def test_bad_config_raises_input_error(tmp_path, capsys, old, new, key):
    assert old in GOOD
    path = write(tmp_path, GOOD.replace(old, new, 1))
    with pytest.raises(InputError) as exc:
        run([path], capsys)
    assert exc.value.key == key
    assert exc.value.file == path


def test_missing_file_is_input_error(tmp_path, capsys):
    with pytest.raises(InputError):
        run([str(tmp_path / "nope.toml")], capsys)


def test_through_main(tmp_path, capsys):
    path = write(tmp_path, GOOD.replace("dp = 2", "dp = 4"))
    assert cli.main(["estimate", path]) == 2
    assert capsys.readouterr().err.startswith(f"error: {path}: parallel: ")
    assert cli.main(["estimate", write(tmp_path, GOOD), "--json"]) == 0
