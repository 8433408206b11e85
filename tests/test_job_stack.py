"""`run` reads the job's stack (PyTorch, Transformer Engine, flash-attn) from package metadata:
fake ``*.dist-info`` / ``*.egg-info`` folders on a temporary path or PYTHONPATH, a fake
Megatron-LM tree (its megatron/core/package_info.py) and a fake ``nvidia-smi`` on PATH.

What the facts change comes from Transformer Engine's
transformer_engine/pytorch/attention/dot_product_attention/utils.py ``get_attention_backend``:
deterministic training before compute capability 9.0 rules out cuDNN fused attention and
flash-attn below 2.4.1, leaving unfused attention (config.typed.deterministic_fallback).
"""

from __future__ import annotations

import json
import sys

import pytest

from conftest import TINY_GPT, flags
from test_cli import run, validate_report
from test_driver_gpu import fake_nvidia_smi

from megatron_estimator import api
from megatron_estimator.core.distributions import find_distribution, job_path, normalized
from megatron_estimator.inputs.job_stack import detect_job_stack, stack_facts
from megatron_estimator.model.overhead import Overheads


def fake_dist(site, name, version, kind="dist-info", versioned=True):
    """A distribution's metadata folder as pip (dist-info) or setuptools (egg-info) writes it."""
    folder = site / (f"{name}-{version}.{kind}" if versioned else f"{name}.{kind}")
    folder.mkdir(parents=True)
    header = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\nVersion: not-a-header\n"
    (folder / ("METADATA" if kind == "dist-info" else "PKG-INFO")).write_text(header)
    return folder


def test_find_distribution_reads_the_version_header_of_the_first_on_the_path(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    fake_dist(first, "flash_attn", "2.7.4.post1")
    fake_dist(second, "flash_attn", "2.3.6")
    assert find_distribution(["flash-attn"], [str(tmp_path / "missing"), str(first), str(second)]) == \
        ("2.7.4.post1", str(first / "flash_attn-2.7.4.post1.dist-info"))
    assert find_distribution(["Flash_Attn"], [str(second)])[0] == "2.3.6"
    assert find_distribution(["torch"], [str(first)]) is None
    assert normalized("Transformer-Engine") == "transformer_engine"


def test_egg_info_with_and_without_a_version_in_its_name(tmp_path):
    fake_dist(tmp_path / "a", "transformer_engine", "2.9.0", kind="egg-info", versioned=False)
    fake_dist(tmp_path / "b", "flash_attn", "2.6.3-py3.12", kind="egg-info")
    assert find_distribution(["transformer_engine"], [str(tmp_path / "a")])[0] == "2.9.0"
    assert find_distribution(["flash_attn"], [str(tmp_path / "b")])[0] == "2.6.3-py3.12"


def test_job_path_puts_the_launchs_pythonpath_first(tmp_path):
    path = job_path({"PYTHONPATH": f"{tmp_path}/x:{tmp_path}/y"})
    assert path[:2] == [f"{tmp_path}/x", f"{tmp_path}/y"]
    assert path[2:] == [e for e in sys.path if e not in path[:2]]


def test_everything_found(tmp_path):
    site = tmp_path / "site"
    fake_dist(site, "torch", "2.5.1")
    fake_dist(site, "transformer_engine", "2.8.0")
    fake_dist(site, "flash_attn", "2.7.4")
    flash, _te, records = stack_facts(detect_job_stack([str(site)]))
    assert flash == "2.7.4"
    assert [(r.name, r.version, r.source) for r in records] == [
        ("torch", "2.5.1", f"installed: {site / 'torch-2.5.1.dist-info'}"),
        ("transformer-engine", "2.8.0", f"installed: {site / 'transformer_engine-2.8.0.dist-info'}"),
        ("flash-attn", "2.7.4", f"installed: {site / 'flash_attn-2.7.4.dist-info'}"),
    ]
    assert records[0].effect.startswith("context only") and "for memory context only" in records[1].effect


def test_site_packages_without_flash_attn_mean_none(tmp_path):
    site = tmp_path / "site"
    fake_dist(site, "torch", "2.5.1")
    flash, _te, records = stack_facts(detect_job_stack([str(site)]))
    assert flash == "none"
    assert [(r.name, r.version) for r in records] == [("torch", "2.5.1"), ("transformer-engine", None),
                                                      ("flash-attn", "none")]
    assert records[1].source == "not installed (no metadata on the job's path)"


def test_nothing_seen_keeps_todays_assumption_and_says_so(tmp_path):
    flash, _te, records = stack_facts(detect_job_stack([str(tmp_path)]))
    assert flash is None
    [record] = records
    assert (record.name, record.version, record.source) == ("torch", None, "not found on the job's path")
    assert "as without detection" in record.effect


def test_the_flash_attn_setting_wins_over_detection(tmp_path):
    site = tmp_path / "site"
    fake_dist(site, "torch", "2.5.1")
    fake_dist(site, "flash_attn", "2.3.6")
    flash, _te, records = stack_facts(detect_job_stack([str(site)]), "2.7.4", "command line --flash-attn")
    assert flash == "2.7.4"
    assert (records[-1].version, records[-1].source) == ("2.7.4", "command line --flash-attn; installed 2.3.6 not used")
    overheads, _ = api.job_stack({}, Overheads(), None, path=[str(site)])
    assert overheads.flash_attn == "2.3.6"


DETERMINISTIC = flags(TINY_GPT, "--global-batch-size 16 --deterministic-mode --tokenizer-type NullTokenizer")


def _megatron_tree(tmp_path, minor):
    tree = tmp_path / "Megatron-LM"
    (tree / "megatron" / "core").mkdir(parents=True)
    (tree / "megatron" / "core" / "package_info.py").write_text(f"MAJOR = 0\nMINOR = {minor}\nPATCH = 0\n")
    (tree / "pretrain_gpt.py").write_text("raise SystemExit(0)\n")
    return tree


@pytest.mark.parametrize("flash, backend", [("2.3.6", "unfused"), ("2.7.4", "flash")])
def test_run_reads_tree_metadata_and_driver(tmp_path, flash, backend):
    tree = _megatron_tree(tmp_path, 18)
    site = tmp_path / "site"
    fake_dist(site, "torch", "2.5.1")
    fake_dist(site, "transformer_engine", "2.8.0")
    fake_dist(site, "flash_attn", flash)
    env = fake_nvidia_smi(tmp_path / "bin", "NVIDIA A100-SXM4-80GB, 81920\n")
    env["PYTHONPATH"] = f"{run.__globals__['REPO']}:{site}"
    env["NCCL_ALGO"] = "Ring"
    command = [sys.executable, str(tree / "pretrain_gpt.py"), *DETERMINISTIC]
    # A 90 GiB CUDA context makes any estimate over the 80 GiB budget: nothing is launched, the report is written.
    result = run(["run", "--format", "json", "--cuda-context", "90GiB", "--"] + command, env=env)
    assert result.returncode == 1, result.stderr
    doc = json.loads(result.stderr)
    validate_report(doc)
    assert doc["megatron"] == {"version": "0.18.0",
                               "source": str(tree / "megatron" / "core" / "package_info.py")}
    assert {p["name"]: (p["version"], p["source"]) for p in doc["stack"]} == {
        "torch": ("2.5.1", f"installed: {site / 'torch-2.5.1.dist-info'}"),
        "transformer-engine": ("2.8.0", f"installed: {site / 'transformer_engine-2.8.0.dist-info'}"),
        "flash-attn": (flash, f"installed: {site / f'flash_attn-{flash}.dist-info'}"),
    }
    [attention] = [a for a in doc["assumptions"] if a["key"] == "attention_backend"]
    assert attention["value"] == backend
    # the budget from the fake driver: the catalog's A100 80GB
    [stage] = doc["stages"]
    assert doc["budget_bytes"] == api.lookup_gpu("a100-80gb").total_memory_bytes


def test_run_text_report_names_the_stack(tmp_path):
    site = tmp_path / "site"
    fake_dist(site, "torch", "2.5.1")
    env = {"PYTHONPATH": f"{run.__globals__['REPO']}:{site}"}
    script = tmp_path / "pretrain_gpt.py"
    script.write_text("raise SystemExit(0)\n")
    result = run(["run", "--budget", "1MiB", "--flash-attn", "2.7.4", "--", sys.executable, str(script),
                  *flags(TINY_GPT)], env=env)
    assert result.returncode == 1
    assert (f"  job stack: torch 2.5.1 (installed: {site / 'torch-2.5.1.dist-info'}): context only: "
            "the estimate does not depend on the PyTorch version\n") in result.stderr
    assert "  job stack: flash-attn 2.7.4 (command line --flash-attn): " in result.stderr
    assert "  job stack: transformer-engine (not installed (no metadata on the job's path)): " in result.stderr


def test_run_checks_the_installed_transformer_engine_version(tmp_path):
    # megatron/training/arguments.py validate_args: --qk-clip asserts is_te_min_version("2.9.0")
    site = tmp_path / "site"
    fake_dist(site, "torch", "2.5.1")
    fake_dist(site, "transformer_engine", "2.8.0")
    env = {"PYTHONPATH": f"{run.__globals__['REPO']}:{site}"}
    script = tmp_path / "pretrain_gpt.py"
    script.write_text("raise SystemExit(0)\n")
    result = run(["run", "--budget", "80GiB", "--megatron-version", "main", "--", sys.executable, str(script),
                  *flags(TINY_GPT), "--qk-clip"], env=env)
    assert result.returncode == 2
    assert ("error: --qk-clip: --qk-clip needs Transformer Engine >= 2.9.0 (Megatron main); the job's "
            "Transformer Engine is 2.8.0 [transformer-engine-version]") in result.stderr


# -- estimate / check --stack: the same facts, stated -----------------------------------------

@pytest.mark.parametrize("stack, backend", [("torch=2.5.1,te=2.8.0,flash-attn=2.3.6", "unfused"),
                                            ("torch=2.5.1,te=2.8.0,flash-attn=2.7.4", "flash"),
                                            ("flash-attn=none", "unfused")])
def test_stated_stack_feeds_the_facts_run_detects(tmp_path, stack, backend):
    # the same A100 deterministic run as test_run_reads_tree_metadata_and_driver: flash-attn
    # below 2.4.1 (or none) leaves Transformer Engine unfused attention before Hopper
    result = run(["estimate", "--gpu", "a100-80gb", "--format", "json", "--stack", stack, "--", *DETERMINISTIC])
    assert result.returncode in (0, 1), result.stdout + result.stderr
    doc = json.loads(result.stdout)
    validate_report(doc)
    [attention] = [a for a in doc["assumptions"] if a["key"] == "attention_backend"]
    assert attention["value"] == backend
    stated = {p["name"]: (p["version"], p["source"]) for p in doc["stack"]}
    assert all(source == "command line --stack" for _, source in stated.values())
    assert stated["flash-attn"][0] == stack.rpartition("flash-attn=")[2]
    # check reads the same option (and a settings file's key) into the same facts
    (tmp_path / "pyproject.toml").write_text(f'[tool.megatron-estimator]\nstack = "{stack}"\n')
    (tmp_path / "train.sh").write_text("#!/bin/bash\npython pretrain_gpt.py " + " ".join(DETERMINISTIC) + "\n")
    checked = run(["check", "--gpu", "a100-80gb", "--format", "json", "train.sh"], cwd=tmp_path)
    verdict = json.loads(checked.stdout)
    [attention] = [a for a in verdict["assumptions"] if a["key"] == "attention_backend"]
    assert attention["value"] == backend
    assert {p["source"] for p in verdict["stack"]} == {f"{tmp_path / 'pyproject.toml'}:2 [tool.megatron-estimator] stack"}


def test_stated_stack_with_an_unknown_package_or_a_bad_version_is_one_located_problem():
    result = run(["estimate", "--stack", "torhc=2.8,flash-attn=2.x.1", "--", *DETERMINISTIC])
    assert result.returncode == 2
    errors = [line for line in result.stdout.splitlines() if line.strip().startswith("error:")]
    assert errors == ["  error: command line --stack: unknown package 'torhc' (known: torch, transformer-engine "
                      "(te), flash-attn); flash-attn=2.x.1: the version must be like 2.8, 2.7.4 or 2.x, or none "
                      "[invalid-setting]"]


def test_stated_series_answers_no_minimum_version_question():
    from megatron_estimator.core.stack import parse_stack
    from megatron_estimator.inputs.job_stack import stated_found, with_stack

    stated = parse_stack("te=2.x, PyTorch=2.8, flash_attn=2.7.4.post1")
    assert stated == {"transformer-engine": "2.x", "torch": "2.8", "flash-attn": "2.7.4.post1"}
    overheads, records = with_stack(Overheads(), stated_found(stated), stated="command line --stack")
    # 2.x cannot say whether Transformer Engine is >= 2.9.0: no version check runs on it
    assert (overheads.transformer_engine, overheads.flash_attn) == (None, "2.7.4.post1")
    assert [r.name for r in records] == ["torch", "transformer-engine", "flash-attn"]
    with pytest.raises(ValueError, match="given twice"):
        parse_stack("te=2.8,transformer-engine=2.9")
