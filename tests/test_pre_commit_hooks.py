""".pre-commit-hooks.yaml: the manifest's fields, its ``files`` pattern, and the hook run the way
pre-commit runs it: ``shlex.split(entry) + args + file names``, from the repository's root.

pre-commit installs this package and runs the ``megatron-estimator`` console script; here that
program is replaced by ``python -m megatron_estimator`` on this working tree (the console
script calls the same ``megatron_estimator.cli:entry_point``, which a test below checks), so
the tests exercise this code and never an older installed copy.
"""

from __future__ import annotations

import configparser
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

MANIFEST = REPO / ".pre-commit-hooks.yaml"
HOOK_ID = "megatron-estimator-check"
STAGE_HEADER = ["stage", "layers", "params", "weights", "grads", "optim", "activ", "other", "peak", "headroom"]

# The manifest keys pre-commit knows (pre-commit's clientlib MANIFEST_HOOK_DICT); a misspelt
# key is ignored there with only a warning, so it is an error here.
KNOWN_KEYS = {
    "id", "name", "entry", "language", "alias", "files", "exclude", "types", "types_or",
    "exclude_types", "additional_dependencies", "args", "always_run", "fail_fast",
    "pass_filenames", "description", "language_version", "log_file", "require_serial",
    "stages", "verbose", "minimum_pre_commit_version",
}

NOT_A_LAUNCH = """\
#!/usr/bin/env bash
# Set up a development environment: not a training launch.
set -euo pipefail
python -m pip install -e .
python tools/preprocess_data.py --input corpus.jsonl --output-prefix corpus --workers 8
"""

GITHUB_WORKFLOW = """\
name: ci
on: [push, pull_request]
jobs:
  test:
    runs-on: ubuntu-latest
    steps:
      - uses: actions/checkout@v4
      - run: pytest
"""

DOCKER_COMPOSE = """\
services:
  trainer:
    image: nvcr.io/nvidia/pytorch:24.05-py3
    volumes: ["./data:/data"]
"""


def manifest() -> list[dict]:
    import yaml

    return yaml.safe_load(MANIFEST.read_text())


def hook() -> dict:
    (found,) = [h for h in manifest() if h["id"] == HOOK_ID]
    return found


def hook_argv(spec: dict, files, user_args=None) -> list[str]:
    """What pre-commit runs: the entry split as a shell would, the hook's args (or the
    repository's own ``args``, which replace them), then the file names."""
    argv = shlex.split(spec["entry"]) + list(spec.get("args", []) if user_args is None else user_args)
    assert argv[0] == "megatron-estimator"
    return [sys.executable, "-m", "megatron_estimator"] + argv[1:] + [str(f) for f in files]


def run_hook(files, *, cwd: Path = REPO, user_args=None, env=None) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith(("MEGATRON_ESTIMATOR_", "SLURM_")) and k != "WORLD_SIZE"}
    environ["PYTHONPATH"] = str(REPO)
    environ.update(env or {})
    return subprocess.run(hook_argv(hook(), files, user_args), capture_output=True, text=True,
                          env=environ, cwd=cwd, timeout=120)


@pytest.fixture
def training_repo(tmp_path: Path) -> Path:
    """A training repository's root: .git (where settings discovery stops) and a team budget."""
    (tmp_path / ".git").mkdir()
    (tmp_path / "pyproject.toml").write_text('[tool.megatron-estimator]\nbudget = "64GiB"\n')
    return tmp_path


def write(root: Path, name: str, text: str) -> Path:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# --- the manifest --------------------------------------------------------------------------

def test_manifest_is_a_list_of_hooks_with_known_keys():
    hooks = manifest()
    assert isinstance(hooks, list) and [h["id"] for h in hooks] == [HOOK_ID]
    for spec in hooks:
        assert set(spec) <= KNOWN_KEYS, set(spec) - KNOWN_KEYS
        for key in ("id", "name", "entry", "language", "description"):
            assert isinstance(spec[key], str) and spec[key].strip(), key
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", spec["id"])


def test_hook_fields():
    spec = hook()
    assert spec["language"] == "python"            # pre-commit pip-installs this repository
    assert shlex.split(spec["entry"]) == ["megatron-estimator", "check", "--skip-unknown"]
    assert spec["pass_filenames"] is True           # check reads the staged files it is given
    assert spec["require_serial"] is False          # each file is checked on its own
    assert spec["types"] == ["text"]
    assert "args" not in spec                       # the budget is the repository's to give
    assert not spec.get("always_run", False)


def test_entry_program_is_the_console_script_python_m_runs():
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    scripts = dict(line.split(" = ") for line in cfg["options.entry_points"]["console_scripts"].strip().splitlines())
    assert scripts[shlex.split(hook()["entry"])[0]] == "megatron_estimator.cli:entry_point"
    assert "from megatron_estimator.cli import entry_point" in (REPO / "megatron_estimator" / "__main__.py").read_text()


@pytest.mark.parametrize("path, selected", [
    ("examples/llama3-8b.yaml", True),
    ("examples/llama3_8b_pretrain.sh", True),
    ("configs/gpt/175b.yml", True),
    ("jobs/pretrain_llama.sbatch", True),
    ("jobs/pretrain_llama.slurm", True),
    ("scripts/train.bash", True),
    (".github/workflows/ci.yml", True),             # selected, then passed over by --skip-unknown
    ("docker-compose.yaml", True),
    ("model/config.json", False),                   # a HF config.json needs a layout to mean anything
    ("README.md", False),
    ("pretrain_gpt.py", False),
    ("configs/llama.yaml.bak", False),
    ("configs/llama.yaml~", False),
    ("scripts/run.sh.orig", False),
    ("Makefile", False),
    ("docs/yaml", False),
    ("shell/sbatch", False),
])
def test_files_pattern(path, selected):
    # pre-commit matches `files` with re.search on the path relative to the repository root
    assert bool(re.search(hook()["files"], path)) is selected


# --- the hook, run as pre-commit runs it ----------------------------------------------------

def test_examples_fit_with_the_budget_in_args():
    result = run_hook(["examples/llama3-8b.yaml", "examples/llama3_8b_pretrain.sh"], user_args=["--gpu", "h100"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr == ""
    assert result.stdout.count("verdict: FITS") == 2
    assert "examples/llama3-8b.yaml:\n  world size 8 (world_size in examples/llama3-8b.yaml:33 training.world_size)" in result.stdout
    assert "examples/llama3_8b_pretrain.sh:\n  world size 16 (torchrun --nproc_per_node 8" in result.stdout
    assert result.stdout.count("parameters: 8,030,261,248") == 2
    assert result.stdout.count("budget: 79.18 GiB per GPU (h100-sxm-80gb capacity") == 2


def test_over_budget_fails_with_the_stage_table(training_repo):
    config = write(training_repo, "configs/llama3-70b.yaml", (REPO / "examples" / "llama3-70b-tight.yaml").read_text())
    result = run_hook([config.relative_to(training_repo)], cwd=training_repo)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert f"  budget: 64.00 GiB per GPU ({training_repo / 'pyproject.toml'}:2 [tool.megatron-estimator] budget)" in lines
    (header,) = [i for i, line in enumerate(lines) if line.split() == STAGE_HEADER]
    rows = [line.split() for line in lines[header + 1:header + 5]]
    # PP 4 x VPP 5: four chunks of 4 layers per rank; the first stage holds the most activations
    assert [row[:3] for row in rows] == [
        ["*0", "20", "(0-3,16-19,32-35,48-51,64-67)"],
        ["1", "20", "(4-7,20-23,36-39,52-55,68-71)"],
        ["2", "20", "(8-11,24-27,40-43,56-59,72-75)"],
        ["3", "20", "(12-15,28-31,44-47,60-63,76-79)"],
    ]
    assert [row[3] for row in rows] == ["4.542B", "4.279B", "4.279B", "4.542B"]
    assert float(rows[0][-1]) < 0                    # negative headroom on the peak stage
    assert "  verdict: OVER BUDGET on " in result.stdout
    assert "stage 0 needs " in result.stdout and " GiB of 64.00 GiB (" in result.stdout


def test_broken_config_fails_with_file_line_key(training_repo):
    text = (REPO / "examples" / "llama3-8b.yaml").read_text()
    text = text.replace("  ffn_hidden_size: 14336", "  ffn_hiden_size: 14336")
    text = text.replace("  tensor_model_parallel_size: 2", "  tensor_model_parallel_size: two")
    write(training_repo, "configs/llama3-8b.yaml", text)
    typo_line = text.splitlines().index("  ffn_hiden_size: 14336") + 1
    tp_line = text.splitlines().index("  tensor_model_parallel_size: two") + 1
    result = run_hook(["configs/llama3-8b.yaml"], cwd=training_repo)
    assert result.returncode == 2, result.stdout + result.stderr
    # the problems, then the seed-format defaults the check took for the rest (its notices)
    assert result.stdout.splitlines()[:4] == [
        "configs/llama3-8b.yaml:",
        "  invalid input, 2 problems:",
        f"  error: configs/llama3-8b.yaml:{typo_line} model.ffn_hiden_size: unknown key ffn_hiden_size in "
        "section model; did you mean ffn_hidden_size? [unknown-key]",
        f"  error: configs/llama3-8b.yaml:{tp_line} parallelism.tensor_model_parallel_size: "
        "tensor_model_parallel_size must be an integer, not the string 'two' [wrong-type]",
    ]
    assert result.stdout.splitlines()[4] == "  notices (what the check assumed about the rest):"
    assert all(line.startswith("  - seed-format default: ") for line in result.stdout.splitlines()[5:] if line)


def test_broken_launch_script_fails_with_file_line_flag(training_repo):
    write(training_repo, "jobs/pretrain.sbatch", """\
#!/bin/bash
#SBATCH --nodes=1
torchrun --nproc_per_node 8 pretrain_gpt.py \\
    --num-layers 32 --hidden-size 4096 --num-attention-heads 32 \\
    --seq-length 4096 --max-position-embeddings 4096 \\
    --micro-batch-size 1 --global-batch-size 64 --vocab-size 32000 \\
    --tensor-model-paralel-size 2 --bf16
""")
    result = run_hook(["jobs/pretrain.sbatch"], cwd=training_repo)
    assert result.returncode == 2, result.stdout + result.stderr
    assert ("  error: jobs/pretrain.sbatch:7 --tensor-model-paralel-size: unknown flag; "
            "did you mean --tensor-model-parallel-size? [unknown-flag]") in result.stdout.splitlines()


def test_files_that_are_not_training_inputs_are_passed_over(training_repo):
    write(training_repo, ".github/workflows/ci.yml", GITHUB_WORKFLOW)
    write(training_repo, "docker-compose.yaml", DOCKER_COMPOSE)
    write(training_repo, "scripts/setup_env.sh", NOT_A_LAUNCH)
    write(training_repo, "configs/llama3-8b.yaml", (REPO / "examples" / "llama3-8b.yaml").read_text())
    files = [".github/workflows/ci.yml", "docker-compose.yaml", "scripts/setup_env.sh", "configs/llama3-8b.yaml"]
    result = run_hook(files, cwd=training_repo, user_args=["--gpu", "h100"])
    assert result.returncode == 0, result.stdout + result.stderr
    not_config = ("not a seed-format YAML, a Megatron --yaml-cfg YAML, a Megatron-Bridge config, a launch script or "
                  "a HuggingFace config.json")
    assert result.stderr.splitlines() == [
        f"megatron-estimator check: skipped .github/workflows/ci.yml: {not_config}",
        f"megatron-estimator check: skipped docker-compose.yaml: {not_config}",
        "megatron-estimator check: skipped scripts/setup_env.sh: launches no Megatron training: its launch at "
        "scripts/setup_env.sh:4 runs -m pip, not a Megatron-LM training entry script, with none of --num-layers, "
        "--hidden-size, --num-attention-heads or --yaml-cfg",
    ]
    assert result.stdout.startswith("configs/llama3-8b.yaml:\n")   # the only verdict in the report
    assert result.stdout.count("verdict: FITS") == 1 and "ci.yml" not in result.stdout


def test_only_non_training_files_pass_with_an_empty_report(training_repo):
    write(training_repo, ".github/workflows/ci.yml", GITHUB_WORKFLOW)
    result = run_hook([".github/workflows/ci.yml"], cwd=training_repo)
    assert (result.returncode, result.stdout) == (0, "")
    as_json = run_hook([".github/workflows/ci.yml"], cwd=training_repo, user_args=["--format", "json"])
    assert as_json.returncode == 0 and json.loads(as_json.stdout) == {"results": []}


def test_passing_over_never_hides_a_broken_training_input(training_repo):
    # a launch script that exits before its launch in this environment is a training launch
    # (it names pretrain_gpt.py), so it is reported, not passed over; so is a missing file
    write(training_repo, "train.sh", """\
#!/bin/bash
if [ -z "${DATA_PATH:-}" ]; then
    echo "usage: DATA_PATH=... $0" >&2
    exit 1
fi
torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 2 --data-path "$DATA_PATH"
""")
    write(training_repo, ".github/workflows/ci.yml", GITHUB_WORKFLOW)
    result = run_hook(["train.sh", ".github/workflows/ci.yml", "gone.yaml"], cwd=training_repo, env={"DATA_PATH": ""})
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    (launch,) = [line for line in lines if line.startswith("  error: train.sh: ")]
    assert launch.endswith("[no-launch-line]") and "the script exits at train.sh:4" in launch
    assert "  error: gone.yaml: no such file [file-not-found]" in lines
    assert result.stderr.startswith("megatron-estimator check: skipped .github/workflows/ci.yml: ")


def test_without_skip_unknown_a_non_config_is_invalid(training_repo):
    write(training_repo, "docker-compose.yaml", DOCKER_COMPOSE)
    spec = dict(hook(), entry="megatron-estimator check")
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MEGATRON_ESTIMATOR_")}
    environ["PYTHONPATH"] = str(REPO)
    result = subprocess.run(hook_argv(spec, ["docker-compose.yaml"]), capture_output=True, text=True,
                            env=environ, cwd=training_repo, timeout=120)
    assert result.returncode == 2
    assert "  error: docker-compose.yaml: not a seed-format YAML" in result.stdout
    assert result.stdout.rstrip().endswith("[unknown-format]")


def test_a_mixed_yaml_and_a_script_naming_training_only_in_comments(training_repo):
    # A YAML with both formats' keys is a broken config, not a file to pass over; a helper
    # script whose only mention of pretrain_gpt.py is a comment launches nothing.
    write(training_repo, "configs/both.yaml", "model:\n  num_layers: 2\nlanguage_model:\n  num_layers: 2\n")
    write(training_repo, "scripts/helper.sh", "#!/bin/bash\n# helper for pretrain_gpt.py runs\necho ready  # pretrain_gpt.py\n")
    result = run_hook(["configs/both.yaml", "scripts/helper.sh"], cwd=training_repo, user_args=["--gpu", "h100"])
    assert result.returncode == 2
    assert "configs/both.yaml: has top-level keys of both YAML formats" in result.stdout
    assert "[mixed-format]" in result.stdout
    assert result.stderr.splitlines() == [
        "megatron-estimator check: skipped scripts/helper.sh: launches nothing (no launcher, python or program in it)"]


# A model config fragment that a launch script sources: it sets flags and launches nothing.
MODEL_FRAGMENT = """\
# conf/llama3_8b.sh: sourced by the launch scripts
MODEL_ARGS=(
    --num-layers 32 --hidden-size 4096 --num-attention-heads 32
    --group-query-attention --num-query-groups 8
)
SEQ_LEN=8192
"""


def test_sourced_flag_fragments_are_passed_over(training_repo):
    write(training_repo, "conf/llama3_8b.sh", MODEL_FRAGMENT)
    result = run_hook(["conf/llama3_8b.sh"], cwd=training_repo)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr.splitlines() == [
        "megatron-estimator check: skipped conf/llama3_8b.sh: launches nothing: it sets Megatron flags for a "
        "script that sources it (no launcher, python or program in it)"]
    assert result.stdout == ""


def test_without_a_budget_the_hook_warns_and_passes(tmp_path):
    (tmp_path / ".git").mkdir()            # a repository with no budget anywhere
    write(tmp_path, "configs/llama3-8b.yaml", (REPO / "examples" / "llama3-8b.yaml").read_text())
    result = run_hook(["configs/llama3-8b.yaml"], cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr == (
        "megatron-estimator check: warning: no budget given (--budget, --gpu, MEGATRON_ESTIMATOR_BUDGET or "
        "[tool.megatron-estimator] budget / gpu): configs/llama3-8b.yaml estimated but not checked against GPU "
        "memory\n")
    assert ("  verdict: NOT CHECKED against a budget: none given (--budget, --gpu, MEGATRON_ESTIMATOR_BUDGET or "
            "the settings file's budget / gpu); peak ") in result.stdout
