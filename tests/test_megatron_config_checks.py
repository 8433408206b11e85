"""The audit of Megatron's configuration checks (tests/data/megatron_config_checks.tsv, issue 12)
and the rules it added (config/rules/).

Every accept / refuse case below was run through Megatron-LM main d98e8a64's own parse_args,
validate_args, core_transformer_config_from_args (the __post_init__ checks) and meta-device
model build (scripts/megatron_validate_child.py on a world of 8, Blackwell, an empty
environment unless given) and Megatron's verdict is the expected one here.
"""

import csv
import re
from pathlib import Path

import pytest

from conftest import TREE_ENV, megatron_tree, problems_of

ROOT = Path(__file__).resolve().parents[1]
AUDIT = ROOT / "tests" / "data" / "megatron_config_checks.tsv"
FILES = {"megatron/core/transformer/transformer_config.py", "megatron/core/model_parallel_config.py"}


def audit_rows():
    with open(AUDIT, newline="", encoding="utf-8") as f:
        lines = [line for line in f if not line.startswith("#")]
    return list(csv.DictReader(lines, delimiter="\t", quoting=csv.QUOTE_NONE))


def package_codes():
    text = "".join(p.read_text(encoding="utf-8") for p in (ROOT / "megatron_estimator").rglob("*.py"))
    return set(re.findall(r'"([a-z0-9]+(?:-[a-z0-9]+)+)"', text))


def test_audit_rows_are_well_formed_and_cover_both_files():
    rows = audit_rows()
    assert {r["file"] for r in rows} == FILES
    keys = [(r["file"], int(r["line"])) for r in rows]
    assert len(keys) == len(set(keys))
    # MLATransformerConfig.__post_init__ comes after TransformerConfig's in the file
    assert any(r["file"].endswith("transformer_config.py") and int(r["line"]) > 3343 for r in rows)
    for r in rows:
        assert r["condition"] and r["flags"] and r["estimator"], r


def test_every_mirrored_row_names_a_rule_code_that_exists():
    codes = package_codes()
    mirrored = [r for r in audit_rows() if not r["estimator"].startswith(("not mirrored:", "unreachable:"))]
    assert len(mirrored) >= 150
    assert [r["estimator"] for r in mirrored if r["estimator"] not in codes] == []


def test_release_gates_named_in_the_audit_exist():
    from megatron_estimator.megatron.behaviour import behaviour_rows

    rules = {row.rule for row in behaviour_rows()}
    named = {m.group(1) for r in audit_rows() for m in [re.search(r"megatron_behaviour\.tsv (\w+)", r["releases"])] if m}
    assert named and named <= rules


def _checks_in(path: Path, start: str, stop: str | None) -> set[int]:
    """Lines of raise / assert statements between ``def __post_init__`` after ``start`` and ``stop``."""
    lines = path.read_text(encoding="utf-8").split("\n")
    begin = next(i for i, l in enumerate(lines) if l.startswith(start))
    post = next(i for i in range(begin, len(lines)) if lines[i].strip().startswith("def __post_init__"))
    end = next((i for i in range(post + 1, len(lines)) if stop and lines[i].startswith(stop)), len(lines))
    return {i + 1 for i in range(post, end) if lines[i].strip().startswith(("raise ", "assert ", "assert("))}


def test_audit_lists_every_raise_and_assert_of_the_tree():
    # the audit (tests/data/megatron_config_checks.tsv) is the record; this rereads the tree
    tree = megatron_tree("megatron/core/transformer/transformer_config.py")
    if tree is None:
        pytest.skip(f"set {TREE_ENV} to a Megatron-LM d98e8a64 checkout to reread its checks")
    rows = audit_rows()
    tc = tree / "megatron/core/transformer/transformer_config.py"
    mp = tree / "megatron/core/model_parallel_config.py"
    want_tc = _checks_in(tc, "class TransformerConfig(", "class MLATransformerConfig(") | _checks_in(tc, "class MLATransformerConfig(", None)
    mp_lines = mp.read_text(encoding="utf-8").split("\n")
    helper = next(i for i, l in enumerate(mp_lines) if l.startswith("def resolve_tensor_parallel_weight_shards"))
    cls = next(i for i, l in enumerate(mp_lines) if l.startswith("class ModelParallelConfig"))
    want_mp = _checks_in(mp, "class ModelParallelConfig", None) | {
        i + 1 for i in range(helper, cls) if mp_lines[i].strip().startswith("raise ")}
    got = {f: {int(r["line"]) for r in rows if r["file"] == f} for f in FILES}
    assert got["megatron/core/transformer/transformer_config.py"] == want_tc
    assert got["megatron/core/model_parallel_config.py"] == want_mp


# -- the rules the audit added: a real-looking GPT launch, one setting at a time ---------------------------

BASE = ("--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 "
        "--max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 32 --train-iters 100 "
        "--lr 1e-4 --min-lr 1e-5 --tokenizer-type NullTokenizer --vocab-size 32000 --mock-data --bf16 "
        "--transformer-impl transformer_engine --position-embedding-type rope --normalization RMSNorm "
        "--swiglu --no-rope-fusion")
MOE = " --num-experts 8 --moe-grouped-gemm --disable-bias-linear --moe-token-dispatcher-type alltoall"
MLA = " --multi-latent-attention --kv-lora-rank 128 --qk-head-dim 64 --qk-pos-emb-head-dim 32 --v-head-dim 64"
OFFLOAD = " --fine-grained-activation-offloading"
OFFLOAD_ENV = {"NVTE_CPU_OFFLOAD_V1": "1"}
EP8 = MOE + " --expert-model-parallel-size 8"
BATCH_INVARIANT = " --batch-invariant-mode --attention-backend flash --flash-attention-version 3 --attention-dropout 0"
HYBRIDEP = MOE + " --moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep --moe-expert-rank-capacity-factor 1.5"

CASES = [
    # model_parallel_config.py
    ("--tensor-parallel-num-weight-shards 1 --tensor-model-parallel-size 2", "weight-shards-vs-tp", "--tensor-parallel-num-weight-shards"),
    ("--tensor-parallel-num-weight-shards 3 --tensor-model-parallel-size 2", "weight-shards-vs-tp", "--tensor-parallel-num-weight-shards"),
    ("--tensor-parallel-num-weight-shards 4 --tensor-model-parallel-size 2", None, None),
    ("--defer-embedding-wgrad-compute", "defer-embedding-wgrad", "--defer-embedding-wgrad-compute"),
    ("--pipeline-model-parallel-size 2 --defer-embedding-wgrad-compute --no-gradient-accumulation-fusion",
     "defer-embedding-wgrad", "--no-gradient-accumulation-fusion"),
    ("--pipeline-model-parallel-size 2 --defer-embedding-wgrad-compute --wgrad-deferral-limit -1",
     "defer-embedding-wgrad", "--wgrad-deferral-limit"),
    ("--pipeline-model-parallel-size 2 --defer-embedding-wgrad-compute --wgrad-deferral-limit 2", None, None),
    ("--overlap-p2p-communication-warmup-flush", "p2p-warmup-flush", "--overlap-p2p-communication-warmup-flush"),
    ("--pipeline-model-parallel-size 4 --num-virtual-stages-per-pipeline-rank 2 --overlap-p2p-communication-warmup-flush "
     "--no-overlap-p2p-communication", "p2p-warmup-flush", "--overlap-p2p-communication-warmup-flush"),
    ("--pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2 --overlap-p2p-communication-warmup-flush", None, None),
    # fp8 / fp4 recipes
    ("--fp8-format hybrid --first-last-layers-bf16", "fp8-bf16-layers", "--first-last-layers-bf16"),
    ("--fp8-format hybrid --fp8-recipe tensorwise --first-last-layers-bf16", None, None),
    ("--fp8-format hybrid --fp8-recipe tensorwise --first-last-layers-bf16 --num-layers-at-start-in-bf16 5 "
     "--pipeline-model-parallel-size 2", "fp8-bf16-layers", "--num-layers-at-start-in-bf16"),
    ("--fp8-format hybrid --fp8-recipe tensorwise --first-last-layers-bf16 --num-layers-at-start-in-bf16 4 "
     "--pipeline-model-parallel-size 2", None, None),
    ("--fp8-format hybrid --fp8-recipe custom", "quantizer-factory-required", "--fp8-recipe"),
    ("--fp8-format hybrid --fp8-recipe custom --fp8-quantizer-factory pkg.mod.factory", None, None),
    ("--fp4-format e2m1 --fp4-recipe custom", "quantizer-factory-required", "--fp4-recipe"),
    ("--fp8-output-proj", "fp8-output-proj", "--fp8-output-proj"),
    ("--fp8-format e4m3 --fp8-recipe tensorwise --fp8-output-proj", "fp8-output-proj", "--fp8-output-proj"),
    ("--fp8-format e4m3 --fp8-recipe mxfp8 --fp8-output-proj", None, None),
    ("--fp4-format e2m1 --fp8-format hybrid", "fp4-conflict", "--fp4-format"),
    ("--fp4-param-gather", "fp4-conflict", "--fp4-param-gather"),
    # MoE routing and capacity
    ("--num-experts 8 --disable-bias-linear --moe-use-grouped-tensor", "moe-grouped-tensor-needs-grouped-gemm", "--moe-use-grouped-tensor"),
    (MOE + " --moe-use-grouped-tensor", None, None),
    ("--moe-ffn-hidden-size 512", "moe-ffn-hidden-size-without-experts", "--moe-ffn-hidden-size"),
    (MOE + " --moe-ffn-hidden-size 512", None, None),
    (MOE + " --moe-router-load-balancing-type aux_loss seq_aux_loss --moe-aux-loss-coeff 0.01",
     "moe-aux-loss-coeff-length", "--moe-aux-loss-coeff"),
    (MOE + " --moe-router-load-balancing-type aux_loss seq_aux_loss --moe-aux-loss-coeff 0.01 0.001", None, None),
    (MOE + " --moe-expert-capacity-factor 1.0 --moe-router-load-balancing-type sinkhorn",
     "moe-capacity-factor-load-balancing", "--moe-expert-capacity-factor"),
    (MOE + " --moe-expert-capacity-factor 1.0 --moe-router-load-balancing-type seq_aux_loss", None, None),
    (MOE + " --moe-router-enable-expert-bias", "moe-expert-bias-score-function", "--moe-router-enable-expert-bias"),
    (MOE + " --moe-router-enable-expert-bias --moe-router-score-function sigmoid", None, None),
    (MOE + " --moe-router-padding-for-quantization", "moe-router-padding", "--moe-router-padding-for-quantization"),
    (MOE + " --moe-router-padding-for-quantization --fp8-format hybrid", None, None),
    (MOE + " --moe-router-padding-for-quantization --fp8-format hybrid --moe-token-dispatcher-type allgather",
     "moe-router-padding", "--moe-router-padding-for-quantization"),
    (MOE + " --moe-router-topk 1", "moe-topk1-needs-pre-softmax", "--moe-router-topk"),
    # the router checks do not ask for experts (the harness's dense CI rows with these mutations)
    ("--moe-router-topk 1", "moe-topk1-needs-pre-softmax", "--moe-router-topk"),
    ("--moe-router-enable-expert-bias", "moe-expert-bias-score-function", "--moe-router-enable-expert-bias"),
    (MOE + " --moe-router-topk 1 --moe-router-pre-softmax", None, None),
    (MOE + " --moe-router-topk 1 --moe-router-score-function sigmoid", None, None),
    (MOE + " --moe-router-topk 1 --moe-router-load-balancing-type sinkhorn", None, None),
    (MOE + " --moe-router-group-topk 2", "moe-group-topk", "--moe-router-group-topk"),
    (MOE + " --moe-router-group-topk 2 --moe-router-num-groups 3", "moe-group-topk", "--moe-router-num-groups"),
    (MOE + " --moe-router-group-topk 5 --moe-router-num-groups 4", "moe-group-topk", "--moe-router-group-topk"),
    (MOE + " --moe-router-group-topk 2 --moe-router-num-groups 4", None, None),
    # MoE dispatchers, overlaps, recompute
    (MOE + " --moe-token-dispatcher-type flex --moe-enable-deepep --moe-flex-dispatcher-backend hybridep",
     "flex-dispatcher-backend", "--moe-enable-deepep"),
    (MOE + " --moe-token-dispatcher-type flex --moe-pad-expert-input-to-capacity --moe-expert-capacity-factor 1.0",
     "flex-dispatcher-backend", "--moe-pad-expert-input-to-capacity"),
    (MOE + " --moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep --moe-pad-expert-input-to-capacity "
     "--moe-expert-capacity-factor 1.0", None, None),
    (MOE + " --moe-flex-dispatcher-backend ncclep", "flex-dispatcher-backend", "--moe-flex-dispatcher-backend"),
    (MOE + " --moe-dispatch-fwd-dtype mxfp8", "flex-dispatcher-backend", "--moe-dispatch-fwd-dtype"),
    (MOE + " --moe-expert-rank-capacity-factor 1.5", "flex-dispatcher-backend", "--moe-expert-rank-capacity-factor"),
    (HYBRIDEP, "flex-dispatcher-backend", "--moe-expert-rank-capacity-factor"),
    (HYBRIDEP + " --moe-use-grouped-tensor", None, None),
    (MOE + " --moe-shared-expert-intermediate-size 512 --moe-shared-expert-overlap --moe-token-dispatcher-type allgather",
     "moe-shared-expert-overlap-dispatcher", "--moe-shared-expert-overlap"),
    (MOE + " --moe-shared-expert-intermediate-size 512 --moe-shared-expert-overlap", None, None),
    (MOE + " --moe-shared-expert-intermediate-size 512 --moe-shared-expert-overlap --recompute-activations "
     "--recompute-modules shared_experts", "moe-shared-expert-overlap-recompute", "--recompute-modules"),
    (MOE + " --moe-layer-recompute --recompute-granularity full --recompute-method uniform --recompute-num-layers 1",
     "moe-layer-recompute-with-full", "--moe-layer-recompute"),
    (MOE + " --moe-layer-recompute", None, None),
    (EP8 + " --overlap-moe-expert-parallel-comm", None, None),
    (EP8 + " --overlap-moe-expert-parallel-comm --recompute-activations --recompute-modules moe",
     "moe-overlap-conflict", "--recompute-modules"),
    (EP8 + " --overlap-moe-expert-parallel-comm --mtp-num-layers 2", "moe-overlap-conflict", "--mtp-num-layers"),
    (EP8 + " --overlap-moe-expert-parallel-comm --mtp-num-layers 1", None, None),
    (EP8 + " --overlap-moe-expert-parallel-comm --moe-shared-expert-intermediate-size 512 --moe-shared-expert-overlap",
     "moe-overlap-conflict", "--moe-shared-expert-overlap"),
    (EP8 + " --delay-wgrad-compute", "moe-wgrad-overlap", "--delay-wgrad-compute"),
    (EP8 + " --overlap-moe-expert-parallel-comm --delay-wgrad-compute", None, None),
    (EP8 + " --overlap-moe-expert-parallel-comm --overlap-dispatch-backward-with-experts-wgrad",
     "moe-wgrad-overlap", "--overlap-dispatch-backward-with-experts-wgrad"),
    (EP8 + " --overlap-dispatch-backward-with-experts-wgrad", None, None),
    (EP8 + " --ep-overlap-early-attn-memory-release", "moe-wgrad-overlap", "--ep-overlap-early-attn-memory-release"),
    (MOE + " --moe-paged-stash", "moe-paged-stash", "--moe-paged-stash"),
    (HYBRIDEP + " --moe-use-grouped-tensor --moe-paged-stash", None, None),
    (MOE + " --moe-single-grouped-weight", "moe-single-grouped", "--moe-single-grouped-weight"),
    (MOE + " --moe-single-grouped-weight --moe-use-grouped-tensor", None, None),
    (MOE + " --moe-single-grouped-bias --moe-use-grouped-tensor", "moe-single-grouped", "--moe-single-grouped-bias"),
    ("--num-experts 8 --moe-grouped-gemm --moe-single-grouped-bias --moe-use-grouped-tensor", None, None),
    # activations and norms
    ("--glu-linear-offset 1.0", "bias-activation-fusion", "--glu-linear-offset"),
    ("--glu-linear-offset 1.0 --no-bias-swiglu-fusion", None, None),
    ("--use-te-activation-func", "bias-activation-fusion", "--use-te-activation-func"),
    ("--use-te-activation-func --no-bias-swiglu-fusion", None, None),
    ("--fused-residual-rmsnorm --normalization LayerNorm", "fused-residual-rmsnorm", "--fused-residual-rmsnorm"),
    ("--fused-residual-rmsnorm", None, None),
    ("--activation-func-clamp-value 7.0", "swiglu-clamp", "--activation-func-clamp-value"),
    (MOE + " --activation-func-clamp-value 7.0", None, None),
    (MOE + " --activation-func-clamp-value -1", "swiglu-clamp", "--activation-func-clamp-value"),
    # attention variants
    (MLA + " --rotary-interleaved", "mla-rope-conflict", "--rotary-interleaved"),
    (MLA + " --attention-output-gate", "mla-rope-conflict", "--attention-output-gate"),
    (MLA, None, None),
    ("--context-parallel-size 2 --cp-comm-type p2p a2a", "cp-comm-type-length", "--cp-comm-type"),
    ("--context-parallel-size 2 --cp-comm-type p2p p2p p2p p2p a2a a2a a2a a2a", None, None),
    ("--no-rope-freq 3", "no-rope-freq", "--no-rope-freq"),
    ("--no-rope-freq 4", None, None),
    ("--no-rope-freq 4 --flash-decode", "no-rope-freq", "--flash-decode"),
    ("--no-rope-freq [0,1,0,1]", "no-rope-freq", "--no-rope-freq"),
    # CUDA graphs
    ("--enable-cuda-graph --cuda-graph-impl local", "cuda-graph-flags", "--enable-cuda-graph"),
    ("--enable-cuda-graph --external-cuda-graph", "cuda-graph-flags", "--external-cuda-graph"),
    ("--cuda-graph-scope attn --cuda-graph-modules attn --cuda-graph-impl local", "cuda-graph-flags", "--cuda-graph-scope"),
    ("--cuda-graph-scope attn --cuda-graph-impl local", None, None),
    ("--cuda-graph-impl full_iteration --cuda-graph-modules attn --no-check-for-nan-in-loss-and-grad",
     "cuda-graph-modules", "--cuda-graph-modules"),
    ("--cuda-graph-impl full_iteration --no-check-for-nan-in-loss-and-grad", None, None),
    ("--cuda-graph-impl transformer_engine --cpu-offloading-num-layers 2", "cuda-graph-cpu-offloading", "--cpu-offloading-num-layers"),
    ("--cuda-graph-impl transformer_engine --cuda-graph-modules moe_router", "cuda-graph-modules", "--cuda-graph-modules"),
    (MOE + " --cuda-graph-impl transformer_engine --cuda-graph-modules moe moe_router", "cuda-graph-modules", "--cuda-graph-modules"),
    (MOE + " --cuda-graph-impl transformer_engine --cuda-graph-modules moe_preprocess", "cuda-graph-modules", "--cuda-graph-modules"),
    (MOE + " --cuda-graph-impl local --cuda-graph-modules moe_preprocess", None, None),
    (MOE + " --cuda-graph-impl transformer_engine --cuda-graph-modules mlp", "cuda-graph-modules", "--cuda-graph-modules"),
    (MOE + " --cuda-graph-impl transformer_engine --cuda-graph-modules moe", "cuda-graph-modules", "--cuda-graph-modules"),
    (MOE + " --cuda-graph-impl transformer_engine --cuda-graph-modules moe --moe-expert-capacity-factor 1.0 "
     "--moe-pad-expert-input-to-capacity", None, None),
    (MOE + " --cuda-graph-impl transformer_engine --cuda-graph-modules moe_router moe_preprocess --moe-expert-capacity-factor 1.0",
     "cuda-graph-modules", "--cuda-graph-modules"),
    (MOE + " --cuda-graph-impl transformer_engine --cuda-graph-modules attn moe_router moe_preprocess", None, None),
    # offloading and hyper connections
    (MOE + OFFLOAD + " --offload-modules expert_fc1 --recompute-activations --recompute-modules moe",
     "offload-inside-moe-recompute", "--offload-modules"),
    (MOE + OFFLOAD + " --offload-modules expert_fc1 --recompute-activations --recompute-modules core_attn", None, None),
    (MOE + OFFLOAD + " --offload-modules fused_group_mlp", "offload-fused-group-mlp", "--offload-modules"),
    (MOE + OFFLOAD + " --offload-modules fused_group_mlp moe_act --use-transformer-engine-op-fuser",
     "offload-fused-group-mlp", "--offload-modules"),
    (MOE + OFFLOAD + " --offload-modules fused_group_mlp --use-transformer-engine-op-fuser", None, None),
    (HYBRIDEP + " --moe-use-grouped-tensor --moe-paged-stash" + OFFLOAD + " --offload-modules moe_act",
     "moe-paged-stash", "--offload-modules"),
    (MOE + OFFLOAD + " --offload-modules expert_fc1 --cuda-graph-impl local", "cuda-graph-offloading", "--cuda-graph-impl"),
    (MOE + OFFLOAD + " --offload-modules expert_fc1 --cuda-graph-impl local --cuda-graph-modules attn", None, None),
    (MOE + OFFLOAD + " --offload-modules expert_fc1 --cuda-graph-impl transformer_engine --cuda-graph-modules moe "
     "--moe-expert-capacity-factor 1.0 --moe-pad-expert-input-to-capacity", "cuda-graph-offloading", "--cuda-graph-modules"),
    (MOE + OFFLOAD + " --offload-modules expert_fc1 --cuda-graph-impl transformer_engine --cuda-graph-warmup-steps 0",
     "cuda-graph-offloading", "--cuda-graph-warmup-steps"),
    (MOE + OFFLOAD + " --offload-modules expert_fc1 --cuda-graph-impl transformer_engine", None, None),
    (MOE + OFFLOAD + " --offload-modules expert_fc1 --cuda-graph-impl full_iteration --no-check-for-nan-in-loss-and-grad",
     "cuda-graph-offloading", "--fine-grained-offloading-max-inflight-offloads"),
    (MOE + OFFLOAD + " --offload-modules expert_fc1 --cuda-graph-impl full_iteration --no-check-for-nan-in-loss-and-grad "
     "--fine-grained-offloading-max-inflight-offloads 2", None, None),
    (EP8 + " --overlap-moe-expert-parallel-comm --cuda-graph-impl transformer_engine --cuda-graph-modules attn moe_router", None, None),
    (EP8 + " --overlap-moe-expert-parallel-comm --cuda-graph-impl transformer_engine --cuda-graph-modules moe "
     "--moe-expert-capacity-factor 1.0 --moe-pad-expert-input-to-capacity", "moe-overlap-conflict", "--cuda-graph-modules"),
    (EP8 + " --overlap-moe-expert-parallel-comm --moe-token-dispatcher-type flex --moe-flex-dispatcher-backend ncclep"
     + OFFLOAD + " --offload-modules expert_fc1", "moe-overlap-conflict", "--offload-modules"),
    (EP8 + " --overlap-moe-expert-parallel-comm --moe-token-dispatcher-type flex --moe-flex-dispatcher-backend ncclep"
     + OFFLOAD + " --offload-modules moe_act", None, None),
    (BATCH_INVARIANT, None, None),
    ("--batch-invariant-mode", "batch-invariant-mode", "--attention-backend"),
    (BATCH_INVARIANT + " --context-parallel-size 2", "batch-invariant-mode", "--context-parallel-size"),
    (BATCH_INVARIANT + " --attention-dropout 0.1", "batch-invariant-mode", "--attention-dropout"),
    (BATCH_INVARIANT + " --flash-attention-version 2", "batch-invariant-mode", "--flash-attention-version"),
    (MOE + BATCH_INVARIANT, None, None),
    (MOE + BATCH_INVARIANT + " --moe-token-dispatcher-type allgather", "batch-invariant-mode", "--moe-token-dispatcher-type"),
    (MOE + BATCH_INVARIANT + " --moe-permute-fusion", "batch-invariant-mode", "--moe-permute-fusion"),
    (MOE + BATCH_INVARIANT + " --fp8-format hybrid", "batch-invariant-mode", "--fp8-format"),
    (MOE + BATCH_INVARIANT + " --moe-expert-capacity-factor 1.0 --moe-pad-expert-input-to-capacity",
     "batch-invariant-mode", "--moe-pad-expert-input-to-capacity"),
    ("--enable-mhc-connections --mtp-num-layers 1", "mhc-conflict", "--mtp-num-layers"),
    ("--enable-mhc-connections --pipeline-model-parallel-size 2", "mhc-conflict", "--pipeline-model-parallel-size"),
    ("--recompute-activations --recompute-modules mhc", "mhc-conflict", "--recompute-modules"),
    ("--enable-mhc-connections --recompute-activations --recompute-modules mhc mlp", "mhc-conflict", "--recompute-modules"),
    ("--enable-mhc-connections --mhc-sinkhorn-iterations 0", "mhc-conflict", "--mhc-sinkhorn-iterations"),
]

AUDIT_CODES = {code for _, code, _ in CASES if code}


@pytest.mark.parametrize("extra, code, location", CASES, ids=[c[0].strip()[:80] for c in CASES])
def test_audit_rules_refuse_what_megatron_refuses(extra, code, location):
    environ = OFFLOAD_ENV if OFFLOAD in extra else {}
    found = [(p.code, p.location) for p in problems_of(BASE + " " + extra, 8, environ)]
    if code is None:
        assert found == []
    else:
        assert (code, location) in found
        assert {c for c, _ in found} <= AUDIT_CODES | {"deepep-needs-flex"}, found


def test_squared_relu_with_biases_has_no_fused_bias_activation():
    # argument_utils.py: without --swiglu the fusion is --bias-gelu-fusion (on by default with biases)
    base = BASE.replace(" --swiglu", "")
    assert ("bias-activation-fusion", "--squared-relu") in [(p.code, p.location) for p in problems_of(base + " --squared-relu", 8)]
    assert problems_of(base + " --squared-relu --disable-bias-linear", 8) == []
    assert problems_of(base + " --squared-relu --no-bias-gelu-fusion", 8) == []
    found = [(p.code, p.location) for p in problems_of(base + " --quick-geglu --use-te-activation-func --no-bias-gelu-fusion", 8)]
    assert found == [("bias-activation-fusion", "--use-te-activation-func")]


def test_mla_rope_fusion_needs_yarn_and_no_latent_cache():
    # MLATransformerConfig.__post_init__: RoPE fusion (on unless --no-rope-fusion) needs yarn
    base = BASE.replace(" --no-rope-fusion", "") + MLA
    assert problems_of(base, 8) == []
    assert ("mla-rope-conflict", "--rope-type") in [(p.code, p.location) for p in problems_of(base + " --rope-type rope", 8)]
    assert ("mla-rope-conflict", "--cache-mla-latents") in [(p.code, p.location) for p in problems_of(base + " --cache-mla-latents", 8)]
    assert problems_of(BASE + MLA + " --rope-type rope", 8) == []


@pytest.mark.parametrize("extra, rule, first", [
    ("--moe-ffn-hidden-size 512", "moe-ffn-hidden-size-without-experts", "0.18.0"),
    (EP8 + " --overlap-moe-expert-parallel-comm --recompute-activations --recompute-modules moe", "moe-overlap-conflict", "0.17.0"),
    (HYBRIDEP, "flex-dispatcher-backend", "0.19.0"),
    (MOE + OFFLOAD + " --offload-modules expert_fc1 --recompute-activations --recompute-modules moe",
     "offload-inside-moe-recompute", "0.19.0"),
    (MOE + OFFLOAD + " --offload-modules fused_group_mlp", "offload-fused-group-mlp", "0.19.0"),
    (MOE + " --activation-func-clamp-value 7.0 --glu-linear-offset 1.0 --no-bias-swiglu-fusion", "swiglu-clamp", "main"),
    (BATCH_INVARIANT + " --context-parallel-size 2", "batch-invariant-mode", "0.19.0"),
    (MOE + BATCH_INVARIANT + " --moe-permute-fusion", "batch-invariant-mode", "main"),
])
def test_audit_rules_hold_from_the_release_that_added_them(extra, rule, first):
    from megatron_estimator.megatron.releases import labels, order_of

    environ = OFFLOAD_ENV if OFFLOAD in extra else {}
    for label in labels():
        found = rule in [p.code for p in problems_of(BASE + " " + extra, 8, environ, label)]
        assert found is (order_of(label) >= order_of(first)), label


def test_single_grouped_weight_checks_follow_the_release():
    text = BASE + MOE + " --moe-single-grouped-weight"
    assert "moe-single-grouped" in [p.code for p in problems_of(text, 8)]          # main: needs grouped tensor
    assert problems_of(text, 8, release="0.19.0") == []                            # no --moe-use-grouped-tensor there
