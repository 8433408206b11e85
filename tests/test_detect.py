"""Format detection by name and content, without importing yaml."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_estimator.inputs.detect import detect_format

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"

LAUNCH = """\
torchrun --nproc_per_node 8 pretrain_gpt.py \\
    --num-layers 32 --hidden-size 4096 --num-attention-heads 32 \\
    --seq-length 4096 --max-position-embeddings 4096 --micro-batch-size 1 --bf16
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_shipped_files():
    assert detect_format(REPO / "examples/llama3-8b.yaml") == "seed-yaml"
    assert detect_format(REPO / "examples/llama3-70b-tight.yaml") == "seed-yaml"
    assert detect_format(FIXTURES / "seed-broken.yaml") == "seed-yaml"
    assert detect_format(FIXTURES / "megatron-yaml-gpt.yaml") == "megatron-yaml"


@pytest.mark.parametrize("name, text", [
    ("train.sh", LAUNCH),
    ("train.slurm", "srun python pretrain_gpt.py --num-layers 2\n"),
    ("train", "#!/bin/bash\n" + LAUNCH),
    ("train", "#!/usr/bin/env bash\nset -e\n" + LAUNCH),
    ("job.txt", "# a slurm job\n#SBATCH --nodes=2\n#SBATCH --gpus-per-node=8\n" + LAUNCH),
    ("run", LAUNCH),
    ("run", "python3 pretrain_gpt.py --num-layers 2\n"),
])
def test_shell(tmp_path, name, text):
    assert detect_format(write(tmp_path, name, text)) == "shell"


def test_hf_config_file_and_directory(tmp_path):
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096}
    path = write(tmp_path, "config.json", json.dumps(config))
    assert detect_format(path) == "hf-config"
    assert detect_format(tmp_path) == "hf-config"
    only_type = write(tmp_path, "other.json", json.dumps({"model_type": "mixtral"}))
    assert detect_format(only_type) == "hf-config"
    no_extension = write(tmp_path, "cfg", json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    assert detect_format(no_extension) == "hf-config"


@pytest.mark.parametrize("name, text", [
    ("tokenizer.json", json.dumps({"version": "1.0", "model": {"type": "BPE"}})),
    ("broken.json", '{"model_type": '),
    ("other.yaml", "trainer:\n  devices: 8\n"),
    ("nested.yaml", "config:\n  model:\n    num_layers: 2\n"),
    ("empty.yaml", ""),
    ("notes.txt", "Remember to run torchrun later.\n"),
])
def test_unknown(tmp_path, name, text):
    assert detect_format(write(tmp_path, name, text)) == "unknown"


def test_missing_file_and_directory_without_config(tmp_path):
    assert detect_format(tmp_path / "absent.yaml") == "unknown"
    assert detect_format(tmp_path) == "unknown"


def test_yaml_formats_by_top_level_keys_even_when_broken(tmp_path):
    assert detect_format(write(tmp_path, "a.yml", "parallelism:\n  tensor_model_parallel_size: 2\n")) == "seed-yaml"
    assert detect_format(write(tmp_path, "b.yaml", "# comment\nmodel_parallel:\n  [broken\n")) == "megatron-yaml"
    assert detect_format(write(tmp_path, "c.cfg", "model: {num_layers: 2}\n")) == "seed-yaml"


def test_detection_does_not_import_yaml(tmp_path):
    script = write(tmp_path, "train.sh", LAUNCH)
    seed = REPO / "examples/llama3-8b.yaml"
    code = ("import sys; from megatron_estimator.inputs.detect import detect_format; "
            f"r = (detect_format({str(script)!r}), detect_format({str(seed)!r})); "
            "print(r, 'yaml' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "('shell', 'seed-yaml') False"


def test_keys_of_both_yaml_formats_are_a_mixed_file(tmp_path):
    path = write(tmp_path, "both.yaml", "model:\n  num_layers: 2\nlanguage_model:\n  num_layers: 2\n")
    assert detect_format(path) == "mixed-yaml"


@pytest.mark.parametrize("name", ["", ".", "..", "/", "//", "///", "//a", "///a//b/", "a/./b", "./a", "a/.", "a/../b",
                                  "x.sh", "..sh", "a.", ".bashrc", "dir/x.tar.gz", "x.SH/", "a/b/..", ".../x", "...",
                                  "a..b", "/..", "a b/c.d", "examples/llama3-8b.yaml/"])
def test_file_names_are_read_as_pathlib_reads_them(name):
    # The readers name files as os.path strings (no pathlib at start-up), the way Path did.
    from pathlib import Path

    from megatron_estimator.core.resources import path_string, path_suffix

    assert path_string(name) == str(Path(name))
    assert path_suffix(name) == Path(name).suffix


def test_a_trailing_slash_names_the_file(monkeypatch):
    monkeypatch.chdir(REPO)
    assert detect_format("examples/llama3-8b.yaml/") == detect_format("examples/llama3-8b.yaml") == "seed-yaml"
    assert detect_format("examples/llama3_8b_pretrain.sh/") == "shell"


@pytest.mark.parametrize("data", [b"", b"\xef\xbb\xbfmodel:\n", b"\xef\xbbmodel:", b"\xef\xbb\xbf\xef\xbb\xbfx", b"a\xffb",
                                  "wörld".encode(), b"\xef\xbb\xbf\xc3", b"\xc3", b"\xef"])
def test_the_head_is_read_as_the_utf_8_sig_codec_reads_it(tmp_path, data):
    from megatron_estimator.inputs.detect import _read_head

    path = tmp_path / "f"
    path.write_bytes(data)
    assert _read_head(str(path), 1 << 20) == data.decode("utf-8-sig", errors="replace")


# ---- the seed format by its shape, not by one `model:` key -----------------------------------
# Self-written files reproducing the shapes of other frameworks' YAML that have a top-level
# model: key (volcengine/verl verl/trainer/config/critic/megatron_critic.yaml; NVIDIA-NeMo/
# Megatron-Bridge examples/distillation/llama/conf/*_override_example.yaml and
# examples/model_verification_cards/*/card.yaml).

VERL_CRITIC = """\
defaults:
  - critic
  - _self_
_target_: verl.workers.config.McoreCriticConfig
strategy: megatron
nccl_timeout: 600
model:
  _target_: verl.trainer.config.BaseModelConfig
  override_config:
    model_config: {}
load_weight: True
"""

BRIDGE_OVERRIDE = """\
model:
  seq_length: 4096
  tensor_model_parallel_size: 2
  pipeline_model_parallel_size: 1
  sequence_parallel: true
train:
  train_iters: 10
  global_batch_size: 8
  micro_batch_size: 1
optimizer:
  lr: 1e-4
checkpoint:
  save: ./distilled
"""

BRIDGE_CARD = """\
title: deepseek_v3
summary: >
  a verification card
model:
  hf_id: deepseek-ai/DeepSeek-V3
  architecture: DeepseekV3ForCausalLM
items:
  pretrain: {}
"""


@pytest.mark.parametrize("text, kind", [(VERL_CRITIC, "unknown"), (BRIDGE_OVERRIDE, "bridge-yaml"),
                                        (BRIDGE_CARD, "unknown")])
def test_other_formats_with_a_model_key_are_not_the_seed_format(tmp_path, text, kind):
    # keys counted: the top-level ones and those of the seed sections; seed ones / all:
    # verl critic: 6 top-level (only model: seed) + model's _target_, override_config -> 1 / 8;
    # Bridge override: 4 top-level (model) + model's 4, parallel / training keys that the
    # seed format keeps under parallelism: / training:, not model: -> 1 / 8; card: 1 / 6.
    # The Bridge override file is Bridge's (model: beside train:, optimizer:, checkpoint:); the
    # card's title:, summary:, items: are no ConfigContainer sections.
    assert detect_format(write(tmp_path, "c.yaml", text)) == kind


def test_a_seed_file_with_a_few_typos_is_still_the_seed_format(tmp_path):
    # tests/fixtures/seed-broken.yaml has 2 misplaced / misspelt keys among 4 seed sections
    assert detect_format(FIXTURES / "seed-broken.yaml") == "seed-yaml"
    # a misspelt section and key: model, num_layers, training seed; hidden_sise, paralelism not
    # (a section that is not the seed's is one key) -> 3 / 5
    text = "model:\n  num_layers: 2\n  hidden_sise: 64\nparalelism:\n  tensor_model_parallel_size: 1\ntraining: {}\n"
    assert detect_format(write(tmp_path, "s.yaml", text)) == "seed-yaml"
    # model seed; name, path, other not -> 1 / 4: not the seed format
    assert detect_format(write(tmp_path, "t.yaml", "model:\n  name: x\n  path: y\nother: 1\n")) == "unknown"


def test_skip_unknown_passes_over_other_frameworks_yaml(tmp_path):
    from megatron_estimator.inputs import registry

    reason = registry.skip_reason(write(tmp_path, "megatron_critic.yaml", VERL_CRITIC))
    assert reason is not None and reason.startswith("not a seed-format YAML")
