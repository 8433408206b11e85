"""Cross-check: the estimator's MLA attention parameters (main) against Megatron-LM main's own
MLASelfAttention and its QKNormConfigResolver (mla_qk_norm_config.py, from 4464d1c197).

tests/mcore_main_mla.py builds MLASelfAttention in a child interpreter with the Megatron-LM tree
first on sys.path (the meta device, the fake process group, Transformer Engine's layers stood in
by their shapes), with the submodules of the GPT TE spec, the hybrid '+' spec and the local spec.
The installed megatron-core 0.16.1 has no resolver (its counts are tests/test_mcore_crosscheck.py's),
so the harness runs where MEGATRON_LM_TREE names a Megatron-LM tree (and torch is installed);
elsewhere the tests read its answers as scripts/record_megatron_checks recorded them
(tests/data/megatron_answers.json).  What the resolver refuses is checked against the
estimator's rule for the same flags.  The same harness builds core_v0.18.0's MLASelfAttention
(no resolver: the spec's modules as given) from a git archive of a Megatron-LM git directory
(MEGATRON_LM_GIT, else the record), compared with the estimate at 0.18.0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import megatron_tree, recorded_answers
from test_mla_norms import GPT, HYBRID, H, A, KV, QK, PE, V, _attention, _codes

HARNESS = Path(__file__).with_name("mcore_main_mla.py")
SHAPE = dict(hidden=H, heads=A, kv_lora=KV, qk_head_dim=QK, pe=PE, v_head_dim=V)


def _flags(spec: str, q_lora, normalization: str, qk_norm: bool) -> str:
    text = (HYBRID if spec == "hybrid" else GPT) + f"--normalization {normalization}"
    if spec == "local":
        text += " --transformer-impl local"
    if q_lora is not None:
        text += f" --q-lora-rank {q_lora}"
    return text + (" --qk-layernorm" if qk_norm else "")


BUILDS = [(spec, q_lora, normalization, t, qk)
          for spec in ("gpt", "hybrid") for q_lora in (32, None) for normalization in ("LayerNorm", "RMSNorm")
          for t in (1, 2) for qk in (True, False)]
BUILDS += [("local", 32, normalization, t, True) for normalization in ("LayerNorm", "RMSNorm") for t in (1, 2)]
# (id, request, the estimator's flags and the rule code that refuses them)
REFUSALS = [
    ("local-q-norm-without-q-lora", dict(spec="local", tp=1, q_lora=None, qk_norm=True),
     _flags("local", None, "RMSNorm", True), "mla-q-norm-unused"),
    ("hybrid-local-backend", dict(spec="hybrid", backend="local", tp=1, q_lora=32, qk_norm=True),
     _flags("hybrid", 32, "RMSNorm", True) + " --transformer-impl local", "mla-qk-norm-needs-te"),
    ("gpt-qk-l2-norm", dict(spec="gpt", tp=1, q_lora=32, qk_l2_norm=True),
     _flags("gpt", 32, "RMSNorm", False) + " --qk-l2-norm", "mla-with-qk-l2-norm"),
    ("hybrid-qk-l2-norm", dict(spec="hybrid", tp=1, q_lora=None, qk_l2_norm=True),
     _flags("hybrid", None, "RMSNorm", False) + " --qk-l2-norm", "mla-with-qk-l2-norm"),
]


def _build_id(case) -> str:
    spec, q_lora, normalization, t, qk = case
    return f"{spec}-q{q_lora or 'none'}-{normalization}-tp{t}-{'qk' if qk else 'noqk'}"


def _requests():
    for spec, q_lora, normalization, t, qk in BUILDS:
        # the local norms (torch's) refuse sequence parallelism; it does not change parameters
        yield dict(spec=spec, tp=t, q_lora=q_lora, normalization=normalization, qk_norm=qk,
                   sp=t > 1 and spec != "local", **SHAPE)
    for _, req, _, _ in REFUSALS:
        yield dict(normalization="RMSNorm", **SHAPE, **req)


def _harness(tree: Path, requests: list[dict]) -> list[dict]:
    result = subprocess.run([sys.executable, str(HARNESS), str(tree)],
                            input="".join(json.dumps(r) + "\n" for r in requests),
                            capture_output=True, text=True, timeout=600)
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if len(lines) != len(requests):
        pytest.fail(f"the harness answered {len(lines)} of {len(requests)} requests:\n{result.stderr[-3000:]}")
    return [json.loads(line) for line in lines]


@pytest.fixture(scope="module")
def megatron_main() -> list[dict]:
    requests = list(_requests())
    tree = megatron_tree("megatron/core/transformer/mla_qk_norm_config.py")
    if tree is None:
        return recorded_answers("mla_main", requests)
    pytest.importorskip("torch")
    return _harness(tree, requests)


@pytest.mark.parametrize("index", range(len(BUILDS)), ids=[_build_id(c) for c in BUILDS])
def test_mla_attention_parameters_match_megatron_main(megatron_main, index):
    spec, q_lora, normalization, t, qk = BUILDS[index]
    answer = megatron_main[index]
    assert "error" not in answer, answer["error"]
    ours = _attention(_flags(spec, q_lora, normalization, qk), t, "main",
                      layer=1 if spec == "hybrid" else None)
    assert ours == sum(answer["params"].values()), sorted(answer["params"].items())


@pytest.mark.parametrize("index", range(len(REFUSALS)), ids=[r[0] for r in REFUSALS])
def test_what_megatron_main_refuses_the_estimator_refuses(megatron_main, index):
    _, _, flags, code = REFUSALS[index]
    answer = megatron_main[len(BUILDS) + index]
    assert "error" in answer and answer["error"].split(":")[0] in ("ValueError", "RuntimeError"), answer
    assert code in _codes(flags, "main")


# -- a release before the resolver: 0.18.0, from the Megatron-LM git mirror ----------------------

OLD_RELEASE, OLD_TAG = "0.18.0", "core_v0.18.0"
OLD_BUILDS = [(spec, q_lora, normalization, t, True) for spec in ("gpt", "local") for q_lora in (32, None)
              for normalization in ("LayerNorm", "RMSNorm") for t in (1, 2)]


def old_requests() -> list[dict]:
    return [dict(spec=spec, tp=t, q_lora=q_lora, normalization=normalization, qk_norm=qk,
                 sp=t > 1 and spec != "local", **SHAPE) for spec, q_lora, normalization, t, qk in OLD_BUILDS]


@pytest.fixture(scope="module")
def megatron_0_18(tmp_path_factory) -> list[dict]:
    """MLASelfAttention of core_v0.18.0 (megatron/core only, by git archive of MEGATRON_LM_GIT)."""
    import shutil

    git_dir = os.environ.get("MEGATRON_LM_GIT")
    if not git_dir or shutil.which("git") is None:
        return recorded_answers("mla_0.18.0", old_requests())
    pytest.importorskip("torch")
    tree = tmp_path_factory.mktemp("megatron-0.18.0")
    archive = subprocess.run(["git", "--git-dir", git_dir, "archive", OLD_TAG, "megatron/core"],
                             capture_output=True, timeout=120)
    if archive.returncode:
        pytest.fail(f"{OLD_TAG} is not in MEGATRON_LM_GIT={git_dir}: {archive.stderr.decode()[-300:]}")
    subprocess.run(["tar", "x", "-C", str(tree)], input=archive.stdout, check=True, timeout=120)
    return _harness(tree, old_requests())


@pytest.mark.parametrize("index", range(len(OLD_BUILDS)), ids=[_build_id(c) for c in OLD_BUILDS])
def test_mla_attention_parameters_match_megatron_0_18(megatron_0_18, index):
    # no q norm without --q-lora-rank (GPT: a plain linear_q_proj; local: q_layernorm not built)
    spec, q_lora, normalization, t, qk = OLD_BUILDS[index]
    answer = megatron_0_18[index]
    assert "error" not in answer, answer["error"]
    ours = _attention(_flags(spec, q_lora, normalization, qk), t, OLD_RELEASE)
    assert ours == sum(answer["params"].values()), sorted(answer["params"].items())
