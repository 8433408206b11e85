"""NeMo-RL and verl configurations read into Megatron settings (inputs/trees/).

Fixtures are written here in the frameworks' formats (NeMo-RL: ``defaults:`` inheritance,
``${mul:...}`` interpolation, Hydra overrides; verl: a Hydra defaults list with a config group).
Expected values are what the framework hands megatron-core, worked out by hand in comments."""

import json
import sys

import pytest

pytest.importorskip("omegaconf")
pytest.importorskip("hydra")

from megatron_estimator.inputs.detect import detect_format
from megatron_estimator.inputs.trees.nemo_rl import read_nemo_rl
from megatron_estimator.inputs.trees.verl import read_verl

_MODEL = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 256,
          "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
          "vocab_size": 1024, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
          "tie_word_embeddings": False, "hidden_act": "silu"}

_BASE = """\
policy:
  model_name: "{model}"
  train_global_batch_size: 16
  train_micro_batch_size: 2
  max_total_sequence_length: 512
  precision: "bfloat16"
  sequence_packing:
    enabled: false
    train_mb_tokens: ${{mul:${{policy.max_total_sequence_length}}, ${{policy.train_micro_batch_size}}}}
  megatron_cfg:
    enabled: true
    tensor_model_parallel_size: 1
    activation_checkpointing: true
    optimizer:
      use_distributed_optimizer: true
  generation:
    backend: vllm
loss_fn:
  reference_policy_kl_penalty: 0.01
cluster:
  num_nodes: 2
  gpus_per_node: 4
"""
_CHILD = "defaults: base.yaml\npolicy:\n  megatron_cfg:\n    tensor_model_parallel_size: 2\n    sequence_parallel: true\n"


def _values(reading):
    return {dest: s.value for dest, s in reading.raw.settings.items()}


@pytest.fixture
def nemo(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(_MODEL))
    (tmp_path / "base.yaml").write_text(_BASE.format(model=tmp_path / "model"))
    (tmp_path / "child.yaml").write_text(_CHILD)
    return tmp_path


def test_nemo_rl_inheritance_interpolation_and_overrides(nemo):
    reading = read_nemo_rl(str(nemo / "child.yaml"))
    assert reading.problems == ()
    v = _values(reading)
    # the child overrides tp 1 -> 2; the rest comes from base.yaml
    assert (v["tensor_model_parallel_size"], v["sequence_parallel"]) == (2, True)
    assert (v["micro_batch_size"], v["seq_length"], v["global_batch_size"]) == (2, 512, 16)
    assert v["bf16"] is True and v["use_distributed_optimizer"] is True
    # activation_checkpointing: full, uniform, 1 layer (setup.py _apply_performance_config)
    assert (v["recompute_granularity"], v["recompute_method"], v["recompute_num_layers"]) == ("full", "uniform", 1)
    assert v["num_layers"] == 4 and v["hidden_size"] == 256      # the model read from its config.json
    assert reading.world_size == 2 * 4                            # cluster.num_nodes x gpus_per_node
    assert reading.raw.location("tensor_model_parallel_size").endswith(
        "child.yaml policy.megatron_cfg.tensor_model_parallel_size")
    # the reference model (reference_policy_kl_penalty 0.01): a CPU state dict, nothing on the GPU
    (ref,) = reading.raw.co_resident
    assert ref.role == "NeMo-RL reference model" and not ref.on_gpu and "setup.py:2039" in ref.source
    assert any("llm.sleep(level=1)" in n for n in reading.notes)
    # packing on, micro batch 4 on the command line: train_mb_tokens = mul(512, 4) = 2048 in one row
    over = read_nemo_rl(str(nemo / "child.yaml"), ["policy.sequence_packing.enabled=true",
                                                    "policy.train_micro_batch_size=4"])
    assert (_values(over)["micro_batch_size"], _values(over)["seq_length"]) == (1, 2048)
    assert over.raw.location("micro_batch_size").endswith("policy.sequence_packing.train_mb_tokens")


def test_nemo_rl_bad_override_and_dtensor(nemo):
    bad = read_nemo_rl(str(nemo / "child.yaml"), ["policy.no_such_key=1"])
    assert [p.code for p in bad.problems] == ["tree-config"] and "override" in bad.problems[0].message
    (nemo / "dtensor.yaml").write_text("defaults: base.yaml\npolicy:\n  megatron_cfg:\n    enabled: false\n")
    reading = read_nemo_rl(str(nemo / "dtensor.yaml"))
    assert [p.code for p in reading.problems] == ["unsupported-stack"] and "not Megatron" in reading.skip
    assert detect_format(nemo / "child.yaml") == "nemo-rl-yaml"


def test_verl_hydra_composition(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(_MODEL))
    (tmp_path / "actor").mkdir()
    (tmp_path / "actor" / "megatron_actor.yaml").write_text(
        "strategy: megatron\nppo_micro_batch_size_per_gpu: 2\nuse_dynamic_bsz: false\nppo_max_token_len_per_gpu: 4096\n"
        "use_kl_loss: false\nmegatron:\n  tensor_model_parallel_size: 1\n  pipeline_model_parallel_size: 1\n"
        "  sequence_parallel: true\n  use_distributed_optimizer: true\n  dtype: bfloat16\n"
        "  override_transformer_config:\n    recompute_granularity: null\n")
    (tmp_path / "trainer.yaml").write_text(
        "defaults:\n  - actor@actor_rollout_ref.actor: megatron_actor\n  - _self_\n"
        f"actor_rollout_ref:\n  model:\n    path: {tmp_path / 'model'}\n  rollout:\n    free_cache_engine: true\n"
        "data:\n  max_prompt_length: 256\n  max_response_length: 768\n"
        "trainer:\n  nnodes: 2\n  n_gpus_per_node: 4\n")
    assert detect_format(tmp_path / "trainer.yaml") == "verl-yaml"
    reading = read_verl(str(tmp_path / "trainer.yaml"),
                        ["actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
                         "actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity=full"])
    assert reading.problems == ()
    v = _values(reading)
    assert v["tensor_model_parallel_size"] == 2 and v["recompute_granularity"] == "full"
    assert (v["micro_batch_size"], v["seq_length"]) == (2, 256 + 768)   # prompt + response
    assert reading.world_size == 2 * 4                                   # nnodes x n_gpus_per_node
    dyn = read_verl(str(tmp_path / "trainer.yaml"), ["actor_rollout_ref.actor.use_dynamic_bsz=true"])
    assert (_values(dyn)["micro_batch_size"], _values(dyn)["seq_length"]) == (1, 4096)
    fsdp = read_verl(str(tmp_path / "trainer.yaml"), ["actor_rollout_ref.actor.strategy=fsdp"])
    assert [p.code for p in fsdp.problems] == ["unsupported-stack"] and fsdp.skip


def test_missing_extra_names_it(nemo, monkeypatch):
    monkeypatch.setitem(sys.modules, "omegaconf", None)
    reading = read_nemo_rl(str(nemo / "child.yaml"))
    assert [p.code for p in reading.problems] == ["missing-extra"]
    assert "megatron-estimator[frameworks]" in reading.problems[0].message
