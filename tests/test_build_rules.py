"""Issue 29: what Megatron refuses when it builds, wraps or first runs the model, and the
validate_args asserts an independent differential run found unmirrored (config/rules/,
and the release-dependent query-group rule, the dense MoE overlap of config/rules/moe.py).

Each expectation is read from Megatron-LM's source at the cited line (tags core_v0.14.0 ...
core_v0.19.0 and main d98e8a64); the megatron-core cases at the end run megatron-core 0.16.1's
own classes where they can be built on CPU.  A world of 8, no GPU named (Hopper assumed), an
empty environment: the CUDA_DEVICE_MAX_CONNECTIONS rule is a note, not a refusal, here.
"""

import pytest

from conftest import problems_of

BASE = ("--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 "
        "--max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 32 --train-iters 100 "
        "--lr 1e-4 --min-lr 1e-5 --tokenizer-type NullTokenizer --vocab-size 32000 --mock-data --bf16 "
        "--transformer-impl transformer_engine --position-embedding-type rope --normalization RMSNorm "
        "--swiglu --no-rope-fusion")
MOE = " --num-experts 8 --moe-grouped-gemm --disable-bias-linear --moe-token-dispatcher-type alltoall"
LOCAL = " --transformer-impl local"
FSDP2 = " --use-torch-fsdp2 --no-gradient-accumulation-fusion --untie-embeddings-and-output-weights"
MFSDP = " --use-megatron-fsdp --ckpt-format fsdp_dtensor --no-gradient-accumulation-fusion"
MTP_UNIFORM = " --mtp-num-layers 1 --recompute-granularity full --recompute-method uniform"
GQA = " --group-query-attention --num-query-groups 2"

# (extra flags, release, the code expected or None for accepted, where)
CASES = [
    # megatron/core/transformer/torch_norm.py: WrappedTorchNorm asserts no sequence parallelism
    # (core_v0.14.0 line 32, d98e8a64 line 52); the local spec builds RMSNorm with it
    # (megatron/core/models/backends.py LocalSpecProvider.layer_norm(rms_norm=True)).
    (LOCAL + " --tensor-model-parallel-size 2 --sequence-parallel", "main", "local-norm-sequence-parallel", "--sequence-parallel"),
    (LOCAL + " --tensor-model-parallel-size 2 --sequence-parallel", "0.14.0", "local-norm-sequence-parallel", "--sequence-parallel"),
    (LOCAL + " --tensor-model-parallel-size 2", "main", None, None),
    (" --tensor-model-parallel-size 2 --sequence-parallel", "main", None, None),       # TE's norm takes SP
    # validate_args turns sequence parallelism off at TP 1 (arguments.py), so nothing to refuse
    (LOCAL + " --sequence-parallel", "main", None, None),
    # megatron/core/transformer/dot_product_attention.py: context_parallel_size == 1 asserted
    # (core_v0.14.0 line 53, d98e8a64 line 58)
    (LOCAL + " --context-parallel-size 2", "main", "local-attention-with-cp", "--context-parallel-size"),
    (LOCAL + " --context-parallel-size 2", "0.14.0", "local-attention-with-cp", "--context-parallel-size"),
    (" --context-parallel-size 2", "main", None, None),
    # megatron/training/arguments.py `if args.use_torch_fsdp2:` (core_v0.14.0 lines 570-582,
    # d98e8a64 lines 1033-1047): each assert on its own
    (FSDP2, "main", None, None),
    (FSDP2, "0.14.0", None, None),
    (FSDP2 + " --pipeline-model-parallel-size 2", "main", "torch-fsdp2-conflict", "--pipeline-model-parallel-size"),
    (FSDP2 + MOE + " --expert-model-parallel-size 2", "main", "torch-fsdp2-conflict", "--expert-model-parallel-size"),
    (FSDP2 + " --use-distributed-optimizer", "main", "torch-fsdp2-conflict", "--use-distributed-optimizer"),
    (" --use-torch-fsdp2 --untie-embeddings-and-output-weights", "main", "torch-fsdp2-conflict", "--use-torch-fsdp2"),
    (FSDP2 + " --ckpt-format torch", "0.16.1", "torch-fsdp2-conflict", "--ckpt-format"),
    (FSDP2 + " --ckpt-format torch_dcp", "main", None, None),
    (" --use-torch-fsdp2 --no-gradient-accumulation-fusion", "main", "torch-fsdp2-conflict", "--use-torch-fsdp2"),
    # megatron/core/distributed/fsdp/mcore_fsdp_adapter.py _get_dp_tp_mesh: the mesh has no
    # pipeline dimension (core_v0.14.0 line 283, d98e8a64 lines 826-832)
    (MFSDP + " --pipeline-model-parallel-size 2", "main", "megatron-fsdp-with-pp", "--pipeline-model-parallel-size"),
    (MFSDP + " --pipeline-model-parallel-size 2", "0.14.0", "megatron-fsdp-with-pp", "--pipeline-model-parallel-size"),
    (MFSDP, "main", None, None),
    # megatron/training/arguments.py: a full-iteration CUDA graph asserts
    # --no-check-for-nan-in-loss-and-grad (d98e8a64 lines 1235-1237; core_v0.17.0 lines 1001-1003
    # spell it --cuda-graph-impl local --cuda-graph-scope full_iteration; core_v0.14.0 669-671
    # --enable-cuda-graph --cuda-graph-scope full_iteration)
    (" --cuda-graph-impl full_iteration", "main", "full-iteration-graph-nan-check", "--cuda-graph-impl"),
    (" --cuda-graph-impl full_iteration --no-check-for-nan-in-loss-and-grad", "main", None, None),
    (" --cuda-graph-impl local --cuda-graph-scope full_iteration", "0.17.0", "full-iteration-graph-nan-check", "--cuda-graph-impl"),
    (" --enable-cuda-graph --cuda-graph-scope full_iteration", "0.14.0", "full-iteration-graph-nan-check", "--cuda-graph-scope"),
    (" --enable-cuda-graph --cuda-graph-scope full_iteration --no-check-for-nan-in-loss-and-grad", "0.14.0", None, None),
    # core_v0.16.1 lines 725-728: not under --inference-dynamic-batching (0.15.x-0.16.x only)
    (" --cuda-graph-impl local --cuda-graph-scope full_iteration --inference-dynamic-batching", "0.16.1", None, None),
    # megatron/training/arguments.py: "a2a+p2p" in --cp-comm-type asserts
    # --hierarchical-context-parallel-sizes (core_v0.14.0 lines 391-393, d98e8a64 583-585)
    (" --context-parallel-size 4 --cp-comm-type a2a+p2p", "main", "cp-a2a-p2p-needs-hierarchy", "--cp-comm-type"),
    (" --context-parallel-size 4 --cp-comm-type a2a+p2p", "0.14.0", "cp-a2a-p2p-needs-hierarchy", "--cp-comm-type"),
    (" --context-parallel-size 4 --cp-comm-type a2a+p2p --hierarchical-context-parallel-sizes 2 2", "main", None, None),
    # linear_fc2 (RowParallelLinear of input --ffn-hidden-size) divides it by TP
    # (megatron/core/utils.py divide, d98e8a64 line 592): 1001 / 2 = 500.5; 1002 / 2 = 501
    (" --tensor-model-parallel-size 2 --ffn-hidden-size 1001", "main", "ffn-hidden-size-vs-tp", "--ffn-hidden-size"),
    (" --tensor-model-parallel-size 2 --ffn-hidden-size 1002", "main", None, None),
    # every layer MoE: no dense MLP of --ffn-hidden-size (the experts use --moe-ffn-hidden-size)
    (" --tensor-model-parallel-size 2 --sequence-parallel --ffn-hidden-size 1001 --moe-ffn-hidden-size 512" + MOE, "main",
     None, None),
    # --moe-layer-freq 2: layers 1, 3, ... are dense MLPs of --ffn-hidden-size
    (" --tensor-model-parallel-size 2 --sequence-parallel --ffn-hidden-size 1001 --moe-ffn-hidden-size 512"
     " --moe-layer-freq 2" + MOE, "main", "ffn-hidden-size-vs-tp", "--ffn-hidden-size"),
    # megatron/core/transformer/transformer_config.py __post_init__ (d98e8a64 lines 3002-3013,
    # core_v0.14.0 1298-1311): the EP overlap's asserts are not gated on experts
    (" --overlap-moe-expert-parallel-comm", "main", "moe-overlap-needs-ep", "--overlap-moe-expert-parallel-comm"),
    (" --overlap-moe-expert-parallel-comm", "0.14.0", "moe-overlap-needs-ep", "--overlap-moe-expert-parallel-comm"),
    # query groups below TP: transformer_config.py core_v0.14.0 line 696 (a multiple of TP,
    # through 0.15.x); from f7dfb99795 (0.16.0) a multiple or a divisor, every backend
    # (attention.py d98e8a64 lines 353-379 build the core attention with num_query_groups = TP)
    (GQA + " --tensor-model-parallel-size 4", "main", None, None),
    (GQA + " --tensor-model-parallel-size 4" + LOCAL, "main", None, None),
    (GQA + " --tensor-model-parallel-size 4" + LOCAL, "0.16.1", None, None),
    (GQA + " --tensor-model-parallel-size 4", "0.15.3", "query-groups-vs-tp", "--num-query-groups"),
    (GQA + " --tensor-model-parallel-size 4", "0.14.0", "query-groups-vs-tp", "--num-query-groups"),
    (" --group-query-attention --num-query-groups 8 --tensor-model-parallel-size 4", "0.14.0", None, None),
    # 3 is neither a multiple nor a divisor of 2 (d98e8a64 lines 1461-1468); heads 24 / 3 = 8
    (" --group-query-attention --num-query-groups 3 --num-attention-heads 24 --hidden-size 1536"
     " --tensor-model-parallel-size 2", "main", "query-groups-vs-tp", "--num-query-groups"),
    # --recompute-method block --recompute-num-layers 0: __post_init__ asks only that the count be
    # set (core_v0.14.0 line 843); block recomputes the first 0 layers of each stage, i.e. none
    (" --recompute-granularity full --recompute-method block --recompute-num-layers 0", "main", None, None),
    (" --recompute-granularity full --recompute-method block --recompute-num-layers 0", "0.14.0", None, None),
    # MTP with uniform recompute asserts recompute_num_layers == 1 at the first training step
    # (multi_token_prediction.py d98e8a64 lines 1621-1627, core_v0.14.0 lines 625-631)
    (MTP_UNIFORM + " --recompute-num-layers 2", "main", "mtp-uniform-recompute", "--recompute-num-layers"),
    (MTP_UNIFORM + " --recompute-num-layers 2", "0.14.0", "mtp-uniform-recompute", "--recompute-num-layers"),
    (MTP_UNIFORM + " --recompute-num-layers 1", "main", None, None),
    (" --mtp-num-layers 1 --recompute-granularity full --recompute-method block --recompute-num-layers 2", "main",
     None, None),     # block: the MTP layer warns and skips recompute (d98e8a64 lines 1630-1633)
]


@pytest.mark.parametrize("extra, release, code, where", CASES, ids=[f"{c[1]}:{c[0].strip()}" for c in CASES])
def test_megatron_refuses_exactly_these(extra, release, code, where):
    problems = problems_of(BASE + extra, world_size=8, release=release)
    if code is None:
        assert problems == [], problems
    else:
        assert code in [p.code for p in problems], problems
        assert where in [p.location for p in problems if p.code == code], problems


def test_fp16_dynamic_loss_scaling_turns_the_nan_check_off_before_the_graph_assert():
    # d98e8a64 arguments.py 1195-1201 (core_v0.14.0 line 649): fp16 without --loss-scale sets
    # check_for_nan_in_loss_and_grad False, before the full_iteration assert (1235-1237).
    fp16 = BASE.replace(" --bf16", " --fp16") + " --cuda-graph-impl full_iteration"
    codes = [p.code for p in problems_of(fp16, world_size=8, release="main")]
    assert "full-iteration-graph-nan-check" not in codes, codes
    codes = [p.code for p in problems_of(fp16 + " --loss-scale 128", world_size=8, release="main")]
    assert "full-iteration-graph-nan-check" in codes, codes


def test_each_torch_fsdp2_assert_is_one_problem_all_at_once():
    # arguments.py asserts them one after the other; the estimator names every one at once:
    # pipeline 2, the distributed optimizer, gradient-accumulation fusion (on by default), the
    # checkpoint format, tied embeddings (the default) and fp16
    flags = BASE.replace("--bf16", "--fp16") + (" --use-torch-fsdp2 --pipeline-model-parallel-size 2 "
                                               "--use-distributed-optimizer --ckpt-format torch")
    problems = [p for p in problems_of(flags, world_size=8) if p.code == "torch-fsdp2-conflict"]
    assert sorted(p.location for p in problems) == sorted([
        "--pipeline-model-parallel-size", "--use-distributed-optimizer", "--use-torch-fsdp2", "--ckpt-format",
        "--use-torch-fsdp2", "--fp16"])


# -- megatron-core 0.16.1's own classes, on CPU --------------------------------------------------

def _mcore():
    pytest.importorskip("torch")
    return pytest.importorskip("megatron.core")


def _config(**kw):
    from megatron.core.transformer.transformer_config import TransformerConfig

    base = dict(num_layers=2, hidden_size=64, num_attention_heads=8, use_cpu_initialization=True)
    base.update(kw)
    return TransformerConfig(**base)


def test_megatron_core_torch_norm_refuses_sequence_parallel():
    _mcore()
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    WrappedTorchNorm(_config(normalization="RMSNorm"), hidden_size=64)
    with pytest.raises(AssertionError, match="sequence parallel"):
        WrappedTorchNorm(_config(normalization="RMSNorm", tensor_model_parallel_size=2, sequence_parallel=True),
                         hidden_size=64)
    assert problems_of(BASE + LOCAL + " --tensor-model-parallel-size 2 --sequence-parallel", 8, release="0.16.1")[0].code \
        == "local-norm-sequence-parallel"


def test_megatron_core_query_groups_and_dense_overlap_checks():
    _mcore()
    # 0.16.1's __post_init__: 2 groups on TP 4 (a divisor) accepted, 3 on TP 2 refused
    _config(num_query_groups=2, tensor_model_parallel_size=4)
    with pytest.raises(ValueError, match="multiple or divisor"):
        _config(num_attention_heads=6, num_query_groups=3, tensor_model_parallel_size=2)
    # the EP all-to-all overlap on a dense model (no experts, EP 1): refused
    with pytest.raises(AssertionError, match="only supported with expert model parallelism"):
        _config(overlap_moe_expert_parallel_comm=True, bf16=True)
    assert problems_of(BASE + GQA + " --tensor-model-parallel-size 4", 8, release="0.16.1") == []


def test_megatron_core_divide_refuses_an_uneven_ffn_split():
    _mcore()
    from megatron.core.utils import divide

    assert divide(1002, 2) == 501
    with pytest.raises(AssertionError):
        divide(1001, 2)


# -- estimate --env / --job-env: the job's environment rules become errors ---------------------

TP2 = BASE + " --tensor-model-parallel-size 2"


def _estimate(*options, env=None):
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith(("MEGATRON_ESTIMATOR_", "NVTE_", "NCCL_")) and k not in ("WORLD_SIZE", "CUDA_DEVICE_MAX_CONNECTIONS")}
    environ.update({"PYTHONPATH": str(repo)}, **(env or {}))
    return subprocess.run([sys.executable, "-m", "megatron_estimator", "estimate", "--world-size", "2", *options,
                           "--", *TP2.split()], capture_output=True, text=True, env=environ, cwd=repo, timeout=120)


def test_estimate_checks_the_job_environment_only_when_given():
    # megatron/training/arguments.py validate_args (d98e8a64 lines 1453-1478): TP 2 before Blackwell
    # asserts CUDA_DEVICE_MAX_CONNECTIONS == "1".  No --gpu: Hopper (9.0) is assumed, and said.
    plain = _estimate()
    assert plain.returncode in (0, 1), plain.stdout
    assert "job environment (not checked here)" in plain.stdout and "CUDA_DEVICE_MAX_CONNECTIONS" in plain.stdout
    assert "compute capability 9" in plain.stdout and "no --gpu named" in plain.stdout
    # --env: exactly these variables are the job's (this shell's are not)
    missing = _estimate("--env", "NCCL_DEBUG=INFO", env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"})
    assert missing.returncode == 2 and "[cuda-device-max-connections]" in missing.stdout, missing.stdout
    given = _estimate("--env", "CUDA_DEVICE_MAX_CONNECTIONS=1")
    assert given.returncode in (0, 1) and "[cuda-device-max-connections]" not in given.stdout, given.stdout
    # --job-env: this shell's environment is the job's
    shell_unset = _estimate("--job-env")
    assert shell_unset.returncode == 2 and "(it is unset) [cuda-device-max-connections]" in shell_unset.stdout
    shell_set = _estimate("--job-env", env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"})
    assert shell_set.returncode in (0, 1), shell_set.stdout
    # --env on top of --job-env wins
    over = _estimate("--job-env", "--env", "CUDA_DEVICE_MAX_CONNECTIONS=8", env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"})
    assert over.returncode == 2 and "(it is 8)" in over.stdout
    # Blackwell (compute capability 10) has no such requirement: --gpu named, nothing assumed
    blackwell = _estimate("--gpu", "B200", "--env", "NCCL_DEBUG=INFO")
    assert blackwell.returncode in (0, 1) and "no --gpu named" not in blackwell.stdout, blackwell.stdout


def test_estimate_env_needs_key_equals_value():
    bad = _estimate("--env", "CUDA_DEVICE_MAX_CONNECTIONS")
    assert bad.returncode == 2
    assert "--env 'CUDA_DEVICE_MAX_CONNECTIONS': give KEY=VALUE" in bad.stderr
    assert "Traceback" not in bad.stderr
