"""The CLI's start-up paths import only what they use (issue 14).

Each case runs ``megatron_estimator.cli.main([...])`` in a fresh interpreter and lists every
module imported by the end, beyond what a bare interpreter of the same environment has; each
path has an explicit allow-list, of the package's modules and of the other top-level modules
(the standard library's, PyYAML's), and a module outside it fails the test.  What the lists
leave out, on purpose: argparse (plain command lines are read by ``cli._fast_namespace``) and
typing everywhere; re, enum, json and ast on ``--version``, ``estimate`` and ``run`` (re, enum and shlex
also on ``check`` of a launch script that needs no unusual shell syntax); jsonschema
when the input is valid (the quick check in core/plain_schema.py answers); yaml without a YAML
input; the planner when nothing is over budget; the readers of inputs not given; the help
width machinery (shutil, bz2, lzma); pathlib (with fnmatch, urllib, ipaddress) everywhere: files
are named as ``os.path`` strings (``core.resources.path_string``); json for a seed YAML file
(its schema is the literal inputs/seed_schema_data.py); dataclasses and inspect
(core/dataclass.py).  A module a change needs is added to its path's list with the
reason in the commit; no timing is measured.
"""

from __future__ import annotations

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

# The package's modules (without the "megatron_estimator." prefix) each path may import.
ESTIMATE_PACKAGE = frozenset("""
    api cli settings
    core core.dataclass core.hints core.patterns core.plain_schema core.problems core.resources core.units
    megatron megatron.behaviour megatron.flag_effects megatron.flag_effects_data megatron.flags megatron.releases
    inputs inputs.argv inputs.entry_script inputs.rawargs inputs.release_choice
    config config.derive config.family config.hybrid config.layout_syntax config.parallel config.resolve
    config.release_rules config.rules config.rules_parity config.run_context config.schema config.schema_data config.typed config.vocab
    model model.activations model.checkpoint model.layout model.overhead model.parameters model.records
    model.stage model.states
    results results.estimate report report.assumptions report.text
""".split())
LAUNCH_PACKAGE = frozenset("""
    core.distributions inputs.job_stack
    inputs.launch inputs.launch.command inputs.launch.launchers inputs.launch.programs inputs.launch.walk
""".split())
# (planner.candidates writes a fitting layout's flags: imported only when a suggestion is found,
# which SMALL over 1GiB never is.)
SUGGESTIONS_PACKAGE = frozenset("""
    planner planner.cost planner.memory planner.search planner.space planner.suggest
    planner.validity results.plan results.suggestion
""".split())
FILE_PACKAGE = frozenset("inputs.detect inputs.registry".split())
SEED_YAML_PACKAGE = frozenset("inputs.seed_schema_data inputs.seed_yaml inputs.yamlpos".split())
SCRIPT_PACKAGE = frozenset("""
    inputs.bash inputs.bash.arith inputs.bash.builtins inputs.bash.commands inputs.bash.conditions
    inputs.bash.expansion inputs.bash.interpreter inputs.bash.lexer inputs.bash.parser inputs.bash.pattern
    inputs.bash.reader inputs.bash.state inputs.bash.syntax inputs.bash.values
    inputs.launch.sbatch inputs.launch.script inputs.launch.shell_string inputs.launch.unknowns
""".split())

# Top-level modules outside the package (private "_x" accelerator modules are not listed).
ESTIMATE_OTHERS = frozenset("collections functools itertools keyword math operator reprlib types".split())
FILE_OTHERS = frozenset("copyreg enum re".split())      # the YAML reader's
YAML_OTHERS = frozenset("yaml base64 binascii cython_runtime datetime struct".split())

CASES = {
    # name: (argv, exit status, package modules allowed, other modules allowed)
    "version": (["--version"], 0, frozenset({"cli"}), frozenset()),
    "estimate": (["estimate", "--world-size", "64", "--budget", "80GiB", "--", *LLAMA3_70B], 0,
                 ESTIMATE_PACKAGE, ESTIMATE_OTHERS),
    "run over budget": (["run", "--budget", "1GiB", "--", "torchrun", "--nproc-per-node", "8",
                         "pretrain_gpt.py", *SMALL], 1,
                        ESTIMATE_PACKAGE | LAUNCH_PACKAGE | SUGGESTIONS_PACKAGE, ESTIMATE_OTHERS | {"gc"}),
    "check seed yaml": (["check", "examples/llama3-8b.yaml"], 0,
                        ESTIMATE_PACKAGE | FILE_PACKAGE | SEED_YAML_PACKAGE, ESTIMATE_OTHERS | FILE_OTHERS | YAML_OTHERS),
    "check launch script": (["check", "examples/llama3_8b_pretrain.sh"], 0,
                            ESTIMATE_PACKAGE | FILE_PACKAGE | LAUNCH_PACKAGE | SCRIPT_PACKAGE,
                            ESTIMATE_OTHERS),        # no re, enum nor shlex (core/patterns.py)
}

# No module is imported before main() runs but what a bare interpreter has (no json: argv
# comes as arguments, the listing goes out as lines).
PROGRAM = """
import sys
real = sys.stdout
class Sink:
    def write(self, text):
        return len(text)
    def flush(self):
        pass
    def isatty(self):
        return False
sys.stdout = sys.stderr = Sink()
from megatron_estimator.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as stop:  # --help
    code = stop.code
real.write(str(code) + "\\n" + "\\n".join(sorted(sys.modules)))
"""
BARE = "import sys; sys.stdout.write(chr(10).join(sorted(sys.modules)))"


def _environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEGATRON_ESTIMATOR_") and k != "WORLD_SIZE"}
    env["PYTHONPATH"] = str(ROOT)
    return env


def _run(args: list[str]) -> list[str]:
    done = subprocess.run([sys.executable, *args], cwd=ROOT, env=_environment(), capture_output=True, text=True,
                          check=True)
    return done.stdout.split("\n")


def imported_modules(argv: list[str]) -> tuple[int, set[str]]:
    """(exit status, the modules imported beyond a bare interpreter's)."""
    bare = set(_run(["-c", BARE]))
    lines = _run(["-c", PROGRAM, *argv])
    return int(lines[0]), set(lines[1:]) - bare


def outside(modules: set[str], package: frozenset, others: frozenset) -> list[str]:
    """The imported modules neither allow-list names."""
    found = []
    for name in modules:
        if name == "megatron_estimator" or name.startswith("_"):
            continue
        if name.startswith("megatron_estimator."):
            if name[len("megatron_estimator."):] not in package:
                found.append(name)
        elif name.split(".")[0] not in others:
            found.append(name)
    return sorted(found)


@pytest.mark.parametrize("case", sorted(CASES))
def test_start_up_imports_only_what_the_path_uses(case):
    argv, exit_code, package, others = CASES[case]
    code, modules = imported_modules(argv)
    assert code == exit_code
    assert "megatron_estimator.cli" in modules
    assert outside(modules, package, others) == []


def test_the_check_sees_a_forbidden_module(tmp_path):
    # The listing is real: printing help imports argparse and the help-width machinery, a
    # preset imports its reader, and an invalid seed YAML file imports jsonschema for its messages.
    code, modules = imported_modules(["estimate", "--help"])
    assert code == 0 and {"argparse", "shutil"} <= modules
    assert outside(modules, ESTIMATE_PACKAGE, ESTIMATE_OTHERS) != []
    _, modules = imported_modules(["estimate", "--world-size", "8", "--model", "llama3-8b"])
    assert "megatron_estimator.inputs.presets" in modules
    bad = tmp_path / "bad.yaml"
    bad.write_text((ROOT / "examples" / "llama3-8b.yaml").read_text(encoding="utf-8")
                   .replace("world_size: 8", "world_size: eight"), encoding="utf-8")
    code, modules = imported_modules(["check", str(bad)])
    assert code == 2 and "jsonschema" in modules
