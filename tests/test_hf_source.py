"""``--hf-config SOURCE``: a local file or directory, an inline JSON object, or a HuggingFace hub
model id (inputs/hf/source.py), and ``check`` of a directory holding a config.json.

No test reaches the network: the hub is read from a cache laid out as huggingface_hub lays it
out, with HF_HUB_OFFLINE=1, in a fresh interpreter (huggingface_hub reads HF_HOME,
HF_HUB_CACHE and HF_HUB_OFFLINE once, when it is imported); a missing huggingface_hub is a
``None`` in ``sys.modules``; the hub's own errors come from a stand-in module whose exception
classes carry huggingface_hub's names.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import pytest

from conftest import REPO

from megatron_estimator.cli import main
from megatron_estimator.inputs.hf import load_hf_config
from megatron_estimator.inputs.hf.source import INLINE, hub_model_id

FIXTURES = REPO / "tests" / "fixtures" / "hf"
LLAMA_1B = FIXTURES / "llama3.2-1b.json"
# Llama-3.2-1B (the fixture: 16 layers, hidden 2048, ffn 8192, 32 heads of 64, 8 KV heads,
# vocabulary 128256, tied embeddings), counted by hand:
#   embedding 128256 x 2048                                   = 262,668,288
#   a layer: q and o 2 x 2048 x 2048 = 8,388,608; k and v 2 x 2048 x (8 x 64) = 2,097,152;
#            MLP 3 x 2048 x 8192 = 50,331,648; two RMSNorms 2 x 2048 = 4,096  = 60,821,504
#   16 layers                                                 = 973,144,064
#   final norm                                                = 2,048
#   total                                                     = 1,235,814,400 (published 1.24B)
LLAMA_1B_PARAMETERS = 262_668_288 + 16 * 60_821_504 + 2_048
TRAINING = ["--seq-length", "2048", "--micro-batch-size", "1", "--bf16", "--make-vocab-size-divisible-by", "1"]
COMMIT = "0123456789abcdef0123456789abcdef01234567"   # any 40 hex digits name a snapshot


# --------------------------------------------------------------------------------------------
# Which form an argument is


@pytest.mark.parametrize("value, expected", [
    ("deepseek-ai/DeepSeek-V3", ("deepseek-ai/DeepSeek-V3", None)),
    ("Qwen/Qwen2.5-0.5B@v1.0", ("Qwen/Qwen2.5-0.5B", "v1.0")),
    ("meta-llama/Llama-3.2-1B@refs/pr/1", ("meta-llama/Llama-3.2-1B", "refs/pr/1")),
    ("a_b/c.d@" + COMMIT, ("a_b/c.d", COMMIT)),
    ("gpt2", (None, None)),                         # a single name: legacy ids are not looked up
    ("configs/llama/config", (None, None)),         # three parts: a path
    ("models/llama.json", (None, None)),            # a .json name: a missing file
    ("-x/y", (None, None)), ("x/y-", (None, None)), ("x/.y", (None, None)),
    ("x--y/z", (None, None)), ("x/y..z", (None, None)), ("x y/z", (None, None)), ("x/", (None, None)),
    ("x/y@", (None, None)), ("x/y@main branch", (None, None)),
    ("o/" + "n" * 94, ("o/" + "n" * 94, None)),      # 96 characters, the hub's longest
    ("o/" + "n" * 95, (None, None)),
])
def test_hub_model_ids_are_spelled_as_the_hub_spells_them(value, expected):
    assert hub_model_id(value) == expected


def test_an_existing_path_wins_over_a_hub_id(tmp_path, monkeypatch):
    (tmp_path / "acme" / "tiny").mkdir(parents=True)
    (tmp_path / "acme" / "tiny" / "config.json").write_text(LLAMA_1B.read_text())
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)   # a hub read would be a problem
    imported = load_hf_config("acme/tiny")
    assert imported.problems == ()
    assert imported.source == os.path.join("acme/tiny", "config.json")
    assert imported.raw.value("num_layers") == 16


def test_neither_a_path_nor_a_hub_id_is_one_problem(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    (problem,) = load_hf_config("gpt2").problems
    assert (problem.code, problem.location) == ("hf-config-not-found", "gpt2")
    assert "OWNER/NAME[@REVISION]" in problem.message
    assert main(["estimate", "--hf-config", "no such/config file", "--", *TRAINING]) == 2
    out = capsys.readouterr().out
    assert "error: no such/config file: no such file or directory, and not a HuggingFace hub model id" in out


# --------------------------------------------------------------------------------------------
# Inline JSON


def test_inline_json_reads_as_the_file_does():
    text = LLAMA_1B.read_text()
    inline, from_file = load_hf_config(text), load_hf_config(LLAMA_1B)
    assert inline.problems == () and inline.source == INLINE
    assert inline.raw.settings.keys() == from_file.raw.settings.keys()
    assert all(inline.raw.value(d) == from_file.raw.value(d) for d in from_file.raw.settings)
    # "num_hidden_layers": 16 is on line 18 of the text
    assert inline.raw.value("num_layers") == 16
    assert inline.raw.location("num_layers") == f"{INLINE}:18 num_hidden_layers"


def test_inline_json_problems_are_located_in_the_argument():
    problems = load_hf_config('{"model_type": "llama",\n "hidden_size": "x"}').problems
    (bad,) = [p for p in problems if p.code == "hf-bad-value"]
    assert bad.location == f"{INLINE}:2 hidden_size"
    assert {p.location for p in problems if p.code == "hf-missing-key"} == {INLINE}   # keys not there
    (broken,) = load_hf_config('  {"model_type": "llama",}').problems
    # the "}" after the comma is the 26th character of the line
    assert (broken.code, broken.location) == ("hf-malformed-json", f"{INLINE}:1")
    assert "line 1, column 26" in broken.message


def test_inline_json_on_the_command_line(capsys):
    code = main(["estimate", "--hf-config", LLAMA_1B.read_text(), "--format", "json", "--", *TRAINING])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0
    assert doc["total_parameters"] == LLAMA_1B_PARAMETERS
    assert doc["source"] == "--hf-config <inline> + command line"


# --------------------------------------------------------------------------------------------
# Hub ids without huggingface_hub, and the hub's errors


def test_a_hub_id_without_huggingface_hub_says_what_to_do(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)       # import huggingface_hub fails
    (problem,) = load_hf_config("deepseek-ai/DeepSeek-V3@main").problems
    assert (problem.code, problem.location) == ("hf-hub-unavailable", "deepseek-ai/DeepSeek-V3@main")
    assert "pip install 'megatron-estimator[hub]'" in problem.message
    assert "download its config.json and give the file's path" in problem.message
    assert main(["estimate", "--hf-config", "deepseek-ai/DeepSeek-V3", "--", *TRAINING]) == 2
    out = capsys.readouterr().out
    assert out.count("error: ") == 1 and "[hf-hub-unavailable]" in out and "Traceback" not in out


def _hub_standing_in(monkeypatch, error_class_names, raised, offline=False):
    """A huggingface_hub whose hf_hub_download raises ``raised``, one of ``error_class_names``
    (classes named as huggingface_hub names them, the first subclassing the rest in order)."""
    base = Exception
    classes = {}
    for name in reversed(error_class_names):
        base = classes[name] = type(name, (base,), {})
    module = types.ModuleType("huggingface_hub")

    def hf_hub_download(repo_id, filename, revision=None):
        raise classes[raised]("from the stand-in")

    module.hf_hub_download = hf_hub_download
    module.constants = types.SimpleNamespace(HF_HUB_OFFLINE=offline)
    monkeypatch.setitem(sys.modules, "huggingface_hub", module)
    monkeypatch.setitem(sys.modules, "huggingface_hub.constants", module.constants)


@pytest.mark.parametrize("classes, code, words", [
    (["GatedRepoError", "RepositoryNotFoundError"], "hf-hub-not-found", "a gated repository"),
    (["RepositoryNotFoundError", "OSError"], "hf-hub-not-found", "no model repository acme/tiny on the HuggingFace hub"),
    (["RevisionNotFoundError"], "hf-hub-not-found", "no such revision"),
    (["RemoteEntryNotFoundError", "EntryNotFoundError"], "hf-hub-not-found", "the repository has no config.json"),
    (["LocalEntryNotFoundError", "EntryNotFoundError"], "hf-hub-unavailable", "the hub cannot be reached"),
    (["HfHubHTTPError"], "hf-hub-unavailable", "HfHubHTTPError: from the stand-in"),
])
def test_hub_errors_are_one_problem_each(monkeypatch, classes, code, words):
    _hub_standing_in(monkeypatch, classes, classes[0])
    (problem,) = load_hf_config("acme/tiny@v2").problems
    assert (problem.code, problem.location) == (code, "acme/tiny@v2")
    assert words in problem.message


def test_offline_and_not_cached_names_hf_hub_offline(monkeypatch):
    _hub_standing_in(monkeypatch, ["LocalEntryNotFoundError"], "LocalEntryNotFoundError", offline=True)
    (problem,) = load_hf_config("acme/tiny").problems
    assert problem.message.startswith("HF_HUB_OFFLINE is set and the model's config.json is not in the "
                                      "HuggingFace cache (HF_HOME / HF_HUB_CACHE)")


# --------------------------------------------------------------------------------------------
# Hub ids through huggingface_hub and its cache (offline)


def _cache(hub_cache, repo_id, text, ref="main"):
    """A model repository's config.json in huggingface_hub's cache layout:
    models--OWNER--NAME/refs/REF holds the commit; snapshots/COMMIT/config.json the file."""
    repo = hub_cache / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / ref).write_text(COMMIT)
    (repo / "snapshots" / COMMIT).mkdir(parents=True)
    (repo / "snapshots" / COMMIT / "config.json").write_text(text)


def _estimate(source, env):
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "MEGATRON_ESTIMATOR_"))}
    environment.update(env, HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "megatron_estimator", "estimate", "--hf-config", source,
                           "--format", "json", "--", *TRAINING], capture_output=True, text=True,
                          env=environment, cwd=REPO, timeout=120)


def test_a_hub_id_is_read_from_the_hf_home_cache(tmp_path):
    pytest.importorskip("huggingface_hub")
    _cache(tmp_path / "home" / "hub", "acme/llama-1b", LLAMA_1B.read_text())
    home = {"HF_HOME": str(tmp_path / "home")}
    for source in ("acme/llama-1b", f"acme/llama-1b@{COMMIT}", "acme/llama-1b@main"):
        result = _estimate(source, home)
        assert result.returncode == 0, result.stdout + result.stderr
        doc = json.loads(result.stdout)
        assert doc["total_parameters"] == LLAMA_1B_PARAMETERS
        assert doc["source"] == f"--hf-config {source} + command line"
    # a revision the cache does not hold, offline: one problem, exit 2
    result = _estimate("acme/llama-1b@v2", home)
    assert result.returncode == 2
    (problem,) = json.loads(result.stdout)["problems"]
    assert (problem["code"], problem["location"]) == ("hf-hub-unavailable", "acme/llama-1b@v2")
    assert problem["message"].startswith("HF_HUB_OFFLINE is set")


def test_hf_hub_cache_is_honoured_and_problems_are_located_in_the_hub_file(tmp_path):
    pytest.importorskip("huggingface_hub")
    config = json.loads(LLAMA_1B.read_text())
    config["hidden_size"] = "2048"                                  # a string: refused
    text = json.dumps(config, indent=2)
    line = text.splitlines().index('  "hidden_size": "2048",') + 1
    _cache(tmp_path / "cache", "acme/bad-llama", text)
    result = _estimate("acme/bad-llama", {"HF_HUB_CACHE": str(tmp_path / "cache")})
    assert result.returncode == 2
    (problem,) = json.loads(result.stdout)["problems"]
    assert (problem["code"], problem["location"]) == ("hf-bad-value", f"acme/bad-llama/config.json:{line} hidden_size")


# --------------------------------------------------------------------------------------------
# check: a directory holding a config.json


def test_check_reads_a_directory_holding_a_config_json(capsys):
    pythia = FIXTURES / "pythia-160m"
    code = main(["check", "--world-size", "1", "--gpu", "h100", str(pythia), "--", "--seq-length", "2048",
                 "--micro-batch-size", "1", "--bf16"])
    out = capsys.readouterr().out
    assert code == 0, out
    # GPT-NeoX 160m: 12 layers, hidden 768, 12 heads (config.json), ffn 4 x 768
    assert f"{pythia}:\n" in out and "  model: 12 layers, hidden 768, ffn 3072, 12 heads\n" in out
