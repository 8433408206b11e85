"""The flag table and the Megatron command-line parser (megatron_estimator/megatron/flags.py, megatron_estimator/inputs/argv.py).

Facts checked against Megatron-LM d98e8a64: megatron/training/arguments.py (parser, converters)
and the config dataclasses whose fields become flags (megatron/core/transformer/transformer_config.py,
megatron/core/model_parallel_config.py, megatron/training/config/*.py).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import functools
import io
import json
import re
from pathlib import Path

import pytest

from megatron_estimator.core.problems import Problem
from megatron_estimator.inputs.argv import conditional_flag_notes, parse_megatron_argv
from megatron_estimator.megatron.flags import (
    CONVERTER_TYPES,
    FlagSpec,
    closest_flags,
    convert_value,
    dest_for_option,
    eval_layer_pattern,
    flag_table,
    read_literal,
)
from megatron_estimator.inputs.rawargs import RawArgs
from megatron_estimator.core.resources import data_path

from conftest import load_script, shared_file


def parse(*argv: str):
    return parse_megatron_argv(list(argv))


def values(*argv: str) -> dict:
    raw, problems = parse(*argv)
    assert problems == ()
    return {dest: setting.value for dest, setting in raw.settings.items()}


def only_problem(*argv: str) -> Problem:
    raw, problems = parse(*argv)
    assert len(problems) == 1, problems
    return problems[0]


# -- the table --------------------------------------------------------------------------------


def test_table_counts_match_the_shared_readme():
    table = flag_table()
    assert len(table) == 862
    assert sum(1 for spec in table if spec.always_registered) == 838
    assert len(table.option_strings()) == 900
    conditional = [spec for spec in table if not spec.always_registered]
    assert {spec.conditional for spec in conditional} == {"modelopt", "kitchen"}
    assert sum(spec.conditional == "kitchen" for spec in conditional) == 2
    assert len(table.option_strings(include_conditional=False)) == 900 - 24


def test_every_option_string_belongs_to_exactly_one_flag():
    table = flag_table()
    seen = {}
    for spec in table:
        for option in spec.option_strings:
            assert option.startswith("--")
            assert option not in seen, (option, seen.get(option))
            seen[option] = spec.flag
            assert table.by_option(option) is spec
            assert dest_for_option(option) == spec.dest
    assert dest_for_option("--tensor-model-paralel-size") is None


def test_dests_are_unique_except_the_yarn_pair_where_the_first_default_wins():
    table = flag_table()
    shared = {dest for dest in table.dests() if len(table.specs_for_dest(dest)) > 1}
    # arguments.py:2406-2409 registers both spellings with one dest.
    assert shared == {"yarn_correction_range_round_to_int"}
    on, off = table.specs_for_dest("yarn_correction_range_round_to_int")
    assert (on.flag, on.action, on.default) == ("--yarn-correction-range-round-to-int", "store_true", None)
    assert (off.flag, off.action, off.default) == ("--no-yarn-correction-range-round-to-int", "store_false", True)
    # argparse sets a dest's default from the first action that has it.
    assert table.default("yarn_correction_range_round_to_int") is None
    assert table.by_dest("yarn_correction_range_round_to_int") is on


def test_every_default_in_the_file_reads_back_as_literal_eval_reads_it():
    lines = data_path("megatron_flags.tsv").read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("# ")
    header = lines[1].split("\t")
    assert header == ["flag", "aliases", "dest", "action", "type", "nargs", "default", "choices",
                      "const", "conditional"]
    rows = [line.split("\t") for line in lines[2:]]
    assert len(rows) == 862
    for row in rows:
        assert len(row) == 10, row
        fast, slow = read_literal(row[6]), ast.literal_eval(row[6])
        assert fast == slow and type(fast) is type(slow), row
        assert not row[6].startswith("<"), row   # no computed default is left


def test_exact_defaults_against_megatron():
    table = flag_table()
    expected = {
        "hidden_dropout": 0.1,                         # transformer_config.py:188
        "attention_dropout": 0.1,
        "make_vocab_size_divisible_by": 128,
        "transformer_impl": "transformer_engine",      # transformer_config.py:1314
        "use_distributed_optimizer": False,
        "moe_layer_freq": 1,                           # transformer_config.py:735
        "expert_tensor_parallel_size": None,
        "recompute_granularity": None,                 # transformer_config.py:532
        "tensor_model_parallel_size": 1,
        "pipeline_model_parallel_size": 1,
        "num_layers": None,
        "seq_length": None,
        "cp_comm_type": ["p2p"],
        "moe_router_load_balancing_type": "aux_loss",  # a str default on an nargs='+' flag
        "pad_vocab_size": True,                        # --no-pad-vocab-size is store_false
        "gradient_accumulation_fusion": True,
        "attention_backend": "auto",                   # <expr> AttnBackend.auto
        "exit_signal": "SIGTERM",                      # <expr> signal.SIGTERM
        "inprocess_active_world_size": 1,              # int(os.getenv('WORLD_SIZE', '1')), unset
        "local_rank": 0,                               # int(os.getenv('LOCAL_RANK', '0')), unset
    }
    for dest, value in expected.items():
        got = table.default(dest)
        assert got == value and type(got) is type(value), (dest, got)


def test_defaults_hold_every_always_registered_dest_and_are_fresh_copies():
    table = flag_table()
    defaults = table.defaults()
    always = {spec.dest for spec in table if spec.always_registered}
    assert set(defaults) == always
    assert len(defaults) == 837             # 838 flags, two of them share a dest
    assert "export_model_type" not in defaults and table.default("export_model_type") == "GPTModel"
    defaults["cp_comm_type"].append("a2a")
    assert table.defaults()["cp_comm_type"] == ["p2p"]
    assert table.default("cp_comm_type") == ["p2p"]
    with pytest.raises(KeyError):
        table.default("no_such_dest")


def test_flag_table_is_loaded_once():
    assert flag_table() is flag_table()
    assert flag_table().by_option("--num-layers") is flag_table().by_option("--num-layers")


def test_specs_are_typed_facts():
    table = flag_table()
    layers = table.by_option("--num-layers")
    assert layers == FlagSpec("--num-layers", (), "num_layers", "store", "int", None, None, None, None, "")
    assert table.by_option("--flash-attention-version").choices == (2, 3, 4)
    assert table.by_option("--rampup-batch-size").nargs == 3
    assert table.by_option("--data-path").nargs == "*"
    assert table.by_option("--recompute-modules").nargs == "+"
    assert table.by_option("--recompute-granularity").choices == ("full", "selective")
    assert table.by_option("--attention-backend").choices == ("flash", "fused", "unfused", "local", "auto")
    assert table.by_option("--export-model-type").conditional == "modelopt"
    assert table.by_option("--kitchen-recipe-number").conditional == "kitchen"
    for spec in table:
        assert spec.type is None or spec.type in CONVERTER_TYPES, spec
        assert spec.action in ("store", "store_true", "store_false", "argparse.BooleanOptionalAction")


def test_boolean_flag_spellings():
    table = flag_table()
    for spec in table:
        if spec.action == "argparse.BooleanOptionalAction":
            # argparse.BooleanOptionalAction adds --no-X itself.
            assert spec.aliases == ("--no-" + spec.flag[2:],), spec
        elif spec.aliases and spec.flag.startswith("--no-") and spec.action == "store_false":
            # argument_utils.py: a True-by-default dataclass bool gets --no-x and --disable-x.
            assert spec.aliases == ("--disable-" + spec.flag[5:],), spec
            assert spec.default is True
    assert table.by_option("--disable-bias-linear").dest == "add_bias_linear"


def test_import_flags_refuses_an_unknown_computed_default(tmp_path, capsys):
    source = tmp_path / "flags.tsv"
    header = ["flag", "aliases", "dest", "action", "type", "nargs", "default", "choices", "const",
              "required", "group", "section_function", "origin", "conditional", "annotation", "source"]
    row = ["--x", "", "x", "store", "int", "", "<expr> compute()", "", "", "", "g", "f", "add_argument",
           "", "", "arguments.py:1"]
    source.write_text("\t".join(header) + "\n" + "\t".join(row) + "\n", encoding="utf-8")
    module = load_script("import_flags")
    assert module.main([str(source), "-o", str(tmp_path / "out.tsv")]) == 2
    assert "--x: cannot evaluate the computed default '<expr> compute()'" in capsys.readouterr().err
    assert not (tmp_path / "out.tsv").exists()


def test_import_flags_reproduces_the_committed_table(tmp_path):
    # the generator's check: data/megatron_flags.tsv is the record, regenerated from its source
    source = shared_file("megatron", "flags.tsv")
    module = load_script("import_flags")
    out = tmp_path / "megatron_flags.tsv"
    assert module.main([str(source), "-o", str(out)]) == 0
    assert out.read_bytes() == data_path("megatron_flags.tsv").read_bytes()


# -- real Megatron command lines (calibration/megatron-ci-dev.tsv argv_json) ------------------

GPT3_7B_TP1_PP4 = [  # gpt/gpt3_7b_tp1_pp4_memory_speed
    "--num-layers", "32", "--hidden-size", "4096", "--num-attention-heads", "32", "--group-query-attention",
    "--num-query-groups", "8", "--untie-embeddings-and-output-weights", "--log-throughput", "--log-params-norm",
    "--log-num-zeros-in-grad", "--log-validation-ppl-to-tensorboard", "--log-timers-to-tensorboard",
    "--tensorboard-dir", "${TENSORBOARD_PATH}", "--micro-batch-size", "1", "--global-batch-size", "8",
    "--seq-length", "8192", "--max-position-embeddings", "8192", "--train-iters", "25", "--timing-log-level", "0",
    "--lr-decay-iters", "320000", "--save", "${CHECKPOINT_SAVE_PATH}", "--load", "${CHECKPOINT_LOAD_PATH}",
    "--tokenizer-type", "NullTokenizer", "--vocab-size", "131073", "--mock-data", "--split", "949,50,1",
    "--distributed-backend", "nccl", "--lr", "0.00015", "--lr-decay-style", "cosine", "--min-lr", "1e-05",
    "--weight-decay", "1e-2", "--clip-grad", "1.0", "--lr-warmup-fraction", "0.01", "--log-interval", "2",
    "--save-interval", "10000", "--eval-interval", "1000", "--eval-iters", "5", "--transformer-impl",
    "transformer_engine", "--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "4",
    "--num-layers-per-virtual-pipeline-stage", "1", "--use-distributed-optimizer", "--overlap-grad-reduce",
    "--overlap-param-gather", "--deterministic-mode", "--no-gradient-accumulation-fusion", "--use-mcore-models",
    "--ckpt-format", "torch_dist", "--dist-ckpt-strictness", "log_all", "--data-cache-path", "${DATA_CACHE_PATH}",
    "--bf16", "--log-memory-to-tensorboard", "--exit-interval", "25", "--async-save", "--use-persistent-ckpt-worker",
]

DEEPSEEK_PROXY_FSDP_EP2 = [  # moe/deepseek_proxy_fsdp_ep2_fsdp2_1node
    "--distributed-timeout-minutes", "60", "--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size",
    "1", "--expert-model-parallel-size", "2", "--context-parallel-size", "1", "--expert-tensor-parallel-size", "1",
    "--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather", "--attention-backend",
    "unfused", "--num-distributed-optimizer-instances", "1", "--use-megatron-fsdp",
    "--data-parallel-sharding-strategy", "optim_grads_params", "--outer-dp-sharding-strategy", "no_shard",
    "--deterministic-mode", "--ckpt-format", "fsdp_dtensor", "--no-gradient-accumulation-fusion", "--fp8-format",
    "e4m3", "--fp8-recipe", "tensorwise", "--fp8-param-gather", "--use-mcore-models", "--sequence-parallel",
    "--disable-bias-linear", "--micro-batch-size", "4", "--global-batch-size", "32", "--train-iters", "50",
    "--exit-duration-in-mins", "60", "--no-check-for-nan-in-loss-and-grad", "--no-rope-fusion", "--manual-gc",
    "--manual-gc-interval", "100", "--transformer-impl", "transformer_engine", "--seq-length", "1024",
    "--data-cache-path", "${DATA_CACHE_PATH}", "--data-path", "${DATA_PATH}/text/the_pile/shard00/my-gpt3_00_text_document",
    "--vocab-file", "${DATA_PATH}/text/the_pile/shard00/bpe/vocab.json", "--merge-file",
    "${DATA_PATH}/text/the_pile/shard00/bpe/merges.txt", "--split", "949,50,1", "--num-layers", "2",
    "--hidden-size", "512", "--ffn-hidden-size", "2048", "--num-attention-heads", "8", "--kv-channels", "128",
    "--max-position-embeddings", "1024", "--position-embedding-type", "rope", "--rotary-base", "10000",
    "--make-vocab-size-divisible-by", "64", "--normalization", "RMSNorm", "--norm-epsilon", "1e-6", "--swiglu",
    "--untie-embeddings-and-output-weights", "--multi-latent-attention", "--attention-dropout", "0.0",
    "--hidden-dropout", "0.0", "--clip-grad", "1.0", "--weight-decay", "0.1", "--qk-layernorm",
    "--lr-warmup-fraction", "0.01", "--lr", "0.00015", "--min-lr", "1e-05", "--lr-decay-style", "cosine",
    "--adam-beta1", "0.9", "--adam-beta2", "0.95", "--num-experts", "8", "--moe-layer-freq", "([0]*1+[1]*1)",
    "--moe-ffn-hidden-size", "1024", "--moe-shared-expert-intermediate-size", "1024",
    "--moe-router-load-balancing-type", "seq_aux_loss", "--moe-router-topk", "4", "--moe-token-dispatcher-type",
    "alltoall", "--moe-router-pre-softmax", "--moe-grouped-gemm", "--moe-aux-loss-coeff", "1e-4",
    "--moe-router-group-topk", "2", "--moe-router-num-groups", "4", "--moe-router-topk-scaling-factor", "2.0",
    "--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias", "--moe-router-bias-update-rate",
    "1e-3", "--moe-router-dtype", "fp32", "--moe-permute-fusion", "--q-lora-rank", "256", "--kv-lora-rank", "128",
    "--qk-head-dim", "128", "--qk-pos-emb-head-dim", "64", "--v-head-dim", "128", "--rotary-scaling-factor", "1.0",
    "--mscale", "1.0", "--mscale-all-dim", "1.0", "--eval-iters", "10", "--eval-interval", "200",
    "--save-interval", "25", "--init-method-std", "0.02", "--log-timers-to-tensorboard",
    "--log-memory-to-tensorboard", "--log-num-zeros-in-grad", "--log-params-norm",
    "--log-validation-ppl-to-tensorboard", "--log-throughput", "--log-interval", "1", "--logging-level", "10",
    "--tensorboard-dir", "${TENSORBOARD_PATH}", "--exit-interval", "50",
]

MOE_FINE_GRAINED_OFFLOADING = [  # moe/gpt3_moe_mcore_te_tp2_pp2_ep4_etp1_fine_grained_offloading
    "--distributed-timeout-minutes", "60", "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size",
    "2", "--expert-model-parallel-size", "4", "--context-parallel-size", "1", "--expert-tensor-parallel-size", "1",
    "--use-distributed-optimizer", "--attention-backend", "unfused", "--use-mcore-models", "--sequence-parallel",
    "--disable-bias-linear", "--micro-batch-size", "1", "--global-batch-size", "8", "--train-iters", "50",
    "--exit-duration-in-mins", "230", "--no-check-for-nan-in-loss-and-grad", "--no-rope-fusion", "--manual-gc",
    "--manual-gc-interval", "100", "--recompute-granularity", "selective", "--recompute-modules", "layernorm",
    "mla_up_proj", "mlp", "moe_act", "--fine-grained-activation-offloading", "--offload-modules", "expert_fc1",
    "moe_act", "attn_norm", "mlp_norm", "qkv_linear", "core_attn", "attn_proj", "--transformer-impl",
    "transformer_engine", "--seq-length", "4096", "--data-cache-path", "${DATA_CACHE_PATH}", "--data-path",
    "${DATA_PATH}/text/common_pile/v01_filtered_data/my-gpt3_00_text_document", "--vocab-file",
    "${DATA_PATH}/text/common_pile/v01_filtered_data/bpe/vocab.json", "--merge-file",
    "${DATA_PATH}/text/common_pile/v01_filtered_data/bpe/merges.txt", "--split", "949,50,1", "--num-layers", "15",
    "--moe-layer-freq", "([0]*3+[1]*12)", "--pipeline-model-parallel-layout", "Et*3|(tt|)*6mL", "--hidden-size",
    "1024", "--ffn-hidden-size", "4096", "--num-attention-heads", "32", "--kv-channels", "128",
    "--max-position-embeddings", "4096", "--position-embedding-type", "rope", "--rotary-base", "10000",
    "--make-vocab-size-divisible-by", "3232", "--normalization", "RMSNorm", "--norm-epsilon", "1e-6", "--swiglu",
    "--untie-embeddings-and-output-weights", "--multi-latent-attention", "--mtp-num-layers", "1",
    "--mtp-loss-scaling-factor", "0.1", "--attention-dropout", "0.0", "--hidden-dropout", "0.0", "--clip-grad",
    "1.0", "--weight-decay", "0.1", "--qk-layernorm", "--lr-warmup-fraction", "0.01", "--lr", "0.00015",
    "--min-lr", "1e-05", "--lr-decay-style", "cosine", "--adam-beta1", "0.9", "--adam-beta2", "0.95",
    "--num-experts", "32", "--moe-ffn-hidden-size", "1024", "--moe-shared-expert-intermediate-size", "1024",
    "--moe-router-load-balancing-type", "seq_aux_loss", "--moe-router-topk", "4", "--moe-token-dispatcher-type",
    "alltoall", "--moe-router-pre-softmax", "--moe-grouped-gemm", "--moe-aux-loss-coeff", "1e-4",
    "--moe-router-group-topk", "2", "--moe-router-num-groups", "4", "--moe-router-topk-scaling-factor", "2.0",
    "--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias", "--moe-router-bias-update-rate",
    "1e-3", "--moe-router-dtype", "fp32", "--moe-permute-fusion", "--q-lora-rank", "1536", "--kv-lora-rank", "512",
    "--qk-head-dim", "128", "--qk-pos-emb-head-dim", "64", "--v-head-dim", "128", "--rotary-scaling-factor", "40",
    "--mscale", "1.0", "--mscale-all-dim", "1.0", "--eval-iters", "32", "--eval-interval", "200", "--save",
    "${CHECKPOINT_SAVE_PATH}", "--load", "${CHECKPOINT_LOAD_PATH}", "--save-interval", "25", "--init-method-std",
    "0.02", "--log-timers-to-tensorboard", "--log-memory-to-tensorboard", "--log-num-zeros-in-grad",
    "--log-params-norm", "--log-validation-ppl-to-tensorboard", "--log-throughput", "--log-interval", "1",
    "--logging-level", "40", "--tensorboard-dir", "${TENSORBOARD_PATH}", "--bf16", "--exit-interval", "50",
    "--overlap-moe-expert-parallel-comm", "--async-save", "--use-persistent-ckpt-worker",
]

REAL_ARGVS = [GPT3_7B_TP1_PP4, DEEPSEEK_PROXY_FSDP_EP2, MOE_FINE_GRAINED_OFFLOADING]


def test_dense_gpt_command_line():
    raw, problems = parse_megatron_argv(GPT3_7B_TP1_PP4)
    assert problems == ()
    assert isinstance(raw, RawArgs) and raw.source == "command line"
    got = {dest: s.value for dest, s in raw.settings.items()}
    assert len(got) == 54          # 54 flags, none repeated
    assert got["num_layers"] == 32 and got["hidden_size"] == 4096 and got["num_query_groups"] == 8
    assert got["seq_length"] == 8192 and got["vocab_size"] == 131073
    assert got["pipeline_model_parallel_size"] == 4 and got["num_layers_per_virtual_pipeline_stage"] == 1
    assert got["weight_decay"] == 0.01 and got["min_lr"] == 1e-05 and got["lr"] == 0.00015
    assert got["split"] == "949,50,1" and got["tokenizer_type"] == "NullTokenizer"
    assert got["use_distributed_optimizer"] is True and got["bf16"] is True
    assert got["gradient_accumulation_fusion"] is False
    assert raw.settings["gradient_accumulation_fusion"].location == "--no-gradient-accumulation-fusion"
    assert got["save"] == "${CHECKPOINT_SAVE_PATH}"


def test_moe_mla_command_line():
    raw, problems = parse_megatron_argv(DEEPSEEK_PROXY_FSDP_EP2)
    assert problems == ()
    got = {dest: s.value for dest, s in raw.settings.items()}
    assert got["moe_layer_freq"] == [0, 1]
    assert got["moe_router_load_balancing_type"] == ["seq_aux_loss"]   # nargs='+' -> a list
    assert got["moe_aux_loss_coeff"] == [1e-4]
    assert got["data_path"] == ["${DATA_PATH}/text/the_pile/shard00/my-gpt3_00_text_document"]
    assert got["attention_backend"] == "unfused"
    assert got["add_bias_linear"] is False and raw.location("add_bias_linear") == "--disable-bias-linear"
    assert got["apply_rope_fusion"] is False
    assert got["layernorm_epsilon"] == 1e-6 and got["num_experts"] == 8 and got["moe_router_topk"] == 4
    assert got["fp8"] == "e4m3" and got["fp8_recipe"] == "tensorwise"   # --fp8-format stores into fp8
    assert got["make_vocab_size_divisible_by"] == 64


def test_moe_offloading_command_line():
    got = values(*MOE_FINE_GRAINED_OFFLOADING)
    assert got["moe_layer_freq"] == [0, 0, 0] + [1] * 12
    assert got["recompute_modules"] == ["layernorm", "mla_up_proj", "mlp", "moe_act"]
    assert got["offload_modules"] == ["expert_fc1", "moe_act", "attn_norm", "mlp_norm", "qkv_linear",
                                      "core_attn", "attn_proj"]
    assert got["pipeline_model_parallel_layout"] == "Et*3|(tt|)*6mL"
    assert got["rotary_scaling_factor"] == 40.0 and type(got["rotary_scaling_factor"]) is float
    assert got["tensor_model_parallel_size"] == 2 and got["expert_model_parallel_size"] == 4


def _calibration_argvs(rows: list[dict]):
    return [(row["test_case"], json.loads(row["argv_json"])) for row in rows]


def test_every_calibration_command_line_parses_cleanly_and_agrees_with_argparse(calibration_rows):
    argvs = _calibration_argvs(calibration_rows)
    assert len(argvs) == 337
    for name, argv in argvs:
        raw, problems = parse_megatron_argv(argv)
        assert problems == (), (name, problems)
        _assert_same_as_argparse(argv, raw)


# -- a cross-check: Python's argparse configured from the table -------------------------------


def _megatron_pattern(text: str):
    # An independent oracle for moe_freq_type & co: the character check, then eval without builtins.
    if re.search(r"[^,\d\[\]\(\)\+\*]", text):
        raise ValueError(text)
    return eval(text, {"__builtins__": {}}, {})  # noqa: S307 - test oracle on a checked charset


def _freq_oracle(text: str):
    return _megatron_pattern(text) if "[" in text else int(text)


def _tuple_oracle(text: str):
    return tuple(int(i) for i in text.strip("()").split(","))


def _argparse_type(spec: FlagSpec):
    if spec.type in ("int", "float", "str", "bool"):
        return {"int": int, "float": float, "str": str, "bool": bool}[spec.type]
    if spec.type in ("moe_freq_type", "la_freq_type", "no_rope_freq_type"):
        return _freq_oracle
    if spec.type == "tuple_type":
        return _tuple_oracle
    if spec.type == "_parse_cuda_graph_modules_arg":
        return functools.partial(convert_value, dataclasses.replace(spec, choices=None))
    return None   # no type, or an enum by name: the string itself, checked against the choices


@functools.cache
def _reference_parser() -> argparse.ArgumentParser:
    """Megatron's parser shape (allow_abbrev=False, -h/--help), every flag from the table."""
    parser = argparse.ArgumentParser(prog="pretrain_gpt.py", allow_abbrev=False)
    for spec in flag_table():
        kwargs = {"dest": spec.dest, "default": spec.default}
        if spec.action == "argparse.BooleanOptionalAction":
            parser.add_argument(spec.flag, action=argparse.BooleanOptionalAction, **kwargs)
            continue
        if spec.action in ("store_true", "store_false"):
            parser.add_argument(*spec.option_strings, action=spec.action, **kwargs)
            continue
        if spec.nargs is not None:
            kwargs["nargs"] = spec.nargs
        if spec.choices is not None:
            kwargs["choices"] = spec.choices
        converter = _argparse_type(spec)
        if converter is not None:
            kwargs["type"] = converter
        parser.add_argument(*spec.option_strings, **kwargs)
    return parser


def _argparse(argv):
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        return _reference_parser().parse_args(argv)


def _assert_same_as_argparse(argv, raw: RawArgs):
    namespace = vars(_argparse(argv))
    table = flag_table()
    for dest, expected in namespace.items():
        if raw.given(dest):
            assert raw.value(dest) == expected, (dest, raw.value(dest), expected)
        else:
            assert table.default(dest) == expected, (dest, "not set by us, but argparse has", expected)


ACCEPTED_BY_BOTH = [
    ["--num-layers=4", "--hidden-size", "64", "--num-layers", "8"],
    ["--min-lr", "-1", "--lr", "-.5", "--init-method-std=-1e-5"],
    ["--data-path", "--seq-length", "8"],                       # nargs='*' takes nothing
    ["--data-path", "a", "b", "c", "--split=1,0,0"],
    ["--rampup-batch-size", "16", "16", "1000"],
    ["--recompute-modules=core_attn", "--cp-comm-type", "p2p", "a2a"],
    ["--rl-skip-bos-token", "--no-rl-skip-bos-token", "--rl-partial-rollouts"],
    ["--no-pad-vocab-size", "--disable-gloo-process-groups", "--no-rope-fusion"],
    ["--yarn-correction-range-round-to-int", "--no-yarn-correction-range-round-to-int"],
    ["--moe-layer-freq", "[1,0,1]", "--window-attn-skip-freq", "4", "--no-rope-freq", "([0]*3+[1]*1)*2"],
    ["--linear-attention-freq", "3*[1]+[0]", "--window-size", "(128,0)"],
    ["--attention-backend", "flash", "--exit-signal", "SIGUSR1", "--flash-attention-version", "3"],
    ["--cuda-graph-modules", "attn", "moe_router", "--cuda-graph-scope", "full_iteration"],
    ["--onnx-safe", "False"],                                   # bool('False') is True, as in Megatron
    ["--export-model-type", "MambaModel", "--kitchen-recipe-number", "2"],
    ["--tokenizer-model=", "--vocab-file", ""],                 # empty strings are values
    ["--empty-unused-memory-level", "2", "--transformer-impl", "local"],
    ["--vocab-file", "-my vocab.json", "--data-path", "-", "-x y"],   # a space, or a lone '-': values
]


@pytest.mark.parametrize("argv", ACCEPTED_BY_BOTH, ids=lambda a: " ".join(a)[:60])
def test_accepted_command_lines_agree_with_argparse(argv):
    raw, problems = parse_megatron_argv(argv)
    assert problems == ()
    _assert_same_as_argparse(argv, raw)


REJECTED_BY_BOTH = [
    ["--num-layer", "4"],
    ["--num-layers"],
    ["--num-layers", "--hidden-size", "4"],
    ["--num-layers", "four"],
    ["--num-layers", "4", "5"],
    ["--bf16", "true"],
    ["--bf16=true"],
    ["--no-rl-skip-bos-token=1"],
    ["stray", "--num-layers", "4"],
    ["--recompute-granularity", "partial"],
    ["--recompute-modules"],
    ["--rampup-batch-size", "16", "16"],
    ["--rampup-batch-size=16"],
    ["--flash-attention-version", "5"],
    ["--moe-router-load-balancing-type", "aux_loss", "bogus"],
    ["--moe-layer-freq", "[1, 0]"],
    ["--moe-layer-freq", "1.5"],
    ["--window-size", "a,b"],
    ["--num-layers", "4", "--", "--hidden-size", "8"],
    ["--help"],
    ["-h"],
    ["--num_layers", "4"],
    ["-num-layers", "4"],
    ["--num-layers", "-0x1"],
]


@pytest.mark.parametrize("argv", REJECTED_BY_BOTH, ids=lambda a: " ".join(a)[:60])
def test_rejected_command_lines_are_rejected_by_argparse_too(argv):
    raw, problems = parse_megatron_argv(argv)
    assert problems, "we accept what argparse rejects"
    with pytest.raises(SystemExit):
        _argparse(argv)


# -- problems, one code at a time -------------------------------------------------------------


def test_unknown_flag_suggests_the_closest():
    problem = only_problem("--tensor-model-paralel-size", "2")
    assert problem.code == "unknown-flag"
    assert str(problem) == "--tensor-model-paralel-size: unknown flag; did you mean --tensor-model-parallel-size?"
    assert str(only_problem("--num_layers", "4")) == "--num_layers: unknown flag; did you mean --num-layers?"
    assert str(only_problem("-num-layers", "4")) == "-num-layers: unknown flag; did you mean --num-layers?"
    assert str(only_problem("--seq-len=8")) == "--seq-len: unknown flag; did you mean --seq-length?"
    assert str(only_problem("--zzzzzzzz")) == "--zzzzzzzz: unknown flag"


def test_closest_flags():
    assert closest_flags("--num_layers")[0] == "--num-layers"
    assert closest_flags("--hiden-size", n=1) == ["--hidden-size"]
    assert len(closest_flags("--pipeline-parallel-size", n=3)) == 3
    assert closest_flags("--qqqqqqqqqqqq") == []


def test_values_after_an_unknown_flag_are_not_reported_again():
    raw, problems = parse("--moe-expert-count", "8", "16", "--num-layers", "4")
    assert [p.code for p in problems] == ["unknown-flag"]
    assert raw.value("num_layers") == 4


def test_missing_value():
    assert str(only_problem("--num-layers")) == "--num-layers: expects a value but the command line ends"
    problem = only_problem("--num-layers", "--hidden-size", "8")
    assert (problem.code, str(problem)) == ("missing-value", "--num-layers: expects a value but --hidden-size follows")
    assert str(only_problem("--recompute-modules", "--bf16")) == \
        "--recompute-modules: expects at least one value but --bf16 follows"
    assert str(only_problem("--rampup-batch-size", "16", "16")) == "--rampup-batch-size: expects 3 values, got 2"
    assert str(only_problem("--rampup-batch-size=16")) == \
        "--rampup-batch-size: expects 3 values; '=16' gives one (write --rampup-batch-size followed by 3 values)"


def test_a_negative_exponent_reads_as_an_option_as_in_argparse():
    raw, problems = parse("--lr", "-1e-5", "--num-layers", "2")
    assert [str(p) for p in problems] == [
        "--lr: expects a value but -1e-5 follows (argparse reads -1e-5 as an option; write --lr=-1e-5)"]
    assert not raw.given("lr") and raw.value("num_layers") == 2
    assert values("--lr=-1e-5") == {"lr": -1e-05}


def test_negative_numbers_are_values():
    assert values("--min-lr", "-1", "--lr", "-.5", "--seed", "-3") == {"min_lr": -1.0, "lr": -0.5, "seed": -3}
    assert values("--rampup-batch-size", "-1", "-2", "-3") == {"rampup_batch_size": [-1, -2, -3]}


def test_invalid_value_names_the_expected_type():
    problem = only_problem("--num-layers", "four")
    assert (problem.code, str(problem)) == ("invalid-value", "--num-layers: invalid value 'four': expected an integer")
    assert str(only_problem("--lr", "fast")) == "--lr: invalid value 'fast': expected a number"
    assert str(only_problem("--window-size", "a,b")) == \
        "--window-size: invalid value 'a,b': expected comma-separated integers such as 1,2 or (1,2)"
    assert str(only_problem("--cuda-graph-modules", "attn", "everything")).startswith(
        "--cuda-graph-modules: invalid value 'everything': expected one of attn, mlp, moe, moe_router")
    raw, problems = parse("--num-layers", "four")
    assert not raw.given("num_layers")


def test_invalid_choice_lists_the_choices():
    problem = only_problem("--recompute-granularity", "ful")
    assert problem.code == "invalid-choice"
    assert str(problem) == "--recompute-granularity: invalid choice 'ful'; choose from full, selective (did you mean full?)"
    assert str(only_problem("--flash-attention-version", "5")) == \
        "--flash-attention-version: invalid choice 5; choose from 2, 3, 4"
    assert only_problem("--attention-backend", "flash-attn").code == "invalid-choice"
    assert only_problem("--moe-router-load-balancing-type", "aux_loss", "bogus").code == "invalid-choice"


def test_unexpected_argument():
    problem = only_problem("--bf16", "true")
    assert (problem.code, str(problem)) == ("unexpected-argument", "--bf16: unexpected argument 'true' (this flag takes no value)")
    assert str(only_problem("--num-layers", "4", "5", "6")) == \
        "--num-layers: unexpected arguments '5' '6' (this flag takes one value)"
    assert str(only_problem("pretrain_gpt.py", "--num-layers", "4")) == \
        "<command>: unexpected argument 'pretrain_gpt.py': Megatron takes only --flags (is a flag missing before it?)"
    raw, problems = parse("--num-layers", "4", "--", "--hidden-size", "8")
    assert [str(p) for p in problems] == [
        "<command>: '--' ends the options; Megatron rejects it and the 2 arguments after it"]
    assert raw.value("num_layers") == 4 and not raw.given("hidden_size")


def test_ignored_explicit_value():
    problem = only_problem("--bf16=true")
    assert (problem.code, str(problem)) == (
        "ignored-explicit-value", "--bf16: this flag takes no value; Megatron rejects '=true' (write --bf16 alone)")
    assert only_problem("--no-rl-skip-bos-token=").code == "ignored-explicit-value"


def test_help_flag():
    assert only_problem("--help").code == "help-flag"
    assert str(only_problem("-h")) == "-h: Megatron prints its help and exits instead of training"


def test_all_problems_are_reported_together_in_order():
    raw, problems = parse("--num-layer", "4", "--hidden-size", "x", "--bf16=1", "--recompute-granularity", "no",
                          "--seq-length")
    assert [p.code for p in problems] == ["unknown-flag", "invalid-value", "ignored-explicit-value",
                                          "invalid-choice", "missing-value"]
    assert raw.settings == {}


# -- values -----------------------------------------------------------------------------------


def test_equals_forms():
    assert values("--num-layers=4", "--data-path=a b", "--split=949,50,1", "--tokenizer-model=") == {
        "num_layers": 4, "data_path": ["a b"], "split": "949,50,1", "tokenizer_model": ""}
    assert values("--vocab-file=a=b") == {"vocab_file": "a=b"}
    assert only_problem("--num-layers=").code == "invalid-value"


def test_repeated_flags_last_wins():
    raw, problems = parse("--num-layers", "4", "--num-layers=8", "--data-path", "a", "b", "--data-path", "c")
    assert problems == ()
    assert raw.value("num_layers") == 8 and raw.value("data_path") == ["c"]
    assert raw.location("num_layers") == "--num-layers"
    raw, _ = parse("--no-pad-vocab-size", "--disable-pad-vocab-size")
    assert raw.location("pad_vocab_size") == "--disable-pad-vocab-size"


def test_nargs_forms():
    assert values("--data-path", "--bf16") == {"data_path": [], "bf16": True}
    assert values("--hierarchical-context-parallel-sizes", "2", "4") == {"hierarchical_context_parallel_sizes": [2, 4]}
    assert values("--moe-aux-loss-coeff", "1e-2", "1e-3") == {"moe_aux_loss_coeff": [0.01, 0.001]}
    assert values("--rampup-batch-size", "32", "32", "2000") == {"rampup_batch_size": [32, 32, 2000]}
    assert values("--spec", "local") == {"spec": ["local"]}


def test_boolean_optional_action():
    assert values("--rl-use-sequence-packing") == {"rl_use_sequence_packing": True}
    assert values("--no-rl-use-sequence-packing") == {"rl_use_sequence_packing": False}
    assert values("--no-inference-disable-ep-consensus", "--inference-disable-ep-consensus") == {
        "inference_disable_ep_consensus": True}
    assert values("--yarn-correction-range-round-to-int") == {"yarn_correction_range_round_to_int": True}
    assert values("--no-yarn-correction-range-round-to-int") == {"yarn_correction_range_round_to_int": False}


def test_moe_freq_type_forms():
    assert values("--moe-layer-freq", "4") == {"moe_layer_freq": 4}
    assert values("--moe-layer-freq", "[1,0,1]") == {"moe_layer_freq": [1, 0, 1]}
    freq = values("--moe-layer-freq", "([0]*3+[1]*58)")["moe_layer_freq"]
    assert len(freq) == 61 and freq[:4] == [0, 0, 0, 1] and sum(freq) == 58
    assert values("--moe-layer-freq", "([1]*3+[0]*1)*3")["moe_layer_freq"] == [1, 1, 1, 0] * 3
    assert values("--moe-layer-freq", "2*[1,0]+[0]*(1+1)")["moe_layer_freq"] == [1, 0, 1, 0, 0, 0]
    assert values("--no-rope-freq", "[0,1]*2") == {"no_rope_freq": [0, 1, 0, 1]}
    assert values("--moe-layer-freq", "[1]*0+[0]*3*2") == {"moe_layer_freq": [0] * 6}
    assert values("--linear-attention-freq", "4") == {"linear_attention_freq": 4}


@pytest.mark.parametrize("text", ["[1, 0]", "[1]-[0]", "[[1]]", "(1,2)", "[1]*[2]", "[1]+1", "[0]**2",
                                  "[1,0", "[0]*10000000", "x", "1.5", "[1][0]", "(" * 500 + "[1]" + ")" * 500,
                                  "[" + "9" * 5000 + "]", "[0]*99999999999*99999999999"])
def test_moe_freq_type_rejects(text):
    problem = only_problem("--moe-layer-freq", text)
    assert problem.code == "invalid-value" and problem.location == "--moe-layer-freq"
    assert problem.message.startswith(f"invalid value {text!r}: ")


def test_eval_layer_pattern_never_evaluates_code():
    with pytest.raises(ValueError):
        eval_layer_pattern("__import__('os').system('true')")
    assert eval_layer_pattern("[0]+[1]*2") == [0, 1, 1]


def test_enum_and_converter_values_are_kept_by_name():
    assert values("--attention-backend", "local", "--exit-signal", "SIGINT") == {
        "attention_backend": "local", "exit_signal": "SIGINT"}
    assert values("--cuda-graph-modules", "attn", "mlp") == {"cuda_graph_modules": ["attn", "mlp"]}
    assert values("--window-size", "4096,0") == {"window_size": (4096, 0)}
    assert values("--onnx-safe", "False") == {"onnx_safe": True}   # argparse type=bool: bool('False')


def test_locations_per_token():
    argv = ["--num-layers", "4", "--hidden-size", "x", "--bf16", "yes", "--tensor-model-paralel-size", "2"]
    where = ["run.sh:3", "run.sh:3", "run.sh:4", "run.sh:4", "run.sh:5", "run.sh:5", "run.sh:6", "run.sh:6"]
    raw, problems = parse_megatron_argv(argv, locations=where, source="run.sh")
    assert raw.source == "run.sh"
    assert raw.location("num_layers") == "run.sh:3 --num-layers"
    assert raw.location("bf16") == "run.sh:5 --bf16"
    assert [p.location for p in problems] == ["run.sh:4 --hidden-size", "run.sh:5 --bf16", "run.sh:6 --tensor-model-paralel-size"]
    raw, problems = parse_megatron_argv(["stray"], locations=["run.sh:9"])
    assert problems[0].location == "run.sh:9"
    with pytest.raises(ValueError):
        parse_megatron_argv(["--bf16"], locations=[])


def test_conditional_flags_are_accepted_with_a_note():
    raw, problems = parse("--export-model-type", "MambaModel", "--num-layers", "2", "--kitchen-recipe-number", "3")
    assert problems == ()
    assert raw.value("export_model_type") == "MambaModel" and raw.value("kitchen_recipe_number") == 3
    notes = conditional_flag_notes(raw)
    assert [(n.code, n.location) for n in notes] == [("conditional-flag", "--export-model-type"),
                                                     ("conditional-flag", "--kitchen-recipe-number")]
    assert "nvidia-modelopt" in notes[0].message and "kitchen" in notes[1].message
    assert conditional_flag_notes(parse_megatron_argv(GPT3_7B_TP1_PP4)[0]) == ()


def test_defaults_are_cached_per_release_and_follow_the_chosen_one():
    # Megatron's default namespace is built once per release's table (flag_table caches
    # one table per label), and flag_table(label) answers for that release.  The value:
    # megatron/training/arguments.py --data-parallel-sharding-strategy, default 'no_shard' at
    # core_v0.14.0 and 'optim_grads_params' at main d98e8a64.
    main_table = flag_table()
    old_table = flag_table("0.14.0")
    assert old_table is flag_table("0.14.0") and old_table is not main_table
    assert old_table._plain_namespace() is old_table._plain_namespace()
    assert old_table.defaults()["data_parallel_sharding_strategy"] == "no_shard"
    assert flag_table("main") is main_table
    assert main_table.defaults()["data_parallel_sharding_strategy"] == "optim_grads_params"


def test_namespace_default_is_defaults_get():
    table = flag_table()
    defaults = table.defaults()
    for dest in table.dests():
        assert table.namespace_default(dest) == defaults.get(dest), dest
    assert table.namespace_default("export_model_type") is None     # conditional: not in the namespace
    assert table.namespace_default("no_such_dest") is None
    value = table.namespace_default("cp_comm_type")
    value.append("a2a")
    assert table.namespace_default("cp_comm_type") == ["p2p"]


def test_every_literal_of_the_tables_reads_as_literal_eval():
    # read_literal reads the common forms with patterns; each cell of the flag tables must
    # give what ast.literal_eval (the table's writer used repr) gives, type included.
    import ast

    from megatron_estimator.core.resources import read_data_text
    from megatron_estimator.megatron.flags import read_literal

    cells = set()
    for name in ("megatron_flags.tsv", "megatron_flag_history.tsv"):
        for line in read_data_text(name).splitlines()[1:]:
            row = line.split("\t")
            if len(row) > 8 and not line.startswith("#"):
                cells.update(c for c in (row[6], row[8]) if c)
    cells -= {"default", "const"}
    assert len(cells) > 20
    for cell in sorted(cells):
        assert read_literal(cell) == ast.literal_eval(cell), cell
        assert type(read_literal(cell)) is type(ast.literal_eval(cell)), cell
