"""Megatron-Bridge: its ConfigContainer YAML, override files and key=value overrides (OmegaConf,
Hydra's override grammar), the mixed-precision recipes, and launches of run_recipe.py.

Fixtures are written here in Bridge's format (``ConfigContainer.to_yaml()``: a ``_target_`` per
dataclass, dtypes and functions as ``{_target_: torch.bfloat16, _call_: false}``), not copied.
The numbers are Llama-3-8B's (Meta's config.json, which Bridge's Llama3ModelProvider8B repeats):
32 layers, hidden 4096, FFN 14336, 32 heads in 8 query groups, vocabulary 128256, untied.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("omegaconf", reason="the frameworks extra (pip install '.[frameworks]')")

from megatron_estimator import api
from megatron_estimator.cli import main
from megatron_estimator.inputs.trees import bridge as bridge_tree

DATA = Path(__file__).parent / "data" / "bridge"
CONTAINER = DATA / "llama3_8b_container.yaml"

# Llama-3-8B's parameters, by hand:
#   embedding and output layer (untied): 2 x 128256 x 4096                = 1,050,673,152
#   per layer: QKV 4096 x (4096 + 2 x 8 x 128) = 4096 x 6144              =    25,165,824
#              attention output 4096 x 4096                                =    16,777,216
#              MLP fc1 (SwiGLU, two halves) 4096 x 2 x 14336               =   117,440,512
#              MLP fc2 14336 x 4096                                        =    58,720,256
#              two RMSNorm weights 2 x 4096                                =         8,192
#              layer total                                                 =   218,112,000
#   32 layers                                                              = 6,979,584,000
#   final norm                                                             =         4,096
#   total                                                                  = 8,030,261,248 (Meta's "8B")
LLAMA3_8B_PARAMETERS = 2 * 128256 * 4096 + 32 * (4096 * 6144 + 4096 * 4096 + 4096 * 2 * 14336 + 14336 * 4096
                                                  + 2 * 4096) + 4096


def _load(text: str, **kwargs):
    return bridge_tree.load_bridge_yaml("c.yaml", textwrap.dedent(text), **kwargs)


def _settings(loaded):
    return {dest: setting.value for dest, setting in loaded.raw.settings.items()}


def test_container_yaml_maps_onto_megatron_settings_with_their_lines():
    assert LLAMA3_8B_PARAMETERS == 8_030_261_248
    inp, problems = api.input_from_file(CONTAINER, environ={})
    assert problems == ()
    raw = inp.raw
    # the model's fields are megatron-core's names; the activation and GQA become Megatron's flags
    assert raw.location("num_layers").endswith("llama3_8b_container.yaml:8 model.num_layers")
    assert (raw.value("swiglu"), raw.value("group_query_attention"), raw.value("num_query_groups")) == (True, True, 8)
    assert raw.value("untie_embeddings_and_output_weights") is True
    # dataset.seq_length is the sequence (model.seq_length interpolates it: ${dataset.seq_length})
    assert raw.value("seq_length") == 8192 and raw.location("seq_length").endswith(":41 dataset.seq_length")
    # GPTModelProvider builds GPTModel(max_sequence_length=seq_length)
    assert raw.value("max_position_embeddings") == 8192
    # bf16_mixed (mixed_precision.py:185): bf16, grads reduced in fp32
    assert raw.value("bf16") is True and raw.value("accumulate_allreduce_grads_in_fp32") is True
    assert raw.value("main_grads_dtype") == "fp32"          # {_target_: torch.float32, _call_: false}
    verdict = api.evaluate(inp, world_size=8, environ={})
    estimate = verdict.estimate
    assert estimate.total_parameters == LLAMA3_8B_PARAMETERS
    assert estimate.parallelism == {"tp": 2, "pp": 2, "vpp": None, "cp": 1, "dp": 2, "ep": 1, "etp": 2, "edp": 2}
    model = estimate.model
    assert (model.micro_batch_size, model.global_batch_size, model.num_microbatches) == (1, 32, 32 // (1 * 2))
    assert (model.params_dtype, model.distributed_optimizer) == ("bf16", True)
    # notes list the keys that were not read, by section (none of them touch memory)
    assert any("model: not read" in n and "hf_model_id" in n for n in inp.notes)


def test_override_files_and_key_value_overrides_are_merged_with_omegaconf(tmp_path):
    override = "model:\n  tensor_model_parallel_size: 4\ntrain:\n  global_batch_size: 16\n"
    loaded = bridge_tree.load_bridge_yaml(
        "base.yaml", CONTAINER.read_text(), override_files=[("over.yaml", override)],
        overrides=[("train.global_batch_size=64", "launch.sh:3"),
                   ("mixed_precision=bf16_with_fp8_current_scaling_mixed", "launch.sh:3"),
                   ("~model.hf_model_id", "launch.sh:3"), ("+model.num_layers=16", "launch.sh:4")])
    assert loaded.problems == ()
    settings = _settings(loaded)
    raw = loaded.raw
    assert settings["tensor_model_parallel_size"] == 4 and raw.location("tensor_model_parallel_size") == \
        "over.yaml:2 model.tensor_model_parallel_size"
    # the command line's override wins over the override file's
    assert settings["global_batch_size"] == 64 and raw.location("global_batch_size") == "launch.sh:3 train.global_batch_size"
    assert settings["num_layers"] == 16
    # mixed_precision.py:285 bf16_with_fp8_current_scaling_mixed: hybrid fp8, tensorwise, first and last layer in bf16
    assert (settings["fp8"], settings["fp8_recipe"], settings["num_layers_at_start_in_bf16"],
            settings["num_layers_at_end_in_bf16"], settings["fp8_param_gather"]) == ("hybrid", "tensorwise", 1, 1, True)
    assert any("mixed_precision.py:285" in a for a in loaded.assumptions)
    assert not any("hf_model_id" in n for n in loaded.notes)


@pytest.mark.parametrize("name, line", sorted((n, v[0]) for n, v in bridge_tree.mixed_precision_recipes()[1].items()))
def test_every_mixed_precision_recipe_sets_one_precision(name, line):
    loaded = bridge_tree.load_bridge_yaml("base.yaml", CONTAINER.read_text(),
                                          overrides=[(f"mixed_precision={name.replace('_', '-')}", "cli")])
    settings = _settings(loaded)
    assert loaded.problems == ()
    assert settings.get("bf16", False) != settings.get("fp16", False)     # exactly one of them
    assert name.startswith("fp16") == bool(settings.get("fp16"))


def test_keys_that_cannot_be_mapped_are_located_problems():
    loaded = _load("""\
        model:
          num_layers: 2
          hidden_size: 64
          num_attention_heads: 4
          seq_length: 128
          activation_func: {_target_: torch.nn.functional.gelu, _call_: false}
          gated_linear_unit: true
          hidden_dropout: fast
        train: {micro_batch_size: 1, global_batch_size: 8}
        dataset: {seq_length: 256}
        mixed_precision: bf16-mixd
        peft: {_target_: megatron.bridge.peft.lora.LoRA, dim: 8}
        optimiser: {lr: 1.0e-4}
        """)
    found = {(p.code, p.location) for p in loaded.problems}
    assert ("unsupported-setting", "c.yaml:6 model.activation_func") in found       # GeGLU: no Megatron flag
    assert ("wrong-type", "c.yaml:8 model.hidden_dropout") in found
    assert ("conflict", "c.yaml:10 dataset.seq_length") in found                     # config.py:1644
    assert ("invalid-choice", "c.yaml:11 mixed_precision") in found
    assert ("unsupported-setting", "c.yaml:12 peft") in found
    assert ("unknown-key", "c.yaml:13 optimiser") in found
    assert any("did you mean optimizer" in p.message for p in loaded.problems)
    assert any("did you mean bf16_mixed" in p.message for p in loaded.problems)


def test_an_override_file_is_not_checked_under_skip_unknown_and_a_problem_without_it(tmp_path, capsys):
    override = tmp_path / "llama32_1b_override.yaml"
    override.write_text("model:\n  tensor_model_parallel_size: 1\ntrain:\n  global_batch_size: 8\n"
                        "optimizer:\n  lr: 0.0003\ncheckpoint:\n  save: ./ckpt\n")
    card = tmp_path / "card.yaml"       # a model card: model: among keys that are no ConfigContainer's
    card.write_text("title: x\nmodel:\n  hf_id: a/b\nitems: {}\n")
    assert main(["check", "--skip-unknown", str(override), str(card)]) == 0
    err = capsys.readouterr().err
    assert f"skipped {override}: not checked: a Megatron-Bridge override file" in err
    assert f"skipped {card}:" in err
    assert main(["check", str(override)]) == 2
    out = capsys.readouterr().out
    assert "[partial-config]" in out and "run_recipe.py --recipe NAME" in out


def test_without_the_frameworks_extra_one_problem_names_it(monkeypatch):
    monkeypatch.setattr(bridge_tree, "omegaconf_or_none", lambda: None)
    loaded = bridge_tree.load_bridge_yaml("c.yaml", CONTAINER.read_text())
    assert [p.code for p in loaded.problems] == ["missing-extra"]
    assert "pip install 'megatron-estimator[frameworks]'" in loaded.problems[0].message


def _bridge_tree(tmp_path, importable: bool) -> Path:
    """A Megatron-Bridge checkout's layout: scripts/training/run_recipe.py (importing the
    package, as the real one does) and, when ``importable``, src/megatron/bridge with a
    recipe_runner.load_recipe that dumps the fixture as ConfigContainer.to_yaml would."""
    training = tmp_path / "scripts" / "training"
    training.mkdir(parents=True)
    (training / "run_recipe.py").write_text("from megatron.bridge.recipes.utils.dataset_utils import DATASET_PRESETS\n")
    if importable:
        package = tmp_path / "src" / "megatron" / "bridge"
        package.mkdir(parents=True)
        (package / "__init__.py").write_text("")
        (training / "recipe_runner.py").write_text(textwrap.dedent(f"""\
            import shutil

            class _Config:
                def __init__(self, name):
                    assert name == "llama3_8b_pretrain_config", name
                def to_yaml(self, path):
                    shutil.copy({str(CONTAINER)!r}, path)

            def load_recipe(name):
                return _Config(name)
            """))
    return tmp_path


LAUNCH = ["torchrun", "--nproc-per-node", "8", "scripts/training/run_recipe.py", "--recipe", "llama3_8b_pretrain_config",
          "-tp", "4", "train.global_batch_size=64", "model.pipeline_model_parallel_size=1"]


def test_run_recipe_launch_builds_the_recipe_in_a_subprocess_and_lays_the_overrides_over_it(tmp_path):
    root = _bridge_tree(tmp_path, importable=True)
    inp, problems, _ = api.input_from_launch(LAUNCH, environ={"PWD": str(root)})
    assert problems == ()
    raw = inp.raw
    # -tp 4 is model.tensor_model_parallel_size=4 (run_recipe.py COMMON_OVERRIDE_FIELDS)
    assert raw.value("tensor_model_parallel_size") == 4 and raw.location("tensor_model_parallel_size") == "-tp model.tensor_model_parallel_size"
    assert (raw.value("global_batch_size"), raw.value("pipeline_model_parallel_size")) == (64, 1)
    assert raw.value("num_layers") == 32                                   # from the recipe's own dump
    # the job's environment as Bridge's launchers set it (TP > 1 on a Hopper-class GPU, assumed
    # without --gpu, needs CUDA_DEVICE_MAX_CONNECTIONS=1: megatron/training/arguments.py)
    verdict = api.evaluate(inp, problems=problems, environ={"CUDA_DEVICE_MAX_CONNECTIONS": "1"})
    assert verdict.estimate is not None, verdict.problems
    # the launcher's world size: torchrun --nproc-per-node 8 -> tp 4 x dp 2
    assert verdict.estimate.world_size == 8 and verdict.estimate.parallelism["dp"] == 2
    assert verdict.estimate.total_parameters == LLAMA3_8B_PARAMETERS


def test_run_recipe_launch_without_bridge_is_one_refusal_that_says_how_to_dump(tmp_path, capsys):
    root = _bridge_tree(tmp_path, importable=False)
    inp, problems, _ = api.input_from_launch(LAUNCH, environ={"PWD": str(root)})
    assert [p.code for p in problems] == ["bridge-not-importable"]        # not unknown flags
    assert "llama3_8b_pretrain_config().to_yaml('config.yaml')" in problems[0].message
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/bash\ncd " + str(root) + "\n" + " ".join(LAUNCH) + "\n")
    assert main(["check", "--skip-unknown", str(script)]) == 0
    assert "not checked: a Megatron-Bridge launch: Megatron-Bridge is not importable" in capsys.readouterr().err


@pytest.mark.parametrize("pad, padded", [(False, 128256), (True, 128512)])
def test_the_vocabulary_is_padded_only_when_the_provider_says_so(pad, padded):
    # GPTModelProvider pads only with should_pad_vocab (default false); padded: to a multiple of
    # make_vocab_size_divisible_by x tp = 128 x 4 = 512: ceil(128256 / 512) = 251 -> 251 x 512 = 128512
    loaded = bridge_tree.load_bridge_yaml("base.yaml", CONTAINER.read_text(), overrides=[
        ("model.tensor_model_parallel_size=4", "cli"), (f"+model.should_pad_vocab={str(pad).lower()}", "cli")])
    inp = api.TrainingInput(loaded.raw, source="base.yaml")
    verdict = api.evaluate(inp, world_size=8, environ={})
    assert verdict.estimate.model.padded_vocab_size == padded
    # each extra row is one embedding row and one output row of 4096
    assert verdict.estimate.total_parameters == LLAMA3_8B_PARAMETERS + 2 * (padded - 128256) * 4096
