"""Validation: Megatron's checks, every problem at once, each naming the flag."""

import pytest

from conftest import LLAMA3_8B, TINY_GPT, problems_of


def codes(text, world_size=1, environ=None, release="main"):
    return [(p.code, p.location) for p in problems_of(text, world_size, environ, release)]


def test_valid_configs_have_no_problems():
    assert codes(TINY_GPT) == []
    assert codes(LLAMA3_8B + " --tensor-model-parallel-size 8 --pipeline-model-parallel-size 4", 64) == []


def test_world_size_product_explains_the_arithmetic():
    problems = problems_of(TINY_GPT + " --tensor-model-parallel-size 4 --pipeline-model-parallel-size 2", 12)
    assert [(p.code, p.location) for p in problems] == [("world-size-not-divisible", "--tensor-model-parallel-size")]
    assert "tp(4) x pp(2) x cp(1) = 8 does not divide world size 12" in problems[0].message


def test_expert_layout_product():
    problems = problems_of(TINY_GPT + " --num-experts 8 --expert-model-parallel-size 4", 6)
    assert ("expert-world-size-not-divisible", "--expert-model-parallel-size") in [(p.code, p.location) for p in problems]
    assert any("etp(1) x ep(4) x pp(1) = 4 does not divide world size 6" in p.message for p in problems)


def test_all_problems_at_once():
    text = (TINY_GPT + " --num-layers 5 --pipeline-model-parallel-size 2 --seq-length 64 "
            "--global-batch-size 3 --recompute-granularity full")
    assert codes(text, 2) == [
        ("seq-length-exceeds-positions", "--seq-length"),
        ("global-batch-not-divisible", "--global-batch-size"),
        ("layers-not-divisible-by-pp", "--num-layers"),
        ("recompute-method-required", "--recompute-granularity"),
        ("recompute-num-layers-required", "--recompute-granularity"),
    ]


@pytest.mark.parametrize("extra, world, expected", [
    ("--num-attention-heads 3", 1, ("heads-not-dividing-hidden", "--num-attention-heads")),
    ("--num-attention-heads 4 --tensor-model-parallel-size 8", 8, ("heads-not-divisible-by-tp", "--num-attention-heads")),
    ("--group-query-attention --num-query-groups 3 --num-attention-heads 4 --kv-channels 16 --tensor-model-parallel-size 2", 2,
     ("query-groups-vs-tp", "--num-query-groups")),
    ("--context-parallel-size 3 --seq-length 32", 3, ("seq-length-vs-cp", "--seq-length")),
    ("--expert-model-parallel-size 2", 2, ("ep-without-experts", "--expert-model-parallel-size")),
    ("--num-experts 6 --expert-model-parallel-size 4", 4, ("experts-not-divisible-by-ep", "--num-experts")),
    ("--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1 --num-virtual-stages-per-pipeline-rank 2", 2,
     ("conflicting-virtual-pipeline-flags", "--num-virtual-stages-per-pipeline-rank")),
    ("--pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 2 --decoder-last-pipeline-num-layers 1", 4,
     ("uneven-split-invalid", "--decoder-first-pipeline-num-layers")),
    ("--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1 --global-batch-size 6", 2,
     ("interleaved-microbatches", "--global-batch-size")),
    ("--recompute-activations --recompute-method uniform", 1, ("recompute-method-with-selective", "--recompute-method")),
    ("--overlap-param-gather", 1, ("overlap-param-gather-needs-dist-opt", "--overlap-param-gather")),
    ("--exp-avg-dtype bf16", 1, ("dtype-needs-precision-aware-optimizer", "--exp-avg-dtype")),
    ("--optimizer-cpu-offload", 1, ("cpu-offload-needs-precision-aware-optimizer", "--optimizer-cpu-offload")),
    ("--fp16", 1, ("conflicting-precision", "--fp16")),
    ("--cross-entropy-loss-fusion --cross-entropy-fusion-impl te", 1, ("te-cross-entropy-disabled", "--cross-entropy-fusion-impl")),
    ("--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout Et|tt|tL", 2, ("invalid-layout", "--pipeline-model-parallel-layout")),
    ("--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout Ett|ttL --decoder-first-pipeline-num-layers 2", 2,
     ("layout-conflict", "--decoder-first-pipeline-num-layers")),
    ("--multi-latent-attention --group-query-attention", 1, ("mla-with-gqa", "--group-query-attention")),
    ("--tensor-model-parallel-size 2 --tp-comm-overlap", 2, ("tp-comm-overlap-needs-sp", "--tp-comm-overlap")),
    ("--lr 0.1 --min-lr 0.5", 1, ("min-lr-exceeds-lr", "--min-lr")),
    ("--distribute-saved-activations", 1, ("distribute-saved-activations", "--distribute-saved-activations")),
])
def test_each_megatron_rule(extra, world, expected):
    assert expected in codes(TINY_GPT + " " + extra, world)


def test_layout_message_names_the_fault():
    problems = problems_of(TINY_GPT + " --pipeline-model-parallel-size 2 --pipeline-model-parallel-layout Et|tt|tL", 2)
    assert problems[0].message == "the layout has 3 stages, not a multiple of pp(2)"
    problems = problems_of(TINY_GPT + " --pipeline-model-parallel-size 2 --pipeline-model-parallel-layout Et|ttL", 2)
    assert "'Et|ttL': the layout has 3 transformer layers 't' but --num-layers is 4" in [p.message for p in problems]


def test_attention_backend_conflicting_with_environment():
    problems = problems_of(TINY_GPT, 1, environ={"NVTE_FLASH_ATTN": "0"})
    assert [(p.code, p.location) for p in problems] == [("attention-backend-env-conflict", "--attention-backend")]
    assert "NVTE_FLASH_ATTN=0" in problems[0].message
    assert codes(TINY_GPT + " --attention-backend unfused", 1, {"NVTE_FLASH_ATTN": "0", "NVTE_FUSED_ATTN": "0"}) == []


def test_schema_types_and_ranges():
    assert codes(TINY_GPT + " --hidden-dropout 1.5") == [("out-of-range", "--hidden-dropout")]
    assert codes(TINY_GPT + " --num-layers 0") == [("out-of-range", "--num-layers")]


def test_missing_required_flags():
    problems = problems_of("--num-layers 2 --bf16")
    assert [(p.code, p.location) for p in problems] == [
        ("missing-required", "--hidden-size"), ("missing-required", "--num-attention-heads"),
        ("missing-required", "--max-position-embeddings"), ("missing-required", "--micro-batch-size"),
        ("missing-required", "--seq-length"),
    ]


def test_unknown_vocabulary_asks_for_vocab_size():
    text = TINY_GPT.replace("--vocab-size 1000", "--tokenizer-type SentencePieceTokenizer --tokenizer-model /nonexistent/tok.model")
    problems = problems_of(text)
    assert [(p.code, p.location) for p in problems] == [("unknown-vocab-size", "--tokenizer-type")]
    assert "pass --vocab-size" in problems[0].message


def test_sequence_parallel_dropped_at_tp1_is_said():
    from conftest import resolve

    config = resolve(TINY_GPT + " --sequence-parallel")
    assert config.training.sequence_parallel is False
    assert any("sequence parallel is off" in note for note in config.notes)


@pytest.mark.parametrize("extra, world, expected", [
    ("--num-experts 4 --tensor-model-parallel-size 2", 2, ("moe-tp-needs-sequence-parallel", "--tensor-model-parallel-size")),
    ("--num-experts 4 --moe-enable-deepep", 1, ("deepep-needs-flex", "--moe-enable-deepep")),
    ("--num-experts 4 --overlap-moe-expert-parallel-comm", 1, ("moe-overlap-needs-ep", "--overlap-moe-expert-parallel-comm")),
    ("--num-experts 4 --expert-model-parallel-size 2 --overlap-moe-expert-parallel-comm", 2,
     ("moe-overlap-dispatcher", "--overlap-moe-expert-parallel-comm")),
    ("--fine-grained-activation-offloading --offload-modules attn_proj", 1,
     ("offload-attn-proj-needs-core-attn", "--offload-modules")),
    ("--fine-grained-activation-offloading --offload-modules qkv_linear --transformer-impl local", 1,
     ("offloading-needs-te", "--fine-grained-activation-offloading")),
])
def test_moe_and_offloading_rules(extra, world, expected):
    assert expected in codes(TINY_GPT + " " + extra, world)


def test_cuda_device_max_connections_only_when_the_gpu_is_known():
    from megatron_estimator.core.problems import InvalidInput
    from megatron_estimator.inputs.argv import parse_megatron_argv
    from megatron_estimator.config.resolve import resolve_config

    raw, _ = parse_megatron_argv((TINY_GPT + " --tensor-model-parallel-size 2").split())
    with pytest.raises(InvalidInput) as err:
        resolve_config(raw, world_size=2, environ={}, compute_capability=9.0, job_environment=True)
    assert [p.code for p in err.value.problems] == ["cuda-device-max-connections"]
    resolve_config(raw, world_size=2, environ={"CUDA_DEVICE_MAX_CONNECTIONS": "1"}, compute_capability=9.0,
                   job_environment=True)
    # A config file checked in a shell that is not the job's: a note, not an error.
    config = resolve_config(raw, world_size=2, environ={}, compute_capability=9.0)
    assert any(note.startswith("job environment (not checked here): ") and "CUDA_DEVICE_MAX_CONNECTIONS=1" in note
               for note in config.notes)
    resolve_config(raw, world_size=2, environ={}, compute_capability=10.0)   # Blackwell: no such rule
    resolve_config(raw, world_size=2, environ={})                            # GPU unknown: not checked


def test_distributed_optimizer_instances_must_split_the_data_parallel_groups():
    base = TINY_GPT + " --global-batch-size 16 --num-distributed-optimizer-instances "
    assert codes(base + "2 --use-distributed-optimizer", 8) == []
    assert codes(base + "2", 8) == [("dist-opt-instances-need-dist-opt", "--num-distributed-optimizer-instances")]
    problems = problems_of(base + "3 --use-distributed-optimizer", 8)
    assert [(p.code, p.location) for p in problems] == [
        ("dist-opt-instances-not-dividing-dp", "--num-distributed-optimizer-instances")]
    assert problems[0].message.startswith("dp(8) x cp(1) = 8 is not divisible by --num-distributed-optimizer-instances 3")
    # MoE: the expert data-parallel group splits too (world 8 / (etp 1 x ep 8 x pp 1) = 1).
    moe = base + "2 --use-distributed-optimizer --num-experts 8 --expert-model-parallel-size 8"
    problems = problems_of(moe, 8)
    assert [(p.code, p.location) for p in problems] == [
        ("dist-opt-instances-not-dividing-edp", "--num-distributed-optimizer-instances")]
    assert "world(8) / (etp(1) x ep(8) x pp(1)) = 1 is not divisible" in problems[0].message
    assert codes(moe.replace("--expert-model-parallel-size 8", "--expert-model-parallel-size 4"), 8) == []


def test_a_mistyped_value_does_not_hide_the_other_problems():
    from megatron_estimator import api

    flags = ("--num-layers abc --hidden-size 4096 --num-attention-heads 30 --tensor-model-parallel-size 3 "
             "--seq-length 4096 --max-position-embeddings 2048 --micro-batch-size 1").split()
    inp, problems = api.input_from_flags(flags, environ={})
    verdict = api.evaluate(inp, world_size=8, problems=problems, environ={})
    assert [(p.code, p.location) for p in verdict.problems] == [
        ("invalid-value", "--num-layers"),
        ("world-size-not-divisible", "--tensor-model-parallel-size"),
        ("heads-not-dividing-hidden", "--num-attention-heads"),
        ("seq-length-exceeds-positions", "--seq-length"),
        # --ffn-hidden-size defaults to 4 x 4096 = 16384, and 16384 / tp 3 is not whole: the dense
        # MLP's tensor-parallel split (megatron/core/utils.py divide) stops the model build
        ("ffn-hidden-size-vs-tp", "--tensor-model-parallel-size"),
    ]
    # The same from a mapping, where the type error is the schema's.
    mapping = {"num_layers": "abc", "hidden_size": 4096, "num_attention_heads": 30, "tensor_model_parallel_size": 3,
               "seq_length": 4096, "max_position_embeddings": 2048, "micro_batch_size": 1}
    inp, problems = api.input_from_mapping(mapping)
    verdict = api.evaluate(inp, world_size=8, problems=problems, environ={})
    assert [p.code for p in verdict.problems] == [
        "wrong-type", "world-size-not-divisible", "heads-not-dividing-hidden", "seq-length-exceeds-positions",
        "ffn-hidden-size-vs-tp"]


def test_a_tokenizer_file_that_cannot_be_read_is_a_problem_not_a_fallback(tmp_path):
    bad = tmp_path / "vocab.json"
    bad.write_text("{not json")
    base = TINY_GPT.replace("--vocab-size 1000", "")
    problems = problems_of(base + f" --tokenizer-type GPT2BPETokenizer --vocab-file {bad}")
    assert [(p.code, p.location, p.message) for p in problems] == [(
        "unreadable-tokenizer", "--vocab-file",
        f"--vocab-file {bad} cannot be read as a vocabulary (a JSON object of tokens, a tokenizer.json, or one "
        "token per line); fix it or pass --vocab-size")]
    assert [p.code for p in problems_of(base + f" --vocab-file {tmp_path}")] == ["unreadable-tokenizer"]
    problems = problems_of(base + f" --tokenizer-type HuggingFaceTokenizer --tokenizer-model {bad}")
    assert [(p.code, p.location) for p in problems] == [("unreadable-tokenizer", "--tokenizer-model")]
    assert problems_of(base + f" --vocab-file {bad} --vocab-size 1000") == []     # the size is given: not read
    good = tmp_path / "good.json"
    good.write_text('{"a": 0, "b": 1, "c": 2}')
    assert problems_of(base + f" --vocab-file {good}") == []


def test_an_uneven_middle_split_does_not_hide_the_virtual_stage_checks():
    text = (TINY_GPT.replace("--num-layers 4", "--num-layers 16") + " --pipeline-model-parallel-size 4 "
            "--decoder-first-pipeline-num-layers 3 --num-virtual-stages-per-pipeline-rank 2 --global-batch-size 8")
    assert codes(text, 4) == [("uneven-split-invalid", "--decoder-first-pipeline-num-layers"),
                              ("uneven-split-vs-vpp", "--decoder-first-pipeline-num-layers")]


def test_fsdp_refuses_cuda_device_max_connections_one():
    # megatron/training/arguments.py validate_args: Megatron-FSDP and torch FSDP2 assert
    # CUDA_DEVICE_MAX_CONNECTIONS != "1", whatever the GPU.
    from megatron_estimator.core.problems import InvalidInput
    from megatron_estimator.inputs.argv import parse_megatron_argv
    from megatron_estimator.config.resolve import resolve_config

    raw, problems = parse_megatron_argv((TINY_GPT + " --use-megatron-fsdp --ckpt-format fsdp_dtensor").split())
    assert not problems
    with pytest.raises(InvalidInput) as err:
        resolve_config(raw, world_size=2, environ={"CUDA_DEVICE_MAX_CONNECTIONS": "1"}, job_environment=True)
    [problem] = err.value.problems
    assert problem.code == "fsdp-cuda-device-max-connections"
    assert problem.location == "CUDA_DEVICE_MAX_CONNECTIONS"
    resolve_config(raw, world_size=2, environ={"CUDA_DEVICE_MAX_CONNECTIONS": "8"}, job_environment=True)
    resolve_config(raw, world_size=2, environ={}, job_environment=True)
    # Not the job's environment (a config file): a note.
    config = resolve_config(raw, world_size=2, environ={"CUDA_DEVICE_MAX_CONNECTIONS": "1"})
    assert any("--use-megatron-fsdp needs CUDA_DEVICE_MAX_CONNECTIONS unset" in n for n in config.notes)


def test_step_batch_size_schedule_with_global_batch_size_is_refused():
    # megatron/training/arguments.py validate_args raises ValueError for both.
    schedule = ["--step-batch-size-schedule", "0:16 1M:32"]
    from megatron_estimator.inputs.argv import parse_megatron_argv
    from megatron_estimator.config.resolve import resolve_config
    from megatron_estimator.core.problems import InvalidInput

    raw, problems = parse_megatron_argv(TINY_GPT.split() + schedule)
    assert not problems
    base = [t for t in TINY_GPT.split()]
    if "--global-batch-size" in base:
        with pytest.raises(InvalidInput) as err:
            resolve_config(raw, world_size=1, environ={})
        assert [(p.code, p.location) for p in err.value.problems] == [
            ("step-schedule-with-global-batch", "--global-batch-size")]
        i = base.index("--global-batch-size")
        del base[i:i + 2]
    raw, problems = parse_megatron_argv(base + schedule)
    resolve_config(raw, world_size=1, environ={})
    raw, problems = parse_megatron_argv(base + schedule + ["--global-batch-size", "32"])
    with pytest.raises(InvalidInput) as err:
        resolve_config(raw, world_size=1, environ={})
    assert [p.code for p in err.value.problems] == ["step-schedule-with-global-batch"]


# ---- checks the differential harness found (scripts/megatron_validate; config/rules/) ----

def test_moe_with_biases_needs_expert_tensor_parallel_size_one():
    # megatron/core/transformer/transformer_config.py __post_init__: num_moe_experts with
    # add_bias_linear (the default) asserts expert_tensor_parallel_size == 1; ETP defaults to TP.
    moe = TINY_GPT + " --num-experts 4 --sequence-parallel"
    assert ("moe-bias-needs-etp1", "--tensor-model-parallel-size") in codes(moe + " --tensor-model-parallel-size 2", 2)
    assert ("moe-bias-needs-etp1", "--expert-tensor-parallel-size") in codes(
        moe + " --expert-tensor-parallel-size 2", 2)
    for fine in (" --tensor-model-parallel-size 2 --disable-bias-linear",
                 " --tensor-model-parallel-size 2 --expert-tensor-parallel-size 1", ""):
        assert "moe-bias-needs-etp1" not in [c for c, _ in codes(moe + fine, 2)], fine


def test_moe_bias_rule_is_release_dependent():
    # before a329dd6da5 (#3858, first in 0.15) MoE experts had no bias and no such check
    text = TINY_GPT + " --num-experts 4 --sequence-parallel --tensor-model-parallel-size 2"
    assert "moe-bias-needs-etp1" not in [c for c, _ in codes(text, 2, release="0.14.0")]
    assert ("moe-bias-needs-etp1", "--tensor-model-parallel-size") in codes(text, 2, release="0.15.3")


@pytest.mark.parametrize("graphs, refused", [
    ("--cuda-graph-impl local", True), ("--cuda-graph-impl transformer_engine", True),
    ("--enable-cuda-graph", True), ("", False)])
def test_full_recompute_with_cuda_graphs_is_refused(graphs, refused):
    # transformer_config.py __post_init__ (2b343d739f): CUDA graphs + full recompute assert
    # cuda_graph_impl == "full_iteration"; selective recompute is not this check
    full = TINY_GPT + " --recompute-granularity full --recompute-method uniform --recompute-num-layers 1 "
    assert (("cuda-graph-full-recompute", "--recompute-granularity") in codes(full + graphs)) is refused
    assert "cuda-graph-full-recompute" not in [c for c, _ in codes(TINY_GPT + " --recompute-activations " + graphs)]


def test_te_cuda_graphs_with_expandable_segments_need_nccl_graph_register_zero():
    # megatron/training/arguments.py validate_args (2b343d739f)
    from megatron_estimator.core.problems import InvalidInput
    from megatron_estimator.inputs.argv import parse_megatron_argv
    from megatron_estimator.config.resolve import resolve_config

    raw, problems = parse_megatron_argv((TINY_GPT + " --cuda-graph-impl transformer_engine").split())
    assert not problems
    segments = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    with pytest.raises(InvalidInput) as err:
        resolve_config(raw, world_size=1, environ=segments, job_environment=True)
    assert [(p.code, p.location) for p in err.value.problems] == [
        ("cuda-graph-nccl-graph-register", "NCCL_GRAPH_REGISTER")]
    resolve_config(raw, world_size=1, environ={**segments, "NCCL_GRAPH_REGISTER": "0"}, job_environment=True)
    resolve_config(raw, world_size=1, environ={}, job_environment=True)
    # not the job's environment (a config file): a note
    config = resolve_config(raw, world_size=1, environ=segments)
    assert any("NCCL_GRAPH_REGISTER=0" in note for note in config.notes)


@pytest.mark.parametrize("extra, refused", [
    ("--fp8-format hybrid --recompute-activations --recompute-modules layernorm", True),
    ("--fp8-format hybrid --recompute-activations --recompute-modules moe_act --num-experts 4 --moe-grouped-gemm", True),
    ("--fp8-format hybrid --fp8-recipe tensorwise --recompute-activations --recompute-modules layernorm", False),
    ("--fp8-format hybrid --recompute-activations --recompute-modules core_attn", False),
    ("--recompute-activations --recompute-modules layernorm", False),
])
def test_fp8_delayed_scaling_cannot_recompute_layernorm_or_moe_act(extra, refused):
    # transformer_config.py __post_init__ (781e765818): ValueError under the delayed recipe
    found = ("fp8-delayed-recompute", "--recompute-modules") in codes(TINY_GPT + " " + extra)
    assert found is refused


def test_offloading_with_local_cuda_graphs_takes_only_the_capturable_modules():
    # transformer_config.py __post_init__ (69c486825c, #3697, from 0.19): expert_fc1, moe_act, fused_group_mlp
    base = TINY_GPT + " --fine-grained-activation-offloading --cuda-graph-impl local --offload-modules "
    assert ("offload-modules-with-local-cuda-graphs", "--offload-modules") in codes(base + "core_attn")
    assert "offload-modules-with-local-cuda-graphs" not in [c for c, _ in codes(base + "expert_fc1 moe_act")]
    assert "offload-modules-with-local-cuda-graphs" not in [c for c, _ in codes(base + "core_attn", release="0.18.0")]



def test_a_value_equal_to_a_valid_one_in_another_type_is_still_reported():
    # jsonschema's answer for a setting is kept by (dest, type, value): True == 1 in Python,
    # but JSON Schema's integer excludes booleans (config.schema.json: micro_batch_size is an
    # integer), so True after 1 is still the wrong type.
    from megatron_estimator.config.schema import check_config_schema
    from megatron_estimator.inputs.rawargs import RawArgs

    settings = {"num_layers": 2, "hidden_size": 8, "num_attention_heads": 2, "seq_length": 8,
                "max_position_embeddings": 8}
    assert [p.code for p in check_config_schema({**settings, "micro_batch_size": 1}, RawArgs({}, "x"))
            if p.code != "missing-required"] == []
    problems = check_config_schema({**settings, "micro_batch_size": True}, RawArgs({}, "x"))
    assert [(p.code, p.message) for p in problems if p.code != "missing-required"] == [
        ("wrong-type", "true has the wrong type: expected integer")]
