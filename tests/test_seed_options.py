"""The seed tool's options on ``estimate`` and ``check`` (--tp ... --json, --no-distributed-optimizer)
and the seed-style defaults (inputs/seed_options.py, api.with_options, cli._seed_options).

The seed tool is megatron-memory-estimator's ``estimate_from_hf.py``: its argparse defaults are
micro batch 1, sequence 4096, 8 GPUs and the distributed optimizer; the bridge it builds
Megatron's config with gives bf16 weights.
"""

from __future__ import annotations

import json

import pytest

from megatron_estimator import api, cli
from megatron_estimator.inputs.rawargs import RawArgs

# A LLaMA-shaped toy written for these tests (no checkpoint's numbers): 2 layers, hidden 64,
# SwiGLU ffn 128, 4 heads (no GQA), vocabulary 1024, untied output layer, RMSNorm, no biases.
TOY = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "hidden_size": 64,
       "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 1024,
       "max_position_embeddings": 4096, "rms_norm_eps": 1e-05, "tie_word_embeddings": False,
       "hidden_act": "silu", "rope_theta": 10000.0}

# Parameters by hand:
#   embedding 1024 x 64 = 65,536; output layer (untied) 1024 x 64 = 65,536; final norm 64
#   per layer: input norm 64 + QKV 64 x 3*64 = 12,288 + proj 64 x 64 = 4,096 + pre-MLP norm 64
#              + fc1 (SwiGLU) 64 x 2*128 = 16,384 + fc2 128 x 64 = 8,192 = 41,088
#   total 65,536 + 65,536 + 64 + 2 x 41,088 = 213,312
# Per GPU at tp 2 (norms are replicated, the rest split in two):
#   32,768 + 32,768 + 64 + 2 x (64 + 64 + (12,288 + 4,096 + 16,384 + 8,192) / 2) = 106,816
TOY_PARAMS, TOY_TP2_PARAMS = 213_312, 106_816


@pytest.fixture
def toy_config(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TOY))
    return str(path)


def parse(*argv):
    ns = cli.build_parser().parse_args(list(argv))
    return ns, cli._seed_values(ns)


def with_options(options, flags=(), seed_style=False, raw=None):
    inp = api.TrainingInput(raw or RawArgs({}), source="test")
    if flags:
        inp, problems = api.input_from_flags(list(flags))
        assert problems == ()
    return api.with_options(inp, (), options, flags=flags, seed_style=seed_style)


# -- parse level ---------------------------------------------------------------------------

EXPECTED_DESTS = {
    "--tp": ("2", "tensor_model_parallel_size", 2),
    "--pp": ("3", "pipeline_model_parallel_size", 3),
    "--ep": ("4", "expert_model_parallel_size", 4),
    "--cp": ("5", "context_parallel_size", 5),
    "--etp": ("6", "expert_tensor_parallel_size", 6),
    "--vpp": ("7", "num_virtual_stages_per_pipeline_rank", 7),
    "--micro-batch-size": ("8", "micro_batch_size", 8),
    "--seq-length": ("9", "seq_length", 9),
    "--recompute-granularity": ("full", "recompute_granularity", "full"),
    "--recompute-method": ("block", "recompute_method", "block"),
    "--recompute-num-layers": ("10", "recompute_num_layers", 10),
    "--recompute-modules": ("core_attn,mlp", "recompute_modules", ["core_attn", "mlp"]),
    "--num-layers-in-first-pipeline-stage": ("11", "decoder_first_pipeline_num_layers", 11),
    "--num-layers-in-last-pipeline-stage": ("12", "decoder_last_pipeline_num_layers", 12),
}


@pytest.mark.parametrize("command", ["estimate", "check"])
def test_each_alias_sets_its_megatron_dest_located_as_the_option(command):
    argv = [command]
    for option, (text, _, _) in EXPECTED_DESTS.items():
        argv += [option, text]
    argv += ["--no-distributed-optimizer"] + (["file.yaml"] if command == "check" else [])
    _, options = parse(*argv)
    inp, problems = with_options(options)
    assert problems == ()
    for option, (_, dest, value) in EXPECTED_DESTS.items():
        assert inp.raw.value(dest) == value, option
        assert inp.raw.location(dest) == f"command line {option}"
    assert inp.raw.value("use_distributed_optimizer") is False
    assert inp.raw.location("use_distributed_optimizer") == "command line --no-distributed-optimizer"


def test_num_gpus_is_world_size_and_json_is_format_json():
    ns, _ = parse("estimate", "--num-gpus", "16", "--json", "--model", "gpt2")
    assert (ns.world_size, ns.world_size_source, ns.format) == (16, "--num-gpus", "json")
    ns, _ = parse("estimate", "--num-gpus", "16", "--world-size", "16", "--format", "json", "--json", "--model", "gpt2")
    assert (ns.world_size, ns.format) == (16, "json")


@pytest.mark.parametrize("argv, message", [
    (["--num-gpus", "8", "--world-size", "16"], "--num-gpus 8 and --world-size 16 disagree"),
    (["--json", "--format", "markdown"], "--json and --format markdown disagree"),
])
def test_alias_and_option_disagreeing_is_a_usage_error(argv, message):
    ns = cli.build_parser().parse_args(["estimate", *argv, "--model", "gpt2"])
    with pytest.raises(cli.UsageError, match=message):
        cli._seed_values(ns)


def test_bad_values_are_problems_named_by_the_option():
    inp, problems = with_options([("--tp", "two"), ("--recompute-method", "uniformly")])
    assert [(p.code, p.location) for p in problems] == [
        ("invalid-value", "command line --tp"), ("invalid-choice", "command line --recompute-method")]
    assert "did you mean uniform?" in problems[1].message


def test_alias_and_megatron_flag_disagreeing_is_one_problem_each():
    flags = ["--tensor-model-parallel-size", "4", "--use-distributed-optimizer", "--seq-length", "2048"]
    _, problems = with_options([("--tp", "2"), ("--no-distributed-optimizer", True), ("--seq-length", "2048")],
                               flags=flags)
    assert [(p.code, p.location) for p in problems] == [
        ("conflicting-options", "command line --tp"), ("conflicting-options", "command line --no-distributed-optimizer")]
    assert "--tp 2 and --tensor-model-parallel-size 4 after '--'" in problems[0].message


def test_alias_agreeing_with_the_megatron_flag_is_fine():
    inp, problems = with_options([("--tp", "4")], flags=["--tensor-model-parallel-size", "4"])
    assert problems == () and inp.raw.value("tensor_model_parallel_size") == 4


def test_did_you_mean_names_the_megatron_flag_of_a_short_name():
    _, problems = api.input_from_flags(["--tp", "2", "--vpp", "2", "--num-layers-in-last-pipeline-stage", "3"])
    messages = [p.message for p in problems if p.code == "unknown-flag"]
    assert messages == ["unknown flag; did you mean --tensor-model-parallel-size?",
                        "unknown flag; did you mean --num-virtual-stages-per-pipeline-rank?",
                        "unknown flag; did you mean --decoder-last-pipeline-num-layers?"]


# -- seed-style defaults --------------------------------------------------------------------

def test_seed_defaults_fill_only_what_nothing_gives():
    raw = RawArgs({})
    inp, problems = with_options([("--micro-batch-size", "2"), ("--recompute-granularity", "full"),
                                  ("--recompute-method", "uniform")], seed_style=True, raw=raw)
    assert problems == ()
    v = inp.raw.value
    assert (v("micro_batch_size"), v("seq_length"), v("bf16"), v("use_distributed_optimizer"),
            v("recompute_num_layers")) == (2, 4096, True, True, 1)
    assert inp.raw.location("seq_length") == "seed-style default --seq-length 4096"
    assert (inp.world_size, inp.defaults) == (8, ("sequence 4096", "bf16", "distributed optimizer",
                                                  "recompute num layers 1"))


def test_seed_style_estimate_by_hand(toy_config):
    """estimate --hf-config toy --tp 2: bf16 weights, fp32 grads, the distributed optimizer over
    8 GPUs (dp 4), micro batch 1, sequence 4096."""
    inp, problems = api.input_from_model([], hf_config=toy_config)
    inp, problems = api.with_options(inp, problems, [("--tp", "2")], seed_style=True)
    verdict = api.evaluate(inp)
    assert verdict.problems == ()
    est = verdict.estimate
    assert est.total_parameters == TOY_PARAMS
    assert (est.world_size, est.parallelism["dp"]) == (8, 4)
    stage, = est.stages
    assert stage.parameters == TOY_TP2_PARAMS
    # The distributed optimizer pads the grad/param buffer to a multiple of lcm(dp, 128) = 128
    # (megatron/core/distributed/param_and_grad_buffer.py _pad_end_of_bucket_if_needed):
    # 106,816 -> 835 x 128 = 106,880 elements; bf16 weights 2 bytes, fp32 main grads 4 bytes.
    padded = 106_880
    assert stage.bytes.weights == padded * 2
    assert stage.bytes.gradients == padded * 4
    # fp32 master weights + Adam's two fp32 moments = 12 bytes per parameter, sharded over dp 4.
    assert stage.bytes.optimizer_states == 12 * TOY_TP2_PARAMS // 4
    assumption = est.assumptions[0]
    assert assumption.key == "seed_defaults"
    for words in ("micro batch 1", "sequence 4096", "bf16", "distributed optimizer",
                  "sequence parallel (tp > 1)", "8 GPUs"):
        assert words in assumption.text


def test_flags_after_separator_keep_megatron_defaults(toy_config):
    """With Megatron flags after '--' nothing is defaulted: fp32 weights, no distributed
    optimizer (4 bytes weights + 4 bytes grads + 8 bytes of Adam moments per parameter)."""
    flags = ["--micro-batch-size", "1", "--seq-length", "4096"]
    inp, problems = api.input_from_model(flags, hf_config=toy_config)
    inp, problems = api.with_options(inp, problems, [("--tp", "2")], flags=flags)
    verdict = api.evaluate(inp, world_size=2)
    assert verdict.problems == ()
    stage, = verdict.estimate.stages
    assert (stage.bytes.weights, stage.bytes.gradients) == (4 * TOY_TP2_PARAMS, 4 * TOY_TP2_PARAMS)
    assert stage.bytes.optimizer_states == 8 * TOY_TP2_PARAMS
    assert all(a.key != "seed_defaults" for a in verdict.estimate.assumptions)


# -- the command line ------------------------------------------------------------------------

def run_cli(capsys, *argv):
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_seed_style_json(capsys, toy_config, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    code, out, _ = run_cli(capsys, "estimate", "--hf-config", toy_config, "--tp", "2", "--num-gpus", "4", "--json")
    assert code == 0
    doc = json.loads(out)
    assert (doc["world_size"], doc["world_size_source"], doc["parallelism"]["dp"]) == (4, "--num-gpus", 2)
    seed = [a for a in doc["assumptions"] if a["key"] == "seed_defaults"]
    assert len(seed) == 1 and "8 GPUs" not in seed[0]["text"] and "micro batch 1" in seed[0]["text"]
    # dp 2: lcm(2, 128) = 128 padding as above; 12 bytes of optimizer state per parameter over 2.
    assert doc["stages"][0]["bytes"]["optimizer_states"] == 12 * TOY_TP2_PARAMS // 2


def test_cli_conflict_exits_2_with_one_message(capsys, toy_config):
    code, out, _ = run_cli(capsys, "estimate", "--hf-config", toy_config, "--tp", "2", "--",
                           "--tensor-model-parallel-size", "4", "--micro-batch-size", "1", "--seq-length", "128")
    assert code == 2
    assert out.count("conflicting-options") == 1 and "command line --tp" in out


def test_check_aliases_override_every_file(capsys, toy_config, tmp_path):
    other = tmp_path / "other" / "config.json"
    other.parent.mkdir()
    other.write_text(json.dumps(TOY))
    code, out, _ = run_cli(capsys, "check", "--json", "--world-size", "2", "--tp", "2", "--micro-batch-size", "1",
                           "--seq-length", "4096", toy_config, str(other))
    assert code == 0
    results = json.loads(out)["results"]
    assert [r["parallelism"]["tp"] for r in results] == [2, 2]
    # check takes no seed-style defaults: fp32 weights (4 bytes per parameter).
    assert [r["stages"][0]["bytes"]["weights"] for r in results] == [4 * TOY_TP2_PARAMS] * 2
    code, out, _ = run_cli(capsys, "check", "--world-size", "2", "--tp", "2", "--micro-batch-size", "1",
                           "--seq-length", "4096", toy_config, "--", "--tensor-model-parallel-size", "1")
    assert code == 2 and "--tp 2 and --tensor-model-parallel-size 1 after '--'" in out
