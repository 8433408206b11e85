"""Megatron's --yaml-cfg format: sections, derived dests, ${VAR}, and every problem's location."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import TREE_ENV, megatron_tree, shared_file
from megatron_estimator.inputs import megatron_yaml
from megatron_estimator.inputs.megatron_yaml import (
    flags_ignored_by_yaml_cfg,
    load_megatron_yaml,
    yaml_cfg_path,
)

REPO = Path(__file__).resolve().parents[1]
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "megatron-yaml-gpt.yaml"

BASE = """\
language_model:
  num_layers: 2
  hidden_size: 64
  num_attention_heads: 4
  activation_func: gelu
model_parallel:
  tensor_model_parallel_size: 1
  pipeline_model_parallel_size: 1
  context_parallel_size: 1
  expert_model_parallel_size: 1
  sequence_parallel: false
  tp_comm_overlap: false
  fp16: false
  bf16: true
micro_batch_size: 1
seq_length: 128
max_position_embeddings: 128
"""


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "cfg.yaml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return str(path)


def codes_at(items) -> list[tuple[str, str]]:
    return [(p.code, p.location) for p in items]


def lm(extra: str) -> str:
    """BASE with lines added at the end of language_model: (they start at line 6)."""
    return BASE.replace("model_parallel:\n", extra + "model_parallel:\n", 1)


# --- a complete file ------------------------------------------------------------------------

def test_fixture_maps_sections_to_megatron_dests():
    path = str(FIXTURE)
    load = load_megatron_yaml(path, environ={})
    assert load.problems == ()
    got = {d: (s.value, s.location) for d, s in load.raw.settings.items()}
    expected = {
        "num_layers": (24, f"{path}:3 language_model.num_layers"),
        "hidden_size": (2048, f"{path}:4 language_model.hidden_size"),
        "num_attention_heads": (16, f"{path}:5 language_model.num_attention_heads"),
        "group_query_attention": (True, f"{path}:6 language_model.num_query_groups"),
        "num_query_groups": (4, f"{path}:6 language_model.num_query_groups"),
        "ffn_hidden_size": (5632, f"{path}:7 language_model.ffn_hidden_size"),
        "hidden_dropout": (0.0, f"{path}:9 language_model.hidden_dropout"),
        "attention_dropout": (0.0, f"{path}:10 language_model.attention_dropout"),
        "add_bias_linear": (False, f"{path}:11 language_model.add_bias_linear"),
        "swiglu": (True, f"{path}:13 language_model.activation_func"),
        "squared_relu": (False, f"{path}:13 language_model.activation_func"),
        "normalization": ("RMSNorm", f"{path}:14 language_model.normalization"),
        "layernorm_epsilon": (1e-6, f"{path}:15 language_model.layernorm_epsilon"),
        "recompute_granularity": ("selective", f"{path}:17 language_model.recompute_granularity"),
        "recompute_modules": (["core_attn"], f"{path}:18 language_model.recompute_modules"),
        "decoder_first_pipeline_num_layers": (5, f"{path}:22 language_model.num_layers_in_first_pipeline_stage"),
        "tensor_model_parallel_size": (2, f"{path}:25 model_parallel.tensor_model_parallel_size"),
        "pipeline_model_parallel_size": (2, f"{path}:26 model_parallel.pipeline_model_parallel_size"),
        "context_parallel_size": (1, f"{path}:27 model_parallel.context_parallel_size"),
        "expert_model_parallel_size": (1, f"{path}:28 model_parallel.expert_model_parallel_size"),
        "sequence_parallel": (True, f"{path}:29 model_parallel.sequence_parallel"),
        "tp_comm_overlap": (False, f"{path}:30 model_parallel.tp_comm_overlap"),
        "fp16": (False, f"{path}:31 model_parallel.fp16"),
        "bf16": (True, f"{path}:32 model_parallel.bf16"),
        "micro_batch_size": (4, f"{path}:36 micro_batch_size"),
        "global_batch_size": (256, f"{path}:37 global_batch_size"),
        "seq_length": (2048, f"{path}:38 seq_length"),
        "max_position_embeddings": (4096, f"{path}:39 max_position_embeddings"),
        "position_embedding_type": ("rope", f"{path}:40 position_embedding_type"),
        "untie_embeddings_and_output_weights": (True, f"{path}:41 untie_embeddings_and_output_weights"),
        "make_vocab_size_divisible_by": (128, f"{path}:42 make_vocab_size_divisible_by"),
        "vocab_size": (50257, f"{path}:43 vocab_size"),
        "transformer_impl": ("transformer_engine", f"{path}:44 transformer_impl"),
        "use_distributed_optimizer": (True, f"{path}:45 use_distributed_optimizer"),
        "data_path": (["${DATA_ROOT}/my-corpus_text_document"], f"{path}:46 data_path"),
        "tokenizer_type": ("GPT2BPETokenizer", f"{path}:47 tokenizer_type"),
        "lr": (3.0e-4, f"{path}:48 lr"),
        "min_lr": (3.0e-5, f"{path}:49 min_lr"),
    }
    assert got == expected
    # null keys with None defaults stay unset: kv_channels, num_moe_experts, fp8, recompute_method, ...
    for dest in ("kv_channels", "num_experts", "fp8", "recompute_method", "recompute_num_layers"):
        assert dest not in got
    assert codes_at(load.notices) == [
        ("incomplete-transformer-config", f"{path}:2 language_model"),
        ("wrong-section", f"{path}:44 transformer_impl"),
        ("env-not-expanded", f"{path}:46 data_path"),
    ]


def test_shared_yaml_cfg_example():
    # Megatron-LM's last --yaml-cfg example (not ours to commit: tests/fixtures/megatron-yaml-gpt.yaml
    # is our own file in its idiom, checked above)
    from megatron_estimator.inputs.detect import detect_format

    example = shared_file("megatron", "yaml-cfg-example.yaml")
    assert detect_format(example) == "megatron-yaml"
    path = str(example)
    load = load_megatron_yaml(path, environ={})
    assert load.problems == ()
    raw = load.raw
    assert (raw.value("num_layers"), raw.value("hidden_size"), raw.value("num_attention_heads")) == (24, 1024, 16)
    assert raw.location("num_layers") == f"{path}:4 language_model.num_layers"
    assert raw.value("group_query_attention") is False          # num_query_groups: null
    assert (raw.value("swiglu"), raw.value("squared_relu")) == (True, False)
    assert raw.location("swiglu") == f"{path}:22 language_model.activation_func"
    assert raw.value("normalization") == "LayerNorm"
    assert raw.value("no_persist_layer_norm") is True            # persist_layer_norm: False
    assert (raw.value("bf16"), raw.value("fp16")) == (True, False)
    assert (raw.value("micro_batch_size"), raw.value("global_batch_size"), raw.value("seq_length")) == (2, 128, 4096)
    assert raw.value("transformer_impl") == "local"
    assert raw.value("use_distributed_optimizer") is False
    assert raw.value("moe_router_load_balancing_type") == ["aux_loss"]
    assert raw.value("initial_loss_scale") == 4294967296.0 and type(raw.value("initial_loss_scale")) is float
    assert not raw.given("num_layers_per_virtual_pipeline_stage")
    notices = codes_at(load.notices)
    assert ("ignored-key", f"{path}:21 language_model.gated_linear_unit") in notices
    assert ("retired-key", f"{path}:135 use_legacy_models") in notices
    assert ("retired-key", f"{path}:224 standalone_embedding_stage") in notices
    assert ("ignored-key", f"{path}:160 swiglu") in notices
    assert ("wrong-section", f"{path}:165 transformer_impl") in notices


# --- ${VAR}: Megatron reads it literally ----------------------------------------------------

def test_env_var_in_a_number_is_a_problem_naming_the_variable(tmp_path):
    path = write(tmp_path, BASE.replace("  num_layers: 2", "  num_layers: ${NUM_LAYERS}")
                 .replace("seq_length: 128", "seq_length: ${SEQ}"))
    load = load_megatron_yaml(path, environ={"NUM_LAYERS": "32"})
    assert codes_at(load.problems) == [
        ("env-not-expanded", f"{path}:2 language_model.num_layers"),
        ("env-not-expanded", f"{path}:16 seq_length"),
    ]
    first, second = (p.message for p in load.problems)
    assert first.startswith("Megatron will not expand '${NUM_LAYERS}': load_yaml parses with yaml.safe_load")
    assert "(NUM_LAYERS is '32' here)" in first and "num_layers would be that string, not an integer" in first
    assert "(SEQ is not set here)" in second
    assert not load.raw.given("num_layers") and not load.raw.given("seq_length")


def test_env_var_in_a_string_is_a_notice(tmp_path):
    path = write(tmp_path, BASE + "save: ${CKPT}/run1\n")
    load = load_megatron_yaml(path, environ={"CKPT": "/ckpt"})
    assert load.problems == ()
    assert codes_at(load.notices)[-1] == ("env-not-expanded", f"{path}:18 save")
    assert load.raw.value("save") == "${CKPT}/run1"


def test_megatrons_env_resolver_does_not_reach_safe_load():
    """The fact behind the two tests above, reproduced the way yaml_arguments.py registers it."""
    code = textwrap.dedent(r"""
        import os, re, yaml
        pattern = re.compile(r".*?\${(.*?)}.*?")
        def expand(loader, node):
            value = loader.construct_scalar(node)
            for group in pattern.findall(value):
                value = value.replace("${%s}" % group, os.environ[group])
            return value
        yaml.add_implicit_resolver("!pathex", pattern)
        yaml.add_constructor("!pathex", expand)
        print(yaml.safe_load("a: ${X}")["a"], yaml.load("a: ${X}", Loader=yaml.FullLoader)["a"])
    """)
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "X": "42"},
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["${X}", "42"]


# --- unknown keys, sections, collisions -----------------------------------------------------

def test_unknown_keys_in_each_place_with_did_you_mean(tmp_path):
    text = lm("  hiden_dropout: 0.1\n  seq_length: 128\n")
    text = text.replace("  bf16: true\n", "  bf16: true\n  tensor_model_paralel_size: 2\n")
    text += "lerning_rate: 0.1\nglobal_bach_size: 8\nnum_layers_in_first_pipeline_stage: 1\n"
    path = write(tmp_path, text)
    load = load_megatron_yaml(path, environ={})
    assert codes_at(load.problems) == [
        ("unknown-key", f"{path}:6 language_model.hiden_dropout"),
        ("unknown-key", f"{path}:7 language_model.seq_length"),
        ("unknown-key", f"{path}:17 model_parallel.tensor_model_paralel_size"),
        ("unknown-key", f"{path}:21 lerning_rate"),
        ("unknown-key", f"{path}:22 global_bach_size"),
    ]
    messages = [p.message for p in load.problems]
    assert messages == [
        "unknown key hiden_dropout in section language_model; did you mean hidden_dropout?",
        "unknown key seq_length in section language_model: seq_length is a top-level training argument, "
        "not a language_model field",
        "unknown key tensor_model_paralel_size in section model_parallel; did you mean tensor_model_parallel_size?",
        "unknown key lerning_rate at the top level",
        "unknown key global_bach_size at the top level; did you mean global_batch_size?",
    ]
    # A config field at the top level is not unknown (code reading args.<key> sees it), but the
    # model config does not: a notice, and no dest (its dest would be decoder_first_pipeline_num_layers).
    assert ("wrong-section", f"{path}:23 num_layers_in_first_pipeline_stage") in codes_at(load.notices)
    assert not load.raw.given("decoder_first_pipeline_num_layers")


def test_a_key_in_two_sections_is_megatrons_type_error(tmp_path):
    path = write(tmp_path, lm("  sequence_parallel: true\n") + "hidden_size: 64\n")
    load = load_megatron_yaml(path, environ={})
    assert codes_at(load.problems) == [
        ("duplicate-across-sections", f"{path}:3 language_model.hidden_size"),
        ("duplicate-across-sections", f"{path}:12 model_parallel.sequence_parallel"),
    ]
    assert load.problems[0].message.startswith("hidden_size is given both here and at the top level (line 19)")
    assert load.problems[1].message.startswith("sequence_parallel is given both here and at language_model: (line 6)")


def test_duplicate_key_and_syntax_error(tmp_path):
    path = write(tmp_path, BASE.replace("  hidden_size: 64\n", "  hidden_size: 64\n  hidden_size: 128\n"))
    load = load_megatron_yaml(path, environ={})
    assert codes_at(load.problems) == [("duplicate-key", f"{path}:4 language_model.hidden_size")]
    assert load.raw.value("hidden_size") == 128
    broken = write(tmp_path, "language_model:\n  num_layers: 2\n hidden_size: 64\n")
    load = load_megatron_yaml(broken, environ={})
    assert codes_at(load.problems) == [("yaml-syntax", f"{broken}:3")]


# --- required keys --------------------------------------------------------------------------

def test_missing_sections_and_required_keys(tmp_path):
    path = write(tmp_path, "micro_batch_size: 1\nseq_length: 128\nmax_position_embeddings: 128\n")
    load = load_megatron_yaml(path, environ={})
    assert codes_at(load.problems) == [("missing-key", f"{path}:1 language_model"),
                                       ("missing-key", f"{path}:1 model_parallel")]


def test_required_keys_missing_null_or_in_the_wrong_section(tmp_path):
    text = BASE.replace("  activation_func: gelu\n", "  sequence_parallel: false\n")
    text = text.replace("  sequence_parallel: false\n  tp_comm_overlap", "  tp_comm_overlap")
    text = text.replace("  hidden_size: 64", "  hidden_size: null").replace("micro_batch_size: 1\n", "")
    path = write(tmp_path, text)
    load = load_megatron_yaml(path, environ={})
    assert codes_at(load.problems) == [
        ("missing-key", f"{path}:1 language_model.activation_func"),
        ("missing-key", f"{path}:1 micro_batch_size"),
        ("missing-key", f"{path}:3 language_model.hidden_size"),
        ("missing-key", f"{path}:6 model_parallel.sequence_parallel"),
    ]
    assert load.problems[2].message == "hidden_size is null; Megatron requires a value"
    assert load.problems[3].message == ("model_parallel.sequence_parallel is missing (it is at language_model:, "
                                        "where Megatron does not read it); Megatron's validate_yaml reads it")


def test_encoder_keys_stand_in_for_null_num_layers_and_seq_length(tmp_path):
    text = BASE.replace("  num_layers: 2", "  num_layers: null").replace("seq_length: 128", "seq_length: null")
    path = write(tmp_path, text + "encoder_num_layers: 6\nencoder_seq_length: 256\n")
    load = load_megatron_yaml(path, environ={})
    assert load.problems == ()
    assert (load.raw.value("num_layers"), load.raw.location("num_layers")) == (6, f"{path}:18 encoder_num_layers")
    assert (load.raw.value("seq_length"), load.raw.location("seq_length")) == (256, f"{path}:19 encoder_seq_length")
    both = write(tmp_path, BASE + "encoder_num_layers: 6\n")
    load = load_megatron_yaml(both, environ={})
    assert codes_at(load.problems) == [("conflicting-keys", f"{both}:18 encoder_num_layers")]


# --- values ---------------------------------------------------------------------------------

def test_wrong_types_and_choices(tmp_path):
    text = lm("  layernorm_epsilon: 1e-5\n  normalization: rmsnorm\n  hidden_dropout: \"0.1\"\n")
    path = write(tmp_path, text.replace("micro_batch_size: 1", "micro_batch_size: two"))
    load = load_megatron_yaml(path, environ={})
    assert codes_at(load.problems) == [
        ("wrong-type", f"{path}:6 language_model.layernorm_epsilon"),
        ("invalid-choice", f"{path}:7 language_model.normalization"),
        ("wrong-type", f"{path}:8 language_model.hidden_dropout"),
        ("wrong-type", f"{path}:18 micro_batch_size"),
    ]
    messages = [p.message for p in load.problems]
    assert messages[0] == ("layernorm_epsilon must be a number, not the string '1e-5' (YAML 1.1, which PyYAML "
                           "and Megatron read, takes 1e-5 for a string; write 1.0e-5)")
    assert messages[1] == "normalization must be one of LayerNorm, RMSNorm, not 'rmsnorm'; did you mean RMSNorm?"
    assert messages[3] == "micro_batch_size must be an integer, not the string 'two'"
    assert not load.raw.given("micro_batch_size") and not load.raw.given("layernorm_epsilon")


def test_activation_functions(tmp_path):
    squared = load_megatron_yaml(write(tmp_path, BASE.replace("gelu", "squaredrelu")), environ={})
    assert squared.problems == ()
    assert (squared.raw.value("swiglu"), squared.raw.value("squared_relu")) == (False, True)
    path = write(tmp_path, BASE.replace("gelu", "relu"))
    bad = load_megatron_yaml(path, environ={})
    assert codes_at(bad.problems) == [("invalid-choice", f"{path}:5 language_model.activation_func")]
    assert bad.problems[0].message.endswith("not 'relu'; did you mean gelu?")
    path = write(tmp_path, lm("  gated_linear_unit: true\n"))
    geglu = load_megatron_yaml(path, environ={})
    assert codes_at(geglu.problems) == [("unsupported-setting", f"{path}:6 language_model.gated_linear_unit")]


def test_top_level_activation_flags_do_not_shape_the_model(tmp_path):
    path = write(tmp_path, BASE + "swiglu: true\ngroup_query_attention: true\n")
    load = load_megatron_yaml(path, environ={})
    assert load.problems == ()
    assert load.raw.value("swiglu") is False                      # activation_func: gelu decides
    assert not load.raw.given("group_query_attention")
    assert codes_at(load.notices)[1:] == [
        ("ignored-key", f"{path}:18 swiglu"),
        ("conflicting-keys", f"{path}:18 swiglu"),
        ("ignored-key", f"{path}:19 group_query_attention"),
    ]


def test_null_booleans_read_false_and_overwritten_keys_are_notices(tmp_path):
    text = BASE.replace("  bf16: true\n", "  bf16: true\n  virtual_pipeline_model_parallel_size: 4\n"
                        "  params_dtype: bfloat16\n  use_cpu_initialization: null\n")
    path = write(tmp_path, text + "num_layers_per_virtual_pipeline_stage: 1\n")
    load = load_megatron_yaml(path, environ={})
    assert load.problems == ()
    assert load.raw.value("use_cpu_initialization") is False
    assert load.raw.value("num_layers_per_virtual_pipeline_stage") == 1
    assert not load.raw.given("virtual_pipeline_model_parallel_size")
    assert codes_at(load.notices)[1:] == [
        ("ignored-key", f"{path}:15 model_parallel.virtual_pipeline_model_parallel_size"),
        ("ignored-key", f"{path}:16 model_parallel.params_dtype"),
    ]


# --- the command line under --yaml-cfg ------------------------------------------------------

def test_flags_ignored_by_yaml_cfg():
    argv = ["--yaml-cfg", "gpt.yaml", "--num-layers", "32", "--bf16", "--lr=1e-4",
            "--data-path", "a", "b", "--micro-batch-size", "1"]
    assert yaml_cfg_path(argv) == "gpt.yaml"
    assert flags_ignored_by_yaml_cfg(argv) == ("--num-layers", "--bf16", "--lr", "--data-path", "--micro-batch-size")
    assert flags_ignored_by_yaml_cfg(["--num-layers", "32", "--bf16"]) == ()
    assert yaml_cfg_path(["--yaml-cfg=a.yaml", "--yaml-cfg", "b.yaml"]) == "b.yaml"
    assert flags_ignored_by_yaml_cfg(["--yaml-cfg=a.yaml", "--seq-length", "4096"]) == ("--seq-length",)


# --- the key table is Megatron's ------------------------------------------------------------

def test_key_table_matches_megatron_source():
    # the generator's check: data/megatron_yaml_keys.json is what scripts/gen_megatron_yaml_keys read
    # from a Megatron-LM tree; this regenerates it from the tree MEGATRON_LM_TREE names
    MEGATRON_SOURCE = megatron_tree("megatron/core/model_parallel_config.py")
    if MEGATRON_SOURCE is None:
        pytest.skip(f"set {TREE_ENV} to a Megatron-LM checkout to regenerate the committed key table from it")
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import gen_megatron_yaml_keys as gen
    finally:
        sys.path.pop(0)
    data = json.loads(megatron_yaml.KEYS_PATH.read_text(encoding="utf-8"))
    tc_path = MEGATRON_SOURCE / "megatron/core/transformer/transformer_config.py"
    mp = gen.dataclass_fields(MEGATRON_SOURCE / "megatron/core/model_parallel_config.py", "ModelParallelConfig")
    assert data["model_parallel"] == mp
    assert data["language_model"] == [f for f in gen.dataclass_fields(tc_path, "TransformerConfig") if f not in mp]
    assert "tensor_model_parallel_size" in mp and "num_layers" in data["language_model"]
    assert data["dests"]["num_layers"] == {"kind": "int", "default_none": True}
    assert data["dests"]["recompute_granularity"] == {"kind": "str", "default_none": True,
                                                      "choices": ["full", "selective"]}


def test_env_var_in_a_choice_is_a_problem(tmp_path):
    path = write(tmp_path, lm("  normalization: ${NORM}\n"))
    load = load_megatron_yaml(path, environ={})
    assert codes_at(load.problems) == [("env-not-expanded", f"{path}:6 language_model.normalization")]
    assert "so normalization would be that string, not one of LayerNorm, RMSNorm (NORM is not set here)" \
        in load.problems[0].message


def test_settings_the_file_lacks_are_located_in_the_file(tmp_path):
    from megatron_estimator import api

    path = tmp_path / "gpt.yaml"
    path.write_text("language_model:\n  num_layers: 2\n  hidden_size: 64\n  num_attention_heads: 4\n"
                    "  activation_func: gelu\nmodel_parallel:\n  tensor_model_parallel_size: 1\n"
                    "  pipeline_model_parallel_size: 1\n  context_parallel_size: 1\n"
                    "  expert_model_parallel_size: 1\n  sequence_parallel: false\n  tp_comm_overlap: false\n"
                    "  fp16: false\n  bf16: true\nmicro_batch_size: 1\nseq_length: 32\n"
                    "tokenizer_type: GPTSentencePieceTokenizer\n")
    inp, problems = api.load_input(str(path), environ={})
    verdict = api.evaluate(inp, world_size=1, problems=problems, environ={})
    assert [(p.code, p.location, p.message) for p in verdict.problems] == [
        ("missing-required", f"{path}:1 max_position_embeddings",
         "max_position_embeddings is required (Megatron's --max-position-embeddings)"),
    ]
    path.write_text(path.read_text() + "max_position_embeddings: 32\n")
    inp, problems = api.load_input(str(path), environ={})
    verdict = api.evaluate(inp, world_size=1, problems=problems, environ={})
    assert [(p.code, p.location, p.message) for p in verdict.problems] == [
        ("unknown-vocab-size", f"{path}:17 tokenizer_type",
         "cannot tell the vocabulary size of tokenizer GPTSentencePieceTokenizer: its files are not on this "
         f"machine; set vocab_size ({path}:1 vocab_size)"),
    ]
