"""Issue 29: the classes the coverage harness (scripts/megatron_coverage) found the estimator
refusing where Megatron accepts, or accepting where Megatron's validate_args stops.

Every expectation is read from Megatron-LM's source at the cited lines (tags core_v0.14.0,
core_v0.16.1, core_v0.17.0 and main d98e8a64); validate_args is in megatron/training, which the
megatron-core wheel does not ship, so these are by hand.  A world of 8.
"""
import pytest

from conftest import problems_of

BASE = ("--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 "
        "--max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 32 "
        "--lr 1e-4 --min-lr 1e-5 --tokenizer-type NullTokenizer --vocab-size 32000 --mock-data --bf16")
ITERS = " --train-iters 100"
DIST = " --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather"
# pp 2 x 4 layers per virtual stage: 8 layers = 2 stages x 2 chunks (interleaved schedule)
VPP = " --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 2"
OPT_STEP = " --overlap-param-gather-with-optimizer-step"

# (extra flags, release, expected code or None for accepted, where)
CASES = [
    # arguments.py: with --train-iters the lr schedule is in iterations (d98e8a64 lines 1276-1289,
    # core_v0.14.0 696-710), with --train-samples in samples (d98e8a64 1290-1302, core_v0.14.0 712-724)
    (ITERS + " --lr-decay-samples 2", "main", "schedule-units", "--lr-decay-samples"),
    (ITERS + " --lr-warmup-samples 3", "0.14.0", "schedule-units", "--lr-warmup-samples"),
    (ITERS + " --lr-warmup-fraction 0.1 --lr-warmup-iters 5", "main", "schedule-units", "--lr-warmup-iters"),
    (ITERS + " --lr-decay-iters 50 --lr-warmup-iters 5", "main", None, None),
    (" --train-samples 6400 --lr-decay-iters 50", "main", "schedule-units", "--lr-decay-iters"),
    (" --train-samples 6400 --lr-decay-samples 3200 --lr-warmup-samples 64", "main", None, None),
    # --skip-train: from 0.17.0 (29e798a48d) neither block runs (d98e8a64 `and not args.skip_train`);
    # before, they do (core_v0.16.1 lines 756-782 have no skip_train)  -- coverage case main#407
    (ITERS + " --skip-train --train-samples 64 --lr-warmup-iters 16", "main", None, None),
    (ITERS + " --skip-train --train-samples 64 --lr-warmup-iters 16", "0.17.0", None, None),
    (ITERS + " --skip-train --train-samples 64", "0.16.1", "iters-and-samples", "--train-samples"),
    # arguments.py `if args.overlap_param_gather_with_optimizer_step:` (core_v0.14.0 595-603,
    # d98e8a64 1066-1074): distributed optimizer, --overlap-param-gather, interleaved pipeline,
    # not distributed checkpointing (use_dist_ckpt = ckpt_format != "torch")
    (ITERS + OPT_STEP, "main", "overlap-param-gather-with-optimizer-step", "--overlap-param-gather-with-optimizer-step"),
    (ITERS + DIST + OPT_STEP + " --ckpt-format torch", "main", "overlap-param-gather-with-optimizer-step",
     "--overlap-param-gather-with-optimizer-step"),                                         # no VPP
    (ITERS + DIST + VPP + OPT_STEP, "main", "overlap-param-gather-with-optimizer-step",
     "--overlap-param-gather-with-optimizer-step"),                                         # torch_dist default
    (ITERS + DIST + VPP + OPT_STEP + " --ckpt-format torch", "main", None, None),
    (ITERS + DIST + VPP + OPT_STEP + " --ckpt-format torch", "0.14.0", None, None),
    # arguments.py `if args.fsdp_manual_registration:` (core_v0.16.1 693-695, d98e8a64 1189-1191)
    (ITERS + " --fsdp-manual-registration", "main", "fsdp-manual-registration", "--fsdp-manual-registration"),
    (ITERS + " --use-megatron-fsdp --ckpt-format fsdp_dtensor --no-gradient-accumulation-fusion"
     " --fsdp-manual-registration --use-nccl-ub", "main", None, None),
    # arguments.py checkpoint formats (core_v0.14.0 969-978, d98e8a64 1667-1677)
    (ITERS + " --ckpt-format torch_dcp", "main", "ckpt-format-conflict", "--ckpt-format"),
    (ITERS + " --ckpt-format fsdp_dtensor", "0.14.0", "ckpt-format-conflict", "--ckpt-format"),
    (ITERS + " --use-torch-fsdp2 --no-gradient-accumulation-fusion --untie-embeddings-and-output-weights"
     " --ckpt-format torch_dcp --tensor-model-parallel-size 2", "main", "ckpt-format-conflict", "--ckpt-format"),
    # arguments.py under --save (core_v0.14.0 779-783, d98e8a64 1361-1366): 30 % 20 = 10 refused
    (ITERS + " --save x --save-interval 20 --save-retain-interval 30", "main", "save-retain-interval",
     "--save-retain-interval"),
    (ITERS + " --save x --save-interval 20 --save-retain-interval 40", "main", None, None),
    (ITERS + " --save-retain-interval 3", "main", None, None),            # no --save: not checked
    # weight-decay schedule (core_v0.14.0 795-802, d98e8a64 1393-1400)
    (ITERS + " --end-weight-decay 0.1", "main", "weight-decay-schedule", "--end-weight-decay"),
    (ITERS + " --weight-decay-incr-style linear --start-weight-decay 0.0", "main", "weight-decay-schedule",
     "--weight-decay-incr-style"),
    (ITERS + " --weight-decay-incr-style linear --start-weight-decay 0.0 --end-weight-decay 0.1", "main", None, None),
    # arguments.py line 1258 (core_v0.14.0 681)
    (ITERS + " --num-dataset-builder-threads 0", "main", "out-of-range", "--num-dataset-builder-threads"),
    # parallel_state.py (core_v0.14.0 719-723, d98e8a64 898-902): tp-cp-ep-pp-dp order with pp 2:
    # etp 2 x ep 2 = 4 != tp 2 x cp 1 = 2 -> expert DP 8/(2*2*2) = 1 vs DP 8/(2*2) = 2
    (ITERS + " --use-tp-pp-dp-mapping --pipeline-model-parallel-size 2 --tensor-model-parallel-size 2"
     " --sequence-parallel --num-experts 8 --expert-model-parallel-size 2", "main", "tp-pp-dp-mapping-expert-dp",
     "--use-tp-pp-dp-mapping"),
    (ITERS + " --use-tp-pp-dp-mapping --pipeline-model-parallel-size 2 --tensor-model-parallel-size 2"
     " --sequence-parallel --num-experts 8 --expert-model-parallel-size 2 --expert-tensor-parallel-size 1",
     "main", None, None),
    # experimental_attention_variant_module_specs.py asserts the TE spec (d98e8a64 line 498)
    (ITERS + " --experimental-attention-variant gated_delta_net --linear-attention-freq 2"
     " --transformer-impl local", "main", "experimental-attention-needs-te", "--transformer-impl"),
    # MLA sizes are read only under --multi-latent-attention (argument_utils.py builds
    # MLATransformerConfig only then)  -- coverage case main#1582: --kv-lora-rank 0 on a GQA model
    (ITERS + " --kv-lora-rank 0", "main", None, None),
    (ITERS + " --multi-latent-attention --kv-lora-rank 0", "main", "out-of-range", "--kv-lora-rank"),
]


@pytest.mark.parametrize("extra, release, code, where", CASES, ids=[f"{c[1]}:{c[0].strip()}" for c in CASES])
def test_megatron_refuses_exactly_these(extra, release, code, where):
    problems = problems_of(BASE + extra, world_size=8, release=release)
    if code is None:
        assert problems == [], problems
    else:
        assert code in [p.code for p in problems], problems
        assert where in [p.location for p in problems if p.code == code], problems
