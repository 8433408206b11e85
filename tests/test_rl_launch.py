"""verl and NeMo-RL launches (inputs/frameworks/verl.py, nemo_rl.py): the entry program is
recognised, its config found as the framework finds it, the launch's key=value overrides laid
over it, the world size taken from the config, and ``check --skip-unknown`` passes over a
non-Megatron policy with its reason.

The fixtures are written here, in the idioms of verl's examples/*/run_*megatron*.sh
(``python3 -m verl.trainer.main_ppo --config-path=config --config-name=... key=value $@``,
``@hydra.main(config_path="config", config_name="ppo_trainer")`` in verl/trainer/main_ppo.py) and
NeMo-RL's documented ``uv run examples/run_grpo.py --config X.yaml key=value`` (the default
config ``os.path.join(os.path.dirname(__file__), "configs", "grpo_math_1B.yaml")``,
examples/run_grpo.py).  The model is a small LLaMA written here; its parameters by hand:
  embedding 1024 x 256 = 262,144; per layer: norms 2 x 256, q 256 x 256 = 65,536, k and v
  2 x 256 x (2 heads x 64) = 65,536, o 65,536, gate+up 2 x 256 x 512 = 262,144, down 131,072:
  590,336; 4 layers 2,361,344; final norm 256; output 262,144 (untied) -> 2,885,888."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("omegaconf", reason="the frameworks extra (pip install '.[frameworks]')")
pytest.importorskip("hydra", reason="the frameworks extra (pip install '.[frameworks]')")

from megatron_estimator import api
from megatron_estimator.cli import main

PARAMETERS = 2_885_888
_MODEL = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 256,
          "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
          "vocab_size": 1024, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
          "tie_word_embeddings": False, "hidden_act": "silu"}
_MAIN_PPO = ('import hydra\nfrom verl.trainer.ppo import ray_trainer\n\n\n'
             '@hydra.main(config_path="config", config_name="ppo_trainer", version_base=None)\n'
             'def main(config):\n    ray_trainer.run(config)\n')
_ACTOR = ("strategy: megatron\nppo_micro_batch_size_per_gpu: 2\nppo_mini_batch_size: 8\nuse_dynamic_bsz: false\nuse_kl_loss: false\n"
          "megatron:\n  tensor_model_parallel_size: 1\n  pipeline_model_parallel_size: 1\n  use_distributed_optimizer: true\n"
          "  dtype: bfloat16\n")
_TRAINER = ("defaults:\n  - actor@actor_rollout_ref.actor: megatron_actor\n  - _self_\n"
            "actor_rollout_ref:\n  model:\n    path: hub-org/unreachable-model\n  rollout:\n    free_cache_engine: true\n    n: 2\n"
            "data:\n  max_prompt_length: 256\n  max_response_length: 768\ntrainer:\n  nnodes: 1\n  n_gpus_per_node: 4\n")


def _model(root):
    (root / "model").mkdir()
    (root / "model" / "config.json").write_text(json.dumps(_MODEL))
    return root / "model"


def _verl_tree(root):
    config = root / "verl" / "trainer" / "config"
    (config / "actor").mkdir(parents=True)
    (root / "verl" / "trainer" / "main_ppo.py").write_text(_MAIN_PPO)
    (config / "actor" / "megatron_actor.yaml").write_text(_ACTOR)
    (config / "mega_trainer.yaml").write_text(_TRAINER)
    # the program's default config (@hydra.main config_name): an FSDP actor
    (config / "ppo_trainer.yaml").write_text("actor_rollout_ref:\n  actor:\n    strategy: fsdp\ntrainer:\n  nnodes: 1\n")
    return root


def _script(root, body: str, export: str = "export CUDA_DEVICE_MAX_CONNECTIONS=1"):
    script = root / "run.sh"
    script.write_text(f"set -x\ncd {root}\n{export}\n{body}\n")
    return script


def test_verl_launch_composes_the_named_config_with_its_overrides_and_takes_its_world_size(tmp_path):
    root, model = _verl_tree(tmp_path), _model(tmp_path)
    script = _script(root, "python3 -m verl.trainer.main_ppo --config-path=config --config-name='mega_trainer.yaml'\\\n"
                           "    actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2 \\\n"
                           f"    actor_rollout_ref.model.path={model} \\\n    trainer.nnodes=2 $@",
                     export="export VLLM_USE_V1=1")
    inp, problems = api.input_from_file(script, environ={"PWD": str(root)})
    assert problems == ()
    raw = inp.raw
    # the override, where the script gives it (line 5: set -x, cd, export, python3, this one)
    assert raw.value("tensor_model_parallel_size") == 2
    assert raw.location("tensor_model_parallel_size").startswith(f"{script}:5 ")
    # a sequence is max_prompt_length + max_response_length = 256 + 768; ppo_micro_batch_size_per_gpu 2
    assert (raw.value("seq_length"), raw.value("micro_batch_size")) == (1024, 2)
    # one optimizer step: ppo_mini_batch_size 8 prompts x rollout.n 2 responses = 16 sequences
    assert raw.value("global_batch_size") == 16
    # trainer.nnodes (2, the override) x trainer.n_gpus_per_node (4, the file) = 8
    assert inp.world_size == 8 and "trainer.nnodes" in inp.world_size_source
    # no export in the script: verl's Ray runtime env sets it in its workers (constants_ppo.py), and
    # TP 2 on the assumed Hopper GPU needs it (megatron/training/arguments.py)
    assert inp.environment["CUDA_DEVICE_MAX_CONNECTIONS"] == "1" and inp.environment["VLLM_USE_V1"] == "1"
    verdict = api.evaluate(inp, problems=problems)
    assert verdict.estimate is not None, verdict.problems
    assert verdict.estimate.world_size == 8 and verdict.estimate.parallelism["dp"] == 8 // 2
    assert verdict.estimate.total_parameters == PARAMETERS
    assert verdict.estimate.model.num_microbatches == 16 // (2 * 4)      # global / (micro x dp)
    assert main(["check", str(script)]) == 0


def test_verl_launch_with_an_fsdp_actor_is_skipped_and_an_unreachable_verl_is_not_checked(tmp_path, capsys):
    root = _verl_tree(tmp_path / "with")
    # no --config-name: @hydra.main's ppo_trainer, whose actor is FSDP
    fsdp = _script(root, "python3 -m verl.trainer.main_ppo trainer.nnodes=1")
    assert main(["check", str(fsdp)]) == 2
    assert "unsupported-stack" in capsys.readouterr().out
    assert main(["check", "--skip-unknown", str(fsdp)]) == 0
    assert "its actor's strategy is not megatron" in capsys.readouterr().err
    # verl's program is not on this machine: its relative --config-path cannot be found
    bare = tmp_path / "without"
    bare.mkdir()
    away = _script(bare, "python3 -m verl.trainer.main_ppo --config-path=config --config-name=mega_trainer "
                         "trainer.nnodes=1")
    assert main(["check", "--skip-unknown", str(away)]) == 0
    assert "not checked: verl launch: --config-path config is relative to verl's entry program" in capsys.readouterr().err
    assert main(["check", str(away)]) == 2
    assert "config-not-found" in capsys.readouterr().out      # one problem, not unknown Megatron flags


_RUN_GRPO = ('import argparse\nimport os\n\nfrom nemo_rl.utils.config import load_config\n\n\n'
             'def main():\n    parser = argparse.ArgumentParser()\n    parser.add_argument("--config", default=None)\n'
             '    args, overrides = parser.parse_known_args()\n    if not args.config:\n'
             '        args.config = os.path.join(os.path.dirname(__file__), "configs", "grpo_math_1B.yaml")\n'
             '    load_config(args.config)\n')
_NEMO = """\
policy:
  model_name: "{model}"
  train_global_batch_size: 16
  train_micro_batch_size: 2
  max_total_sequence_length: 512
  precision: "bfloat16"
  megatron_cfg:
    enabled: true
    tensor_model_parallel_size: 1
    optimizer:
      use_distributed_optimizer: true
  generation:
    backend: vllm
cluster:
  num_nodes: 2
  gpus_per_node: 8
"""


def _nemo_tree(root, model):
    (root / "examples" / "configs").mkdir(parents=True)
    (root / "examples" / "run_grpo.py").write_text(_RUN_GRPO)
    (root / "examples" / "configs" / "grpo_math_1B.yaml").write_text(
        "grpo:\n  max_num_steps: 100\npolicy:\n  model_name: x\n  megatron_cfg:\n    enabled: false\ncluster:\n  num_nodes: 1\n  gpus_per_node: 8\n")
    (root / "mine").mkdir()
    (root / "mine" / "mega.yaml").write_text(_NEMO.format(model=model))
    return root


def test_nemo_rl_launch_reads_its_config_relative_to_the_working_directory(tmp_path):
    root = _nemo_tree(tmp_path, _model(tmp_path))
    script = _script(root, "uv run examples/run_grpo.py --config mine/mega.yaml \\\n"
                           "    policy.megatron_cfg.tensor_model_parallel_size=2 cluster.gpus_per_node=4")
    inp, problems = api.input_from_file(script, environ={"PWD": str(root)})
    assert problems == ()
    assert inp.raw.value("tensor_model_parallel_size") == 2
    assert inp.raw.location("tensor_model_parallel_size").startswith(f"{script}:5 ")
    assert (inp.raw.value("micro_batch_size"), inp.raw.value("seq_length"), inp.raw.value("global_batch_size")) == (2, 512, 16)
    # cluster.num_nodes 2 (the file) x cluster.gpus_per_node 4 (the override) = 8
    assert inp.world_size == 8
    verdict = api.evaluate(inp, problems=problems)
    assert verdict.estimate is not None, verdict.problems
    assert verdict.estimate.parallelism["dp"] == 8 // 2 and verdict.estimate.total_parameters == PARAMETERS


def test_nemo_rl_launch_without_config_takes_the_programs_default_and_skips_a_dtensor_policy(tmp_path, capsys):
    root = _nemo_tree(tmp_path / "with", "unused")
    script = _script(root, "uv run examples/run_grpo.py grpo.max_num_steps=5")
    assert main(["check", "--skip-unknown", str(script)]) == 0
    assert "DTensor/FSDP2" in capsys.readouterr().err
    # the program is not on this machine: its default config cannot be told
    bare = tmp_path / "without"
    bare.mkdir()
    away = _script(bare, "uv run examples/run_grpo.py grpo.max_num_steps=5")
    assert main(["check", "--skip-unknown", str(away)]) == 0
    assert "not checked: NeMo-RL launch: no --config, and the program's default config cannot be told: its " \
           "source is not on this machine" in capsys.readouterr().err
