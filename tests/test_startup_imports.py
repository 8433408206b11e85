"""The CLI's start-up paths import only what they use (issue 14).

Each case runs ``megatron_estimator.cli.main([...])`` in a fresh interpreter and lists every
module imported by the end; a module from the case's forbidden set fails the test.  The sets
name what each path has no use for: jsonschema when the input is valid (the quick check in
core/plain_schema.py answers), yaml without a YAML input, the planner when nothing is over
budget, the readers of inputs not given, argparse's help-width machinery (shutil, bz2, lzma)
when no help is printed, pathlib (with urllib and ipaddress) for flags on the command line,
and argparse, typing and the API for ``--version``.  No timing is measured.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

LLAMA3_70B = (
    "--num-layers 80 --hidden-size 8192 --ffn-hidden-size 28672 --num-attention-heads 64 "
    "--group-query-attention --num-query-groups 8 --swiglu --normalization RMSNorm "
    "--disable-bias-linear --untie-embeddings-and-output-weights --position-embedding-type rope "
    "--vocab-size 128256 --max-position-embeddings 8192 --seq-length 8192 --micro-batch-size 1 --bf16 "
    "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 4 --sequence-parallel "
    "--use-distributed-optimizer --global-batch-size 512 --recompute-granularity selective"
).split()
SMALL = ("--num-layers 2 --hidden-size 256 --num-attention-heads 4 --seq-length 512 "
         "--max-position-embeddings 512 --micro-batch-size 1 --vocab-size 1000 --bf16").split()

READERS = ("megatron_estimator.inputs.hf", "megatron_estimator.inputs.bash", "megatron_estimator.inputs.launch",
           "megatron_estimator.inputs.seed_yaml", "megatron_estimator.inputs.megatron_yaml",
           "megatron_estimator.inputs.registry", "megatron_estimator.inputs.presets")
HELP_WIDTH = ("shutil", "bz2", "lzma")
# The static reader of custom entry scripts: only for a script that is not Megatron's own.
SCRIPT_READER = "megatron_estimator.inputs.script_flags"
PATHS = ("pathlib", "urllib", "ipaddress")

CASES = {
    "version": (["--version"], 0,
                ("argparse", "typing", "megatron_estimator.api", "megatron_estimator.settings")),
    "estimate": (["estimate", "--world-size", "64", "--budget", "80GiB", "--", *LLAMA3_70B], 0,
                 ("jsonschema", "yaml", "megatron_estimator.planner", *READERS, *HELP_WIDTH, *PATHS, SCRIPT_READER)),
    "run over budget": (["run", "--budget", "1GiB", "--", "torchrun", "--nproc-per-node", "8",
                         "pretrain_gpt.py", *SMALL], 1,
                        ("jsonschema", "yaml", "megatron_estimator.inputs.hf", "megatron_estimator.inputs.bash",
                         "megatron_estimator.inputs.seed_yaml", *HELP_WIDTH, *PATHS, SCRIPT_READER)),
    "check seed yaml": (["check", "examples/llama3-8b.yaml"], 0,
                        ("jsonschema", "megatron_estimator.planner", "megatron_estimator.inputs.hf",
                         "megatron_estimator.inputs.bash", "megatron_estimator.inputs.launch", *HELP_WIDTH)),
    "check launch script": (["check", "examples/llama3_8b_pretrain.sh"], 0,
                            ("jsonschema", "yaml", "megatron_estimator.planner", "megatron_estimator.inputs.hf",
                             *HELP_WIDTH, SCRIPT_READER)),
}

PROGRAM = """
import io, json, sys
real = sys.stdout
sys.stdout = sys.stderr = io.StringIO()
from megatron_estimator.cli import main
try:
    code = main(json.loads(sys.argv[1]))
except SystemExit as stop:  # --help
    code = stop.code
real.write(json.dumps({"exit": code, "modules": sorted(sys.modules)}))
"""


def imported_modules(argv: list[str]) -> tuple[int, set[str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEGATRON_ESTIMATOR_") and k != "WORLD_SIZE"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, "-c", PROGRAM, json.dumps(argv)], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=True)
    result = json.loads(done.stdout)
    return result["exit"], set(result["modules"])


def newcomers(modules: set[str], forbidden: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == f or m.startswith(f + ".") for f in forbidden))


@pytest.mark.parametrize("case", sorted(CASES))
def test_start_up_imports_only_what_the_path_uses(case):
    argv, exit_code, forbidden = CASES[case]
    code, modules = imported_modules(argv)
    assert code == exit_code
    assert "megatron_estimator.cli" in modules
    assert newcomers(modules, forbidden) == []


def test_the_check_sees_a_forbidden_module(tmp_path):
    # The listing is real: printing help imports the help-width machinery, a preset imports its
    # reader, and an invalid seed YAML file imports jsonschema for its messages.
    code, modules = imported_modules(["estimate", "--help"])
    assert code == 0 and "shutil" in modules
    _, modules = imported_modules(["estimate", "--world-size", "8", "--model", "llama3-8b"])
    assert "megatron_estimator.inputs.presets" in modules
    bad = tmp_path / "bad.yaml"
    bad.write_text((ROOT / "examples" / "llama3-8b.yaml").read_text(encoding="utf-8")
                   .replace("world_size: 8", "world_size: eight"), encoding="utf-8")
    code, modules = imported_modules(["check", str(bad)])
    assert code == 2 and "jsonschema" in modules
