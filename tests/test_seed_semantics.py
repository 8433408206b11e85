"""The seed format read with the seed tool's semantics (issue 26): its files load as written
(world_size under training:, null for unset keys, every key its scripts read), what a file
leaves out takes the seed's defaults (each stated among the assumptions), and full recompute
by block of 0 layers is accepted and recomputes nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import REPO, TINY_GPT, estimate, problems_of
from megatron_estimator import api
from megatron_estimator.inputs import seed_yaml
from megatron_estimator.inputs.seed_yaml import load_seed_yaml

FIXTURES = Path(__file__).resolve().parent / "fixtures"

# The seed's idiom (tests/fixtures/seed-llama-7b.yaml is a whole file of it): world_size
# under training:, no top-level key.
SMALL = """\
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


def verdict_of(path: str, world_size: int | None = None):
    inp, problems = api.load_input(path)
    return api.evaluate(inp, problems=problems, world_size=world_size,
                        world_size_source="--world-size" if world_size else None, environ={})


def with_training(extra: str) -> str:
    return SMALL.replace("  seq_length: 128\n", "  seq_length: 128\n" + extra)


# --- the seed's own files ------------------------------------------------------------------

def test_llama_7b_in_the_seed_idiom_has_its_published_parameter_count():
    verdict = verdict_of(str(FIXTURES / "seed-llama-7b.yaml"))
    assert verdict.problems == ()
    # By hand, with the seed's model (untied, rotary, no biases, RMSNorm weights only, SwiGLU):
    #   embedding + output layer   2 * 32000 * 4096                       =   262,144,000
    #   per layer: attention       4 * 4096^2 (q, k, v, o; 32 groups)     =    67,108,864
    #              MLP             3 * 4096 * 11008 (gate, up, down)      =   135,266,304
    #              norms           2 * 4096                               =         8,192
    #   32 layers                  32 * 202,383,360                       = 6,476,267,520
    #   final norm                 4096
    #   total                      262,144,000 + 6,476,267,520 + 4,096    = 6,738,415,616
    # (LLaMA 7B's published size, 6.7B; 32000 is a multiple of 128 x TP 2: no padding.)
    assert 2 * 32000 * 4096 + 32 * (4 * 4096 ** 2 + 3 * 4096 * 11008 + 2 * 4096) + 4096 == 6_738_415_616
    assert verdict.estimate.total_parameters == 6_738_415_616
    assert verdict.estimate.world_size == 2


def test_llama_7b_in_the_seed_idiom_is_what_megatron_core_builds():
    # The dests the seed file maps to, built by megatron-core 0.16.1 on the meta device.
    ref = pytest.importorskip("mcore_reference")
    ok, why = ref.megatron_core_available()
    if not ok:
        pytest.skip(f"megatron-core is not installed here: {why}")
    load = load_seed_yaml(FIXTURES / "seed-llama-7b.yaml")
    not_model = {"micro_batch_size", "seq_length", "use_distributed_optimizer", "sequence_parallel",
                 "recompute_granularity", "recompute_method", "recompute_num_layers", "tensor_model_parallel_size",
                 "pipeline_model_parallel_size", "expert_model_parallel_size", "expert_tensor_parallel_size",
                 "context_parallel_size", "layernorm_epsilon", "qk_layernorm", "multi_latent_attention"}
    spec = {dest: s.value for dest, s in load.raw.settings.items() if dest not in not_model}
    [stage] = ref.reference_parameter_counts(spec)
    assert stage.total == 6_738_415_616


def test_the_bundled_llama3_8b_example_keeps_its_published_size():
    # Meta's Llama 3 8B: 8,030,261,248 parameters; the example states no rope/untie/bias key.
    text = (REPO / "examples" / "llama3-8b.yaml").read_text(encoding="utf-8")
    assert "position_embedding_type" not in text and "untie_embeddings" not in text and "add_bias" not in text
    verdict = verdict_of(str(REPO / "examples" / "llama3-8b.yaml"))
    assert verdict.problems == () and verdict.estimate.total_parameters == 8_030_261_248


# The keys the seed's scripts read (yzlnew/infra-skills megatron-memory-estimator:
# scripts/estimate.py create_args_from_config and create_transformer_config,
# scripts/validate_config.py validate_config), by section.
SEED_SCRIPT_KEYS = {
    "model": ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size",
              "num_experts", "moe_router_topk", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size",
              "vocab_size", "max_position_embeddings", "normalization", "layernorm_epsilon", "activation_func",
              "gated_linear_unit", "qk_layernorm", "multi_latent_attention", "fp16_lm_cross_entropy"),
    "parallelism": ("tensor_model_parallel_size", "pipeline_model_parallel_size", "expert_model_parallel_size",
                    "expert_tensor_parallel_size", "context_parallel_size", "virtual_pipeline_model_parallel_size"),
    "training": ("micro_batch_size", "seq_length", "use_distributed_optimizer", "sequence_parallel", "world_size",
                 "recompute_granularity", "recompute_method", "recompute_num_layers"),
    "precision": ("params_dtype", "fp8"),
}


def test_every_key_the_seed_scripts_read_is_known():
    schema = seed_yaml.seed_schema()["properties"]
    for section, keys in SEED_SCRIPT_KEYS.items():
        assert set(keys) <= set(schema[section]["properties"]), section


def test_fp16_lm_cross_entropy_is_megatrons_flag(tmp_path):
    base = SMALL.replace("  max_position_embeddings: 128\n", "  max_position_embeddings: 128\n"
                         "  fp16_lm_cross_entropy: true\n")
    path = write(tmp_path, base)
    load = load_seed_yaml(path)
    assert load.problems == ()
    assert (load.raw.value("fp16_lm_cross_entropy"), load.raw.location("fp16_lm_cross_entropy")) == \
        (True, f"{path}:7 model.fp16_lm_cross_entropy")
    # Megatron (arguments.py validate_args) needs --fp16 for it: the seed's default bf16 is refused.
    verdict = verdict_of(path)
    assert [(p.code, p.location) for p in verdict.problems] == [
        ("fp16-lm-cross-entropy-needs-fp16", f"{path}:7 model.fp16_lm_cross_entropy")]
    assert verdict_of(write(tmp_path, base + "precision:\n  params_dtype: fp16\n", "fp16.yaml")).problems == ()


# --- world_size ----------------------------------------------------------------------------

def test_world_size_under_training_or_at_the_top_level(tmp_path):
    path = write(tmp_path, SMALL.replace("  world_size: 1\n", "  world_size: 4\n"))
    load = load_seed_yaml(path)
    assert load.problems == () and (load.world_size, load.world_size_location) == (4, f"{path}:13 training.world_size")
    top = write(tmp_path, SMALL.replace("  world_size: 1\n", "") + "world_size: 4\n", "top.yaml")
    load = load_seed_yaml(top)
    assert load.problems == () and (load.world_size, load.world_size_location) == (4, f"{top}:13 world_size")
    both = write(tmp_path, SMALL.replace("  world_size: 1\n", "  world_size: 4\n") + "world_size: 4\n", "both.yaml")
    load = load_seed_yaml(both)
    assert load.problems == () and load.world_size == 4


def test_world_size_given_twice_differently_is_one_problem_at_the_later_key(tmp_path):
    path = write(tmp_path, "world_size: 8\n" + SMALL.replace("  world_size: 1\n", "  world_size: 16\n"))
    load = load_seed_yaml(path)
    assert [(p.code, p.location, p.message) for p in load.problems] == [
        ("conflicting-keys", f"{path}:14 training.world_size",
         f"the world size is given twice: 16 here, 8 at {path}:1 world_size; give it once")]
    assert load.world_size is None and load.world_size_unknown is None
    assert len(verdict_of(path).problems) == 1


def test_a_missing_world_size_is_a_problem_only_without_world_size(tmp_path):
    path = write(tmp_path, SMALL.replace("  world_size: 1\n", ""))
    load = load_seed_yaml(path)
    assert load.problems == () and load.world_size is None
    assert (load.world_size_unknown.code, load.world_size_unknown.location) == \
        ("missing-key", f"{path}:10 training.world_size")
    assert [p.code for p in verdict_of(path).problems] == ["missing-key"]
    verdict = verdict_of(path, world_size=16)
    assert verdict.problems == () and verdict.estimate.world_size == 16


def run_cli(args):
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MEGATRON_ESTIMATOR_") and k != "WORLD_SIZE"}
    environ["PYTHONPATH"] = str(REPO)
    return subprocess.run([sys.executable, "-m", "megatron_estimator"] + args, capture_output=True, text=True,
                          env=environ, cwd=REPO, timeout=120)


def test_the_cli_world_size_fills_or_overrides_the_files(tmp_path):
    absent = write(tmp_path, SMALL.replace("  world_size: 1\n", ""), "absent.yaml")
    given = write(tmp_path, SMALL.replace("  world_size: 1\n", "  world_size: 4\n"), "given.yaml")
    result = run_cli(["check", absent])
    assert result.returncode == 2
    assert f"error: {absent}:10 training.world_size: the world size is not given" in result.stdout
    result = run_cli(["check", "--world-size", "16", absent, given])
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("  world size 16 (--world-size); ") == 2


# --- null is unset -------------------------------------------------------------------------

def _optional_keys():
    schema = seed_yaml.seed_schema()["properties"]
    for section in seed_yaml.SECTIONS:
        spec = schema[section]
        for key in spec["properties"]:
            if key not in spec["required"] and not (section == "training" and key == "world_size"):
                yield section, key


def values(load) -> dict:
    return {dest: setting.value for dest, setting in load.raw.settings.items()}


@pytest.mark.parametrize("section, key", list(_optional_keys()))
def test_null_is_unset_for_every_optional_key(tmp_path, section, key):
    # The same settings and defaults as the file without the key.
    text = SMALL if f"\n{section}:\n" in "\n" + SMALL else SMALL + f"{section}:\n"
    text = text.replace(f"{section}:\n", f"{section}:\n  {key}: null\n", 1)
    load = load_seed_yaml(write(tmp_path, text))
    plain = load_seed_yaml(write(tmp_path, SMALL, "plain.yaml"))
    assert load.problems == ()
    assert values(load) == values(plain) and load.notes == plain.notes


def test_the_seeds_null_keys_load_as_absent(tmp_path):
    # dense_llama_7b-style: moe_router_topk: null (an integer key), num_experts: null.
    path = write(tmp_path, SMALL.replace("  max_position_embeddings: 128\n", "  max_position_embeddings: 128\n"
                                         "  num_experts: null\n  moe_router_topk: null\n"))
    load = load_seed_yaml(path)
    assert load.problems == ()
    assert values(load) == values(load_seed_yaml(write(tmp_path, SMALL, "plain.yaml")))


def test_a_required_key_that_is_null_is_missing_at_its_line(tmp_path):
    path = write(tmp_path, SMALL.replace("  num_layers: 2\n", "  num_layers: null\n"))
    load = load_seed_yaml(path)
    assert [(p.code, p.location, p.message) for p in load.problems] == [
        ("missing-key", f"{path}:2 model.num_layers", "required key num_layers is null (null means unset)")]


# --- the seed's defaults -------------------------------------------------------------------

def test_the_seeds_model_by_hand_and_explicit_keys_win(tmp_path):
    # SMALL with the seed's defaults: h 64, 4 heads, 2 layers, vocabulary 1000 padded to 1024
    # (128 x TP 1), SwiGLU with Megatron's derived ffn int(4 * 64 * 2 / 3 / 64) * 64 = 128.
    #   embedding 1024 * 64 = 65,536 and an untied output layer of as many
    #   per layer: qkv 64 * 192 = 12,288, proj 64 * 64 = 4,096, fc1 64 * 2 * 128 = 16,384,
    #              fc2 128 * 64 = 8,192, two RMSNorm weights 2 * 64 = 128   -> 41,088
    #   final RMSNorm 64:  2 * 65,536 + 2 * 41,088 + 64 = 213,312 (no position table: rope)
    seed = verdict_of(write(tmp_path, SMALL))
    assert seed.estimate.total_parameters == 2 * 65_536 + 2 * 41_088 + 64 == 213_312
    # Megatron's own defaults, written out: a learned position table 128 * 64 = 8,192, the output
    # layer tied (-65,536), biases per layer qkv 192 + proj 64 + fc1 256 + fc2 64 = 576.
    text = SMALL.replace("  max_position_embeddings: 128\n", "  max_position_embeddings: 128\n"
                         "  position_embedding_type: learned_absolute\n"
                         "  untie_embeddings_and_output_weights: false\n  add_bias_linear: true\n")
    path = write(tmp_path, text, "megatron.yaml")
    load = load_seed_yaml(path)
    assert [(d, load.raw.location(d)) for d in ("position_embedding_type", "untie_embeddings_and_output_weights",
                                                 "add_bias_linear")] == [
        ("position_embedding_type", f"{path}:7 model.position_embedding_type"),
        ("untie_embeddings_and_output_weights", f"{path}:8 model.untie_embeddings_and_output_weights"),
        ("add_bias_linear", f"{path}:9 model.add_bias_linear")]
    assert not any("model.position_embedding_type" in n or "untie" in n or "add_bias_linear" in n for n in load.notes)
    assert verdict_of(path).estimate.total_parameters == 213_312 + 8_192 - 65_536 + 2 * 576 == 157_120


def test_a_moe_model_takes_grouped_gemm_and_expert_tensor_parallel_1(tmp_path):
    moe = SMALL.replace("  max_position_embeddings: 128\n", "  max_position_embeddings: 128\n  num_experts: 4\n")
    moe = moe.replace("  tensor_model_parallel_size: 1\n", "  tensor_model_parallel_size: 2\n")
    moe = moe.replace("  world_size: 1\n", "  world_size: 2\n  sequence_parallel: true\n")
    path = write(tmp_path, moe)
    load = load_seed_yaml(path)
    assert load.problems == ()
    assert (load.raw.value("moe_grouped_gemm"), load.raw.location("moe_grouped_gemm")) == \
        (True, f"{path} model.moe_grouped_gemm (seed-format default)")
    # the guide's default 1, not Megatron's (the tensor parallel size, 2 here)
    assert (load.raw.value("expert_tensor_parallel_size"), load.raw.location("expert_tensor_parallel_size")) == \
        (1, f"{path} parallelism.expert_tensor_parallel_size (seed-format default)")
    assert verdict_of(path).estimate.parallelism["etp"] == 1
    written = moe.replace("  num_experts: 4\n", "  num_experts: 4\n  moe_grouped_gemm: false\n")
    written = written.replace("  tensor_model_parallel_size: 2\n",
                              "  tensor_model_parallel_size: 2\n  expert_tensor_parallel_size: 2\n")
    load = load_seed_yaml(write(tmp_path, written, "written.yaml"))
    assert (load.raw.value("moe_grouped_gemm"), load.raw.value("expert_tensor_parallel_size")) == (False, 2)
    assert not any("moe_grouped_gemm" in n or "expert_tensor" in n for n in load.notes)


def test_seed_defaults_are_assumptions_in_text_and_json(tmp_path):
    from megatron_estimator.report.text import render_json, render_text

    verdict = verdict_of(write(tmp_path, SMALL))
    texts = [a.text for a in verdict.estimate.assumptions]
    expected = [
        "seed-format default: model.normalization RMSNorm (the seed guide's default; Megatron's is LayerNorm)",
        "seed-format default: model.position_embedding_type rope (the seed's model uses rotary embeddings, "
        "rotary_percent 1.0, base 10000; Megatron's default is learned_absolute)",
        "seed-format default: model.untie_embeddings_and_output_weights true (the seed's model has an output "
        "layer of its own; Megatron's default ties it to the embedding)",
        "seed-format default: model.add_bias_linear false (the seed's model has no linear biases; Megatron's "
        "default has them)",
        "seed-format default: training.use_distributed_optimizer true (the seed guide's default; Megatron's is off)",
        "seed-format default: model.activation_func swiglu (the seed guide's default; Megatron's is gelu)",
        "seed-format default: precision.params_dtype bf16 (the seed guide's default; Megatron's is fp32)",
    ]
    assert [t for t in texts if t.startswith("seed-format default: ")] == expected
    text = render_text([verdict])
    assert all(f"  - {line}\n" in text for line in expected)
    doc = json.loads(render_json([verdict]))
    assert [e["text"] for e in doc["assumptions"] if e["text"].startswith("seed-format default: ")] == expected


# --- full recompute by block of 0 layers ---------------------------------------------------

FULL = " --recompute-granularity full --recompute-method {} --recompute-num-layers {}"


def test_block_of_zero_layers_is_accepted_and_recomputes_nothing():
    # transformer_config.py asks only that the count be set; recompute.py's block path
    # checkpoints layers 0 .. count-1 of each stage: none for 0.  So every byte is what the
    # same run holds without recompute, and block 1 holds less.
    assert problems_of(TINY_GPT + FULL.format("block", 0)) == []
    plain = estimate(TINY_GPT).stages
    block0 = estimate(TINY_GPT, extra=FULL.format("block", 0)).stages
    block1 = estimate(TINY_GPT, extra=FULL.format("block", 1)).stages
    assert [s.bytes for s in block0] == [s.bytes for s in plain]
    assert [s.device_peak_bytes for s in block0] == [s.device_peak_bytes for s in plain]
    assert block1[0].bytes.activations < plain[0].bytes.activations


def test_uniform_of_zero_layers_is_refused():
    # recompute.py's uniform path steps `count` layers at a time: 0 never ends.
    found = problems_of(TINY_GPT + FULL.format("uniform", 0))
    assert [(p.code, p.location) for p in found] == [("out-of-range", "--recompute-num-layers")]
    assert "0 never ends" in found[0].message


def test_the_seeds_recompute_num_layers_default_is_0(tmp_path):
    # The seed's scripts read 0 when recompute_num_layers is absent (deepseek_v3_lite.yaml
    # writes block with 0): block then recomputes no layer; uniform with 0 is refused at the key.
    block = write(tmp_path, with_training("  recompute_granularity: full\n  recompute_method: block\n"), "block.yaml")
    load = load_seed_yaml(block)
    assert (load.raw.value("recompute_num_layers"), load.raw.location("recompute_num_layers")) == \
        (0, f"{block} training.recompute_num_layers (seed-format default)")
    assert verdict_of(block).problems == ()
    uniform = write(tmp_path, with_training("  recompute_granularity: full\n  recompute_method: uniform\n"),
                    "uniform.yaml")
    assert [(p.code, p.location) for p in verdict_of(uniform).problems] == [
        ("out-of-range", f"{uniform} training.recompute_num_layers (seed-format default)")]
    # selective: Megatron forbids a count, so none is written
    selective = write(tmp_path, with_training("  recompute_granularity: selective\n"), "selective.yaml")
    assert not load_seed_yaml(selective).raw.given("recompute_num_layers")
    assert verdict_of(selective).problems == ()
