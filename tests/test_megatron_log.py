"""Megatron training logs: the reader (inputs/megatron_log.py) and ``compare``.

The logs are written here from the formats of their printers:
- megatron/training/arguments.py ``_print_args``: the header, ``'  {} {} {}'.format(arg,
  '.' * (48 - len(arg)), getattr(args, arg))`` sorted by ``x.lower()``, the end line;
- megatron/training/utils.py ``report_memory``: ``'[Rank {}] {}'`` of ``name + ' memory (MB)'``
  and ``' | allocated: {:.2f}'`` ... figures divided by 1024 * 1024;
- c10/cuda/CUDACachingAllocator.cpp's out-of-memory message with c10 ``format_size``.
"""

from __future__ import annotations

import json
import signal

import pytest

from megatron_estimator import api
from megatron_estimator.cli import main
from megatron_estimator.inputs.detect import detect_format
from megatron_estimator.inputs.megatron_log import parse_megatron_log
from megatron_estimator.results.comparison import pipeline_rank_of

MiB = 1024 * 1024
GiB = 1024 * MiB

# The namespace Megatron holds for a small run after validate_args: the flags given, values it
# derived (ffn_hidden_size = 4 h, kv_channels = h / heads), and attributes that are no flag.
NAMESPACE = {
    "num_layers": 4, "hidden_size": 256, "num_attention_heads": 8, "ffn_hidden_size": 1024,
    "kv_channels": 32, "seq_length": 512, "max_position_embeddings": 512, "micro_batch_size": 2,
    "global_batch_size": 16, "tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2,
    "bf16": True, "fp16": False, "train_iters": 10, "lr": 0.0001, "min_lr": 0.0, "tokenizer_type": "NullTokenizer",
    "vocab_size": 1000, "use_distributed_optimizer": True, "mock_data": True, "load": None,
    "exp_avg_dtype": "torch.float32", "attention_backend": "AttnBackend.auto",
    "exit_signal": str(signal.SIGTERM), "moe_aux_loss_coeff": [0.0],
    "world_size": 8, "data_parallel_size": 2, "rank": 0, "params_dtype": "torch.bfloat16",
    "consumed_train_samples": 0, "virtual_pipeline_model_parallel_size": None,
}
FLAGS = ["--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "8", "--seq-length", "512",
         "--max-position-embeddings", "512", "--micro-batch-size", "2", "--global-batch-size", "16",
         "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2", "--bf16",
         "--train-iters", "10", "--lr", "1e-4", "--tokenizer-type", "NullTokenizer", "--vocab-size", "1000",
         "--use-distributed-optimizer", "--mock-data"]


def arguments_block(namespace=NAMESPACE) -> list[str]:
    """The lines _print_args writes (a 48-character name would get no dots)."""
    body = ["  {} {} {}".format(arg, "." * (48 - len(arg)), value) for arg, value in namespace.items()]
    return (["------------------------ arguments ------------------------"]
            + sorted(body, key=lambda x: x.lower())
            + ["-------------------- end of arguments ---------------------"])


def memory_line(rank: int, iteration: int, allocated: int, max_allocated: int, reserved: int,
                max_reserved: int, device_used: int | None = None) -> str:
    mega = 1024.0 * 1024.0
    string = f"(after {iteration} iterations)" + " memory (MB)"
    string += f" | allocated: {allocated / mega:.2f}"
    string += f" | max allocated: {max_allocated / mega:.2f}"
    string += f" | reserved: {reserved / mega:.2f}"
    string += f" | max reserved: {max_reserved / mega:.2f}"
    if device_used is not None:
        string += f" | total device memory used: {device_used / mega:.2f}"
    return "[Rank {}] {}".format(rank, string)


def format_size(size: int) -> str:
    if size <= 1024:
        return f"{size} bytes"
    if size <= 1048576:
        return f"{size / 1024.0:.2f} KiB"
    if size <= 1073741824:
        return f"{size / 1048576.0:.2f} MiB"
    return f"{size / 1073741824.0:.2f} GiB"


def oom_line(device: int, requested: int, total: int, free: int, in_use: int, allocated: int, reserved: int) -> str:
    return ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate " + format_size(requested)
            + f". GPU {device} has a total capacity of " + format_size(total) + " of which " + format_size(free)
            + " is free. Including non-PyTorch memory, this process has " + format_size(in_use)
            + " memory in use. Of the allocated memory " + format_size(allocated) + " is allocated by PyTorch, and "
            + format_size(reserved - allocated) + " is reserved by PyTorch but unallocated. If reserved but "
            "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
            "fragmentation.  See documentation for Memory Management  "
            "(https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)")


def write(tmp_path, lines, name="train.log", newline=True):
    path = tmp_path / name
    path.write_text("\n".join(lines) + ("\n" if newline else ""))
    return path


def flag_estimate():
    return api.estimate(FLAGS, world_size=8)


# -- the reader ----------------------------------------------------------------------------

def test_single_rank_log_rebuilds_the_configuration(tmp_path):
    lines = ["using world size: 8, data-parallel size: 2"] + arguments_block() + [
        memory_line(0, 1, 120 * MiB, 180 * MiB, 200 * MiB, 210 * MiB)]
    path = write(tmp_path, lines)
    assert detect_format(path) == "megatron-log"
    log = parse_megatron_log(path.read_text(), "train.log")
    assert log.problems == ()
    assert log.world_size == 8
    header = 2   # line 1 is the world-size line
    sorted_names = sorted(NAMESPACE, key=lambda n: ("  " + n).lower())
    assert log.world_size_location == f"train.log:{header + 1 + sorted_names.index('world_size')} world_size"
    raw = log.raw
    assert raw.value("num_layers") == 4 and raw.value("lr") == 0.0001
    assert raw.value("exp_avg_dtype") is None            # torch.float32 is fp32, the default: not given
    assert not raw.given("attention_backend")            # AttnBackend.auto is the default
    assert not raw.given("exit_signal")                  # '15' is SIGTERM, the default
    assert not raw.given("moe_aux_loss_coeff")           # [0.0] is the default 0.0 made a list
    assert not raw.given("params_dtype") and "params_dtype" in log.derived
    assert log.memory[0].max_allocated == 180 * MiB and log.memory[0].max_reserved == 210 * MiB
    # The same configuration as the flags it was launched with.
    inp, problems = api.input_from_file(path)
    verdict = api.evaluate(inp, problems=problems)
    expected = flag_estimate()
    assert [s.device_peak_bytes for s in verdict.estimate.stages] == [s.device_peak_bytes for s in expected.stages]


def test_enum_and_dtype_values_map_back_to_flag_values(tmp_path):
    namespace = dict(NAMESPACE, attention_backend="AttnBackend.flash", exit_signal=str(signal.SIGINT),
                     exp_avg_dtype="torch.bfloat16")
    log = parse_megatron_log("\n".join(arguments_block(namespace)) + "\n", "t.log")
    assert log.raw.value("attention_backend") == "flash"
    assert log.raw.value("exit_signal") == "SIGINT"
    assert log.raw.value("exp_avg_dtype") == "bf16"


def test_a_value_the_flag_cannot_hold_is_located(tmp_path):
    namespace = dict(NAMESPACE, num_layers="four")
    lines = arguments_block(namespace)
    log = parse_megatron_log("\n".join(lines) + "\n", "t.log")
    number = 1 + lines.index("  num_layers " + "." * 38 + " four")
    assert [(p.code, p.location) for p in log.problems] == [("invalid-value", f"t.log:{number} num_layers")]


def test_torchrun_prefixes(tmp_path):
    lines = [f"[default0]:{line}" for line in arguments_block()]
    lines += [f"[default{r}]:" + memory_line(r, 2, 100 * MiB, (150 + r) * MiB, 190 * MiB, (200 + r) * MiB)
              for r in (0, 2, 4, 6)]
    path = write(tmp_path, lines)
    log = parse_megatron_log(path.read_text(), "train.log")
    assert log.problems == () and log.world_size == 8
    assert [(m.rank, m.max_allocated) for m in log.memory] == [(r, (150 + r) * MiB) for r in (0, 2, 4, 6)]


def test_srun_label_prefixes_and_interleaved_ranks(tmp_path):
    block = arguments_block()
    lines = []
    for i, line in enumerate(block):   # rank 1's output lands between rank 0's lines
        lines.append(f"0: {line}")
        if i % 5 == 2:
            lines.append("1: > building NullTokenizer tokenizer ...")
    lines.insert(10, "3: " + memory_line(3, 1, 90 * MiB, 95 * MiB, 120 * MiB, 130 * MiB))
    log = parse_megatron_log("\n".join(lines) + "\n", "train.log")
    assert log.problems == ()
    assert log.raw.value("hidden_size") == 256
    assert [(m.rank, m.max_reserved) for m in log.memory] == [(3, 130 * MiB)]


def test_truncated_log_reads_what_it_has(tmp_path):
    block = arguments_block()
    kept = block[:-1]                         # no end line ...
    cut = kept[-1][: len(kept[-1]) - 3]       # ... and the last line cut mid-value
    text = "\n".join(kept[:-1] + [cut])
    log = parse_megatron_log(text, "train.log")
    assert any("no end line" in n for n in log.notes)
    assert any(f"train.log:{len(kept)}" in n and "cut off" in n for n in log.notes)
    last_name = kept[-1].split()[0]
    assert not log.raw.given(last_name) and last_name not in log.derived
    # What the block no longer holds is named with where it ends.
    assert log.raw.location("zzz_missing") == f"train.log zzz_missing (the truncated arguments block ends at line {len(kept) - 1})"


def test_a_log_without_arguments_block_is_exit_2(tmp_path, capsys):
    path = write(tmp_path, [memory_line(0, 1, MiB, 2 * MiB, 3 * MiB, 4 * MiB)])
    assert main(["compare", str(path)]) == 2
    out = capsys.readouterr().out
    assert "no Megatron arguments block" in out and "[no-arguments-block]" in out
    assert main(["check", str(path)]) == 2


def test_rank_order():
    # tp-cp-ep-dp-pp: a stage is world / pp consecutive ranks.
    assert [pipeline_rank_of(r, 8, 2, 1, 2) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    # --use-tp-pp-dp-mapping (tp-cp-ep-pp-dp): pp follows tp.
    assert [pipeline_rank_of(r, 8, 2, 1, 2, True) for r in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]


# -- compare -------------------------------------------------------------------------------

def test_compare_per_rank_and_json(tmp_path, capsys):
    figures = {0: (180 * MiB, 210 * MiB), 4: (150 * MiB, 190 * MiB)}
    lines = [f"[default0]:{line}" for line in arguments_block()]
    lines += [f"[default{r}]:" + memory_line(r, 2, 100 * MiB, a, 120 * MiB, res) for r, (a, res) in figures.items()]
    path = write(tmp_path, lines)
    assert main(["compare", "--format", "json", str(path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    expected = flag_estimate()
    stages = {s.pipeline_rank: s for s in expected.stages}
    got = {r["rank"]: r for r in doc["ranks"]}
    assert sorted(got) == [0, 4]
    for rank, (alloc, res) in figures.items():
        stage = stages[rank // 4]
        row = got[rank]
        assert row["pipeline_rank"] == rank // 4
        assert row["measured_max_allocated_bytes"] == alloc and row["measured_max_reserved_bytes"] == res
        assert row["allocated_peak_bytes"] == stage.allocated_peak_bytes
        assert row["device_peak_bytes"] == stage.device_peak_bytes
        assert row["allocated_error"] == pytest.approx((stage.allocated_peak_bytes - alloc) / alloc)
        assert row["device_error"] == pytest.approx((stage.device_peak_bytes - res) / res)
    assert main(["compare", str(path)]) == 0
    text = capsys.readouterr().out
    assert "max alloc" in text and "est device" in text


def test_compare_oom_against_the_refusal(tmp_path, capsys):
    lines = [f"[default0]:{line}" for line in arguments_block()]
    lines.append("[default0]:" + memory_line(0, 1, 100 * MiB, 150 * MiB, 160 * MiB, 170 * MiB))
    # Rank 5 runs out of memory on a small GPU: 2 GiB in all (figures format_size prints exactly:
    # 1.25 GiB allocated, 256.00 MiB reserved but unallocated, 1.75 GiB in use).
    lines.append("[default5]:" + oom_line(5, 64 * MiB, 2 * GiB, 10 * MiB, 1792 * MiB,
                                          1280 * MiB, 1536 * MiB))
    path = write(tmp_path, lines)
    assert main(["compare", "--format", "json", str(path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    [oom] = doc["out_of_memory"]
    expected = api.estimate(FLAGS, world_size=8, budget=2 * GiB)
    stage = expected.stages[1]   # rank 5 of 8 with pp 2
    assert oom["rank"] == 5 and oom["pipeline_rank"] == 1
    assert oom["allocated_bytes"] == 1280 * MiB and oom["reserved_bytes"] == 1536 * MiB
    assert oom["process_in_use_bytes"] == 1792 * MiB and oom["requested_bytes"] == 64 * MiB
    assert oom["total_capacity_bytes"] == 2 * GiB and oom["budget_bytes"] == 2 * GiB
    assert oom["device_peak_bytes"] == stage.device_peak_bytes
    assert oom["stage_refused"] is (stage.device_peak_bytes > 2 * GiB)
    assert oom["launch_refused"] is (expected.fits is False)


def test_suggest_settings(tmp_path, capsys):
    lines = arguments_block()
    lines.append(memory_line(0, 1, 100 * MiB, 200 * MiB, 210 * MiB, 230 * MiB, device_used=2000 * MiB))
    lines.append(memory_line(4, 1, 100 * MiB, 100 * MiB, 110 * MiB, 125 * MiB))
    path = write(tmp_path, lines)
    assert main(["compare", "--suggest-settings", "--format", "json", str(path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    settings = {s["key"]: s for s in doc["suggested_settings"]}
    # Rank 4: 125 / 100 - 1 = 0.25, above rank 0's 230 / 200 - 1 = 0.15.
    assert settings["fragmentation"]["value"] == 0.25
    # Outside the allocator: 2000 MiB used - 210 MiB reserved = 1790 MiB; the context keeps
    # 512 MiB; tp 2, pp 2, dp 2 are three communicators: ceil(1278 / 3) = 426 MiB each.
    assert settings["cuda-context"]["value"] == 512 * MiB
    assert settings["nccl-buffers"]["value"] == 426 * MiB
    toml = doc["suggested_toml"]
    assert "[tool.megatron-estimator]" in toml and 'nccl-buffers = "426MiB"' in toml
    assert "fragmentation = 0.25" in toml
    from megatron_estimator.settings import load_settings

    settings_file = tmp_path / "megatron-estimator.toml"
    settings_file.write_text(toml.replace("[tool.megatron-estimator]\n", ""))
    loaded, problems = load_settings({}, environ={}, cwd=tmp_path)
    assert problems == ()
    assert loaded.nccl_buffers == 426 * MiB and loaded.fragmentation == 0.25 and loaded.cuda_context == 512 * MiB


# -- compare: when each memory line was printed --------------------------------------------
# Without --use-distributed-optimizer the moments are unsharded: exp_avg + exp_avg_sq in fp32,
# 8 bytes per parameter of the stage.  Parameters per GPU by hand (h 256, 8 heads, ffn 1024,
# tp 2, pp 2 -> 2 layers a stage, vocabulary 1000 padded to 1024 = 128 x tp, LayerNorm, biases):
#   a layer: 2 norms 2 x 512 + qkv 256 x 384 + 384 + proj 128 x 256 + 256
#            + fc1 256 x 512 + 512 + fc2 512 x 256 + 256                    = 395,648
#   stage 0: 2 layers + word embeddings 512 x 256 + positions 512 x 256     = 1,053,440
PLAIN_FLAGS = [f for f in FLAGS if f != "--use-distributed-optimizer"]
PLAIN_NAMESPACE = {**NAMESPACE, "use_distributed_optimizer": False}
STAGE0_MOMENTS = 8 * 1_053_440


def test_memory_report_iteration_from_its_name():
    log = parse_megatron_log("\n".join([
        memory_line(0, 3, MiB, MiB, MiB, MiB),
        "[Rank 0] (before save_checkpoint for iteration 7) memory (MB) | allocated: 1.00 | max allocated: 1.00"
        " | reserved: 1.00 | max reserved: 1.00",
        "[Rank 0] memory (MB) | allocated: 1.00 | max allocated: 1.00 | reserved: 1.00 | max reserved: 1.00",
        " successfully loaded checkpoint from /ckpt [ t 1/2, p 1/2 ] at iteration 100"]) + "\n", "train.log")
    assert [r.iteration for r in log.memory] == [3, 7, None]
    assert log.loaded_iteration == 100 and log.loaded_location == "train.log:4"


def _compare_rank0(tmp_path, capsys, lines, namespace=PLAIN_NAMESPACE) -> dict:
    path = write(tmp_path, arguments_block(namespace) + lines)
    assert main(["compare", "--format", "json", str(path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    return {r["rank"]: r for r in doc["ranks"]}[0] | {"notes": doc["notes"]}


def test_first_iteration_peak_is_compared_without_the_moments(tmp_path, capsys):
    stage = api.estimate(PLAIN_FLAGS, world_size=8).stages[0]
    # the precondition of this case: the forward/backward peak without the moments is above the
    # optimizer step's (activations freed, moments created), so the moments are what is taken off
    assert stage.bytes.activations > STAGE0_MOMENTS
    measured = stage.allocated_peak_bytes - STAGE0_MOMENTS
    row = _compare_rank0(tmp_path, capsys, [memory_line(0, 1, 100 * MiB, measured, 200 * MiB, 210 * MiB)])
    assert row["iteration"] == 1 and row["state"] == "before the moments"
    assert row["steady_allocated_peak_bytes"] == stage.allocated_peak_bytes
    assert row["allocated_peak_bytes"] == stage.allocated_peak_bytes - STAGE0_MOMENTS
    # the MiB figure rounds to 2 decimals: within 0.005 MiB of the estimate
    assert abs(row["allocated_error"]) < 0.01 * MiB / measured
    assert any("no checkpoint loaded" in note for note in row["notes"])


def test_second_iteration_and_resumed_runs_are_steady(tmp_path, capsys):
    stage = api.estimate(PLAIN_FLAGS, world_size=8).stages[0]
    lines = [memory_line(0, 1, 100 * MiB, 150 * MiB, 200 * MiB, 210 * MiB),
             memory_line(0, 2, 100 * MiB, 160 * MiB, 200 * MiB, 210 * MiB)]
    row = _compare_rank0(tmp_path, capsys, lines)
    assert row["iteration"] == 2 and row["state"] == "steady"
    assert row["allocated_peak_bytes"] == stage.allocated_peak_bytes
    # a checkpoint loaded with its optimizer state: the moments exist before the first step
    loaded = ["successfully loaded checkpoint from /ckpt [ t 1/2, p 1/2 ] at iteration 100",
              memory_line(0, 101, 100 * MiB, 150 * MiB, 200 * MiB, 210 * MiB)]
    row = _compare_rank0(tmp_path, capsys, loaded)
    assert row["state"] == "steady" and row["allocated_peak_bytes"] == stage.allocated_peak_bytes


def test_finetune_from_a_checkpoint_creates_the_moments_at_its_first_step(tmp_path, capsys):
    # --finetune loads no optimizer state (checkpointing.py load_checkpoint) and restarts at 0
    namespace = {**PLAIN_NAMESPACE, "finetune": True}
    lines = ["successfully loaded checkpoint from /ckpt [ t 1/2, p 1/2 ] at iteration 0",
             memory_line(0, 1, 100 * MiB, 150 * MiB, 200 * MiB, 210 * MiB)]
    row = _compare_rank0(tmp_path, capsys, lines, namespace)
    stage = api.estimate(PLAIN_FLAGS + ["--finetune"], world_size=8).stages[0]
    assert row["state"] == "before the moments"
    assert row["allocated_peak_bytes"] == stage.allocated_peak_bytes - STAGE0_MOMENTS
    assert any("--finetune" in note for note in row["notes"])
    path = write(tmp_path, arguments_block(namespace) + lines)
    assert main(["compare", str(path)]) == 0
    assert "iteration*" in capsys.readouterr().out
