"""The Python API: megatron_estimator.estimate(config, world_size=None, budget=None)."""

import dataclasses

import pytest

import megatron_estimator as me
from conftest import LLAMA3_8B, REPO, TINY_GPT, flags


def test_flags_in_frozen_results_out():
    result = me.estimate(flags(LLAMA3_8B, "--tensor-model-parallel-size 2 --use-distributed-optimizer"),
                         world_size=8, budget="80GiB")
    assert result.fits is True
    assert result.world_size == 8 and result.parallelism["dp"] == 4
    assert result.total_parameters == 8_030_261_248
    assert result.peak_stage is result.stages[0]
    assert result.stages[0].allocated_peak_bytes == sum(dataclasses.astuple(result.stages[0].bytes))
    assert any(a.key == "cuda_context" for a in result.assumptions)
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.stages[0].parameters = 0


def test_mapping_of_dests_and_flags():
    by_flags = me.estimate(flags(TINY_GPT, "--tensor-model-parallel-size 2"), world_size=2)
    by_mapping = me.estimate({"num_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32,
                              "max_position_embeddings": 32, "micro_batch_size": 2, "vocab_size": 1000,
                              "bf16": True, "--tensor-model-parallel-size": 2}, world_size=2)
    assert by_mapping.stages == by_flags.stages


def test_a_path_reads_the_file_and_its_world_size():
    result = me.estimate(str(REPO / "examples" / "llama3-8b.yaml"), budget=80 * 2**30)
    assert result.world_size == 8 and result.fits is True


def test_budget_decides_fits():
    small = me.estimate(flags(TINY_GPT), budget=1)
    assert small.fits is False and small.status == "over_budget"
    assert me.estimate(flags(TINY_GPT)).fits is None


def test_invalid_input_raises_every_problem():
    with pytest.raises(me.InvalidInput) as err:
        me.estimate(flags(TINY_GPT, "--num-layer 3 --tensor-model-parallel-size 3"), world_size=4)
    codes = [p.code for p in err.value.problems]
    assert codes[0] == "unknown-flag"
    assert "world-size-not-divisible" in codes and "heads-not-divisible-by-tp" in codes
    with pytest.raises(me.InvalidInput):
        me.estimate(flags(TINY_GPT), budget="eighty")


def test_import_is_cheap():
    import subprocess
    import sys

    code = "import sys, megatron_estimator; print(sorted(m for m in sys.modules if m.startswith('megatron_estimator')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                         env={"PYTHONPATH": str(REPO)}).stdout
    assert out.strip() == "['megatron_estimator']"


def test_bad_arguments_are_reported_with_the_configurations_problems():
    import megatron_estimator as me

    bad_flags = ("--num-layers 30 --hidden-size 4096 --num-attention-heads 32 --tensor-model-parallel-size 4 "
                 "--pipeline-model-parallel-size 4 --seq-length 4096 --max-position-embeddings 2048 "
                 "--micro-batch-size 1 --bf16").split()
    with pytest.raises(me.InvalidInput) as raised:
        me.estimate(bad_flags, world_size=12, budget="eighty")
    assert [(p.code, p.location) for p in raised.value.problems] == [
        ("invalid-budget", "budget"), ("world-size-not-divisible", "--tensor-model-parallel-size"),
        ("seq-length-exceeds-positions", "--seq-length"), ("layers-not-divisible-by-pp", "--num-layers")]
    for world_size, budget, message in (("8", None, "world_size must be a positive integer, not '8'"),
                                        (True, None, "world_size must be a positive integer, not True"),
                                        (0, None, "world_size must be a positive integer, not 0"),
                                        (None, 0, "budget 0 bytes must be positive"),
                                        (None, "0GiB", "budget '0GiB' must be more than 0 bytes")):
        with pytest.raises(me.InvalidInput) as raised:
            me.estimate(bad_flags, world_size=world_size, budget=budget)
        assert raised.value.problems[0].message == message


def test_the_parallelism_of_a_result_is_read_only():
    import megatron_estimator as me

    result = me.estimate(str(REPO / "examples" / "llama3-8b.yaml"))
    assert dict(result.parallelism) == {"tp": 2, "pp": 1, "vpp": None, "cp": 1, "dp": 4, "ep": 1, "etp": 2, "edp": 4}
    with pytest.raises(TypeError):
        result.parallelism["tp"] = 9
