"""The Megatron release a run is checked against: its choice, its flags, its behaviour.

Expected values come from Megatron-LM's own sources: which release has a flag from each tag's
megatron/training/arguments.py (../shared/megatron/by-release/, dumped from each tag's parser),
the NullTokenizer rule from megatron/core/tokenizers/text/libraries/null_tokenizer.py before and
after c9dfe34798, the FSDP default from 3499efef80, the TE fusion check from 168cb15d70.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_estimator.megatron.releases import UnknownRelease, choose_release, default_release

ROOT = Path(__file__).resolve().parent.parent
from conftest import SHARED_ENV, shared_records  # noqa: E402
from test_release_tables import BY_RELEASE  # noqa: E402  (../shared, or ESTIMATOR_SHARED_DIR)
TAG_FILES = {"0.14.0": "core_v0.14.0", "0.15.3": "core_v0.15.3", "0.16.1": "core_v0.16.1",
             "0.17.0": "core_v0.17.0", "0.18.0": "core_v0.18.0", "0.19.0": "core_v0.19.0",
             "main": "main-d98e8a64"}


def unknown(argv, label):
    from megatron_estimator.inputs.argv import parse_megatron_argv
    _, problems = parse_megatron_argv(argv, release=label)
    return [p for p in problems if p.code == "unknown-flag"]


# -- choosing a release -------------------------------------------------------------------------

@pytest.mark.parametrize("text, label, warns", [
    ("0.16.1", "0.16.1", False), ("0.16", "0.16.1", False), ("main", "main", False),
    ("core_v0.18.0", "0.18.0", False), ("0.17", "0.17.1", False), ("0.17.0", "0.17.0", False),
    ("0.18.0rc2", "0.18.0", True), ("0.15.0", "0.15.3", True), ("0.16.0rc0", "0.16.1", True),
    ("0.20.0rc0", "main", True),
])
def test_version_strings_map_to_known_releases(text, label, warns):
    got, warning = choose_release(text)
    assert got == label
    assert bool(warning) == warns


@pytest.mark.parametrize("text", ["0.9", "0.12.3", "1.0.0", "latest"])
def test_unknown_release_names_the_supported_ones(text):
    with pytest.raises(UnknownRelease, match=r"supported: 0\.14\.0, 0\.15\.3, 0\.16\.1, .*main"):
        choose_release(text)


def test_default_is_main_and_says_so():
    from megatron_estimator.api import choose_megatron_release, input_from_flags
    assert default_release().version == "main"
    assert "newest supported" in default_release().source
    assert choose_megatron_release(None, {}) == default_release()
    assert input_from_flags(["--num-layers", "2"])[0].release == default_release()


def fake_tree(tmp_path, major, minor, patch, pre=""):
    core = tmp_path / "Megatron-LM" / "megatron" / "core"
    core.mkdir(parents=True)
    (core / "package_info.py").write_text(
        f"MAJOR = {major}\nMINOR = {minor}\nPATCH = {patch}\nPRE_RELEASE = '{pre}'\n"
        "VERSION = (MAJOR, MINOR, PATCH, PRE_RELEASE)\n")
    (tmp_path / "Megatron-LM" / "pretrain_gpt.py").write_text("")
    return tmp_path / "Megatron-LM"


def test_detected_from_the_launched_megatron_tree(tmp_path):
    from megatron_estimator.api import choose_megatron_release
    tree = fake_tree(tmp_path, 0, 16, 1)
    chosen = choose_megatron_release(None, {}, launch=["torchrun", "--nproc-per-node", "8",
                                                       str(tree / "pretrain_gpt.py"), "--bf16"])
    assert chosen.version == "0.16.1"
    assert chosen.source == str(tree / "megatron" / "core" / "package_info.py")


def test_detected_from_the_jobs_pythonpath_with_rc_warning(tmp_path):
    from megatron_estimator.api import choose_megatron_release
    tree = fake_tree(tmp_path, 0, 18, 0, "rc0")
    chosen = choose_megatron_release(None, {"PYTHONPATH": f"/nowhere{os.pathsep}{tree}"},
                                     launch=["python", "train.py"])
    assert chosen.version == "0.18.0"
    assert "0.18.0rc0" in chosen.warning


def test_given_version_and_setting_win_over_the_tree(tmp_path):
    from megatron_estimator.api import choose_megatron_release
    tree = fake_tree(tmp_path, 0, 16, 1)
    env = {"MEGATRON_ESTIMATOR_MEGATRON_VERSION": "0.14"}
    assert choose_megatron_release("0.19", env, launch=[str(tree / "pretrain_gpt.py")]).version == "0.19.0"
    # The setting (here its environment variable) is asked for: it wins over the tree detected
    # (the order: the flag, the setting or its variable, then what is detected).
    chosen = choose_megatron_release(None, env, launch=[str(tree / "pretrain_gpt.py")])
    assert (chosen.version, chosen.source) == ("0.14.0", "MEGATRON_ESTIMATOR_MEGATRON_VERSION")
    assert choose_megatron_release(None, {}, launch=[str(tree / "pretrain_gpt.py")]).version == "0.16.1"
    chosen = choose_megatron_release(None, env, launch=["python", "x.py"])
    assert (chosen.version, chosen.source) == ("0.14.0", "MEGATRON_ESTIMATOR_MEGATRON_VERSION")


# -- flags per release ----------------------------------------------------------------------------

@pytest.mark.parametrize("flag, present, absent, message", [
    ("--use-legacy-models", "0.17.1", "main", "removed in 0.18.0"),
    ("--use-legacy-models", "0.14.0", "0.18.0", "removed in 0.18.0"),
    ("--moe-extended-tp", "0.16.1", "0.17.0", "removed in 0.17.0"),
    ("--no-pad-vocab-size", "0.18.0", "0.16.1", "needs Megatron 0.18.0 or later"),
    ("--no-pad-vocab-size", "main", "0.17.1", "needs Megatron 0.18.0 or later"),
])
def test_a_flag_of_some_releases_only(flag, present, absent, message):
    assert unknown([flag], present) == []
    [problem] = unknown([flag], absent)
    assert message in problem.message
    assert problem.location == flag


def _rows(label, by_release: Path):
    return [line.split("\t") for line in (by_release / f"{TAG_FILES[label]}.tsv").read_text().splitlines()[1:]]


def only_in(by_release: Path) -> dict[str, dict[str, list[str]]]:
    """Per release and other release: up to five store_true flags the first has and the other
    has not, from the reference tables of ../shared/megatron/by-release (each tag's own parser)."""
    mine = {label: {cols[0] for cols in _rows(label, by_release) if cols[3] == "store_true"
                    and (len(cols) < 10 or not cols[9])} for label in TAG_FILES}
    strings = {label: {o for cols in _rows(label, by_release) for o in [cols[0], *filter(None, cols[1].split(","))]}
               for label in TAG_FILES}
    return {label: {other: sorted(mine[label] - strings[other])[:5] for other in TAG_FILES if other != label}
            for label in TAG_FILES}


@pytest.fixture(scope="module")
def release_only_flags():
    """Live from the shared folder, else as scripts/record_megatron_checks recorded them."""
    if BY_RELEASE.is_dir():
        return only_in(BY_RELEASE)
    return shared_records()["release_only_store_true"]


def test_the_recorded_release_only_flags_are_the_shared_tables():
    if not BY_RELEASE.is_dir():
        pytest.skip(f"{BY_RELEASE} is absent (set {SHARED_ENV}); the recorded flags were checked")
    assert only_in(BY_RELEASE) == shared_records()["release_only_store_true"]


@pytest.mark.parametrize("label", sorted(TAG_FILES))
def test_each_release_accepts_its_own_flags_and_others_refuse_them(label, release_only_flags):
    for other, only_mine in release_only_flags[label].items():
        assert len(only_mine) <= 5
        for flag in only_mine:
            assert unknown([flag], label) == [], (flag, label)
            [problem] = unknown([flag], other)
            assert "removed in" in problem.message or "or later" in problem.message, (flag, other)


def test_typo_suggestions_come_from_the_chosen_release():
    [problem] = unknown(["--use-legacy-model"], "0.16.1")
    assert "--use-legacy-models" in problem.message
    [problem] = unknown(["--no-pad-vocab-sizes"], "main")
    assert "--no-pad-vocab-size" in problem.message


# -- behaviour per release ---------------------------------------------------------------------

LLAMA3_8B = ("--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 "
             "--group-query-attention --num-query-groups 8 --seq-length 8192 --max-position-embeddings 8192 "
             "--micro-batch-size 1 --global-batch-size 64 --swiglu --normalization RMSNorm "
             "--untie-embeddings-and-output-weights --disable-bias-linear --position-embedding-type rope --bf16 "
             "--tokenizer-type NullTokenizer --vocab-size 128256").split()


def _parameters(n_vocab_rows):
    # per layer: qkv 4096*(4096+2*1024), proj 4096*4096, fc1 4096*2*14336, fc2 14336*4096, 2 norms
    layer = 4096 * (4096 + 2 * 1024) + 4096 * 4096 + 4096 * 2 * 14336 + 14336 * 4096 + 2 * 4096
    return 32 * layer + 4096 + 2 * n_vocab_rows * 4096


@pytest.mark.parametrize("label, rows", [
    ("0.14.0", 128384), ("0.16.1", 128384), ("0.17.1", 128384),   # 128256 + 1, padded to 128
    ("0.18.0", 128256), ("0.19.0", 128256), ("main", 128256),     # 128256 exactly
])
def test_null_tokenizer_vocabulary_per_release(label, rows):
    from megatron_estimator.api import evaluate, input_from_flags
    inp, problems = input_from_flags(LLAMA3_8B, release=label)
    assert not problems
    verdict = evaluate(inp, world_size=8)
    assert verdict.estimate.total_parameters == _parameters(rows)
    assert _parameters(128384) == 8_031_309_824 and _parameters(128256) == 8_030_261_248


@pytest.mark.parametrize("label, strategy", [
    ("0.14.0", "no_shard"), ("0.16.1", "no_shard"), ("0.17.1", "no_shard"),
    ("0.18.0", "optim_grads_params"), ("main", "optim_grads_params"),
])
def test_megatron_fsdp_default_sharding_per_release(label, strategy):
    from conftest import resolve
    text = " ".join(LLAMA3_8B) + " --use-megatron-fsdp --ckpt-format fsdp_dtensor"
    config = resolve(text, 8, release=label)
    assert config.optimizer.data_parallel_sharding_strategy == strategy


@pytest.mark.parametrize("label, refused", [("0.14.0", False), ("0.18.0", False), ("0.19.0", True),
                                            ("main", True)])
def test_te_cross_entropy_fusion_per_release(label, refused):
    from megatron_estimator.api import evaluate, input_from_flags
    argv = LLAMA3_8B + ["--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "te"]
    inp, problems = input_from_flags(argv, release=label)
    verdict = evaluate(inp, world_size=8)
    codes = [p.code for p in (*problems, *verdict.problems)]
    assert ("te-cross-entropy-disabled" in codes) == refused


# MLA, --qk-layernorm, no --q-lora-rank (h 64, 4 heads of 8 + 8, kv_lora 16, v 8, RMSNorm, 2 layers):
# from 4464d1c197 (0.19.0) mla_qk_norm_config.py fuses a q norm of the hidden size into each
# layer's linear_q_proj (megatron_behaviour.tsv mla_qk_norm_resolved).
MLA_NO_Q_LORA = ("--num-layers 2 --hidden-size 64 --num-attention-heads 4 --ffn-hidden-size 256 "
                 "--multi-latent-attention --kv-lora-rank 16 --qk-head-dim 8 --qk-pos-emb-head-dim 8 --v-head-dim 8 "
                 "--qk-layernorm --normalization RMSNorm --disable-bias-linear --position-embedding-type rope "
                 "--seq-length 32 --max-position-embeddings 32 --micro-batch-size 1 --bf16 --vocab-size 1000 "
                 "--make-vocab-size-divisible-by 1 --untie-embeddings-and-output-weights").split()


def _mla_parameters(q_norm: bool) -> int:
    # per layer: input norm 64; [q norm 64]; q 64 x 64; kv down 64 x 24; kv norm 16; kv up 16 x 64;
    # proj 32 x 64; pre-MLP norm 64; fc1 64 x 256; fc2 256 x 64; + final norm, embedding and output
    layer = 64 + (64 if q_norm else 0) + 64 * 64 + 64 * 24 + 16 + 16 * 64 + 32 * 64 + 64 + 2 * 64 * 256
    return 2 * layer + 64 + 2 * 1000 * 64


@pytest.mark.parametrize("label, q_norm", [("0.14.0", False), ("0.18.0", False), ("0.19.0", True), ("main", True)])
def test_mla_q_norm_without_q_lora_per_release(label, q_norm):
    from megatron_estimator.api import evaluate, input_from_flags
    inp, problems = input_from_flags(MLA_NO_Q_LORA, release=label)
    assert not problems
    verdict = evaluate(inp, world_size=1)
    assert verdict.estimate.total_parameters == _mla_parameters(q_norm)


# -- the command line and the report -------------------------------------------------------------

def cli(*args, env=None):
    environ = {k: v for k, v in os.environ.items() if k != "MEGATRON_ESTIMATOR_MEGATRON_VERSION"}
    environ.update(env or {})
    environ["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "megatron_estimator", *args], capture_output=True,
                          text=True, env=environ, cwd=ROOT)


def test_json_report_names_the_release_and_its_source():
    result = cli("estimate", "--megatron-version", "0.16", "--format", "json", "--budget", "80GiB",
                 "--world-size", "8", "--", *LLAMA3_8B)
    doc = json.loads(result.stdout)
    assert doc["megatron"] == {"version": "0.16.1", "source": "--megatron-version"}
    assert doc["total_parameters"] == 8_031_309_824


def test_environment_variable_and_text_header():
    result = cli("estimate", "--budget", "80GiB", "--world-size", "8", "--", *LLAMA3_8B,
                 env={"MEGATRON_ESTIMATOR_MEGATRON_VERSION": "0.18"})
    assert "  megatron: 0.18.0 (MEGATRON_ESTIMATOR_MEGATRON_VERSION)\n" in result.stdout
    assert "parameters: 8,030,261,248" in result.stdout


def test_unknown_release_is_exit_2():
    result = cli("estimate", "--megatron-version", "0.9", "--budget", "80GiB", "--", *LLAMA3_8B)
    assert result.returncode == 2
    # 0.9 < 0.14, the first row of data/megatron_releases.tsv: named as older than it
    assert "not a supported release: it is older than 0.14.0" in result.stdout + result.stderr
    assert "(supported: 0.14.0" in result.stdout + result.stderr
    assert "Traceback" not in result.stderr


def test_evaluate_depends_only_on_its_arguments():
    # Inputs read against 0.17.1 and main, evaluated interleaved: each verdict follows its own
    # input's release (NullTokenizer: 128256 + 1 padded to 128384 rows through 0.17, 128256
    # after), whatever was evaluated before it, and names that release.
    from megatron_estimator.api import evaluate, input_from_flags
    old, _ = input_from_flags(LLAMA3_8B, release="0.17.1")
    new, _ = input_from_flags(LLAMA3_8B)
    for inp, rows, label in ((old, 128384, "0.17.1"), (new, 128256, "main"), (old, 128384, "0.17.1")):
        verdict = evaluate(inp, world_size=8)
        assert verdict.estimate.total_parameters == _parameters(rows)
        assert verdict.megatron.version == label
