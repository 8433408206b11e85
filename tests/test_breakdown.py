"""The per-module breakdown of a stage (model/breakdown.py, ``--verbose``, the JSON's
``modules``): each module's parameters itemised by hand on small shapes, its bytes from the
precision and the optimizer, megatron-core's own parameter counts per module, and the rows
adding up to the stage totals the report prints."""

from __future__ import annotations

import json

import pytest

from conftest import estimate
from test_record_blocks import GPT_CASES

# A small GPT: 2 layers, hidden 64, 4 heads (kv_channels 16), ffn 256, vocab 1000, untied,
# rope, no bias, RMSNorm, SwiGLU.
SMALL = ("--num-layers 2 --hidden-size 64 --num-attention-heads 4 --ffn-hidden-size 256 --vocab-size 1000 "
         "--untie-embeddings-and-output-weights --position-embedding-type rope --disable-bias-linear "
         "--normalization RMSNorm --swiglu --seq-length 128 --max-position-embeddings 128 --micro-batch-size 1 "
         "--global-batch-size 8 --bf16 --use-distributed-optimizer")


def rows(stage) -> dict:
    return {(m.chunk, m.module, m.kind): m for m in stage.modules}


def test_small_gpt_tp2_pp2_by_hand():
    # tp 2, pp 2, dp 1 (world 4).  Vocabulary padded to a multiple of 128 x tp = 256: 1024.
    #   embedding / output layer: 1024 / 2 x 64                         = 32,768
    #   layer: linear_qkv (4 + 2 x 4) x 16 / 2 = 96 out x 64 in        =  6,144
    #          linear_proj 4 x 16 / 2 = 32 in x 64 out                  =  2,048
    #          linear_fc1 (SwiGLU: 2 x 256) / 2 = 256 out x 64 in       = 16,384
    #          linear_fc2 256 / 2 = 128 in x 64 out                     =  8,192
    #          input_layernorm + pre_mlp_layernorm (RMSNorm: weight)    =    128
    #                                                                    = 32,896
    #   final norm                                                       =     64
    e = estimate(SMALL, world_size=4, extra="--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2")
    first, last = e.stages
    r0, r1 = rows(first), rows(last)
    assert [(m.module, m.kind, m.count, m.parameters) for m in first.modules] == [
        ("embedding", None, 1, 32_768), ("layers", "dense", 1, 32_896)]
    assert r1[0, "layers", "dense"].parameters == 32_896
    assert r1[0, "final_norm", None].parameters == 64
    assert r1[0, "output_layer", None].parameters == 32_768
    # bf16 weights (2 B), fp32 main grads (4 B), fp32 master + Adam's two fp32 moments (12 B)
    # sharded over dp = 1.
    for m in (r0[0, "embedding", None], r0[0, "layers", "dense"], r1[0, "final_norm", None]):
        assert (m.weights, m.gradients, m.optimizer_states) == (2 * m.parameters, 4 * m.parameters,
                                                                12 * m.parameters)
    # The distributed optimizer's buffer ends on a multiple of lcm(dp, 128) = 128 elements:
    # stage 0 holds 65,664 = 513 x 128 (no padding); stage 1 65,728, padded to 65,792: 64
    # elements, 128 B of bf16 weights and 256 B of fp32 gradients.
    assert "padding" not in {m.module for m in first.modules}
    pad = r1[None, "padding", None]
    assert (pad.parameters, pad.weights, pad.gradients, pad.optimizer_states) == (0, 128, 256, 0)
    # 1F1B on 2 stages: stage 0 keeps 2 microbatches, stage 1 one; a layer keeps the same
    # bytes per microbatch on both.
    assert first.microbatches_in_flight == (2,) and last.microbatches_in_flight == (1,)
    assert r0[0, "layers", "dense"].activations == 2 * r1[0, "layers", "dense"].activations > 0
    assert_sums(e)


def test_moe_layer_with_expert_parallelism_by_hand():
    # ep 2, tp 1, dp 2 (world 2): expert data parallel 1.  Layer 0 dense, layer 1 MoE with 4
    # experts of ffn 128, 2 local.
    #   attention: linear_qkv 12 x 16 = 192 x 64 = 12,288, linear_proj 64 x 64 = 4,096,
    #              two RMSNorm weights 128                                    -> 16,512
    #   dense MLP: fc1 512 x 64 = 32,768, fc2 256 x 64 = 16,384               -> 65,664
    #   MoE: router 4 x 64 = 256; 2 local experts x (fc1 256 x 64 = 16,384 + fc2 128 x 64 = 8,192)
    #        = 49,152 expert parameters                                        -> 65,920
    e = estimate(SMALL, world_size=2, extra="--num-experts 4 --moe-ffn-hidden-size 128 --expert-model-parallel-size 2 "
                                            "--moe-layer-freq [0,1]")
    (stage,) = e.stages
    r = rows(stage)
    dense, moe = r[0, "layers", "dense"], r[0, "layers", "moe"]
    assert (dense.count, dense.parameters) == (1, 65_664)
    assert (moe.count, moe.parameters) == (1, 65_920)
    # Master + moments (12 B) over dp x cp = 2 for the 16,768 dense parameters of the MoE
    # layer, over edp = 1 for its 49,152 expert parameters.
    assert moe.optimizer_states == 16_768 * 12 // 2 + 49_152 * 12
    assert dense.optimizer_states == 65_664 * 12 // 2
    assert r[0, "embedding", None].parameters == r[0, "output_layer", None].parameters == 1024 * 64
    assert_sums(e)


def test_mtp_layer_by_hand():
    # tp 1: one MTP depth holds enorm + hnorm (2 x 64), eh_proj 2h -> h (128 x 64 = 8,192), a
    # transformer layer like the last decoder layer (16,512 + 49,152 = 65,664) and its final
    # norm (64): 74,048.
    e = estimate(SMALL, extra="--mtp-num-layers 1")
    (stage,) = e.stages
    mtp = rows(stage)[0, "mtp", None]
    assert (mtp.count, mtp.parameters) == (1, 74_048)
    assert_sums(e)


def assert_sums(e) -> None:
    """The modules of each stage add up to its parameters, weights, gradients, optimizer states
    and activations."""
    for s in e.stages:
        assert s.modules
        b = s.bytes
        assert sum(m.parameters for m in s.modules) == s.parameters
        for field in ("weights", "gradients", "optimizer_states", "activations"):
            assert sum(getattr(m, field) for m in s.modules) == getattr(b, field), (s.pipeline_rank, field)
        layers = sum(m.count for m in s.modules if m.module == "layers")
        assert layers == s.layers


SUM_CASES = GPT_CASES + [
    (SMALL, 4, "--pipeline-model-parallel-size 2 --num-layers 8 --num-layers-per-virtual-pipeline-stage 2 "
               "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1"),
    (SMALL, 2, "--pipeline-model-parallel-size 2 --num-layers 4 --recompute-granularity full "
               "--recompute-method block --recompute-num-layers 1 --defer-embedding-wgrad-compute"),
    (SMALL, 1, "--num-layers 4 --cpu-offloading-num-layers 1"),
    (SMALL.replace(" --untie-embeddings-and-output-weights", ""), 2, "--pipeline-model-parallel-size 2"),
]


@pytest.mark.parametrize("text, world, extra", SUM_CASES)
def test_modules_add_up_to_the_stage_totals(text, world, extra):
    e = estimate(text, world_size=world, extra=extra)
    assert_sums(e)
    if "distributed-optimizer" not in text + extra and "fsdp" not in extra and "muon" not in extra:
        assert all(m.module != "padding" for s in e.stages for m in s.modules)


def test_hybrid_layer_kinds_by_hand():
    # tests/test_hybrid.py itemises each hybrid layer of its toy by hand (mamba_params,
    # attention_params, mlp_params); a stage's M layers are one module of count 2.
    from test_hybrid import MOE, attention_params, hybrid_estimate, mamba_params, mlp_params

    (stage,) = hybrid_estimate("M*M-")[1].stages
    assert [(m.kind, m.count, m.parameters) for m in stage.modules if m.module == "layers"] == [
        ("M", 2, 2 * mamba_params(1)), ("*", 1, attention_params(1)), ("-", 1, mlp_params(1))]
    # Two pipeline stages (the pattern's '|'), MTP depths of their own pattern on the last.
    _, e = hybrid_estimate("M*-E|M-M-/M-/M-", MOE + "--pipeline-model-parallel-size 2 --position-embedding-type rope", 2)
    assert [(m.kind, m.count) for m in e.stages[1].modules if m.module == "layers"] == [("M", 2), ("-", 2)]
    assert rows(e.stages[1])[0, "mtp", None].count == 2
    assert_sums(e)


@pytest.mark.parametrize("fmt", ["text", "markdown", "json"])
def test_cli_verbose(fmt, capsys):
    import shlex

    from megatron_estimator.cli import main

    argv = ["estimate", "--world-size", "4", "--format", fmt, "--verbose", "--"] + shlex.split(
        SMALL + " --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2")
    assert main(argv) == 0
    out = capsys.readouterr().out
    if fmt == "json":
        stages = json.loads(out)["stages"]
        assert [m["module"] for m in stages[1]["modules"]] == ["layers", "final_norm", "output_layer", "padding"]
        assert stages[0]["modules"][1] == {"chunk": 0, "module": "layers", "kind": "dense", "count": 1,
                                           "parameters": 32_896, "weights": 65_792, "gradients": 131_584,
                                           "optimizer_states": 394_752,
                                           "activations": stages[0]["modules"][1]["activations"]}
        return
    assert "decoder layer" in out and "output layer, loss" in out and "buffer padding" in out
    assert "32,896" in out and "65,728" in out        # a layer's parameters, stage 1's total


def test_cli_without_verbose_prints_no_modules(capsys):
    import shlex

    from megatron_estimator.cli import main

    assert main(["estimate", "--world-size", "4", "--"] + shlex.split(SMALL)) == 0
    assert "modules per stage" not in capsys.readouterr().out

