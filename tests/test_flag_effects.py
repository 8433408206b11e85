"""Every Megatron flag either changes the estimate, is a stated assumption, or is documented
as not changing memory (megatron_estimator/data/flag_effects.tsv, read by
megatron_estimator/megatron/flag_effects.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from megatron_estimator.megatron import flag_effects as fe
from megatron_estimator.inputs.argv import parse_megatron_argv
from megatron_estimator.megatron.flags import flag_table

PACKAGE = Path(fe.__file__).resolve().parents[1]

# The modules that turn a validated namespace into the estimate.  A MODELLED dest must be
# named as a string literal in one of them; add a module here when the estimate reads a dest
# from it.  Loaders, validation and the CLI also name dests, but reading a dest there does
# not put it in the estimate.
ESTIMATE_SOURCES = ("config", "model")

TABLES = {
    "MODELLED": fe.MODELLED,
    "NOT_MODELLED": fe.NOT_MODELLED,
    "NO_MEMORY_EFFECT": fe.NO_MEMORY_EFFECT,
}


def _misclassified(dests) -> list[str]:
    problems = []
    for dest in sorted(set(dests)):
        homes = [name for name, table in TABLES.items() if dest in table]
        if len(homes) != 1:
            problems.append(f"{dest}: in {', '.join(homes) if homes else 'no table'}")
    return problems


def test_every_dest_of_the_flag_table_is_in_exactly_one_table():
    dests = flag_table().dests()
    assert len(dests) > 800            # the whole table, not a stub
    problems = _misclassified(dests)
    assert not problems, ("classify these dests in megatron_estimator/data/flag_effects.tsv "
                          "(read how Megatron uses each first):\n" + "\n".join(problems))


def test_every_conditional_flag_is_classified():
    conditional = [spec.dest for spec in flag_table() if spec.conditional]
    assert {spec.conditional for spec in flag_table() if spec.conditional} == {"modelopt", "kitchen"}
    assert not _misclassified(conditional)
    assert fe.classify("export_kd_teacher_load") == fe.MODELLED_KIND      # model/distillation.py
    assert fe.classify("modelopt_enabled") == fe.NOT_MODELLED_KIND
    assert fe.classify("kitchen_config_file") == fe.NOT_MODELLED_KIND
    assert fe.classify("export_quant_cfg") == fe.NO_MEMORY_EFFECT_KIND


def test_tables_name_only_megatron_dests():
    known = set(flag_table().dests())
    stale = sorted(f"{dest} ({name})" for name, table in TABLES.items() for dest in table if dest not in known)
    assert not stale, "no longer Megatron flags; remove them:\n" + "\n".join(stale)


def test_no_memory_effect_reasons_are_the_documented_categories():
    used = set(fe.NO_MEMORY_EFFECT.values())
    undocumented = sorted(used - set(fe.CATEGORIES))
    assert not undocumented, f"categories missing from CATEGORIES: {undocumented}"
    unused = sorted(set(fe.CATEGORIES) - used)
    assert not unused, f"categories no flag uses: {unused}"
    assert all(text.strip() for text in fe.CATEGORIES.values())
    assert fe.NO_MEMORY_EFFECT["log_interval"] == fe.LOGGING == "logging"
    assert fe.NO_MEMORY_EFFECT["lr"] == fe.LR_SCHEDULE
    assert fe.NO_MEMORY_EFFECT["save"] == fe.CHECKPOINTING
    assert fe.NO_MEMORY_EFFECT["rl_kv_cache_management_mode"] == fe.RL_ONLY
    assert fe.NO_MEMORY_EFFECT["inference_dynamic_batching_buffer_size_gb"] == fe.INFERENCE_ONLY
    assert fe.NO_MEMORY_EFFECT["batch_size"] == fe.DEPRECATED


def test_assumption_texts_read_as_report_lines():
    for dest, text in fe.NOT_MODELLED.items():
        assert text == text.strip() and text, dest
        assert "\n" not in text and not text.endswith("."), dest
        assert not text.startswith("--"), f"{dest}: the report puts the flag in front of the text"


def _string_literals(paths) -> set[str]:
    literal = re.compile(r"""(["'])([a-z][a-z0-9_]*)\1""")
    found: set[str] = set()
    for path in paths:
        found.update(match.group(2) for match in literal.finditer(path.read_text(encoding="utf-8")))
    return found


def test_modelled_dests_are_read_by_the_estimate():
    paths = []
    for name in ESTIMATE_SOURCES:
        target = PACKAGE / name
        paths.extend(sorted(target.rglob("*.py")) if target.is_dir() else [target])
    assert all(p.exists() for p in paths) and len(paths) >= 8
    assert all(p.name != "flag_effects.py" for p in paths)
    named = _string_literals(paths)
    missing = sorted(fe.MODELLED - named)
    assert not missing, ("MODELLED dests that the estimate's source ("
                         + ", ".join(ESTIMATE_SOURCES) + ") never names; model them or move them "
                         "to NOT_MODELLED:\n" + "\n".join(missing))


def test_memory_assumptions_for_given_dests():
    given = ["log_interval", "cuda_graph_impl", "num_layers", "moe_enable_deepep", "tp_comm_overlap_cfg",
             "moe_enable_deepep", "world_size"]
    # Each flag once, in the order given, with its NOT_MODELLED entry (data/flag_effects.tsv).
    expected = [(flag, fe.NOT_MODELLED[dest]) for flag, dest in (
        ("--moe-enable-deepep", "moe_enable_deepep"), ("--cuda-graph-impl", "cuda_graph_impl"),
        ("--tp-comm-overlap-cfg", "tp_comm_overlap_cfg"))]
    assert all("not modelled" in why for _, why in expected)
    assert fe.memory_assumptions(given) == expected
    assert fe.memory_assumptions(reversed(given)) == expected
    assert fe.memory_assumptions(["num_layers", "lr", "save"]) == []


def test_memory_assumptions_name_store_false_flags_as_spelled():
    assert fe.memory_assumptions(["clone_scatter_output_in_embedding"]) == [
        ("--no-clone-scatter-output-in-embedding", fe.NOT_MODELLED["clone_scatter_output_in_embedding"])]


def test_memory_assumptions_skip_values_at_megatron_default():
    values = {"cuda_graph_impl": "none", "moe_enable_deepep": True, "manual_gc": False}
    assert fe.memory_assumptions(values, values) == [("--moe-enable-deepep", fe.NOT_MODELLED["moe_enable_deepep"])]
    values["manual_gc"] = True
    assert [flag for flag, _ in fe.memory_assumptions(values, values)] == ["--moe-enable-deepep", "--manual-gc"]


def test_memory_assumptions_for_a_ci_launch():
    # Megatron-LM CI's gpt/gpt3_mcore_te_tp2_zp_z3_resume_fsdp_dtensor (its argv as the CI
    # builds it): --megatron-fsdp-main-params-dtype fp32 is Megatron's default, so it is not listed.
    argv = [
        "--num-layers", "12", "--hidden-size", "512", "--num-attention-heads", "8", "--log-params-norm",
        "--log-num-zeros-in-grad", "--log-validation-ppl-to-tensorboard", "--log-timers-to-tensorboard",
        "--log-memory-to-tensorboard", "--tensorboard-dir", "${TENSORBOARD_PATH}", "--micro-batch-size", "4",
        "--global-batch-size", "32", "--seq-length", "1024", "--max-position-embeddings", "1024",
        "--train-iters", "100", "--timing-log-level", "0", "--lr-decay-iters", "320000",
        "--save", "${CHECKPOINT_SAVE_PATH}", "--load", "${CHECKPOINT_LOAD_PATH}",
        "--data-path", "${DATA_PATH}/text/common_pile/v01_filtered_data/my-gpt3_00_text_document",
        "--vocab-file", "${DATA_PATH}/text/common_pile/v01_filtered_data/bpe/vocab.json",
        "--merge-file", "${DATA_PATH}/text/common_pile/v01_filtered_data/bpe/merges.txt",
        "--split", "949,50,1", "--distributed-backend", "nccl", "--lr", "0.00015", "--lr-decay-style", "cosine",
        "--min-lr", "1e-05", "--weight-decay", "1e-2", "--clip-grad", "1.0", "--lr-warmup-fraction", "0.01",
        "--log-interval", "1", "--save-interval", "50", "--eval-interval", "1000", "--eval-iters", "10",
        "--transformer-impl", "transformer_engine", "--tensor-model-parallel-size", "2", "--use-megatron-fsdp",
        "--calculate-per-token-loss", "--data-parallel-sharding-strategy", "optim_grads_params",
        "--use-distributed-optimizer", "--deterministic-mode", "--no-gradient-accumulation-fusion",
        "--megatron-fsdp-main-params-dtype", "fp32", "--megatron-fsdp-main-grads-dtype", "fp32",
        "--megatron-fsdp-grad-comm-dtype", "fp32", "--attention-softmax-in-fp32",
        "--use-checkpoint-opt_param-scheduler", "--use-mcore-models", "--ckpt-format", "fsdp_dtensor",
        "--data-cache-path", "${DATA_CACHE_PATH}", "--bf16", "--async-save", "--use-persistent-ckpt-worker",
    ]
    raw, problems = parse_megatron_argv(argv)
    assert problems == ()
    values = {dest: setting.value for dest, setting in raw.settings.items()}
    assert fe.memory_assumptions(raw.settings, values) == [
        ("--megatron-fsdp-main-grads-dtype", fe.NOT_MODELLED["megatron_fsdp_main_grads_dtype"]),
        ("--megatron-fsdp-grad-comm-dtype", fe.NOT_MODELLED["megatron_fsdp_grad_comm_dtype"]),
    ]
    assert len(fe.memory_assumptions(raw.settings)) == 3      # without values: the fp32 default too


def test_classify():
    assert fe.classify("num_layers") == fe.MODELLED_KIND == "modelled"
    # Modelled since: the momentum buffer, the cuBLAS workspaces, deferred wgrad buffers.
    assert {fe.classify(d) for d in ("sgd_momentum", "deterministic_mode", "wgrad_deferral_limit")} == {"modelled"}
    assert fe.classify("moe_enable_deepep") == fe.NOT_MODELLED_KIND == "not modelled"
    assert fe.classify("log_interval") == fe.NO_MEMORY_EFFECT_KIND == "no memory effect"
    with pytest.raises(KeyError, match="num_layerz"):
        fe.classify("num_layerz")


@pytest.mark.parametrize("dest", [
    "moe_enable_deepep", "cuda_graph_impl", "enable_cuda_graph", "tp_comm_overlap_cfg", "nccl_ub",
    "use_torch_fsdp2", "empty_unused_memory_level", "manual_gc", "freeze_all_layers",
    "perform_rl_step", "eval_micro_batch_size", "cp_comm_type",
    "use_checkpoint_args", "moe_layer_recompute", "clone_scatter_output_in_embedding",
])
def test_flags_that_change_memory_are_stated_assumptions(dest):
    assert fe.classify(dest) == fe.NOT_MODELLED_KIND
