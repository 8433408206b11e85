"""Resuming from a checkpoint: whether a run resumes (config/run_context.py ``resume_of``) and
the fully parallel load's broadcast buffers it keeps into its first step (model/checkpoint.py)."""

from __future__ import annotations

import json

from megatron_estimator.inputs.argv import parse_megatron_argv
from megatron_estimator.model.layout import pipeline_stages
from megatron_estimator.model.checkpoint import load_exchange_bytes, resume_load
from megatron_estimator.results.estimate import build_estimate as estimate
from megatron_estimator.model.parameters import chunk_tensors
from megatron_estimator.config.resolve import resolve_config
from megatron_estimator.config.run_context import Resume, resume_of
from megatron_estimator.report.assumptions import LOAD_PATHS, resume_note, state_all

from conftest import TINY_GPT, flags
from test_cli import run

# World 8: tp 2, dp 4, ep 2, etp 2 (the default, = tp), so edp 2.  Ranks of the stage are
# numbered tp fastest, then dp (dense) and etp, ep, edp (experts); the rank the estimate stands
# for is the last, 7: tp 1, dp 3 / etp 1, ep 1, edp 1.  Its data-parallel group is {1, 3, 5, 7},
# whose ep coordinates are 0, 1, 0, 1 and edp coordinates 0, 0, 1, 1.
MOE = (TINY_GPT + " --num-experts 4 --moe-router-topk 1 --moe-router-pre-softmax --disable-bias-linear --sequence-parallel "
       "--tensor-model-parallel-size 2 --expert-model-parallel-size 2 --use-distributed-optimizer "
       "--load /nowhere/ckpt --ckpt-fully-parallel-load")


def config_of(extra: str = "", resume: str = "yes", text: str = MOE, world: int = 8):
    raw, problems = parse_megatron_argv(flags(text, extra))
    assert not problems, problems
    return resolve_config(raw, world_size=world, world_size_source="test", environ={}, resume=resume)


def exchange(config):
    stage = pipeline_stages(config)[0]
    tensors = [chunk_tensors(config, chunk) for chunk in stage.chunks]
    dense = sum(t.numel * t.count for chunk in tensors for t in chunk if not t.expert)
    expert = sum(t.numel * t.count for chunk in tensors for t in chunk if t.expert)
    return load_exchange_bytes(config, tensors), dense, expert


def test_the_rank_receives_the_other_expert_ranks_weights():
    # One optimizer instance: each optimizer piece has one holder, never exchanged.  The
    # other ep rank's expert weights (held by ranks 1 and 5) arrive in bf16 buffers.
    buffers, dense, expert = exchange(config_of())
    assert dense > 0 and expert > 0
    assert buffers == 2 * expert


def test_two_optimizer_instances_exchange_the_other_shards_states():
    # Instances {1, 3} and {5, 7}: every piece has a holder in each instance.  Rank 7 receives
    # the other ep rank's weights (2 B) and fp32 main params and moments of its experts (12 B,
    # edp 2 / 2 instances = 1 shard), and the other intra-instance dense shard (12 B / 2).
    buffers, dense, expert = exchange(config_of("--num-distributed-optimizer-instances 2"))
    assert buffers == 2 * expert + 12 * expert + 12 * dense // 2


def test_no_load_optim_and_finetune_load_the_weights_only():
    for extra in ("--no-load-optim", "--finetune"):
        buffers, dense, expert = exchange(config_of("--num-distributed-optimizer-instances 2 " + extra))
        assert buffers == 2 * expert, extra


def test_a_plain_optimizer_exchanges_expert_states_with_their_weights():
    # Without the distributed optimizer, the expert states are replicated like the expert
    # weights: bf16 weights, fp32 main params and Adam's two fp32 moments of the other ep rank.
    buffers, dense, expert = exchange(config_of(text=MOE.replace(" --use-distributed-optimizer", "")))
    assert buffers == (2 + 4 + 8) * expert


def test_the_expert_data_parallel_group_holds_the_same_experts():
    # --ckpt-fully-parallel-load-process-group ep_dp: the group {3, 7} holds the same experts
    # and the same optimizer pieces, so it exchanges nothing it does not need.
    buffers, _, _ = exchange(config_of("--num-distributed-optimizer-instances 2 "
                                       "--ckpt-fully-parallel-load-process-group ep_dp"))
    assert buffers == 0


def test_a_dense_model_with_one_instance_exchanges_nothing():
    buffers, dense, expert = exchange(config_of(text=TINY_GPT + " --tensor-model-parallel-size 2 "
                                                "--use-distributed-optimizer --load /ckpt --ckpt-fully-parallel-load"))
    assert (buffers, expert) == (0, 0)


def test_nothing_without_a_resume_or_a_fully_parallel_load():
    assert exchange(config_of(resume="no"))[0] == 0
    assert exchange(config_of(text=MOE.replace(" --ckpt-fully-parallel-load", "")))[0] == 0


def test_load_paths_the_estimate_does_not_model_are_said():
    for extra, why in (("--ckpt-fully-parallel-load-exchange-algo gather_rounds", "gather_rounds exchange"),
                       ("--dist-ckpt-optim-fully-reshardable", "fully reshardable")):
        config = config_of(extra)
        load = resume_load(config)
        assert not load.modelled and why in LOAD_PATHS[load.path].format(algo=load.exchange_algo)
        assert exchange(config)[0] == 0
    assert resume_load(config_of()).modelled
    assert resume_load(config_of(resume="no")) is None


def test_the_buffers_are_in_the_peak_and_the_report_says_why():
    fresh = estimate(config_of(resume="no")).stages[0]
    resumed_estimate = estimate(config_of("--num-distributed-optimizer-instances 2"))
    resumed = resumed_estimate.stages[0]
    fresh_two = estimate(config_of("--num-distributed-optimizer-instances 2", resume="no")).stages[0]
    buffers = dict(resumed.details)["checkpoint_load_buffers"]
    assert buffers > 0 and dict(fresh.details)["checkpoint_load_buffers"] == 0
    assert resumed.allocated_peak_bytes == fresh_two.allocated_peak_bytes + buffers
    # The MOE shape by hand, per GPU (tp 2, ep 2, etp 2, no biases, 4 layers, all MoE):
    # dense: word embeddings 1024/2 x 64, positions 32 x 64, final LayerNorm 2 x 64, and per layer
    # two LayerNorms (2 x 2 x 64), qkv 64 x 192 / 2, proj 64 x 64 / 2, router 4 experts x 64;
    # experts: 4 / ep 2 = 2 local experts of fc1 64 x 256 / 2 and fc2 256 x 64 / 2 per layer.
    h, f, layers = 64, 256, 4
    dense = 1024 // 2 * h + 32 * h + 2 * h + layers * (2 * 2 * h + h * 3 * h // 2 + h * h // 2 + 4 * h)
    expert = layers * 2 * (h * f // 2 + f * h // 2)
    assert exchange(config_of("--num-distributed-optimizer-instances 2"))[1:] == (dense, expert)
    # As test_two_optimizer_instances_exchange_the_other_shards_states itemises: the other ep
    # rank's bf16 expert weights, the fp32 main params and moments of its experts, and the other
    # intra-instance dense shard's 12 B per parameter.
    assert buffers == 2 * expert + 12 * expert + 12 * dense // 2
    [text] = [a.text for a in state_all(resumed_estimate.assumed) if a.key == "resume"]
    # The facts the report gives: where it resumes from and why (the flags), what is counted,
    # its size on the stage in MiB (rendered to one decimal), and the other group's figure.
    assert text.startswith("resume: from the checkpoint in --load /nowhere/ckpt (--resume yes)")
    assert "--ckpt-fully-parallel-load: the broadcast buffers" in text and "(counted, an upper bound)" in text
    assert f"{buffers / (1 << 20):.1f} MiB on stage 0" in text
    # ep_dp: rank 7's expert data-parallel group is {3, 7} (same etp and ep); both hold the same
    # experts, the same dense shard (dp index 1 and 3, two shards per instance) and the one expert
    # shard per instance (edp 2 / 2 instances): nothing to receive.
    assert text.endswith("(with --ckpt-fully-parallel-load-process-group ep_dp: none)")
    dense = estimate(config_of(text=TINY_GPT + " --tensor-model-parallel-size 2 --use-distributed-optimizer "
                                         "--load /ckpt --ckpt-fully-parallel-load"))
    assert [a.text for a in state_all(dense.assumed) if a.key == "resume"][0].endswith(
        ": none here (every shard its group exchanges is one this rank holds)")


def resumes(ns, requested):
    """(whether the run resumes, what the report says about it)."""
    resume = resume_of(ns, requested)
    return resume.resumes, resume_note(resume)


def test_auto_resumes_when_the_load_directory_holds_a_checkpoint(tmp_path):
    ns = {"load": str(tmp_path), "ckpt_step": None}
    assert resume_of(ns, "auto") == Resume("auto", str(tmp_path), None)
    assert resumes(ns, "auto") == (False, f"resume: --load {tmp_path} holds no checkpoint "
                                          "(latest_checkpointed_iteration.txt is not there): estimated as a first "
                                          "run; say --resume yes for a run that will find one")
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("50")
    assert resume_of(ns, "auto") == Resume("auto", str(tmp_path), "latest_checkpointed_iteration.txt")
    assert resumes(ns, "auto") == (True, f"resume: from the checkpoint in --load {tmp_path} "
                                         "(latest_checkpointed_iteration.txt is there)")
    assert resumes(ns, "no") == (False, None)
    # --resume yes and no are taken as said: the directory is not read.
    assert resume_of(ns, "yes") == Resume("yes", str(tmp_path), None) and resume_of(ns, "yes").resumes
    assert resume_of(ns, "no") == Resume("no", str(tmp_path), None)


def test_auto_resumes_from_the_ckpt_step_directory(tmp_path):
    (tmp_path / "iter_0000050").mkdir()
    assert resume_of({"load": str(tmp_path), "ckpt_step": 50}, "auto").found == "iter_0000050"
    assert resumes({"load": str(tmp_path), "ckpt_step": 50}, "auto")[0] is True
    assert resumes({"load": str(tmp_path), "ckpt_step": 60}, "auto")[0] is False


def test_without_load_nothing_resumes():
    assert resume_of({"load": None}, "yes") == Resume("yes", None, None)
    assert resume_of({"load": ""}, "auto").load is None
    assert resumes({"load": None}, "auto") == (False, None)
    assert resumes({"load": None}, "yes") == (False, "resume: --resume yes, but there is no --load: nothing is loaded")


def test_the_run_context_carries_the_resume_and_the_gpu():
    # resolve_config's facts beyond the flags travel as the configuration's ``run``.
    config = config_of(resume="yes")
    assert config.run.resume == Resume("yes", "/nowhere/ckpt", None) and config.run.resume.resumes
    assert config.run.gpu_compute_capability is None and config.run.launch_location is None
    assert not config_of(resume="no").run.resume.resumes
    raw, _ = parse_megatron_argv(flags(TINY_GPT))
    run = resolve_config(raw, world_size=1, environ={}, compute_capability=8.0, flash_attn="2.3.0",
                         job_environment=True, launch_location="train.sh:12").run
    assert (run.gpu_compute_capability, run.flash_attn, run.job_environment, run.launch_location) == (
        8.0, "2.3.0", True, "train.sh:12")
    assert run.resume == Resume("auto", None, None) and not run.resume.resumes


def test_the_cli_reads_the_checkpoint_directory(tmp_path):
    argv = flags(MOE.replace("/nowhere/ckpt", str(tmp_path)), "--num-distributed-optimizer-instances 2")
    first = run(["estimate", "--world-size", "8", "--format", "json", "--"] + argv)
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("50")
    again = run(["estimate", "--world-size", "8", "--format", "json", "--"] + argv)
    told = run(["estimate", "--world-size", "8", "--format", "json", "--resume", "no", "--"] + argv)
    assert first.returncode == again.returncode == told.returncode == 0

    def peak(result):
        return json.loads(result.stdout)["stages"][0]["allocated_peak_bytes"]

    config = config_of("--num-distributed-optimizer-instances 2")
    assert peak(again) - peak(first) == exchange(config)[0] > 0
    assert peak(told) == peak(first)


def test_a_bad_resume_value_is_a_usage_problem():
    result = run(["estimate", "--resume", "maybe", "--world-size", "1", "--"] + flags(TINY_GPT))
    assert result.returncode == 2
    assert "invalid choice: 'maybe'" in result.stderr
