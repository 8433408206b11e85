"""Named presets: each model's parameter count through the estimator equals its published size
(and the megatron-core count pinned in tests/test_hf.py), and the --model / --hf-config CLI."""

import json
import subprocess
import sys

import pytest

from conftest import REPO
from test_hf import PRESET_PARAMETERS

PUBLISHED = {
    "llama3-8b": 8_030_261_248,
    "llama3-70b": 70_553_706_496,
    "mixtral-8x7b": 46_702_792_704,
    "deepseek-v2-lite": 15_706_484_224,
    "mistral-7b": 7_241_732_096,
    "qwen3-8b": 8_190_735_360,
    "gpt2": 124_439_808,
}


def _estimate(name, extra, release="0.16.1"):
    """The estimate at ``release``: 0.16.1 by default, the megatron-core that counted
    PRESET_PARAMETERS (its counts equal the published sizes)."""
    from megatron_estimator.api import evaluate, input_from_model
    flags = ["--seq-length", "1024", "--micro-batch-size", "1", "--bf16", *extra]
    inp, problems = input_from_model(flags, model=name, environ={}, release=release)
    verdict = evaluate(inp, world_size=1, environ={}, problems=problems)
    assert verdict.estimate is not None, verdict.problems
    return verdict.estimate


@pytest.mark.parametrize("name", sorted(PRESET_PARAMETERS))
def test_preset_parameters_equal_megatron_core(name):
    unpadded, padded = PRESET_PARAMETERS[name]
    assert _estimate(name, ["--make-vocab-size-divisible-by", "1"]).total_parameters == unpadded
    assert _estimate(name, []).total_parameters == padded


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_preset_published_sizes(name):
    assert _estimate(name, ["--make-vocab-size-divisible-by", "1"]).total_parameters == PUBLISHED[name]


@pytest.mark.parametrize("release, extra", [("0.18.0", 0), ("0.19.0", 27 * 2048), ("main", 27 * 2048)])
def test_deepseek_v2_lite_gains_a_q_norm_in_linear_q_proj_from_0_19(release, extra):
    # DeepSeek-V2-Lite has no --q-lora-rank and sets --qk-layernorm: from 4464d1c197 (0.19.0)
    # mla_qk_norm_config.py makes each of the 27 layers' linear_q_proj a fused RMSNorm + linear,
    # one weight of the hidden size (2048) more per layer than the published model (and 0.18).
    total = _estimate("deepseek-v2-lite", ["--make-vocab-size-divisible-by", "1"], release).total_parameters
    assert total == PUBLISHED["deepseek-v2-lite"] + extra


def cli(*args):
    return subprocess.run([sys.executable, "-m", "megatron_estimator", *args], capture_output=True, text=True,
                          cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=120)


def test_model_flag_with_overrides():
    result = cli("estimate", "--model", "llama3-8b", "--world-size", "8", "--format", "json", "--",
                 "--tensor-model-parallel-size", "2", "--seq-length", "4096", "--micro-batch-size", "1", "--bf16",
                 "--hidden-dropout", "0.1")
    doc = json.loads(result.stdout)
    assert result.returncode == 0, result.stdout
    assert doc["parallelism"]["tp"] == 2
    notes = [a["text"] for a in doc["assumptions"]]
    assert any(n.startswith("--model llama3-8b supplies: --num-layers 32 --hidden-size 4096") for n in notes)
    assert "the command line overrides --hidden-dropout" in notes


def test_hf_config_flag():
    result = cli("estimate", "--hf-config", str(REPO / "tests" / "fixtures" / "hf" / "llama3.2-1b.json"),
                 "--format", "json", "--", "--seq-length", "2048", "--micro-batch-size", "1", "--bf16",
                 "--make-vocab-size-divisible-by", "1")
    doc = json.loads(result.stdout)
    assert result.returncode == 0, result.stdout
    assert doc["total_parameters"] == 1_235_814_400


def test_unknown_preset_is_exit_2_with_suggestion():
    result = cli("estimate", "--model", "llama3-8", "--", "--seq-length", "1024", "--micro-batch-size", "1")
    assert result.returncode == 2
    assert "unknown-preset" in result.stdout and "llama3-8b" in result.stdout
