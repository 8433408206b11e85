"""Validation that depends on the Megatron release, and main as of a day.

Expected outcomes come from Megatron-LM's sources (git show TAG:FILE in the mirror):
- --deterministic-mode: megatron/training/arguments.py validate_args of core_v0.14.0 ..
  core_v0.18.0 asserts ``not args.use_flash_attn``, ``not args.cross_entropy_loss_fusion`` and
  ``os.getenv("NCCL_ALGO") in ["Tree", "Ring", "CollnetDirect", "CollnetChain", "^NVLS"]``;
  from 3ab71eeb3e (#5041, 2026-07-08; core_v0.19.0 and main) megatron/training/determinism.py
  ARG_VALUES_REQUIRED_FOR_DETERMINISM = {cross_entropy_loss_fusion: False, tp_comm_overlap:
  False}, NCCL_ALGO tokens (when set) in {Ring, CollnetDirect, CollnetChain, ^NVLS},
  NVTE_ALLOW_NONDETERMINISTIC_ALGO in {"0"}, CUBLAS_WORKSPACE_CONFIG in {":4096:8", ":16:8"},
  MAMBA_DETERMINISTIC starting with "1", and on main only (f101c470de, #6655) also
  CAUSAL_CONV1D_DETERMINISTIC.
- MoE with EP > 1 and TP > 1 without sequence parallel: megatron/core/model_parallel_config.py
  raises ValueError in core_v0.14.0, warns from 0532e92748 (#3678; core_v0.15.3 on);
  megatron/core/transformer/moe/moe_layer.py raises in the training forward in every release.
"""

from __future__ import annotations

import pytest

from megatron_estimator.megatron.behaviour import behaviour, behaviour_row, behaviour_rows
from megatron_estimator.megatron.releases import ChosenRelease, labels

GPT = ("--num-layers 2 --hidden-size 256 --num-attention-heads 4 --seq-length 512 "
       "--max-position-embeddings 512 --micro-batch-size 1 --global-batch-size 8 --bf16 "
       "--tokenizer-type NullTokenizer --vocab-size 1000").split()


def verdict_at(release, argv, environ=None, world_size=8, job=False):
    from megatron_estimator.api import evaluate, input_from_flags
    inp, problems = input_from_flags(GPT + argv, environ=environ or {}, release=release)
    if job:
        from dataclasses import replace
        inp = replace(inp, job_environment=True)
    return evaluate(inp, world_size=world_size, environ=environ or {}, problems=problems)


def codes(verdict):
    return sorted((p.code, p.location) for p in verdict.problems)


def main_as_of(day):
    return ChosenRelease("main", f"main as of {day}", as_of=day)


# -- the table ------------------------------------------------------------------------------------

def test_every_rule_covers_every_release_once_and_dates_are_ordered():
    rules = {row.rule for row in behaviour_rows()}
    for rule in rules:
        rows = [r for r in behaviour_rows() if r.rule == rule]
        for label in labels()[labels().index(rows[0].first):]:     # from the release that has it
            assert len([r for r in rows if labels().index(r.first) <= labels().index(label)
                        <= labels().index(r.last)]) == 1, (rule, label)
        assert rows[0].date == "" and all(r.date for r in rows[1:]), rule
        assert [r.date for r in rows[1:]] == sorted(r.date for r in rows[1:]), rule


@pytest.mark.parametrize("day, value", [
    ("2026-07-07", "use_flash_attn,cross_entropy_loss_fusion"),     # the day before 3ab71eeb3e
    ("2026-07-08", "cross_entropy_loss_fusion,tp_comm_overlap"),
    ("2026-08-22", "cross_entropy_loss_fusion,tp_comm_overlap"),
])
def test_main_as_of_a_day_steps_back_past_later_commits(day, value):
    assert behaviour_row("deterministic_mode_forbids", "main", as_of=day).value == value
    assert behaviour("deterministic_mode_forbids", main_as_of(day)) == value


def test_main_as_of_steps_back_more_than_one_row():
    # deterministic_env_one: main row from f101c470de (2026-08-21), 0.19.0 row from 3ab71eeb3e (2026-07-08)
    assert behaviour_row("deterministic_env_one", "main", as_of="2026-08-21").value == \
        "MAMBA_DETERMINISTIC,CAUSAL_CONV1D_DETERMINISTIC"
    assert behaviour_row("deterministic_env_one", "main", as_of="2026-08-20").value == "MAMBA_DETERMINISTIC"
    assert behaviour_row("deterministic_env_one", "main", as_of="2026-07-01").value == ""
    # A dated release label is not moved by as_of.
    assert behaviour_row("deterministic_env_one", "0.19.0", as_of="2026-07-01").value == "MAMBA_DETERMINISTIC"


# -- --deterministic-mode --------------------------------------------------------------------------

@pytest.mark.parametrize("release, flag, refused", [
    ("0.14.0", "--use-flash-attn", True), ("0.18.0", "--use-flash-attn", True),
    ("0.19.0", "--use-flash-attn", False), ("main", "--use-flash-attn", False),
    ("0.14.0", "--tp-comm-overlap", False), ("0.17.1", "--tp-comm-overlap", False),
    ("0.19.0", "--tp-comm-overlap", True), ("main", "--tp-comm-overlap", True),
    ("0.14.0", "--cross-entropy-loss-fusion", True), ("0.16.1", "--cross-entropy-loss-fusion", True),
    ("0.19.0", "--cross-entropy-loss-fusion", True), ("main", "--cross-entropy-loss-fusion", True),
    (main_as_of("2026-07-02"), "--tp-comm-overlap", False), (main_as_of("2026-07-02"), "--use-flash-attn", True),
    (main_as_of("2026-07-08"), "--tp-comm-overlap", True), (main_as_of("2026-07-08"), "--use-flash-attn", False),
])
def test_deterministic_mode_forbids_per_release(release, flag, refused):
    extra = ["--sequence-parallel", "--tensor-model-parallel-size", "2"] if flag == "--tp-comm-overlap" else []
    verdict = verdict_at(release, ["--deterministic-mode", flag, *extra], {"NCCL_ALGO": "Ring"})
    assert (("deterministic-mode-conflict", flag) in codes(verdict)) == refused
    if refused:
        [problem] = [p for p in verdict.problems if p.code == "deterministic-mode-conflict"]
        assert f"{flag} cannot be used with --deterministic-mode" in problem.message


def test_without_deterministic_mode_nothing_is_refused():
    verdict = verdict_at("0.14.0", ["--use-flash-attn"])
    assert "deterministic-mode-conflict" not in [c for c, _ in codes(verdict)]


@pytest.mark.parametrize("release, environ, refused", [
    ("0.14.0", {}, True), ("0.18.0", {}, True),                        # must be set
    ("0.18.0", {"NCCL_ALGO": "Tree"}, False), ("0.18.0", {"NCCL_ALGO": "Ring,Tree"}, True),
    ("0.19.0", {}, False), ("main", {}, False),                        # unset: Ring
    ("main", {"NCCL_ALGO": "Tree"}, True), ("main", {"NCCL_ALGO": "Ring,^NVLS"}, False),
    ("main", {"NCCL_ALGO": "Ring,Tree"}, True),
    ("main", {"NVTE_ALLOW_NONDETERMINISTIC_ALGO": "1"}, True), ("0.18.0", {"NVTE_ALLOW_NONDETERMINISTIC_ALGO": "1", "NCCL_ALGO": "Ring"}, False),
    ("main", {"CUBLAS_WORKSPACE_CONFIG": ":16:8"}, False), ("main", {"CUBLAS_WORKSPACE_CONFIG": ":0:0"}, True),
    ("0.19.0", {"MAMBA_DETERMINISTIC": "0"}, True), ("0.19.0", {"CAUSAL_CONV1D_DETERMINISTIC": "0"}, False),
    ("main", {"CAUSAL_CONV1D_DETERMINISTIC": "0"}, True), ("main", {"CAUSAL_CONV1D_DETERMINISTIC": "1"}, False),
])
def test_deterministic_environment_per_release_in_the_jobs_environment(release, environ, refused):
    verdict = verdict_at(release, ["--deterministic-mode"], environ, job=True)
    assert ("deterministic-mode-environment" in [c for c, _ in codes(verdict)]) == refused


def test_deterministic_environment_is_a_note_outside_the_jobs_environment():
    from megatron_estimator.config.resolve import resolve_config
    from megatron_estimator.inputs.argv import parse_megatron_argv
    assert verdict_at("0.18.0", ["--deterministic-mode"], {}).status != "invalid"
    from megatron_estimator.megatron.releases import release_of
    raw, _ = parse_megatron_argv(GPT + ["--deterministic-mode"], release="0.18.0")
    config = resolve_config(raw, world_size=8, environ={}, release=release_of("0.18.0", "test"))
    assert ("job environment (not checked here): --deterministic-mode needs NCCL_ALGO set to one of Tree, Ring, "
            "CollnetDirect, CollnetChain, ^NVLS (Megatron 0.18.0); it is not set") in config.notes


# -- MoE with tensor parallel and no sequence parallel --------------------------------------------

@pytest.mark.parametrize("release, ep, when", [
    ("0.14.0", 2, "when it builds the model configuration, model_parallel_config.py"),
    ("0.14.0", 1, "at the first training step, moe_layer.py"),
    ("0.15.3", 2, "at the first training step, moe_layer.py"),
    ("0.19.0", 2, "at the first training step, moe_layer.py"),
    ("main", 2, "at the first training step, moe_layer.py"),
])
def test_moe_tensor_parallel_without_sequence_parallel_per_release(release, ep, when):
    verdict = verdict_at(release, ["--num-experts", "4", "--tensor-model-parallel-size", "2",
                                   "--expert-model-parallel-size", str(ep)])
    [problem] = [p for p in verdict.problems if p.code == "moe-tp-needs-sequence-parallel"]
    assert problem.message == ("MoE with tensor parallel size > 1 needs --sequence-parallel "
                               f"(Megatron raises {when})")


def test_moe_with_sequence_parallel_is_accepted_in_every_release():
    for label in ("0.14.0", "0.15.3", "main"):
        verdict = verdict_at(label, ["--num-experts", "4", "--tensor-model-parallel-size", "2",
                                     "--expert-model-parallel-size", "2", "--sequence-parallel"])
        assert "moe-tp-needs-sequence-parallel" not in [c for c, _ in codes(verdict)], label


# -- multi-latent attention with group query attention (dd546099fa, #1929) --------------------------

MLA = ["--multi-latent-attention", "--q-lora-rank", "64", "--kv-lora-rank", "32", "--qk-head-dim", "32",
       "--qk-pos-emb-head-dim", "16", "--v-head-dim", "32", "--position-embedding-type", "rope"]


@pytest.mark.parametrize("release, refused", [("0.14.0", False), ("0.15.3", False), ("0.16.1", True),
                                              ("0.19.0", True), ("main", True),
                                              (main_as_of("2025-12-09"), False), (main_as_of("2025-12-10"), True)])
def test_mla_with_group_query_attention_per_release(release, refused):
    verdict = verdict_at(release, MLA + ["--group-query-attention", "--num-query-groups", "2"])
    assert (("mla-with-gqa", "--group-query-attention") in codes(verdict)) == refused


# -- Megatron-FSDP's optimizer check and distributed optimizer (ab43d43f0b, #4133) ---------------------

FSDP = ["--use-megatron-fsdp", "--ckpt-format", "fsdp_dtensor"]


@pytest.mark.parametrize("release, refused", [("0.16.1", False), ("0.17.1", False), ("0.18.0", True),
                                              ("main", True)])
def test_megatron_fsdp_optimizer_check_per_release(release, refused):
    verdict = verdict_at(release, FSDP + ["--optimizer", "muon"], {"CUDA_DEVICE_MAX_CONNECTIONS": "8"})
    assert (("fsdp-optimizer", "--optimizer") in codes(verdict)) == refused


@pytest.mark.parametrize("release, forced", [("0.17.1", False), ("0.18.0", True), ("main", True)])
def test_megatron_fsdp_turns_on_the_distributed_optimizer_from_0_18(release, forced):
    from conftest import resolve
    config = resolve(" ".join(GPT + FSDP), 8, release=release)
    assert config.optimizer.use_distributed_optimizer == forced
    assert ("Megatron-FSDP v1 turns on the distributed optimizer" in config.notes) == forced


# -- what validate_args asks of the installed Transformer Engine (is_te_min_version) -----------------

def verdict_with_te(release, argv, te, environ=None):
    from megatron_estimator.api import evaluate, input_from_flags
    from megatron_estimator.model.overhead import Overheads
    inp, problems = input_from_flags(GPT + argv, environ=environ or {}, release=release)
    return evaluate(inp, world_size=8, environ=environ or {}, problems=problems,
                    overheads=Overheads(transformer_engine=te))


@pytest.mark.parametrize("release, argv, te, refused", [
    ("main", ["--fp4-format", "e2m1"], "2.6.0", True), ("main", ["--fp4-format", "e2m1"], "2.7.0.dev0+abc", False),
    ("main", ["--fp4-format", "e2m1"], "2.7.0", False), ("main", ["--fp4-format", "e2m1"], None, False),
    ("main", ["--qk-clip"], "2.8.0", True), ("main", ["--qk-clip"], "2.9.0", False),
    ("0.16.1", ["--log-max-attention-logit"], "2.9.0rc1", True), ("0.16.1", ["--log-max-attention-logit"], "2.9.1", False),
    # --delay-wgrad-compute with --overlap-grad-reduce: TE 2.7.0 in 0.14.0, 2.8.0 from d44b5134fe (0.15.3)
    ("0.14.0", ["--delay-wgrad-compute", "--overlap-grad-reduce", "--use-distributed-optimizer"], "2.7.0", False),
    ("0.15.3", ["--delay-wgrad-compute", "--overlap-grad-reduce", "--use-distributed-optimizer"], "2.7.0", True),
    ("main", ["--delay-wgrad-compute", "--overlap-grad-reduce", "--use-distributed-optimizer"], "2.8.0", False),
    ("main", ["--delay-wgrad-compute", "--no-gradient-accumulation-fusion"], "2.6.3", True),
])
def test_transformer_engine_minimum_versions(release, argv, te, refused):
    verdict = verdict_with_te(release, argv, te)
    found = [p for p in verdict.problems if p.code == "transformer-engine-version"]
    assert bool(found) == refused, [str(p) for p in verdict.problems]
    if refused:
        assert f"the job's Transformer Engine is {te}" in found[0].message


def test_fine_grained_offloading_needs_the_cpu_offload_variable_from_te_2_10():
    argv = ["--fine-grained-activation-offloading", "--offload-modules", "core_attn"]
    from megatron_estimator.config.resolve import resolve_config
    from megatron_estimator.inputs.argv import parse_megatron_argv
    raw, _ = parse_megatron_argv(GPT + argv)
    with pytest.raises(Exception) as err:
        resolve_config(raw, world_size=8, environ={}, job_environment=True, transformer_engine="2.10.0")
    assert [p.code for p in err.value.problems] == ["transformer-engine-environment"]
    resolve_config(raw, world_size=8, environ={"NVTE_CPU_OFFLOAD_V1": "1"}, job_environment=True,
                   transformer_engine="2.10.0")
    resolve_config(raw, world_size=8, environ={}, job_environment=True, transformer_engine="2.9.0")


# -- Megatron-FSDP's default sharding per release, in bytes -----------------------------------------

# GPT above: 2 layers of hidden 256, ffn 1024 (qkv 3h^2+3h, proj h^2+h, fc1 hf+f, fc2 fh+h, 4h norms),
# vocabulary 1024 rows (1000, or 1001 before 0.18, padded to 128), 512 learned positions, final norm.
GPT_PARAMETERS = 2 * (3 * 256 * 256 + 3 * 256 + 256 * 256 + 256 + 256 * 1024 + 1024 + 1024 * 256 + 256
                      + 4 * 256) + 1024 * 256 + 512 * 256 + 2 * 256


@pytest.mark.parametrize("release, gradient_bytes", [
    ("0.14.0", GPT_PARAMETERS * 4), ("0.17.1", GPT_PARAMETERS * 4),            # no_shard: fp32 main grads whole
    ("0.18.0", GPT_PARAMETERS * 4 // 8), ("main", GPT_PARAMETERS * 4 // 8),    # optim_grads_params: 1/dp of them
])
def test_megatron_fsdp_default_sharding_in_bytes(release, gradient_bytes):
    verdict = verdict_at(release, FSDP, {"CUDA_DEVICE_MAX_CONNECTIONS": "8"})
    assert verdict.estimate.total_parameters == GPT_PARAMETERS == 1_973_248
    [stage] = verdict.estimate.stages
    figures = stage.to_json()["bytes"]
    assert figures["gradients"] == gradient_bytes
    # fp32 master weights and Adam's two moments (12 B a parameter), sharded over dp 8 either way
    assert figures["optimizer_states"] == GPT_PARAMETERS * 12 // 8


# -- --rampup-batch-size with --train-iters (29e798a48d, 532ad926b4) -----------------------------------

@pytest.mark.parametrize("release, extra, refused", [
    ("0.14.0", [], True), ("0.16.1", [], True), ("0.16.1", ["--skip-train"], True),
    ("0.17.0", [], True), ("0.17.1", ["--skip-train"], False),
    ("0.18.0", [], False), ("main", [], False),
    (main_as_of("2026-04-20"), [], True), (main_as_of("2026-04-21"), [], False),
])
def test_rampup_with_train_iters_per_release(release, extra, refused):
    verdict = verdict_at(release, ["--train-iters", "100", "--rampup-batch-size", "4", "4", "64", *extra])
    assert (("rampup-with-train-iters", "--rampup-batch-size") in codes(verdict)) == refused


def test_rampup_with_train_samples_is_accepted():
    verdict = verdict_at("0.14.0", ["--train-samples", "800", "--rampup-batch-size", "4", "4", "64"])
    assert "rampup-with-train-iters" not in [c for c, _ in codes(verdict)]
