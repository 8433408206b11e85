"""Cross-check: the estimator's 'G' and 'D' layer parameters against megatron-core's own modules.

Megatron-LM main (d98e8a64) builds GatedDeltaNet / GatedDeltaNet2 and AbsorbedMLASelfAttention
with its DSAttention / DSAIndexer in a child interpreter (tests/mcore_main_gd.py: that tree first
on sys.path, the meta device, the fake process group, Transformer Engine's layers stood in by
their shapes).  The installed megatron-core 0.16.1 has neither module, so the harness needs
a Megatron-LM tree; where MEGATRON_LM_TREE names none, the tests read the harness's answers as
scripts/record_megatron_checks recorded them (tests/data/megatron_answers.json)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from test_hybrid import config
from conftest import megatron_tree, recorded_answers
from test_hybrid_gd import DSA, GDN, tp

from megatron_estimator.model.parameters import layer_tensors

HARNESS = Path(__file__).with_name("mcore_main_gd.py")

TOY = dict(hidden=64, heads=4)
G_SHAPE = dict(key_heads=4, value_heads=8, key_head_dim=8, value_head_dim=8)
D_SHAPE = dict(q_lora=24, kv_lora=16, qk_head_dim=8, pe=4, v_head_dim=8, index_heads=2, index_head_dim=8, topk=4)

# (id, request to megatron-core, (pattern, flags, world size, layer index) for the estimator)
CASES = [
    *[(f"G-tp{t}", dict(kind="G", tp=t, **TOY, **G_SHAPE), ("G-", GDN + tp(t), t, 0)) for t in (1, 2, 4)],
    *[(f"gdn2-tp{t}", dict(kind="G", tp=t, variant="gdn2", **TOY, **G_SHAPE),
       ("G-", GDN + tp(t) + "--experimental-attention-variant gdn2", t, 0)) for t in (1, 2)],
    ("G-rmsnorm", dict(kind="G", tp=2, normalization="RMSNorm", **TOY, **G_SHAPE),
     ("G-", GDN + tp(2) + "--normalization RMSNorm", 2, 0)),
    *[(f"D-tp{t}", dict(kind="D", tp=t, **TOY, **D_SHAPE), ("D-", DSA + tp(t), t, 0)) for t in (1, 2, 4)],
    ("D-rmsnorm", dict(kind="D", tp=2, normalization="RMSNorm", **TOY, **D_SHAPE),
     ("D-", DSA + tp(2) + "--normalization RMSNorm", 2, 0)),
    ("D-no-q-lora", dict(kind="D", tp=2, **TOY, **{**D_SHAPE, "q_lora": None}),
     ("D-", DSA.replace("--q-lora-rank 24 ", "") + tp(2), 2, 0)),
    ("D-skips-its-topk", dict(kind="D", tp=1, topk_freq=2, layer_number=2, **TOY, **D_SHAPE),
     ("DD-", DSA + "--dsa-indexer-topk-freq 2", 1, 1)),
]


def _answers(name: str, cases) -> dict[str, dict]:
    """The harness's answers to the cases' requests: live from MEGATRON_LM_TREE, else recorded."""
    requests = [req for _, req, _ in cases]
    tree = megatron_tree("megatron/core/ssm/gated_delta_net/common.py")
    if tree is None:
        answers = recorded_answers(name, requests)
    else:
        pytest.importorskip("torch")
        result = subprocess.run([sys.executable, str(HARNESS), str(tree)], capture_output=True, text=True,
                                input="".join(json.dumps(req) + "\n" for req in requests), timeout=600)
        answers = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
        if len(answers) != len(cases):
            pytest.fail(f"the harness answered {len(answers)} of {len(cases)} requests:\n{result.stderr[-3000:]}")
    return {case_id: answer for (case_id, _, _), answer in zip(cases, answers)}


@pytest.fixture(scope="module")
def megatron_core_counts() -> dict[str, dict]:
    return _answers("gd_params", CASES)


@pytest.mark.parametrize("case_id, request_, ours", CASES, ids=[c[0] for c in CASES])
def test_g_and_d_layer_parameters_match_megatron_core(megatron_core_counts, case_id, request_, ours):
    answer = megatron_core_counts[case_id]
    assert "error" not in answer, answer["error"]
    reference = answer["params"]
    pattern, flags, world, index = ours
    cfg = config(pattern, flags, world_size=world)
    mine = layer_tensors(cfg, index, "")
    assert sum(p.numel for p in mine) == sum(reference.values()), (sorted(reference.items()), mine)
    assert sorted(p.numel for p in mine) == sorted(reference.values())


# -- activations: DSA's PyTorch sparse attention, run for real ---------------------------------
# dsa.py's path without a fused kernel is megatron-core's own PyTorch code: the harness runs
# _run_sparse_attention (the absorbed path and its V up-projection einsum) on the CPU in bf16
# and counts what autograd saves, once per storage.

CORE_CASES = [
    ("tp1", dict(kind="dsa_core", s=32, b=2, n=4, kv_lora=16, pe=4, v_head_dim=8, qk_head_dim=8, topk=4),
     ("D-", DSA, 1)),
    ("tp2-sp", dict(kind="dsa_core", s=32, b=2, n=2, kv_lora=16, pe=4, v_head_dim=8, qk_head_dim=8, topk=4),
     ("D-", DSA + tp(2), 2)),
    ("cp2", dict(kind="dsa_core", s=16, skv=32, b=2, n=4, kv_lora=16, pe=4, v_head_dim=8, qk_head_dim=8, topk=4),
     ("D-", DSA + "--context-parallel-size 2 --cp-comm-type allgather", 2)),
]


@pytest.fixture(scope="module")
def megatron_core_saved() -> dict[str, dict]:
    return _answers("dsa_saved", CORE_CASES)


@pytest.mark.parametrize("case_id, request_, ours", CORE_CASES, ids=[c[0] for c in CORE_CASES])
def test_dsa_sparse_attention_saves_what_megatron_core_saves(megatron_core_saved, case_id, request_, ours):
    from megatron_estimator.model.activations import dsa_core_bytes

    answer = megatron_core_saved[case_id]
    assert "error" not in answer, answer["error"]
    pattern, flags, world = ours
    cfg = config(pattern, flags, world_size=world)
    # the core's output is linear_proj's input, counted apart from the core
    assert dsa_core_bytes(cfg) == answer["saved_bytes"]
