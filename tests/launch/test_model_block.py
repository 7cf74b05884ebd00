"""The model's architecture fields: read from TOML and HuggingFace configs, counted in the
parameters, and written by both exports from the spec (never hard-coded).

Parameter counts are checked against published figures: Qwen2-7B has 7,615,616,512 parameters
(its model card, and the sum of the tensors in its safetensors index), GPT-2 small 124,439,808
(``GPT2LMHeadModel``'s count with the tied head once), and GPT-3 175B is counted by hand below.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from solver.cli.main import main
from solver.cost.stage import StageConfig
from solver.launch import flagscale_config, megatron_args
from solver.spec.errors import InputError
from solver.spec.loaders import INSTANCES, load_catalog, load_job, load_model
from tests.launch.readback import build_plan, island, with_batch

DATA = Path(__file__).parent / "data"
MODELS = INSTANCES / "models"


def test_qwen2_config_reads_qkv_bias_rope_base_epsilon_and_counts_its_published_size():
    m = load_model(DATA / "qwen2-7b-config.json")
    assert (m.qkv_bias, m.bias, m.rotary_base, m.norm_epsilon) == (True, False, 1e6, 1e-6)
    assert (m.normalization, m.position_embedding, m.activation) == ("rmsnorm", "rope", "swiglu")
    # Per layer: q, o 3584^2 each; k, v 3584 x 512 each; QKV biases 3584 + 2 x 512;
    # SwiGLU 3 x 3584 x 18944; two RMSNorm vectors of 3584.
    layer = 2 * 3584 ** 2 + 2 * 3584 * 512 + (3584 + 1024) + 3 * 3584 * 18944 + 2 * 3584
    assert m.params_per_layer == layer == 233_057_792
    # Untied embedding and head of 152064 x 3584, and the final norm.
    assert m.total_params == 28 * layer + 2 * 152064 * 3584 + 3584 == 7_615_616_512


def test_gpt2_config_reads_layernorm_learned_positions_biases_gelu():
    m = load_model(DATA / "gpt2-config.json")
    assert (m.normalization, m.position_embedding, m.bias, m.activation, m.gated_mlp) == \
        ("layernorm", "learned", True, "gelu", False)
    assert m.max_positions == 1024 and m.tied_embeddings and m.ffn == 4 * 768
    assert m.total_params == 124_439_808


def test_gpt3_175b_by_hand():
    m = load_model(MODELS / "gpt3-175b.toml")
    h = 12288
    # Attention 4h^2 with biases 3h (QKV) + h (output); GELU MLP 8h^2 with biases 4h + h;
    # two LayerNorms of weight and bias.
    layer = 4 * h * h + 4 * h + 8 * h * h + 5 * h + 4 * h
    assert m.params_per_layer == layer == 1_812_099_072
    # Token embedding 50257 x h, learned positions 2048 x h, final LayerNorm 2h; the LM head is
    # tied to the embedding.
    assert m.total_params == 96 * layer + 50257 * h + 2048 * h + 2 * h == 174_604_259_328
    # Without biases and LayerNorm's bias vectors, 96 (12 h^2 + 2h) + ...: the fields count.
    plain = replace(m, bias=False, qkv_bias=False, normalization="rmsnorm")
    assert m.params_per_layer - plain.params_per_layer == 9 * h + 2 * h


@pytest.mark.parametrize("name", sorted(p.stem for p in MODELS.glob("*.toml")))
def test_every_catalog_model_states_its_architecture(name):
    text = (MODELS / f"{name}.toml").read_text()
    for key in ("normalization", "norm_epsilon", "position_embedding", "bias", "qkv_bias",
                "activation"):
        assert f"\n{key} = " in text, f"{name} does not state {key}"
    assert "config.json" in text or "Brown et al." in text  # the source, in a comment


def test_catalog_values_are_their_configs():
    def arch(name):
        m = load_model(MODELS / f"{name}.toml")
        return m.normalization, m.norm_epsilon, m.position_embedding, m.rotary_base, m.qkv_bias
    assert arch("llama2-7b") == arch("llama2-13b") == ("rmsnorm", 1e-5, "rope", 1e4, False)
    assert arch("llama3-8b") == arch("llama3-70b") == ("rmsnorm", 1e-5, "rope", 5e5, False)
    assert arch("mixtral-8x22b")[3] == 1e6
    assert arch("qwen3-235b-a22b") == ("rmsnorm", 1e-6, "rope", 1e6, False)
    gpt = load_model(MODELS / "gpt3-175b.toml")
    assert (gpt.normalization, gpt.norm_epsilon, gpt.position_embedding, gpt.bias,
            gpt.activation) == ("layernorm", 1e-5, "learned", True, "gelu")


def test_old_tomls_keep_loading_and_gated_mlp_agrees_with_activation(tmp_path):
    shape = "layers = 2\nhidden = 64\nffn = 128\nheads = 4\nkv_heads = 4\nvocab = 100\n"
    path = tmp_path / "m.toml"
    path.write_text(shape)
    m = load_model(path)
    assert (m.activation, m.gated_mlp, m.normalization, m.bias, m.qkv_bias) == \
        ("swiglu", True, "rmsnorm", False, False)
    path.write_text(shape + "gated_mlp = false\n")
    assert load_model(path).activation == "gelu"
    path.write_text(shape + 'activation = "gelu"\n')
    assert load_model(path).gated_mlp is False
    path.write_text(shape + 'gated_mlp = true\nactivation = "gelu"\n')
    with pytest.raises(InputError, match="contradicts gated_mlp"):
        load_model(path)
    path.write_text(shape + "bias = true\nqkv_bias = false\n")
    with pytest.raises(InputError, match="qkv_bias"):
        load_model(path)
    path.write_text(shape + 'normalization = "batchnorm"\n')
    with pytest.raises(InputError, match="normalization"):
        load_model(path)
    # In code, the fields stay one choice: replace() of gated_mlp changes the activation.
    assert replace(m, gated_mlp=False).activation == "gelu"
    assert replace(m, bias=True).has_qkv_bias and replace(m, bias=True).params_per_layer > \
        m.params_per_layer


def test_a_contradiction_is_one_line_exit_2(tmp_path, capsys):
    job = (INSTANCES / "jobs" / "homog-a100-llama2-13b.toml").read_text()
    model = tmp_path / "m.toml"
    model.write_text("layers = 2\nhidden = 64\nffn = 128\nheads = 4\nkv_heads = 4\n"
                     "vocab = 100\ngated_mlp = false\nactivation = \"swiglu\"\n")
    path = tmp_path / "job.toml"
    path.write_text(job.replace('model = "llama2-13b"', f'model = "{model}"'))
    assert main(["plan", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("error: ") and "activation" in err


def _one_mesh(model, tp=2, seq=2048):
    """Two stages of the model's halves, each on 2 A100 nodes at (tp, dp = 16 / tp),
    batch 64 of one sequence per rank."""
    job = load_job(INSTANCES / "jobs" / "homog-a100-llama2-13b.toml")
    job = with_batch(job, model, 64)
    job = replace(job, training=replace(job.training, seq_len=seq))
    isl = island("a", load_catalog()["A100-SXM-80GB"], 4)
    c = StageConfig(tp=tp, dp=16 // tp, micro_batch=1)
    half = model.layers // 2
    return build_plan(job, [(isl, half, c), (isl, model.layers - half, c)],
                      n_micro=64 // c.dp)


def _flags(plan) -> dict:
    return {a.partition(" ")[0][2:]: a.partition(" ")[2] or True for a in megatron_args(plan)}


def test_megatron_model_block_of_a_gpt_style_model():
    gpt = replace(load_model(MODELS / "gpt3-175b.toml"), layers=4, name="gpt-small")
    f = _flags(_one_mesh(gpt))
    assert f["normalization"] == "LayerNorm" and float(f["norm-epsilon"]) == 1e-5
    assert f["position-embedding-type"] == "learned_absolute"
    assert f["max-position-embeddings"] == "2048" and "rotary-base" not in f
    assert "swiglu" not in f and "disable-bias-linear" not in f  # GELU, biases: the defaults
    assert "untie-embeddings-and-output-weights" not in f  # tied
    assert f["padded-vocab-size"] == "50258"  # 50257 rounded up to a multiple of tp 2
    assert f["kv-channels"] == "128" and "group-query-attention" not in f


def test_megatron_model_block_of_qwen2():
    m = load_model(DATA / "qwen2-7b-config.json")
    f = _flags(_one_mesh(m, tp=2))
    assert f["normalization"] == "RMSNorm" and float(f["norm-epsilon"]) == 1e-6
    assert f["position-embedding-type"] == "rope" and f["rotary-base"] == "1000000"
    assert f["add-qkv-bias"] is True and f["disable-bias-linear"] is True
    assert f["swiglu"] is True and f["untie-embeddings-and-output-weights"] is True
    assert f["group-query-attention"] is True and f["num-query-groups"] == "4"
    assert f["padded-vocab-size"] == "152064" and f["ffn-hidden-size"] == "18944"


def test_learned_positions_shorter_than_the_sequence_are_refused():
    from solver.launch import NotExpressible
    gpt = replace(load_model(MODELS / "gpt3-175b.toml"), layers=4)
    with pytest.raises(NotExpressible, match="learned position table"):
        megatron_args(_one_mesh(gpt, seq=4096))


def test_flagscale_model_block_uses_the_same_keys():
    m = load_model(DATA / "qwen2-7b-config.json")
    plan = _one_mesh(m)
    model = flagscale_config(plan)["model"]
    f = _flags(plan)
    for key, value in model.items():
        flag = key.replace("_", "-")
        if value is True:
            assert f[flag] is True
        elif value is False:
            assert flag not in f
        elif not isinstance(value, dict) and value != "???":
            assert f[flag] == str(value), key
    doc = yaml.safe_load(yaml.safe_dump(model))
    assert doc["add_qkv_bias"] is True and doc["rotary_base"] == 1000000
