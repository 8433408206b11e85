"""Nemotron-H (``model_type`` nemotron_h): the HuggingFace import, the hybrid presets and their
published sizes, and the presets' estimates through the CLI.

Every expected count is derived here, independently of the estimator: ``hf_checkpoint_tensors``
itemises the tensors the HuggingFace checkpoint holds (modeling_nemotron_h.py: per block a norm and
one mixer) from the config's numbers, the published totals are quoted with their source, and
megatron-core's own MambaModel builds each preset (skipped where it cannot be imported).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, megatron_tree, recorded_answers

from megatron_estimator.inputs.hf import parse_hf_config
from megatron_estimator.inputs.presets import load_preset

PRESETS = REPO / "megatron_estimator" / "data" / "presets"
MODELOPT_CONF = "examples/post_training/modelopt/conf/nvidia"

# Published sizes: an exact total of each checkpoint where one is quoted publicly, and the size
# the model card / paper states.
#   nemotron-h-8b: 8,100,852,736, a public named_parameters() analysis of nvidia/Nemotron-H-8B-Base-8K
#     (published "8B"; Nemotron-H paper: 24 Mamba-2, 24 MLP and 4 attention layers).
#   nemotron-h-56b: published "56B" (paper: 54 Mamba-2, 54 MLP, 10 attention layers); no exact
#     total found, so the hand itemisation below is the exact reference.
#   nemotron-nano-9b-v2: 8,888,227,328, the Hub's safetensors metadata total of
#     nvidia/NVIDIA-Nemotron-Nano-9B-v2 as a public model registry (kvfit) records it (published "9B").
#   nemotron-3-nano-30b-a3b: 31,577,940,288, llama.cpp's n_params of the converted checkpoint
#     (published "31.6B total, 3.2B active"); it counts the 23 MoE layers'
#     e_score_correction_bias (128 each), which Megatron keeps as the router's expert_bias buffer.
# The shapes: Megatron-LM's examples/post_training/modelopt/conf/nvidia/<checkpoint>.sh (d98e8a64),
# Megatron-Bridge's nemotron_h_provider.py, and the checkpoints' config.json as quoted by
# Megatron-Bridge's tests (8B) and public conversion code (Nemotron 3 Nano, Nano 9B v2).
PUBLISHED = {
    "nemotron-h-8b": (8_100_852_736, 8e9),
    "nemotron-h-56b": (None, 56e9),
    "nemotron-nano-9b-v2": (8_888_227_328, 9e9),
    "nemotron-3-nano-30b-a3b": (31_577_940_288, 31.6e9),
}
# What megatron-core builds: the checkpoint less the MoE routers' e_score_correction_bias
# (a buffer in Megatron, megatron/core/transformer/moe/router.py).
MEGATRON_PARAMETERS = {
    "nemotron-h-8b": 8_100_852_736,
    "nemotron-h-56b": 56_324_350_464,
    "nemotron-nano-9b-v2": 8_888_227_328,
    "nemotron-3-nano-30b-a3b": 31_577_940_288 - 23 * 128,
}


def hf_checkpoint_tensors(config: dict) -> dict[str, int]:
    """Every tensor of the HuggingFace checkpoint, name -> element count, from config.json."""
    h, vocab = config["hidden_size"], config["vocab_size"]
    pattern = config["hybrid_override_pattern"]
    tensors = {"backbone.embeddings.weight": vocab * h, "backbone.norm_f.weight": h}
    if not config["tie_word_embeddings"]:
        tensors["lm_head.weight"] = vocab * h
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or config["attention_head_dim"]
    for i, kind in enumerate(pattern):
        p = f"backbone.layers.{i}."
        tensors[p + "norm.weight"] = h
        if kind == "M":
            inner = config["mamba_num_heads"] * config["mamba_head_dim"]
            group_state = config["n_groups"] * config["ssm_state_size"]
            nheads = config["mamba_num_heads"]
            conv_dim = inner + 2 * group_state
            tensors[p + "mixer.in_proj.weight"] = (2 * inner + 2 * group_state + nheads) * h
            tensors[p + "mixer.conv1d.weight"] = conv_dim * config["conv_kernel"]
            tensors[p + "mixer.conv1d.bias"] = conv_dim
            for name in ("dt_bias", "A_log", "D"):
                tensors[p + "mixer." + name] = nheads
            tensors[p + "mixer.norm.weight"] = inner
            tensors[p + "mixer.out_proj.weight"] = h * inner
        elif kind == "*":
            tensors[p + "mixer.q_proj.weight"] = heads * head_dim * h
            tensors[p + "mixer.k_proj.weight"] = kv * head_dim * h
            tensors[p + "mixer.v_proj.weight"] = kv * head_dim * h
            tensors[p + "mixer.o_proj.weight"] = h * heads * head_dim
        elif kind == "-":
            tensors[p + "mixer.up_proj.weight"] = config["intermediate_size"] * h
            tensors[p + "mixer.down_proj.weight"] = h * config["intermediate_size"]
        else:  # E
            experts, width = config["n_routed_experts"], config["moe_intermediate_size"]
            tensors[p + "mixer.gate.weight"] = experts * h
            tensors[p + "mixer.gate.e_score_correction_bias"] = experts
            for e in range(experts):
                tensors[p + f"mixer.experts.{e}.up_proj.weight"] = width * h
                tensors[p + f"mixer.experts.{e}.down_proj.weight"] = h * width
            shared = config["moe_shared_expert_intermediate_size"]
            tensors[p + "mixer.shared_experts.up_proj.weight"] = shared * h
            tensors[p + "mixer.shared_experts.down_proj.weight"] = h * shared
    return tensors


def _config(name: str) -> dict:
    return json.loads((PRESETS / f"{name}.json").read_text())


def _estimate(name: str, extra=()):
    from megatron_estimator.api import evaluate, input_from_model

    flags = ["--seq-length", "4096", "--micro-batch-size", "1", "--bf16", *extra]
    inp, problems = input_from_model(flags, model=name, environ={})
    verdict = evaluate(inp, world_size=1, environ={}, problems=problems)
    assert verdict.estimate is not None, verdict.problems
    return verdict


# --------------------------------------------------------------------------------------------
# Presets: the checkpoint's own tensors, the published totals, the estimator


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_checkpoint_itemisation_is_the_published_size(name):
    exact, rounded = PUBLISHED[name]
    total = sum(hf_checkpoint_tensors(_config(name)).values())
    if exact is not None:
        assert total == exact
    assert abs(total - rounded) / rounded < 0.02


@pytest.mark.parametrize("name", sorted(MEGATRON_PARAMETERS))
def test_estimator_counts_what_megatron_builds(name):
    tensors = hf_checkpoint_tensors(_config(name))
    buffers = sum(v for k, v in tensors.items() if k.endswith("e_score_correction_bias"))
    assert MEGATRON_PARAMETERS[name] == sum(tensors.values()) - buffers
    verdict = _estimate(name, ["--make-vocab-size-divisible-by", "1"])
    assert verdict.estimate.total_parameters == MEGATRON_PARAMETERS[name]
    assert verdict.family.name == "hybrid"
    # 131072 is a multiple of 128: Megatron's default padding changes nothing.
    assert _estimate(name).estimate.total_parameters == MEGATRON_PARAMETERS[name]


@pytest.mark.parametrize("name", sorted(MEGATRON_PARAMETERS))
def test_megatron_core_builds_each_preset_at_that_size(name):
    # megatron-core 0.16.1's MambaModel on the meta device, from the preset's mapped flags
    # (tests/mcore_hybrid_reference.py; test-only stubs stand in for the kernel packages).
    hybrid_reference = pytest.importorskip("mcore_hybrid_reference")
    ok, why = hybrid_reference.mamba_available()
    if not ok:
        pytest.skip(f"megatron-core's MambaModel cannot be built here: {why}")
    spec = {dest: s.value for dest, s in load_preset(name).raw.settings.items()}
    spec["hybrid_override_pattern"] = spec.pop("hybrid_layer_pattern")  # 0.16.1's name
    spec.update(make_vocab_size_divisible_by=1, moe_grouped_gemm=True)
    assert hybrid_reference.reference_hybrid_parameter_counts(spec) == [MEGATRON_PARAMETERS[name]]


def test_layer_counts_are_the_papers():
    # Nemotron-H paper / model cards: 8B 24 Mamba-2 + 24 MLP + 4 attention; 56B 54 + 54 + 10;
    # Nemotron 3 Nano 23 Mamba-2 + 23 MoE + 6 attention.
    def kinds(name):
        pattern = _config(name)["hybrid_override_pattern"]
        return {k: pattern.count(k) for k in "M-*E" if k in pattern}

    assert kinds("nemotron-h-8b") == {"M": 24, "-": 24, "*": 4}
    assert kinds("nemotron-h-56b") == {"M": 54, "-": 54, "*": 10}
    assert kinds("nemotron-3-nano-30b-a3b") == {"M": 23, "E": 23, "*": 6}


MODELOPT_CHECKPOINTS = ["Nemotron-H-8B-Base-8K", "Nemotron-H-56B-Base-8K", "NVIDIA-Nemotron-Nano-9B-v2",
                        "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"]


def modelopt_model_args(tree: Path, name: str) -> dict:
    """MODEL_ARGS of Megatron-LM's examples/post_training/modelopt/conf/nvidia/<name>.sh."""
    text = (tree / MODELOPT_CONF / f"{name}.sh").read_text()
    body = re.search(r'MODEL_ARGS="(.*?)"', text, re.S).group(1)
    return {"model_args": shlex.split(body.replace("\\\n", " "))}


def _modelopt_flags(name: str) -> list[str]:
    """MODEL_ARGS of the example: from MEGATRON_LM_TREE, else as scripts/record_megatron_checks
    recorded them (tests/data/megatron_answers.json)."""
    tree = megatron_tree(MODELOPT_CONF)
    if tree is None:
        answers = recorded_answers("modelopt_model_args", [{"checkpoint": c} for c in MODELOPT_CHECKPOINTS])
        tokens = answers[MODELOPT_CHECKPOINTS.index(name)]["model_args"]
    else:
        tokens = modelopt_model_args(tree, name)["model_args"]
    drop = {"--trust-remote-code", "--use-mcore-models", "--export-model-type", "--tokenizer-type",
            "--tiktoken-pattern", "--save-interval", "--exit-duration-in-mins", "--enable-experimental"}
    kept, skip = [], False
    for token in tokens:
        if skip:
            skip = False
            continue
        if token in drop:
            skip = token not in ("--trust-remote-code", "--use-mcore-models", "--enable-experimental")
            continue
        kept.append(token)
    return kept


@pytest.mark.parametrize("name, checkpoint, vocab", [
    ("nemotron-h-8b", "Nemotron-H-8B-Base-8K", 131072),
    ("nemotron-h-56b", "Nemotron-H-56B-Base-8K", 131072),
    ("nemotron-nano-9b-v2", "NVIDIA-Nemotron-Nano-9B-v2", 131072),
    ("nemotron-3-nano-30b-a3b", "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", 131072),
])
def test_megatron_lms_own_launch_settings_build_the_same_model(name, checkpoint, vocab):
    # Megatron-LM exports these checkpoints with its own flags (the tokenizer gives the vocabulary).
    from megatron_estimator.api import evaluate, input_from_flags

    flags = _modelopt_flags(checkpoint)
    flags = [f for f in flags if f not in ("--use-fused-weighted-squared-relu", "--disable-gloo-process-groups")]
    if "--padded-vocab-size" not in flags:
        flags += ["--vocab-size", str(vocab), "--make-vocab-size-divisible-by", "1"]
    for dest in ("--tensor-model-parallel-size", "--pipeline-model-parallel-size"):
        if dest in flags:
            i = flags.index(dest)
            del flags[i:i + 2]
    inp, problems = input_from_flags(flags, environ={})
    assert not problems, problems
    verdict = evaluate(inp, world_size=1, environ={}, problems=problems)
    assert verdict.estimate is not None, verdict.problems
    assert verdict.estimate.total_parameters == MEGATRON_PARAMETERS[name]


# --------------------------------------------------------------------------------------------
# The CLI, end to end


def cli(*args):
    return subprocess.run([sys.executable, "-m", "megatron_estimator", *args], capture_output=True, text=True,
                          cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=120)


MOE_LAYOUT = ("--tensor-model-parallel-size 2 --sequence-parallel --expert-model-parallel-size 8 "
              "--expert-tensor-parallel-size 1")


@pytest.mark.parametrize("name, world, layout, fits", [
    ("nemotron-h-8b", 8, "--tensor-model-parallel-size 2 --sequence-parallel", True),
    ("nemotron-nano-9b-v2", 8, "--tensor-model-parallel-size 2 --sequence-parallel", True),
    ("nemotron-h-56b", 64, "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 2 --sequence-parallel", True),
    ("nemotron-3-nano-30b-a3b", 32, MOE_LAYOUT, True),
    ("nemotron-3-nano-30b-a3b", 8, "--expert-model-parallel-size 8", False),
    ("nemotron-h-56b", 1, "", False),
])
def test_preset_estimate_through_the_cli(name, world, layout, fits):
    flags = (f"{layout} --seq-length 8192 --micro-batch-size 1 --global-batch-size 64 --bf16 "
             "--use-distributed-optimizer").split()
    result = cli("estimate", "--model", name, "--world-size", str(world), "--gpu", "h100",
                 "--format", "json", "--", *flags)
    assert result.returncode == (0 if fits else 1), result.stdout + result.stderr
    doc = json.loads(result.stdout)
    assert doc["total_parameters"] == MEGATRON_PARAMETERS[name]
    assert doc["model"]["family"] == "hybrid"


def test_preset_text_report_names_the_layers():
    result = cli("estimate", "--model", "nemotron-3-nano-30b-a3b", "--world-size", "32", "--gpu", "h100", "--",
                 *MOE_LAYOUT.split(), "--seq-length", "4096", "--micro-batch-size", "1", "--bf16",
                 "--use-distributed-optimizer")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "parameters: 31,577,937,344" in result.stdout
    assert "stage 0 MEMEM*EMEMEM*" in result.stdout


# --------------------------------------------------------------------------------------------
# The importer on small configs

TINY = {
    "model_type": "nemotron_h", "hidden_size": 64, "intermediate_size": 256, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "hybrid_override_pattern": "M*-M", "num_hidden_layers": 4,
    "mamba_num_heads": 8, "mamba_head_dim": 16, "ssm_state_size": 8, "n_groups": 2, "conv_kernel": 4,
    "vocab_size": 1000, "max_position_embeddings": 64, "tie_word_embeddings": False,
    "layer_norm_epsilon": 1e-5, "mlp_hidden_act": "relu2", "use_bias": False, "mlp_bias": False,
    "attention_bias": False, "use_conv_bias": True,
}
TINY_MOE = {**TINY, "hybrid_override_pattern": "M*EM", "n_routed_experts": 4, "moe_intermediate_size": 32,
            "num_experts_per_tok": 2, "n_shared_experts": 1, "moe_shared_expert_intermediate_size": 48,
            "routed_scaling_factor": 2.5, "n_group": 1, "topk_group": 1, "norm_topk_prob": True}


def _import(config: dict, release: str = "main"):
    return parse_hf_config(json.dumps(config, indent=2), "config.json", release)


def _values(imported) -> dict:
    return {dest: s.value for dest, s in imported.raw.settings.items()}


def tiny_count(config: dict, *, padded_vocab: int) -> int:
    """The tiny model as Megatron builds it: the checkpoint's tensors less the router buffers,
    with the vocabulary padded as Megatron pads it."""
    tensors = hf_checkpoint_tensors(config)
    rows = 2 * (padded_vocab - config["vocab_size"]) * config["hidden_size"]
    buffers = sum(v for k, v in tensors.items() if k.endswith("e_score_correction_bias"))
    return sum(tensors.values()) - buffers + rows


def _estimate_import(imported, extra="", release="main"):
    from megatron_estimator.api import TrainingInput, evaluate
    from megatron_estimator.inputs.argv import parse_megatron_argv
    from megatron_estimator.megatron.releases import release_of

    flags, problems = parse_megatron_argv(shlex.split("--seq-length 64 --micro-batch-size 1 --bf16 " + extra),
                                          release=release)
    assert not problems
    inp = TrainingInput(imported.raw.merged(flags), source="test", release=release_of(release, "test"))
    verdict = evaluate(inp, world_size=1, environ={}, problems=())
    assert verdict.estimate is not None, verdict.problems
    return verdict.estimate


def test_tiny_dense_hybrid_maps_and_counts():
    # By hand: Mamba 64 + 64 x (256+32+8) + 160 x 5 + 24 + 128 + 128 x 64 = 28,152 per layer (x2);
    # attention 64 + 64x64 + 2 x 64x32 + 64x64 = 12,352; MLP 64 + 2 x 64x256 = 32,832;
    # embeddings 2 x 1024 x 64 (padded) + final norm 64.
    imported = _import(TINY)
    assert imported.ok, imported.problems
    values = _values(imported)
    assert values["hybrid_layer_pattern"] == "M*-M"
    assert (values["mamba_num_heads"], values["mamba_head_dim"], values["mamba_state_dim"],
            values["mamba_num_groups"]) == (8, 16, 8, 2)
    assert values["squared_relu"] is True and values["position_embedding_type"] == "none"
    assert values["add_bias_linear"] is False and values["kv_channels"] == 16
    assert "num_layers" not in values  # Megatron derives it from the pattern
    assert tiny_count(TINY, padded_vocab=1024) == 2 * 28_152 + 12_352 + 32_832 + 2 * 1024 * 64 + 64
    assert _estimate_import(imported).total_parameters == tiny_count(TINY, padded_vocab=1024)
    assert imported.raw.location("hybrid_layer_pattern").startswith("config.json:8 hybrid_override_pattern")


def test_tiny_moe_hybrid_maps_the_router_and_shared_expert():
    imported = _import(TINY_MOE)
    assert imported.ok, imported.problems
    values = _values(imported)
    assert (values["num_experts"], values["moe_ffn_hidden_size"], values["moe_router_topk"]) == (4, 32, 2)
    assert values["moe_shared_expert_intermediate_size"] == 48
    assert values["moe_router_score_function"] == "sigmoid" and values["moe_router_enable_expert_bias"] is True
    assert values["moe_router_topk_scaling_factor"] == 2.5
    assert "moe_router_num_groups" not in values  # one group: no group-limited routing
    # MoE layer by hand: norm 64, router 4 x 64, 4 experts x 2 x 64x32, shared 2 x 64x48.
    moe = 64 + 256 + 4 * 4096 + 6144
    dense = tiny_count(TINY, padded_vocab=1024) - 32_832
    assert tiny_count(TINY_MOE, padded_vocab=1024) == dense + moe
    assert _estimate_import(imported).total_parameters == tiny_count(TINY_MOE, padded_vocab=1024)


def test_layers_block_type_is_the_same_pattern():
    config = {k: v for k, v in TINY_MOE.items() if k != "hybrid_override_pattern"}
    config["layers_block_type"] = ["mamba", "attention", "moe", "mamba"]
    imported = _import(config)
    assert imported.ok, imported.problems
    assert _values(imported) == _values(_import(TINY_MOE))
    both = {**TINY_MOE, "layers_block_type": ["mamba", "attention", "mlp", "mamba"]}
    problems = _import(both).problems
    assert [p.code for p in problems] == ["hf-conflicting-keys"]
    assert "M*-M" in problems[0].message and "M*EM" in problems[0].message


def test_mtp_layers_become_the_patterns_mtp_part():
    config = {**TINY_MOE, "num_nextn_predict_layers": 2, "mtp_hybrid_override_pattern": "*E"}
    imported = _import(config)
    assert imported.ok, imported.problems
    assert _values(imported)["hybrid_layer_pattern"] == "M*EM/*E/*E"
    estimate = _estimate_import(imported)
    # Two MTP depths, each: enorm, hnorm, eh_proj 2h x h, attention, MoE layer, final norm.
    depth = 3 * 64 + 2 * 64 * 64 + 12_352 + (64 + 256 + 4 * 4096 + 6144)
    assert estimate.total_parameters == tiny_count(TINY_MOE, padded_vocab=1024) + 2 * depth
    missing = {**TINY_MOE, "num_nextn_predict_layers": 1}
    assert [p.code for p in _import(missing).problems] == ["hf-missing-key"]


def test_every_problem_is_reported_at_its_line_at_once():
    config = {**TINY_MOE, "num_hidden_layers": 5, "conv_kernel": 3, "use_bias": True, "moe_latent_size": 16,
              "mamba_head_dim": "sixteen"}
    imported = _import(config)
    text = json.dumps(config, indent=2).splitlines()
    line = {key: next(i for i, t in enumerate(text, 1) if t.strip().startswith(f'"{key}"')) for key in config}
    found = {(p.code, p.location) for p in imported.problems}
    assert found == {
        ("hf-conflicting-keys", f"config.json:{line['num_hidden_layers']} num_hidden_layers"),
        ("hf-unsupported-feature", f"config.json:{line['conv_kernel']} conv_kernel"),
        ("hf-unsupported-feature", f"config.json:{line['use_bias']} use_bias"),
        ("hf-unsupported-feature", f"config.json:{line['moe_latent_size']} moe_latent_size"),
        ("hf-bad-value", f"config.json:{line['mamba_head_dim']} mamba_head_dim"),
    }
    assert imported.raw.settings == {} and imported.flags == ()


def test_bad_pattern_symbols_and_block_names():
    imported = _import({**TINY, "hybrid_override_pattern": "M*G-"})
    assert [p.code for p in imported.problems] == ["hf-bad-value"]
    assert "'G'" in imported.problems[0].message
    config = {k: v for k, v in TINY.items() if k != "hybrid_override_pattern"}
    config["layers_block_type"] = ["mamba", "attention", "linear_attention", "mamba"]
    imported = _import(config)
    assert [p.code for p in imported.problems] == ["hf-bad-value"]
    assert '"linear_attention"' in imported.problems[0].message
    config.pop("layers_block_type")
    imported = _import(config)
    assert [p.code for p in imported.problems] == ["hf-missing-key"]


def test_cli_exit_2_for_an_unsupported_config(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**TINY_MOE, "moe_latent_size": 16}, indent=2))
    result = cli("estimate", "--hf-config", str(path), "--", "--seq-length", "64", "--micro-batch-size", "1")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "moe_latent_size" in result.stdout and "Traceback" not in result.stdout + result.stderr
    # The import's problems are the whole answer: no follow-on "--num-layers is required".
    assert "invalid input, 1 problem" in result.stdout and "missing-required" not in result.stdout


def test_presets_have_no_unread_keys():
    for name in PUBLISHED:
        imported = load_preset(name)
        assert imported.ok and imported.notes == (), (name, imported.notes)


def test_unknown_mixer_keys_are_refused_and_other_unknown_keys_noted():
    imported = _import({**TINY_MOE, "moe_expert_scale_mode": "x", "mamba_dt_groups": 2, "colour": "green"})
    assert sorted((p.code, p.location.split(" ")[-1]) for p in imported.problems) == [
        ("hf-unsupported-feature", "mamba_dt_groups"), ("hf-unsupported-feature", "moe_expert_scale_mode")]
    imported = _import({**TINY_MOE, "colour": "green"})
    assert imported.ok
    assert [n.location.split(" ")[-1] for n in imported.notes if n.code == "hf-key-not-read"] == ["colour"]


@pytest.mark.parametrize("release, main_flag, mtp_flags", [
    ("main", "--hybrid-layer-pattern M*EM/*E/*E", ()),
    ("0.17.0", "--hybrid-layer-pattern M*EM", ("--mtp-hybrid-override-pattern *E", "--mtp-num-layers 2")),
    ("0.16.1", "--hybrid-override-pattern M*EM", ("--mtp-hybrid-override-pattern *E", "--mtp-num-layers 2")),
])
def test_pattern_flags_are_the_chosen_releases(release, main_flag, mtp_flags):
    # megatron_flag_history.tsv: --hybrid-layer-pattern from 0.17.0; --hybrid-override-pattern in every
    # release; the '/' MTP syntax is main's (hybrid_layer_allocation.py at d98e8a64).
    from megatron_estimator.megatron.flags import flag_table

    config = {**TINY_MOE, "num_nextn_predict_layers": 2, "mtp_hybrid_override_pattern": "*E"}
    imported = _import(config, release)
    line = " ".join(imported.flags)
    if "--mtp-hybrid-override-pattern" not in flag_table(release):
        assert [p.code for p in imported.problems] == ["hf-unsupported-feature"]
        assert main_flag.split()[0] in flag_table(release)
        return
    assert imported.ok, imported.problems
    assert main_flag in line and all(f in line for f in mtp_flags), line
    assert _estimate_import(imported, release=release).total_parameters == \
        _estimate_import(_import(config), release="main").total_parameters
