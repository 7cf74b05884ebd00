"""Reading a FlagScale config back (:mod:`solver.launch.flagscale_read`) and the Megatron-LM
split and shell details, on configs written by hand (issue 46, point 6: each test kills
mutants mutation testing found alive).

FlagScale (da4935e) reads a hetero config by ``pre_validate_args``: mesh ``i`` runs
``dp_0 · micro_batch_size / dp_i`` sequences per rank and ``n = global_batch / (mbs · dp_0)``
micro-batches; ``post_validate_args`` reads each ``*_per_stage_micro_batch`` entry as
``[stages, n0, v0, n1, v1, ...]`` (the runner may hand the entries over as strings, read with
``ast.literal_eval``). One mesh is plain Megatron-LM: tp, pp, cp and ep default to 1 and
``data_parallel_size = world / (tp · pp · cp)`` (``validate_args``).
"""

from __future__ import annotations

import pytest

from solver.launch.flagscale_read import ReadBack, Stage, read_back
from solver.launch.megatron import _shell, layer_split_flags, megatron_launch, pipeline_layout
from solver.launch.meshes import NotExpressible
from solver.spec.domain import Recompute

#: H100 mesh tp 4 dp 2 pp 1 (8 GPUs), A100 mesh tp 2 dp 4 pp 2 (16 GPUs); 8 layers as 4, 2, 2;
#: 64 sequences in micro-batches of 2 per H100 rank: n = 64 / (2 · 2) = 16; an A100 rank runs
#: 2 · 2 / 4 = 1 sequence per micro-batch. Stage 0 recomputes 3 layers by the block method,
#: the A100 stages nothing.
HOSTS = "h0 slots=8 type=H100\na0 slots=8 type=A100\na1 slots=8 type=A100\n"


def _hetero() -> dict:
    recompute = {
        "recompute_granularity": "full", "recompute_method": "uniform",
        "recompute_num_layers": 1,
        "recompute_granularity_per_stage_micro_batch": [[1, 16, 1], [2, 16, 0]],
        "recompute_method_per_stage_micro_batch": [[1, 16, 1], [2, 16, 0]],
        "recompute_num_layers_per_stage_micro_batch": [[1, 16, 3], [2, 16, 0]]}
    hetero = {"enable_hetero": True,
              "hetero_process_meshes": [4, 1, 1, 2, 1, 2, 1, 1, 4, 2],
              "hetero_pipeline_layer_split": [4, 2, 2],
              "hetero_device_types": ["H100", "A100"], "hetero_current_device_type": "H100"}
    return {"train": {"system": {"pipeline_model_parallel_size": 3, "recompute": recompute,
                                 "hetero": hetero},
                      "model": {"num_layers": 8, "micro_batch_size": 2,
                                "global_batch_size": 64},
                      "data": {}}}


WANT = ReadBack(stages=(Stage(4, 4, 1, 1, 2, 2, "full", 3, "H100"),
                        Stage(2, 2, 1, 1, 4, 1, "none", None, "A100"),
                        Stage(2, 2, 1, 1, 4, 1, "none", None, "A100")),
                virtual_stages=1, n_micro=16, global_batch=64, hetero=True)


def _lists(doc: dict) -> dict:
    return doc["train"]["system"]["recompute"]


def test_a_hetero_config_reads_back_by_hand():
    assert read_back(_hetero(), HOSTS) == WANT


def test_per_stage_entries_given_as_strings_and_split_micro_batches_read_alike():
    # "[2, 8, 0, 8, 0]": two stages, 8 + 8 micro-batches, 0 in both halves.
    doc = _hetero()
    for key, first in (("recompute_granularity_per_stage_micro_batch", 1),
                       ("recompute_method_per_stage_micro_batch", 1),
                       ("recompute_num_layers_per_stage_micro_batch", 3)):
        _lists(doc)[key] = [f"[1, 16, {first}]", "[2, 8, 0, 8, 0]"]
    assert read_back(doc, HOSTS) == WANT


def test_per_stage_entries_must_hold_one_value_and_cover_the_batch_and_the_stages():
    doc = _hetero()
    # 8 + 8 micro-batches with values 0 and 1: not one value for the stage (an export's).
    _lists(doc)["recompute_granularity_per_stage_micro_batch"][1] = [2, 8, 0, 8, 1]
    with pytest.raises(ValueError, match=r"micro-batch counts must sum to 16 "
                                         r"\(post_validate_args\)$"):
        read_back(doc, HOSTS)
    doc = _hetero()
    _lists(doc)["recompute_method_per_stage_micro_batch"] = [[1, 16, 1], [1, 16, 0]]
    with pytest.raises(ValueError, match=r"covers 2 stages, not 3 \(post_validate_args\)$"):
        read_back(doc, HOSTS)


def test_one_mesh_without_parallel_sizes_is_megatrons_default_of_one():
    # 4 layers on 2 GPUs, tp = pp = cp = ep = 1: dp 2, n = 8 / (1 · 2) = 4.
    doc = {"train": {"system": {}, "data": {},
                     "model": {"num_layers": 4, "micro_batch_size": 1,
                               "global_batch_size": 8}}}
    assert read_back(doc, "n0 slots=2\n") == ReadBack(
        (Stage(4, 1, 1, 1, 2, 1, "none", None, None),), 1, 4, 8, False)


def test_megatron_split_flags_by_hand():
    # Equal stages and no interleaving: no flag (the default is one chunk per stage).
    assert layer_split_flags([4, 4]) == {}
    # Interleaving needs equal stages even when each divides into the chunks (8 and 6, v 2).
    with pytest.raises(NotExpressible, match="equal stages"):
        layer_split_flags([8, 6], 2)
    with pytest.raises(NotExpressible, match="equal stages"):
        layer_split_flags([8, 8, 6], 2)
    # A stage with no decoder layer has no "t" in the layout (E alone opens the pipeline).
    assert pipeline_layout([0, 5, 3]) == "E|t*5|t*3L"


def test_a_bare_flag_is_passed_without_a_value():
    # argparse's store_true flags take no value: "--bf16 ''" would be an unrecognized
    # argument.
    assert _shell("--bf16") == "--bf16"
    assert _shell("--pipeline-model-parallel-layout Et*4|t*4L") == \
        "--pipeline-model-parallel-layout 'Et*4|t*4L'"


def test_the_launch_passes_the_bare_flags_bare():
    from tests.launch.test_megatron_flags import _plan
    from solver.spec.loaders import load_catalog
    text = megatron_launch(_plan(load_catalog()["A100-SXM-80GB"], [10, 10]))
    lines = [line.rstrip(" \\") for line in text.splitlines()]
    assert "--use-flash-attn" in lines and "--sequence-parallel" in lines
    assert not any(line.endswith("''") for line in lines)



def test_a_stage_with_granularity_off_recomputes_nothing_whatever_its_layer_count():
    # FlagScale's per-stage granularity 0 switches recomputation off for the stage, even where
    # its num_layers entry is not 0.
    doc = _hetero()
    _lists(doc)["recompute_num_layers_per_stage_micro_batch"] = [[1, 16, 3], [2, 16, 1]]
    assert read_back(doc, HOSTS) == WANT


def test_uniform_recomputation_in_chunks_is_refused_by_name():
    # Megatron's uniform method with chunks of 2 layers recomputes every layer in pairs: no
    # plan asks for it (a plan's full recomputation is chunks of 1 or the block method).
    doc = {"train": {"system": {"recompute_granularity": "full", "recompute_method": "uniform",
                                "recompute_num_layers": 2}, "data": {},
                     "model": {"num_layers": 4, "micro_batch_size": 1,
                               "global_batch_size": 8}}}
    with pytest.raises(ValueError, match=r"^uniform recomputation in chunks of 2 layers is not "
                                         r"a plan's choice$"):
        read_back(doc, "n0 slots=2\n")


def test_nodes_of_different_sizes_take_nproc_per_node_from_the_environment():
    # One layout (tp 4, dp 2: 8 GPUs a stage) on an 8-GPU A100 node and two 4-GPU H100 nodes:
    # torchrun's --nproc-per-node differs by node, so the launch reads it per node.
    from solver.cost.stage import StageConfig
    from solver.spec.loaders import load_catalog
    from tests.launch.readback import build_plan, island, megatron_flags
    from tests.launch.test_megatron_flags import _job
    cat = load_catalog()
    a = island("a", cat["A100-SXM-80GB"], 1)
    h = island("h", cat["H100-SXM-80GB"], 2, per_node=4)
    c = StageConfig(tp=4, dp=2, micro_batch=1)
    plan = build_plan(_job(20, 16), [(a, 10, c), (h, 10, c)], 8)
    text = megatron_launch(plan)
    assert '--nproc-per-node "$NPROC_PER_NODE"' in text
    assert megatron_flags(text)[1] == [8, 4, 4]


def test_a_padded_vocabulary_is_said_in_the_launch_header():
    # 32001 tokens on tp 8: the vocab-parallel embedding needs a multiple of 8, 32008.
    from dataclasses import replace

    from solver.cost.stage import StageConfig
    from solver.spec.loaders import load_catalog
    from tests.launch.readback import build_plan, island, megatron_flags
    from tests.launch.test_megatron_flags import _job
    a = island("a", load_catalog()["A100-SXM-80GB"], 2)
    c = StageConfig(tp=8, dp=1, micro_batch=1)
    note = ("# --padded-vocab-size 32008: the model's 32001 tokens padded to a multiple of the "
            "TP degree (the vocab-parallel embedding splits rows evenly).")
    for vocab, padded in ((32001, 32008), (32000, 32000)):
        job = _job(20, 64)
        job = replace(job, model=replace(job.model, vocab=vocab))
        text = megatron_launch(build_plan(job, [(a, 10, c), (a, 10, c)], 64))
        assert megatron_flags(text)[0]["padded_vocab_size"] == str(padded)
        assert (note in text.splitlines()) == (vocab != padded)
        assert ("padded to a multiple" in text) == (vocab != padded)


def test_the_launch_is_the_header_then_the_command_then_one_flag_a_line():
    from solver.launch.megatron import megatron_args
    from solver.spec.loaders import load_catalog
    from tests.launch.test_megatron_flags import _plan
    plan = _plan(load_catalog()["A100-SXM-80GB"], [10, 10])
    lines = megatron_launch(plan).split("\n")
    body = [line for line in lines if not line.startswith("#")]
    assert body[0].startswith("torchrun --nnodes 2 ") and body[0].endswith(" \\")
    assert body[1:-1] == [_shell(a) + " \\" for a in megatron_args(plan)[:-1]] + \
        [_shell(megatron_args(plan)[-1])]
    assert body[-1] == ""  # the script ends with a newline


def test_megatron_flags_that_depend_on_tp_and_the_kernels():
    # Sequence parallelism and TP comm overlap only with tp > 1 (Megatron-LM's validate_args
    # turns --sequence-parallel off at tp 1 with a warning; the export never
    # asks for it); Transformer Engine and flash attention always.
    from solver.cost.stage import StageConfig
    from solver.spec.loaders import load_catalog
    from tests.launch.test_megatron_flags import _f, _plan
    a100 = load_catalog()["A100-SXM-80GB"]
    one = _f(_plan(a100, [10, 10], StageConfig(tp=1, dp=8, micro_batch=1)))
    two = _f(_plan(a100, [10, 10], StageConfig(tp=2, dp=4, micro_batch=1)))
    eight = _f(_plan(a100, [10, 10]))
    assert "sequence-parallel" not in one and "tp-comm-overlap" not in one
    for f in (two, eight):
        assert f["sequence-parallel"] is True and f["tp-comm-overlap"] is True
    for f in (one, two, eight):
        assert f["transformer-impl"] == "transformer_engine" and f["use-flash-attn"] is True


def test_two_recomputation_settings_are_refused_by_megatron():
    from dataclasses import replace

    from solver.cost.stage import StageConfig
    from solver.launch.megatron import megatron_args
    from solver.spec.loaders import load_catalog
    from tests.launch.readback import build_plan, island
    from tests.launch.test_megatron_flags import _job
    a = island("a", load_catalog()["A100-SXM-80GB"], 3)
    c = StageConfig(tp=8, dp=1, micro_batch=1)
    plan = build_plan(_job(30, 16), [(a, 10, c), (a, 10, replace(c, recompute=Recompute.FULL)),
                                     (a, 10, replace(c, recompute=Recompute.FULL))], 16)
    with pytest.raises(NotExpressible, match="^the stages recompute differently: Megatron-LM "
                                             "sets one recomputation; export to flagscale$"):
        megatron_args(plan)
