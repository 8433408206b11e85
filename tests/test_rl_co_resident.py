"""Models an RL job keeps beside the trained actor on its GPUs (model/co_resident.py), read from
verl trainer configs written here in verl's Hydra format (inputs/trees/verl.py).

The model is a small Llama (config.json below); its parameters, by hand (no biases, untied):
  per layer: q 256*256 + k,v 2*256*(2*64) + o 256*256 = 196608; MLP gated fc1 2*512*256 +
             fc2 512*256 = 393216; two RMSNorm weights 2*256 = 512  -> 590336
  4 layers 2361344 + embedding 1024*256 + output 1024*256 + final norm 256 = N = 2885888.
At TP 2 every linear and the (vocab-parallel) embedding and output are halved; the 9 norm
weights (2 per layer + final, 2304 elements) are replicated:
  (N - 2304) / 2 + 2304 = 1441792 + 2304 = 1444096 per GPU, x 2 bytes (bf16) = 2888192 bytes.
"""

import json

import pytest

pytest.importorskip("omegaconf")
pytest.importorskip("hydra")

from megatron_estimator import api

_MODEL = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 256,
          "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
          "vocab_size": 1024, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
          "tie_word_embeddings": False, "hidden_act": "silu"}
N = 2885888
REF_TP2_BYTES = ((N - 2304) // 2 + 2304) * 2        # = 2888192

_ACTOR = ("strategy: megatron\nppo_micro_batch_size_per_gpu: 1\nppo_mini_batch_size: 8\nuse_dynamic_bsz: false\n"
          "use_kl_loss: true\nmegatron:\n  tensor_model_parallel_size: 1\n  pipeline_model_parallel_size: 1\n"
          "  use_distributed_optimizer: true\n  dtype: bfloat16\n  param_offload: false\n")
# verl/trainer/config/ref/megatron_ref.yaml interpolates the actor's layout unless set.
_REF = ("megatron:\n  tensor_model_parallel_size: ${oc.select:actor_rollout_ref.actor.megatron."
        "tensor_model_parallel_size,1}\n  pipeline_model_parallel_size: 1\n  param_offload: false\n")
_CRITIC = ("strategy: megatron\nmegatron:\n  tensor_model_parallel_size: 1\n  pipeline_model_parallel_size: 1\n"
           "  param_offload: false\n  optimizer_offload: false\n")


@pytest.fixture
def trainer(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(_MODEL))
    for group, text in (("actor", _ACTOR), ("ref", _REF), ("critic", _CRITIC)):
        (tmp_path / group).mkdir()
        (tmp_path / group / f"megatron_{group}.yaml").write_text(text)
    (tmp_path / "trainer.yaml").write_text(
        "defaults:\n  - actor@actor_rollout_ref.actor: megatron_actor\n  - ref@actor_rollout_ref.ref: megatron_ref\n"
        "  - critic@critic: megatron_critic\n  - _self_\n"
        f"actor_rollout_ref:\n  model:\n    path: {tmp_path / 'model'}\n  rollout:\n    n: 1\n"
        "    free_cache_engine: true\n    gpu_memory_utilization: 0.5\n"
        "algorithm:\n  adv_estimator: grpo\n  use_kl_in_reward: false\n"
        "data:\n  max_prompt_length: 256\n  max_response_length: 256\n"
        "trainer:\n  nnodes: 1\n  n_gpus_per_node: 8\n")
    return tmp_path / "trainer.yaml"


def _verdict(path, *overrides):
    from megatron_estimator.inputs.registry import ReadOptions, read_file
    from megatron_estimator.inputs.trees.verl import read_verl

    reading = read_verl(str(path), list(overrides))
    assert reading.problems == ()
    inp = api.TrainingInput(reading.raw, source=str(path), world_size=reading.world_size,
                            world_size_source=reading.world_size_source, notes=reading.notes)
    verdict = api.evaluate(inp, budget=80 * 2**30)
    assert not verdict.problems, verdict.problems
    return verdict


def _beside(verdict):
    return {dict(s.details)["co_resident_models"] for s in verdict.estimate.stages}


def _said(verdict):
    return [a.text for a in verdict.estimate.assumptions]


def test_reference_weights_at_its_own_tensor_parallel_size(trainer):
    # The reference model at TP 2 (the actor at TP 1): 2888192 bytes per GPU (module docstring).
    v = _verdict(trainer, "actor_rollout_ref.ref.megatron.tensor_model_parallel_size=2")
    assert _beside(v) == {REF_TP2_BYTES}
    line = next(t for t in _said(v) if t.startswith("verl reference model"))
    assert "TP 2 x PP 1" in line and "megatron_workers.py:374" in line
    # At TP 1 (interpolated from the actor): every parameter, N x 2 bytes.
    assert _beside(_verdict(trainer)) == {N * 2}


def test_reference_param_offload_counts_nothing(trainer):
    on = _verdict(trainer)
    off = _verdict(trainer, "actor_rollout_ref.ref.megatron.param_offload=true")
    assert _beside(off) == {0}
    assert any(t.startswith("verl reference model") and "offloaded to the CPU" in t for t in _said(off))
    # the stage's total drops by exactly the reference's weights
    assert on.estimate.stages[0].bytes.total - off.estimate.stages[0].bytes.total == N * 2
    # no KL (use_kl_loss false, use_kl_in_reward false): verl builds no reference model
    assert _beside(_verdict(trainer, "actor_rollout_ref.actor.use_kl_loss=false")) == {0}


def test_critic_states_when_colocated(trainer):
    kl_off = "actor_rollout_ref.actor.use_kl_loss=false"
    gae = _verdict(trainer, kl_off, "algorithm.adv_estimator=gae")
    # The critic at the actor's layout and world keeps what the actor keeps: weights, grads and
    # optimizer states (its value head counted as the output layer, the module's stated over-estimate).
    actor = gae.estimate.stages[0].bytes
    assert _beside(gae) == {actor.weights + actor.gradients + actor.optimizer_states}
    # optimizer_offload only: weights bf16 2N + main grads fp32 4N (Megatron's --main-grads-dtype
    # default fp32 under bf16), within the distributed optimizer's buffer padding (under 64
    # elements per tensor, 40 tensors here).
    opt_off = _verdict(trainer, kl_off, "algorithm.adv_estimator=gae", "critic.megatron.optimizer_offload=true")
    (held,) = _beside(opt_off)
    assert 6 * N <= held <= 6 * (N + 64 * 40)
    off = _verdict(trainer, kl_off, "algorithm.adv_estimator=gae", "critic.megatron.param_offload=true",
                   "critic.megatron.optimizer_offload=true")
    assert _beside(off) == {0}
    # grpo without critic.enable: no critic (verl/trainer/ppo/utils.py need_critic)
    assert _beside(_verdict(trainer, kl_off)) == {0}
