"""The seed YAML loader: schema problems with exact locations, and keys -> Megatron dests."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from megatron_estimator.inputs import seed_yaml
from megatron_estimator.inputs.seed_yaml import SEED_SCHEMA_PATH, load_seed_yaml

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"

MINIMAL = """\
model:
  num_layers: 2
  hidden_size: 64
  num_attention_heads: 4
  vocab_size: 1000
  max_position_embeddings: 128
parallelism:
  tensor_model_parallel_size: 1
  pipeline_model_parallel_size: 1
training:
  micro_batch_size: 1
  seq_length: 128
world_size: 1
"""


def write(tmp_path: Path, text: str, name: str = "cfg.yaml") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return str(path)


def settings(load) -> dict:
    return {dest: (s.value, s.location) for dest, s in load.raw.settings.items()}


def codes_at(load) -> list[tuple[str, str]]:
    return [(p.code, p.location) for p in load.problems]


# --- the shipped examples -------------------------------------------------------------------

def test_llama3_8b_example_maps_every_key_to_its_megatron_dest():
    path = "examples/llama3-8b.yaml"
    load = load_seed_yaml(REPO / path)
    assert load.problems == () and load.world_size_unknown is None
    assert load.world_size == 8
    assert load.world_size_location == f"{REPO / path}:33 training.world_size"
    p = str(REPO / path)
    default = f"{p} model.%s (seed-format default)"
    assert settings(load) == {
        "num_layers": (32, f"{p}:8 model.num_layers"),
        "hidden_size": (4096, f"{p}:9 model.hidden_size"),
        "num_attention_heads": (32, f"{p}:10 model.num_attention_heads"),
        "group_query_attention": (True, f"{p}:11 model.num_query_groups"),
        "num_query_groups": (8, f"{p}:11 model.num_query_groups"),
        "ffn_hidden_size": (14336, f"{p}:12 model.ffn_hidden_size"),
        "vocab_size": (128256, f"{p}:13 model.vocab_size"),
        "max_position_embeddings": (8192, f"{p}:14 model.max_position_embeddings"),
        "normalization": ("RMSNorm", f"{p}:15 model.normalization"),
        "layernorm_epsilon": (1e-5, f"{p}:16 model.layernorm_epsilon"),
        "swiglu": (True, f"{p}:17 model.activation_func"),
        "hidden_dropout": (0.0, f"{p}:19 model.hidden_dropout"),
        "attention_dropout": (0.0, f"{p}:20 model.attention_dropout"),
        # the seed's model: rotary positions, its own output layer, no linear biases
        "position_embedding_type": ("rope", default % "position_embedding_type"),
        "untie_embeddings_and_output_weights": (True, default % "untie_embeddings_and_output_weights"),
        "add_bias_linear": (False, default % "add_bias_linear"),
        "tensor_model_parallel_size": (2, f"{p}:23 parallelism.tensor_model_parallel_size"),
        "pipeline_model_parallel_size": (1, f"{p}:24 parallelism.pipeline_model_parallel_size"),
        "context_parallel_size": (1, f"{p}:25 parallelism.context_parallel_size"),
        "micro_batch_size": (1, f"{p}:28 training.micro_batch_size"),
        "seq_length": (8192, f"{p}:29 training.seq_length"),
        "global_batch_size": (128, f"{p}:30 training.global_batch_size"),
        "use_distributed_optimizer": (True, f"{p}:31 training.use_distributed_optimizer"),
        "sequence_parallel": (True, f"{p}:32 training.sequence_parallel"),
        "bf16": (True, f"{p}:36 precision.params_dtype"),
    }
    assert [note.split(" (")[0] for note in load.notes] == [
        "seed-format default: model.position_embedding_type rope",
        "seed-format default: model.untie_embeddings_and_output_weights true",
        "seed-format default: model.add_bias_linear false",
    ]


def test_llama3_70b_example_uses_interleaving_and_context_parallel():
    load = load_seed_yaml(REPO / "examples/llama3-70b-tight.yaml")
    assert load.problems == ()
    assert load.world_size == 64
    raw = load.raw
    p = str(REPO / "examples/llama3-70b-tight.yaml")
    assert (raw.value("num_layers"), raw.value("hidden_size"), raw.value("ffn_hidden_size")) == (80, 8192, 28672)
    assert raw.value("num_virtual_stages_per_pipeline_rank") == 5
    assert raw.location("num_virtual_stages_per_pipeline_rank") == f"{p}:27 parallelism.virtual_pipeline_model_parallel_size"
    assert (raw.value("tensor_model_parallel_size"), raw.value("pipeline_model_parallel_size"),
            raw.value("context_parallel_size")) == (4, 4, 2)
    # 64 GPUs / (TP 4 * PP 4 * CP 2) = DP 2; 128 / (1 * 2) = 64 microbatches, a multiple of PP 4.
    assert raw.value("global_batch_size") // (raw.value("micro_batch_size") * 2) % 4 == 0
    assert not raw.given("expert_tensor_parallel_size")


# --- the deliberately broken fixture: every problem, each at its line ------------------------

def test_broken_fixture_reports_every_problem_at_its_line():
    path = str(FIXTURES / "seed-broken.yaml")
    load = load_seed_yaml(path)
    assert codes_at(load) == [
        ("duplicate-key", f"{path}:21 training.recompute_method"),
        ("missing-key", f"{path}:2 model.hidden_size"),
        ("unknown-key", f"{path}:4 model.hidden_sise"),
        ("out-of-range", f"{path}:6 model.num_query_groups"),
        ("wrong-type", f"{path}:8 model.vocab_size"),
        ("invalid-choice", f"{path}:10 model.normalization"),
        ("wrong-type", f"{path}:11 model.layernorm_epsilon"),
        ("out-of-range", f"{path}:12 model.hidden_dropout"),
        ("unknown-key", f"{path}:16 parallelism.micro_batch_size"),
        ("missing-key", f"{path}:17 training.micro_batch_size"),
        ("invalid-choice", f"{path}:24 precision.params_dtype"),
        ("conflicting-keys", f"{path}:25 world_size"),
    ]
    messages = [p.message for p in load.problems]
    assert messages[2] == "unknown key hidden_sise in section model; did you mean hidden_size?"
    assert messages[5] == ("normalization must be one of RMSNorm, LayerNorm, not rmsnorm; "
                           "did you mean RMSNorm?")
    assert "write 1.0e-5" in messages[6]
    assert messages[8] == ("unknown key micro_batch_size in section parallelism: "
                           "micro_batch_size belongs under training:")
    assert messages[10] == "params_dtype must be one of bf16, fp16, fp32, not bf32; did you mean fp32?"
    assert messages[11] == (f"the world size is given twice: 16 here, 8 at {path}:22 training.world_size; "
                            "give it once")
    # Bad values are not mapped; good ones still are, and the world size is unknown.
    assert not load.raw.given("vocab_size") and not load.raw.given("normalization")
    assert load.raw.value("recompute_method") == "block"          # YAML keeps the later value
    assert load.raw.value("num_layers") == 32
    assert load.world_size is None and load.world_size_unknown is None   # reported once, as the conflict


# --- defaults and the mapping ---------------------------------------------------------------

def test_seed_defaults_are_written_out_and_megatron_defaults_are_left_unset(tmp_path):
    path = write(tmp_path, MINIMAL)
    load = load_seed_yaml(path)
    assert load.problems == ()
    got = settings(load)
    assert got["normalization"] == ("RMSNorm", f"{path} model.normalization (seed-format default)")
    assert got["swiglu"] == (True, f"{path} model.activation_func (seed-format default)")
    assert got["bf16"] == (True, f"{path} precision.params_dtype (seed-format default)")
    assert got["use_distributed_optimizer"] == (True, f"{path} training.use_distributed_optimizer (seed-format default)")
    # Defaults for experts and full recompute apply only to a MoE model and to full recompute;
    # the seed's defaults that Megatron shares (one query group per head, no fp8, ...) need no setting.
    for dest in ("expert_tensor_parallel_size", "moe_grouped_gemm", "recompute_num_layers", "ffn_hidden_size",
                 "group_query_attention", "num_query_groups", "fp8", "sequence_parallel"):
        assert dest not in got
    assert load.world_size == 1 and load.world_size_location == f"{path}:13 world_size"
    assert [note.split(" (")[0] for note in load.notes] == [
        "seed-format default: model.normalization RMSNorm",
        "seed-format default: model.position_embedding_type rope",
        "seed-format default: model.untie_embeddings_and_output_weights true",
        "seed-format default: model.add_bias_linear false",
        "seed-format default: training.use_distributed_optimizer true",
        "seed-format default: model.activation_func swiglu",
        "seed-format default: precision.params_dtype bf16",
    ]


def test_explicit_keys_replace_the_seed_defaults(tmp_path):
    text = MINIMAL.replace("  max_position_embeddings: 128\n",
                           "  max_position_embeddings: 128\n  normalization: LayerNorm\n  activation_func: gelu\n")
    text = text.replace("  seq_length: 128\n", "  seq_length: 128\n  use_distributed_optimizer: false\n")
    text += "precision:\n  params_dtype: fp16\n"
    path = write(tmp_path, text)
    load = load_seed_yaml(path)
    assert load.problems == ()
    got = settings(load)
    assert got["normalization"] == ("LayerNorm", f"{path}:7 model.normalization")
    assert got["use_distributed_optimizer"] == (False, f"{path}:15 training.use_distributed_optimizer")
    assert got["fp16"] == (True, f"{path}:18 precision.params_dtype")
    assert "bf16" not in got and "swiglu" not in got and "squared_relu" not in got


@pytest.mark.parametrize("value, expected", [("fp32", {}), ("bf16", {"bf16": True}), ("fp16", {"fp16": True})])
def test_params_dtype(tmp_path, value, expected):
    load = load_seed_yaml(write(tmp_path, MINIMAL + f"precision:\n  params_dtype: {value}\n"))
    got = {d: load.raw.value(d) for d in ("bf16", "fp16") if load.raw.given(d)}
    assert got == expected


@pytest.mark.parametrize("value, expected", [("true", "hybrid"), ("e4m3", "e4m3"), ("hybrid", "hybrid"),
                                             ("false", None)])
def test_fp8(tmp_path, value, expected):
    path = write(tmp_path, MINIMAL + f"precision:\n  fp8: {value}\n")
    load = load_seed_yaml(path)
    assert load.problems == ()
    assert load.raw.value("fp8") == expected
    if expected is not None:
        assert load.raw.location("fp8") == f"{path}:15 precision.fp8"


def test_fp8_format_outside_megatrons_choices(tmp_path):
    path = write(tmp_path, MINIMAL + "precision:\n  fp8: e5m2\n")
    load = load_seed_yaml(path)
    assert codes_at(load) == [("invalid-choice", f"{path}:15 precision.fp8")]
    assert load.problems[0].message == "fp8 must be one of false, true, hybrid, e4m3, not e5m2"


def test_query_groups_equal_to_heads_is_plain_multi_head_attention(tmp_path):
    load = load_seed_yaml(write(tmp_path, MINIMAL.replace("  num_attention_heads: 4\n",
                                                          "  num_attention_heads: 4\n  num_query_groups: 4\n")))
    assert not load.raw.given("group_query_attention") and not load.raw.given("num_query_groups")


def test_pipeline_and_expert_keys_map_to_megatron_dests(tmp_path):
    path = write(tmp_path, """\
        model:
          num_layers: 16
          hidden_size: 64
          num_attention_heads: 4
          vocab_size: 1000
          max_position_embeddings: 128
          num_experts: 8
          moe_router_topk: 2
          moe_ffn_hidden_size: 32
          moe_layer_freq: [0, 1]
        parallelism:
          tensor_model_parallel_size: 1
          pipeline_model_parallel_size: 4
          num_layers_in_first_pipeline_stage: 3
          num_layers_in_last_pipeline_stage: 5
          expert_model_parallel_size: 2
          expert_tensor_parallel_size: 1
          virtual_pipeline_model_parallel_size: 2
        training:
          micro_batch_size: 1
          seq_length: 128
        world_size: 8
        """)
    load = load_seed_yaml(path)
    assert load.problems == ()
    got = settings(load)
    assert got["num_experts"] == (8, f"{path}:7 model.num_experts")
    assert got["moe_router_topk"] == (2, f"{path}:8 model.moe_router_topk")
    assert got["moe_ffn_hidden_size"] == (32, f"{path}:9 model.moe_ffn_hidden_size")
    assert got["moe_layer_freq"] == ([0, 1], f"{path}:10 model.moe_layer_freq")
    assert got["pipeline_model_parallel_size"] == (4, f"{path}:13 parallelism.pipeline_model_parallel_size")
    assert got["decoder_first_pipeline_num_layers"] == (3, f"{path}:14 parallelism.num_layers_in_first_pipeline_stage")
    assert got["decoder_last_pipeline_num_layers"] == (5, f"{path}:15 parallelism.num_layers_in_last_pipeline_stage")
    assert got["expert_model_parallel_size"] == (2, f"{path}:16 parallelism.expert_model_parallel_size")
    assert got["expert_tensor_parallel_size"] == (1, f"{path}:17 parallelism.expert_tensor_parallel_size")
    assert got["num_virtual_stages_per_pipeline_rank"] == (2, f"{path}:18 parallelism.virtual_pipeline_model_parallel_size")
    assert load.world_size == 8


def test_recompute_keys_keep_megatron_dests(tmp_path):
    text = MINIMAL.replace("  seq_length: 128\n", "  seq_length: 128\n  recompute_granularity: full\n"
                           "  recompute_method: block\n  recompute_num_layers: 2\n")
    load = load_seed_yaml(write(tmp_path, text))
    assert load.problems == ()
    assert [load.raw.value(d) for d in ("recompute_granularity", "recompute_method", "recompute_num_layers")] \
        == ["full", "block", 2]


def test_integral_floats_become_integers(tmp_path):
    load = load_seed_yaml(write(tmp_path, MINIMAL.replace("hidden_size: 64", "hidden_size: 64.0")))
    assert load.problems == ()
    value = load.raw.value("hidden_size")
    assert value == 64 and type(value) is int


# --- activation and gating ------------------------------------------------------------------

def test_squared_relu(tmp_path):
    text = MINIMAL.replace("  max_position_embeddings: 128\n", "  max_position_embeddings: 128\n  activation_func: squared_relu\n")
    path = write(tmp_path, text)
    load = load_seed_yaml(path)
    assert settings(load)["squared_relu"] == (True, f"{path}:7 model.activation_func")
    assert not load.raw.given("swiglu")


def test_gated_gelu_has_no_megatron_flag(tmp_path):
    text = MINIMAL.replace("  max_position_embeddings: 128\n",
                           "  max_position_embeddings: 128\n  activation_func: gelu\n  gated_linear_unit: true\n")
    path = write(tmp_path, text)
    load = load_seed_yaml(path)
    assert codes_at(load) == [("unsupported-setting", f"{path}:8 model.gated_linear_unit")]


def test_ungated_swiglu_contradicts_itself(tmp_path):
    text = MINIMAL.replace("  max_position_embeddings: 128\n", "  max_position_embeddings: 128\n  gated_linear_unit: false\n")
    path = write(tmp_path, text)
    load = load_seed_yaml(path)
    assert codes_at(load) == [("conflicting-keys", f"{path}:7 model.gated_linear_unit")]
    assert "(the seed-format default)" in load.problems[0].message
    assert not load.raw.given("swiglu")


# --- structural problems --------------------------------------------------------------------

def test_yaml_syntax_error_is_one_problem_with_yamls_description(tmp_path):
    path = write(tmp_path, "model:\n  num_layers: 2\n  hidden_size: [64\nparallelism: {}\n")
    load = load_seed_yaml(path)
    assert len(load.problems) == 1
    problem = load.problems[0]
    assert problem.code == "yaml-syntax"
    assert problem.location == f"{path}:4"
    assert problem.message == ("YAML syntax error: while parsing a flow sequence; "
                               "expected ',' or ']', but got ':' (column 12)")
    assert load.raw.settings == {} and load.world_size is None


def test_empty_missing_and_non_mapping_files(tmp_path):
    empty = write(tmp_path, "# nothing\n", "empty.yaml")
    assert codes_at(load_seed_yaml(empty)) == [("empty-file", f"{empty}:1")]
    missing = str(tmp_path / "absent.yaml")
    assert codes_at(load_seed_yaml(missing)) == [("file-not-found", missing)]
    listing = write(tmp_path, "\n- model\n- parallelism\n", "list.yaml")
    load = load_seed_yaml(listing)
    assert codes_at(load) == [("wrong-type", f"{listing}:2")]
    assert load.problems[0].message == "the top level must be a mapping of sections, not a list"


def test_section_of_the_wrong_type_and_missing_section(tmp_path):
    text = MINIMAL.replace("parallelism:\n  tensor_model_parallel_size: 1\n  pipeline_model_parallel_size: 1\n",
                           "parallelism: 8\n")
    text = text.replace("training:\n  micro_batch_size: 1\n  seq_length: 128\n", "")
    path = write(tmp_path, "\n" + text)
    load = load_seed_yaml(path)
    assert codes_at(load) == [
        ("missing-key", f"{path}:2 training"),
        ("wrong-type", f"{path}:8 parallelism"),
    ]
    assert load.problems[0].message == "required section training is missing from the top level"
    assert load.problems[1].message == "parallelism must be a mapping, not the integer 8"


def test_unknown_keys_at_the_top_level(tmp_path):
    path = write(tmp_path, MINIMAL.replace("world_size: 1\n", "world_size: 1\nmodle: {}\nnum_layers: 3\n"))
    load = load_seed_yaml(path)
    assert codes_at(load) == [("unknown-key", f"{path}:14 modle"), ("unknown-key", f"{path}:15 num_layers")]
    assert load.problems[0].message == "unknown key modle at the top level; did you mean model?"
    assert load.problems[1].message == "unknown key num_layers at the top level: num_layers belongs under model:"


def test_several_problems_in_one_key_list_and_world_size(tmp_path):
    text = MINIMAL.replace("  seq_length: 128\n", "  seq_length: 128\n  recompute_modules: [core_attn, mlpp, core_attn]\n")
    text = text.replace("world_size: 1", "world_size: 0")
    path = write(tmp_path, text)
    load = load_seed_yaml(path)
    assert codes_at(load) == [
        ("invalid-choice", f"{path}:13 training.recompute_modules"),
        ("invalid-choice", f"{path}:13 training.recompute_modules"),
        ("out-of-range", f"{path}:14 world_size"),
    ]
    assert sorted(p.message for p in load.problems[:2]) == [
        "recompute_modules (item 2) must be one of core_attn, moe_act, layernorm, mla_up_proj, mlp, moe, "
        "shared_experts, gdn_norm_out, gdp_in_proj, gdp_qkv, mhc, not mlpp; did you mean mlp?",
        "recompute_modules lists an item more than once: ['core_attn', 'mlpp', 'core_attn']",
    ]
    assert load.world_size is None
    assert not load.raw.given("recompute_modules")


def test_moe_layer_freq_of_the_wrong_type(tmp_path):
    path = write(tmp_path, MINIMAL.replace("  vocab_size: 1000\n", "  vocab_size: 1000\n  moe_layer_freq: every\n"))
    load = load_seed_yaml(path)
    assert codes_at(load) == [("wrong-type", f"{path}:6 model.moe_layer_freq")]


# --- the schema file itself -----------------------------------------------------------------

def test_schema_is_valid_draft_2020_12_and_every_key_is_mapped():
    from jsonschema import Draft202012Validator

    schema = json.loads(SEED_SCHEMA_PATH.read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    special = {("model", "num_query_groups"), ("model", "activation_func"), ("model", "gated_linear_unit"),
               ("precision", "params_dtype"), ("precision", "fp8"), ("training", "world_size")}
    for section in seed_yaml.SECTIONS:
        spec = schema["properties"][section]
        assert spec["additionalProperties"] is False
        for key in spec["properties"]:
            assert (section, key) in seed_yaml._SAME_VALUE or (section, key) in special, (section, key)
    # world_size is not required by the schema: training.world_size, the top-level key or --world-size gives it.
    assert set(schema["required"]) == {"model", "parallelism", "training"}
    assert schema["properties"]["model"]["required"] == [
        "num_layers", "hidden_size", "num_attention_heads", "vocab_size", "max_position_embeddings"]


def test_mapped_dests_are_megatron_flags():
    # data/megatron_flags.tsv: Megatron-LM's parser as scripts/import_flags recorded it (d98e8a64)
    from megatron_estimator.core.resources import data_path

    dests = {line.split("\t")[2] for line in data_path("megatron_flags.tsv").read_text(encoding="utf-8").splitlines()[2:]}
    produced = set(seed_yaml._SAME_VALUE.values()) | {"group_query_attention", "num_query_groups", "swiglu",
                                                      "squared_relu", "bf16", "fp16", "fp8"}
    assert produced - dests == set()


def test_a_missing_or_mistyped_key_is_one_problem_at_its_key(tmp_path):
    # The file's own problem names the key; validation's "required" for the same setting is
    # not repeated, and a setting the format does not require is located at its key too.
    from megatron_estimator import api

    path = tmp_path / "train.yaml"
    path.write_text("model:\n  num_layers: abc\n  num_attention_heads: 32\n  max_position_embeddings: 4096\n"
                    "  vocab_size: 32000\nparallelism:\n  tensor_model_parallel_size: 1\n  pipeline_model_parallel_size: 1\n"
                    "training:\n  micro_batch_size: 1\nworld_size: 8\n")
    inp, problems = api.load_input(str(path))
    verdict = api.evaluate(inp, problems=problems, environ={})
    assert [(p.code, p.location, p.message) for p in verdict.problems] == [
        ("missing-key", f"{path}:1 model.hidden_size", "required key hidden_size is missing from model"),
        ("wrong-type", f"{path}:2 model.num_layers", "num_layers must be an integer, not the string 'abc'"),
        ("missing-key", f"{path}:9 training.seq_length", "required key seq_length is missing from training"),
    ]
