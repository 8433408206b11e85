"""``fits on:`` (the catalog GPUs on which every stage fits) and ``check --summary``.

Every expected figure is derived here by hand from the shapes, and the catalog capacities are
read from the catalog itself (megatron/gpus.py): the assertions hold the estimator to margins
that leave no doubt, never to its own output."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import REPO, TINY_GPT, flags
from megatron_estimator import api
from dataclasses import replace
from megatron_estimator.core.units import GiB
from megatron_estimator.megatron.gpus import GPUS
from megatron_estimator.model.overhead import Overheads


def _verdict(argv, world_size=1, **kwargs):
    inp, problems = api.input_from_flags(argv)
    assert not problems
    return api.evaluate(inp, world_size=world_size, **kwargs)


# A GPT whose model states dominate: 9 layers, hidden 4096 (ffn 4h, biases, LayerNorm, learned
# positions, tied output), sequence 1024, vocabulary 32000 (= 250 x 128: no padding), bf16 with
# Adam on one GPU.  Parameters:
#   per layer 12h^2 + 13h = 201,326,592 + 53,248 = 201,379,840;  x 9 = 1,812,418,560
#   word embeddings 32000 x 4096 = 131,072,000; positions 1024 x 4096 = 4,194,304; final norm 2h = 8,192
#   total 1,947,693,056
# Bytes per parameter: bf16 weight 2 + fp32 main gradient 4 + fp32 master 4 + Adam m, v 8 = 18:
#   35,058,475,008 B = 32.65 GiB, a floor of the peak.  A ceiling, generously: activations
#   34 s b h bytes per layer (Korthikanti et al., flash attention) 9 x 142.6 MB = 1.2 GiB, the
#   logits (s V at 2 + 3 x 4 bytes) 0.43 GiB, workspaces and transients under 1 GiB: under
#   35.4 GiB allocated; x 1.05 fragmentation + 0.5 GiB CUDA context + 0.5 GiB for anything else:
#   under 38.2 GiB.  The catalog has nothing between 31.7 GiB (v100-32gb) and 39.4 GiB
#   (a100-pcie-40gb), so the answer is every GPU of 40 GB and more.
STATES_BOUND = flags("--num-layers 9 --hidden-size 4096 --num-attention-heads 32 --seq-length 1024 "
                     "--max-position-embeddings 1024 --micro-batch-size 1 --global-batch-size 1 "
                     "--vocab-size 32000 --bf16")
PARAMETERS = 9 * (12 * 4096**2 + 13 * 4096) + 32000 * 4096 + 1024 * 4096 + 2 * 4096
FLOOR, CEILING = 18 * PARAMETERS, int(38.2 * GiB)


def test_fits_on_is_every_catalog_gpu_above_the_hand_peak_whatever_the_budget():
    assert PARAMETERS == 1_947_693_056
    assert not [g.name for g in GPUS if FLOOR <= g.total_memory_bytes <= CEILING]     # the margin is clear
    expected = tuple(g.name for g in GPUS if g.total_memory_bytes > CEILING)
    assert "a100-pcie-40gb" in expected and "v100-32gb" not in expected and "l40s" in expected
    for budget in (None, 1 * GiB, 200 * GiB):           # the budget given changes nothing
        estimate = _verdict(STATES_BOUND, budget=budget).estimate
        assert estimate.total_parameters == PARAMETERS
        assert FLOOR <= estimate.peak_stage.device_peak_bytes <= CEILING
        assert estimate.fits_on == expected


def test_fits_on_judges_each_gpu_with_its_own_attention_kernel():
    # Deterministic mode with no flash-attn: before compute capability 9.0 Transformer Engine
    # rules out fused and flash attention (config/typed.py deterministic_fallback), so the
    # unfused kernel keeps each layer's softmax output, b a s^2 bf16 values:
    #   1 x 32 x 8192^2 x 2 B = 4 GiB a layer, x 24 layers held for the backward = 96 GiB at least,
    # above every GPU of compute capability < 9 (the largest, a100-pcie-80gb, has 80 GiB).
    # On 9.0 and later (flash): P = 24 (12h^2 + 13h) + 32000 h + 8192 h + 2h = 343,468,032 at h 1024;
    # 18 P = 5.76 GiB; activations 34 s b h x 24 = 6.4 GiB; logits 8192 x 32000 x 14 B = 3.4 GiB;
    # (15.6 + 2) x 1.05 + 1 = 19.5 GiB at most, below the smallest such GPU (mi250x, 64 GiB).
    argv = flags("--num-layers 24 --hidden-size 1024 --num-attention-heads 32 --seq-length 8192 "
                 "--max-position-embeddings 8192 --micro-batch-size 1 --global-batch-size 1 "
                 "--vocab-size 32000 --bf16 --deterministic-mode")
    verdict = _verdict(argv, overheads=Overheads(flash_attn="none"))
    assert verdict.estimate is not None, verdict.problems
    assert verdict.estimate.peak_stage.device_peak_bytes <= 19.5 * GiB         # the GPU was not named: Hopper
    assert min(g.total_memory_bytes for g in GPUS if g.compute_capability_value >= 9.0) > 19.5 * GiB
    assert max(g.total_memory_bytes for g in GPUS if g.compute_capability_value < 9.0) < 96 * GiB
    assert verdict.estimate.fits_on == tuple(g.name for g in GPUS if g.compute_capability_value >= 9.0)
    # Named, an A100 80GB is judged the same way: over its budget, and on no GPU before Hopper.
    a100 = api.lookup_gpu("a100-80gb")
    on_a100 = _verdict(argv, budget=a100.total_memory_bytes,
                       overheads=replace(Overheads(flash_attn="none"), compute_capability=8.0, gpu_known=True))
    assert on_a100.estimate.peak_stage.device_peak_bytes >= 96 * GiB and on_a100.estimate.fits is False
    assert on_a100.estimate.fits_on == verdict.estimate.fits_on


@pytest.mark.parametrize("connections, expected_capability", [("1", 0.0), (None, 10.0)])
def test_a_job_invalid_on_a_gpu_does_not_fit_there(connections, expected_capability):
    # Tensor parallelism in the job's own environment: before Blackwell (compute capability < 10)
    # Megatron's validate_args stops without CUDA_DEVICE_MAX_CONNECTIONS=1 (config/rules/environment.py
    # device_connections).  The tiny model needs well under 3 GiB (model states of 0.2M
    # parameters, 0.5 GiB CUDA context, two 0.5 GiB NCCL communicators), below every GPU.
    inp, problems = api.input_from_flags(flags(TINY_GPT + " --tensor-model-parallel-size 2"))
    inp = replace(inp, job_environment=True)
    environ = {} if connections is None else {"CUDA_DEVICE_MAX_CONNECTIONS": connections}
    verdict = api.evaluate(inp, world_size=2, environ=environ)
    if connections is None:
        # No GPU named: the rule assumes Hopper (Overheads.compute_capability 9.0) and stops the job
        # there; named as a Blackwell GPU, it is estimated
        assert [p.code for p in verdict.problems] == ["cuda-device-max-connections"]
        assert "assumed: no --gpu named" in verdict.problems[0].message
        verdict = api.evaluate(inp, world_size=2, environ=environ,
                               overheads=Overheads(compute_capability=10.0, gpu_known=True))
    assert verdict.estimate is not None and verdict.estimate.peak_stage.device_peak_bytes < 3 * GiB
    assert verdict.estimate.fits_on == tuple(g.name for g in GPUS if g.compute_capability_value >= expected_capability)


def _cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "megatron_estimator", *args], cwd=cwd, capture_output=True,
                          text=True, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})


def test_text_and_markdown_reports_name_the_gpus(tmp_path):
    out = _cli("estimate", "--world-size", "1", "--", *STATES_BOUND, cwd=tmp_path)
    expected = ", ".join(g.name for g in GPUS if g.total_memory_bytes > CEILING)
    assert out.returncode == 0 and f"  fits on: {expected}\n" in out.stdout
    out = _cli("estimate", "--format", "markdown", "--world-size", "1", "--", *STATES_BOUND, cwd=tmp_path)
    assert f"Fits on: {expected}.\n" in out.stdout


# Two seed configurations with GPT's plain layers stated (LayerNorm, gelu; the seed format's
# defaults are RMSNorm and swiglu), vocabulary 1000 padded to 1024 (a multiple of 128), tied
# output, learned positions, on one GPU:
#   small: 2 layers, h 64, ffn 256:  per layer 4h^2+4h (attention) + 2 h ffn + ffn + h (MLP)
#          + 4h (two norms) = 16,640 + 33,088 + 256 = 49,984; x 2 = 99,968;
#          + 1024 x 64 + 32 x 64 + 2 x 64 = 65,536 + 2,048 + 128  -> 167,680 parameters
#   large: 4 layers, h 128, ffn 512: 66,048 + 131,712 + 512 = 198,272; x 4 = 793,088;
#          + 1024 x 128 + 64 x 128 + 2 x 128 = 131,072 + 8,192 + 256  -> 932,608 parameters
# Both counts are multiples of 128, so no gradient buffer padding; weights, gradients and
# optimizer states are 2 + 4 + 12 = 18 bytes a parameter.
SEED = """\
model:
  num_layers: {layers}
  hidden_size: {hidden}
  num_attention_heads: 4
  ffn_hidden_size: {ffn}
  vocab_size: 1000
  max_position_embeddings: {seq}
  normalization: LayerNorm
  activation_func: gelu
  # Megatron's own model, not the seed format's defaults (rope, untied, no biases):
  position_embedding_type: learned_absolute
  untie_embeddings_and_output_weights: false
  add_bias_linear: true
parallelism:
  tensor_model_parallel_size: 1
  pipeline_model_parallel_size: 1
training:
  micro_batch_size: {micro}
  seq_length: {seq}
  global_batch_size: 8
  use_distributed_optimizer: false
precision:
  params_dtype: bf16
world_size: 1
"""
SMALL, LARGE = 167_680, 932_608


@pytest.fixture
def two_configs(tmp_path):
    (tmp_path / "small.yaml").write_text(SEED.format(layers=2, hidden=64, ffn=256, seq=32, micro=1))
    (tmp_path / "large.yaml").write_text(SEED.format(layers=4, hidden=128, ffn=512, seq=64, micro=2))
    (tmp_path / "broken.yaml").write_text(SEED.format(layers=2, hidden=64, ffn=256, seq=32, micro=1)
                                          .replace("num_attention_heads: 4", "num_attention_heads: 3"))
    return tmp_path


def test_summary_json_rows_are_the_hand_figures(two_configs):
    out = _cli("check", "--summary", "--format", "json", "--budget", "80GiB", "small.yaml", "large.yaml",
               "broken.yaml", cwd=two_configs)
    assert out.returncode == 2                              # the worst verdict: broken.yaml is invalid
    doc = json.loads(out.stdout)
    import jsonschema
    jsonschema.validate(doc, json.loads((REPO / "schemas" / "report.schema.json").read_text()))
    small, large, broken = doc["summary"]["rows"]
    assert [r["source"] for r in (small, large, broken)] == ["small.yaml", "large.yaml", "broken.yaml"]
    for row, params, layers, hidden, micro, seq in ((small, SMALL, 2, 64, 1, 32), (large, LARGE, 4, 128, 2, 64)):
        assert row["total_parameters"] == params
        assert row["model_states_bytes"] == 18 * params
        assert (row["num_layers"], row["hidden_size"], row["micro_batch_size"], row["seq_length"]) == (
            layers, hidden, micro, seq)
        assert row["world_size"] == 1 and row["parallelism"]["tp"] == 1 and row["status"] == "fits"
        assert row["family"] == "gpt" and row["peak_stage"] == 0
    assert broken["status"] == "invalid" and broken["device_peak_bytes"] is None
    # The large model holds more of everything: least small, most large.
    assert (doc["summary"]["least"], doc["summary"]["most"]) == ("small.yaml", "large.yaml")
    # The broken file's problem is still reported, in its own result.
    assert any("num_attention_heads" in p["location"] or "3" in p["message"] for p in doc["results"][2]["problems"])


def test_summary_text_and_markdown_tables(two_configs):
    out = _cli("check", "--summary", "--budget", "80GiB", "small.yaml", "large.yaml", "broken.yaml",
               cwd=two_configs)
    assert out.returncode == 2
    reports, table = out.stdout.split("\nsummary:\n")
    assert "broken.yaml:\n  invalid input" in reports and "small.yaml:\n  world size 1" in reports
    lines = table.splitlines()
    assert lines[0].split() == ["file", "model", "tp/pp/vpp/cp/ep/etp/dp", "GPUs", "micro", "seq", "params",
                                "weights+optim", "activ", "peak", "verdict"]
    small = lines[1].split()
    # 18 x 167,680 B = 3,018,240 B = 0.0028 GiB; 0.2M parameters
    assert small[:10] == ["small.yaml", "gpt", "0.2M", "(2x64)", "1/1/-/1/1/1/1", "1", "1", "32", "0.2M", "0.00"]
    assert small[-1] == "fits"
    assert lines[2].split()[:4] == ["large.yaml", "gpt", "0.9M", "(4x128)"] and lines[2].split()[8] == "0.9M"
    assert lines[3].split() == ["broken.yaml", "gpt"] + ["-"] * 8 + ["invalid"]     # the family it was read as
    assert lines[-1].startswith("  least memory: small.yaml (") and "most memory: large.yaml (" in lines[-1]
    out = _cli("check", "--summary", "--format", "markdown", "--budget", "80GiB", "small.yaml", "large.yaml",
               cwd=two_configs)
    assert out.returncode == 0
    assert "### Summary\n\n| file | model | tp/pp/vpp/cp/ep/etp/dp |" in out.stdout
    assert "| small.yaml | gpt 0.2M (2x64) | 1/1/-/1/1/1/1 | 1 | 1 | 32 | 0.2M |" in out.stdout
    assert "Least memory: small.yaml (" in out.stdout
