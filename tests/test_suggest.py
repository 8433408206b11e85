"""Suggestions on refusal (planner/suggest.py, api.evaluate(suggest=True), the renderers, the CLI
and the pytest fixture): the nearest changes that make every stage of a refused launch fit.

The reference for every figure is the normal path (``api.estimate`` on the changed flags),
and the premises (what the original cannot do, what the change saves) are derived by hand from
the model's shapes."""

from __future__ import annotations

import json
import subprocess
import sys

import jsonschema
import pytest

from conftest import REPO, TINY_GPT, flags
from megatron_estimator import api
from megatron_estimator.report.text import render_json, render_markdown, render_text

CLI = [sys.executable, "-m", "megatron_estimator"]
MiB = 1 << 20

# One layer, one attention head (so tensor parallelism cannot divide it), 8 tokens: the model
# states dwarf the activations.  P by hand: word embedding 1024 x 256, learned positions 8 x 256,
# the layer 12 h^2 + 13 h (QKV, projection, 4h MLP, biases, two LayerNorms), final LayerNorm 2h.
STATES_BOUND = ("--num-layers 1 --hidden-size 256 --num-attention-heads 1 --seq-length 8 "
                "--max-position-embeddings 8 --micro-batch-size 1 --global-batch-size 4 --vocab-size 1024 --bf16")
H = 256
P = 1024 * H + 8 * H + 12 * H * H + 13 * H + 2 * H
WORLD = 4

# Four layers, one head, 2048 tokens, one GPU: only recompute can change the peak.
ACTIVATIONS_BOUND = ("--num-layers 4 --hidden-size 64 --num-attention-heads 1 --seq-length 2048 "
                     "--max-position-embeddings 2048 --micro-batch-size 1 --vocab-size 1024 --bf16")
FULL_BLOCK = "--recompute-granularity full --recompute-method block --recompute-num-layers {n}"


def _refusal(text: str, world: int, budget: int):
    inp, problems = api.input_from_flags(flags(text), environ={})
    assert not problems
    return api.evaluate(inp, world_size=world, world_size_source="test", budget=budget, environ={}, suggest=True)


def _applied(text: str, suggestion) -> list[str]:
    """The input's flags with a suggestion applied: Megatron's argparse keeps the last value."""
    assert not suggestion.remove_flags
    return flags(text) + list(suggestion.flags)


def _states_budget() -> tuple[int, api.Estimate, api.Estimate]:
    plain = api.estimate(flags(STATES_BOUND), world_size=WORLD)
    sharded = api.estimate(flags(STATES_BOUND, "--use-distributed-optimizer"), world_size=WORLD)
    return (plain.peak_stage.device_peak_bytes + sharded.peak_stage.device_peak_bytes) // 2, plain, sharded


def test_distributed_optimizer_is_the_one_change_when_states_do_not_fit():
    budget, plain, sharded = _states_budget()
    assert plain.total_parameters == P
    stage = plain.peak_stage
    # Mixed precision without the distributed optimizer: bf16 weights 2P, fp32 main grads 4P,
    # Adam's fp32 master copy and two moments 12P (megatron/core/optimizer).
    assert (stage.bytes.weights, stage.bytes.gradients, stage.bytes.optimizer_states) == (2 * P, 4 * P, 12 * P)
    # Even with no activations at all the original is over: no recompute, micro batch or
    # context-parallel change can fit; tensor and pipeline parallelism cannot divide 1 head, 1 layer.
    assert stage.device_peak_bytes - stage.bytes.activations > budget
    verdict = _refusal(STATES_BOUND, WORLD, budget)
    assert verdict.estimate.fits is False
    found = verdict.suggestions
    assert found.note is None
    assert [s.changes for s in found.suggestions] == [("distributed optimizer",)]
    only = found.suggestions[0]
    assert only.flags == ("--use-distributed-optimizer",)
    # The optimizer states sharded over dp = 4: 12P / 4.
    assert only.estimate.peak_stage.bytes.optimizer_states == 12 * P // WORLD
    again = api.estimate(_applied(STATES_BOUND, only), world_size=WORLD, budget=budget)
    assert again.fits is True
    assert (only.device_peak_bytes, only.peak_stage) == (sharded.peak_stage.device_peak_bytes, 0)
    assert only.device_peak_bytes == again.peak_stage.device_peak_bytes
    assert only.headroom_bytes == budget - only.device_peak_bytes > 0
    assert only.cost.recompute == 0 and only.cost.bubble == 0    # no pipeline, nothing recomputed


def test_full_recompute_with_the_fewest_layers_that_suffice():
    peaks = {n: api.estimate(flags(ACTIVATIONS_BOUND, FULL_BLOCK.format(n=n)), world_size=1).peak_stage.device_peak_bytes
             for n in (1, 2, 3)}
    selective = api.estimate(flags(ACTIVATIONS_BOUND, "--recompute-granularity selective"),
                             world_size=1).peak_stage.device_peak_bytes
    budget = peaks[2]                     # two recomputed layers fit exactly; one does not
    assert peaks[1] > budget and selective > budget and peaks[3] < budget
    verdict = _refusal(ACTIVATIONS_BOUND, 1, budget)
    assert verdict.estimate.fits is False
    [only] = verdict.suggestions.suggestions
    assert only.changes == ("recompute",)
    assert only.flags == tuple(flags(FULL_BLOCK.format(n=2)))
    assert only.device_peak_bytes == peaks[2] and only.headroom_bytes == 0
    assert only.cost.recompute > 0


# s x h = 4096 x 256 = 1,048,576 elements: each [s, b, h] tensor reaches Megatron's default
# --min-offloaded-tensor-size (1024 x 1024), so fine-grained offloading moves it to the host.
# (ACTIVATIONS_BOUND's 2048 x 64 tensors stay: offloading cannot help there.)
OFFLOADABLE = ("--num-layers 2 --hidden-size 256 --num-attention-heads 1 --seq-length 4096 "
               "--max-position-embeddings 4096 --micro-batch-size 1 --vocab-size 1024 --bf16")
OFFLOAD = "--fine-grained-activation-offloading --offload-modules attn_norm qkv_linear core_attn attn_proj mlp_norm"
FULL_UNIFORM = "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1"


def test_activation_offloading_is_a_change_and_fewer_flags_come_first():
    def peak(extra: str) -> int:
        return api.estimate(flags(OFFLOADABLE, extra), world_size=1).peak_stage.device_peak_bytes

    budget = peak(OFFLOAD)
    assert peak("") > budget and peak(FULL_BLOCK.format(n=1)) > budget and peak(FULL_UNIFORM) < budget
    shown = _refusal(OFFLOADABLE, 1, budget).suggestions.suggestions
    # Both change one group; offloading takes two flags, full recompute three.
    assert [(s.changes, s.flags) for s in shown] == [
        (("activation offloading",), tuple(flags(OFFLOAD))), (("recompute",), tuple(flags(FULL_UNIFORM)))]
    assert [s.device_peak_bytes for s in shown] == [budget, peak(FULL_UNIFORM)]
    assert shown[0].cost.recompute == 0 < shown[1].cost.recompute


def test_suggestions_are_nearest_first_and_each_fits_on_the_normal_path():
    budget = api.estimate(flags(TINY_GPT), world_size=4).peak_stage.device_peak_bytes - MiB
    verdict = _refusal(TINY_GPT, 4, budget)
    assert verdict.estimate.fits is False
    shown = verdict.suggestions.suggestions
    assert 1 <= len(shown) <= 3
    # Nearest first: fewer changed groups, fewer flags (--global-batch-size only keeps the global
    # batch), lower proxy step.
    keys = [(len(s.changes), sum(t.startswith("--") and t != "--global-batch-size" for t in s.flags)
             + len(s.remove_flags), s.cost.step) for s in shown]
    assert keys == sorted(keys)
    for s in shown:
        again = api.estimate(flags(TINY_GPT) + list(s.flags), world_size=4, budget=budget) if not s.remove_flags \
            else s.estimate
        assert again.fits is True
        peak = again.peak_stage
        assert (peak.device_peak_bytes, peak.pipeline_rank, peak.headroom_bytes) == (
            s.device_peak_bytes, s.peak_stage, s.headroom_bytes)
    # No suggestion repeats the changes of a nearer one and more.
    for i, s in enumerate(shown):
        assert not any(set(t.changes) < set(s.changes) for t in shown[:i])


def test_nothing_fits_says_so():
    # Below the CUDA context and NCCL buffers every layout is over.
    verdict = _refusal(TINY_GPT, 4, 256 * MiB)
    found = verdict.suggestions
    assert found.suggestions == () and found.note.startswith("no change within reach fits")
    text = render_text([verdict])
    assert [line for line in text.splitlines() if "suggestions" in line] == [f"  suggestions: {found.note}"]
    doc = json.loads(render_json([verdict]))
    assert doc["suggestions"] == [] and doc["suggestions_note"] == found.note
    assert f"Suggestions: {found.note}" in render_markdown([verdict])


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + list(args), capture_output=True, text=True, cwd=REPO)


def test_cli_json_suggestions(tmp_path):
    budget, _, sharded = _states_budget()
    done = _cli("estimate", "--world-size", str(WORLD), "--budget", f"{budget}B", "--format", "json", "--",
                *flags(STATES_BOUND))
    assert done.returncode == 1, done.stderr
    doc = json.loads(done.stdout)
    jsonschema.validate(doc, json.loads((REPO / "schemas" / "report.schema.json").read_text()))
    [one] = doc["suggestions"]
    assert set(one) == {"flags", "remove_flags", "changes", "peak_stage", "device_peak_bytes",
                        "allocated_peak_bytes", "headroom_bytes", "cost"}
    assert one["flags"] == ["--use-distributed-optimizer"] and one["peak_stage"] == 0
    assert one["device_peak_bytes"] == sharded.peak_stage.device_peak_bytes
    assert one["headroom_bytes"] == budget - one["device_peak_bytes"]
    assert {"step", "bubble", "recompute", "tp_comm", "cp_comm", "ep_comm", "dp_comm"} <= set(one["cost"])
    text = _cli("estimate", "--world-size", str(WORLD), "--budget", f"{budget}B", "--", *flags(STATES_BOUND))
    assert text.returncode == 1
    lines = text.stdout.splitlines()
    at = lines.index("  suggestions (nearest first; each re-estimated, every stage fits):")
    assert lines[at + 1] == "  1. --use-distributed-optimizer"
    assert lines[at + 2].startswith("     changes distributed optimizer: peak ")


def test_check_and_run_list_suggestions(tmp_path):
    budget, _, _ = _states_budget()
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/bash\ntorchrun --nproc-per-node 4 pretrain_gpt.py " + STATES_BOUND + "\n")
    done = _cli("check", "--budget", f"{budget}B", str(script))
    assert done.returncode == 1
    assert "  1. --use-distributed-optimizer" in done.stdout.splitlines()
    run = _cli("run", "--budget", f"{budget}B", "--", "torchrun", "--nproc-per-node", "4", "pretrain_gpt.py",
               *flags(STATES_BOUND))
    assert run.returncode == 1
    assert "  1. --use-distributed-optimizer" in run.stderr.splitlines()


def test_a_fitting_launch_pays_nothing():
    # A fitting launch has no suggestions key, and the planner is never imported.
    code = ("import sys, json, shlex\n"
            "from megatron_estimator import api\n"
            "from megatron_estimator.report.text import render_json\n"
            f"inp, _ = api.input_from_flags(shlex.split({TINY_GPT!r}), environ={{}})\n"
            "v = api.evaluate(inp, world_size=4, budget=80 * 2**30, environ={}, suggest=True)\n"
            "assert v.estimate.fits and v.suggestions is None\n"
            "assert 'suggestions' not in json.loads(render_json([v]))\n"
            "print(sorted(m for m in sys.modules if m.startswith('megatron_estimator.planner')))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


pytest_plugins = ["pytester"]


def test_the_fixture_failure_lists_suggestions(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    budget, _, _ = _states_budget()
    pytester.makepyfile(f"""
        def test_over(megatron_memory):
            megatron_memory.assert_fits({flags(STATES_BOUND)!r}, world_size={WORLD}, budget={budget})
    """)
    result = pytester.runpytest_subprocess("-p", "megatron_estimator.pytest_plugin")
    result.assert_outcomes(failed=1)
    text = "\n".join(result.stdout.lines)
    assert "AssertionError: OVER BUDGET" in text
    assert "suggestions (nearest first; each re-estimated, every stage fits):" in text
    assert "1. --use-distributed-optimizer" in text


# tp 4 with --expert-tensor-parallel-size 2 (outside the planner's etp choices 1 and tp): some
# neighbouring families have no expert choice left within two parallel changes.
MOE_ETP2 = ("--num-layers 4 --hidden-size 128 --num-attention-heads 8 --num-experts 4 --moe-router-topk 1 --moe-router-pre-softmax "
            "--tensor-model-parallel-size 4 --pipeline-model-parallel-size 2 --expert-model-parallel-size 2 "
            "--expert-tensor-parallel-size 2 --sequence-parallel --seq-length 256 --max-position-embeddings 256 "
            "--micro-batch-size 4 --global-batch-size 32 --vocab-size 1000 --bf16 --disable-bias-linear")


@pytest.mark.parametrize("text, world, below", [(TINY_GPT, 4, MiB), (MOE_ETP2, 8, 8 * MiB)], ids=["gpt", "moe-etp2"])
def test_each_suggestion_applied_to_the_command_line_fits(text, world, below):
    from megatron_estimator.planner.candidates import candidate_argv

    env = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    budget = api.estimate(flags(text), world_size=world, environ=env).peak_stage.device_peak_bytes - below
    inp, _ = api.input_from_flags(flags(text), environ=env)
    verdict = api.evaluate(inp, world_size=world, budget=budget, environ=env, suggest=True)
    assert verdict.estimate.fits is False and verdict.suggestions.suggestions
    for s in verdict.suggestions.suggestions:
        # The user's edit: the flags it changes or removes taken out, the suggested ones appended.
        again = api.estimate(candidate_argv(flags(text), s, "main"), world_size=world, budget=budget, environ=env)
        assert again.fits is True
        assert again.peak_stage.device_peak_bytes == s.device_peak_bytes
