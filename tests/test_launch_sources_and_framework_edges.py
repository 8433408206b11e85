"""Launch scripts met in Megatron-LM's, slime's and Pai-Megatron-Patch's repositories (issue 27):
what `check --skip-unknown` does with a launch that comes through sourced files and submitted
scripts, a flag line that lost the `\\` before it, flags only slime's patched Megatron-LM has,
Pai's entry programs run from their example folder, and a Pai tree older than the supported
releases.

The fixtures are written here.  They reproduce idioms only: Megatron-LM's
examples/academic_paper_scripts/sc21 (run_figure_N.sh: `. \\`pwd\\`/CONFIG.sh; . \\`pwd\\`/SBATCH.sh`,
CONFIG.sh a template with `<...>` placeholders, SBATCH.sh `sbatch ... SRUN.sh`, SRUN.sh
`srun ... sh -c "python -u ${MEGATRON_CODE_DIR}/pretrain_gpt.py ${MEGATRON_PARAMS}"`); slime's
scripts/run-*.sh (`ray job submit ... -- python3 train.py` with the flags of
docker/patch/<release>/megatron.patch); Pai-Megatron-Patch's examples/<model>/run_mcore_*.sh
(`torchrun ... pretrain_<model>_YYMMDD.py`, PYTHONPATH=backends/megatron/Megatron-LM-YYMMDD).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap

import pytest

from test_cli import run
from megatron_estimator import api
from megatron_estimator.inputs.frameworks.adapter import patched_megatron_flags
from megatron_estimator.megatron.flags import flag_table

MODEL = ("--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 128 "
         "--max-position-embeddings 128 --micro-batch-size 1 --global-batch-size 8 --bf16 "
         "--tokenizer-type NullTokenizer --vocab-size 1000")


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def sc21(tmp_path):
    """run.sh sources CONFIG.sh (a template: line 2 is `export SLURM_PARTITION=<partition name>`)
    and SBATCH.sh, which submits SRUN.sh, which launches pretrain_gpt.py."""
    root = tmp_path / "sc21"
    write(root / "CONFIG.sh", """
        #!/bin/bash
        export SLURM_PARTITION=<partition name>
        export MEGATRON_PARAMS="--num-layers ${NLS} --hidden-size ${HS} --num-attention-heads 4"
    """)
    write(root / "SBATCH.sh", """
        #!/bin/bash
        sbatch -p ${SLURM_PARTITION} \\
               --nodes=${NNODES} \\
               --export=MEGATRON_CODE_DIR,MEGATRON_PARAMS SRUN.sh
        exit 0
    """)
    write(root / "SRUN.sh", """
        #!/bin/bash
        #SBATCH --ntasks-per-node=8
        CMD="python -u ${MEGATRON_CODE_DIR}/pretrain_gpt.py ${MEGATRON_PARAMS}"
        srun -l sh -c "${CMD}"
    """)
    write(root / "run.sh", """
        #!/bin/bash
        NLS=4
        HS=256
        NNODES=1
        . `pwd`/CONFIG.sh
        . `pwd`/SBATCH.sh
        exit 0
    """)
    return root


def test_bash_stops_reading_the_template_at_its_placeholder():
    """The premise of the next test, from bash itself: `<partition name>` at the end of a line is a
    redirection with no file after `>`, a syntax error at that line; `.` then fails (status 2)."""
    if shutil.which("bash") is None:
        pytest.skip("no bash on PATH to confirm the premise")
    done = subprocess.run(["bash", "-c", "export A=<partition name>\n"], capture_output=True, text=True)
    assert done.returncode == 2 and "syntax error" in done.stderr and "line 1" in done.stderr


def test_a_launch_through_a_sourced_template_is_not_checked_never_skipped(tmp_path, monkeypatch):
    root = sc21(tmp_path)
    # Run where the script expects (`pwd` is sc21/): CONFIG.sh is read and stops at its line 2.
    monkeypatch.chdir(root)
    why = api.not_a_training_input(str(root / "run.sh"))
    assert why.startswith("not checked: ") and f"{root / 'CONFIG.sh'}:2" in why
    # From elsewhere, `pwd`/CONFIG.sh and `pwd`/SBATCH.sh do not exist (bash: "No such file").
    monkeypatch.chdir(tmp_path)
    why = api.not_a_training_input(str(root / "run.sh"))
    assert why.startswith("not checked: ") and f"{tmp_path / 'CONFIG.sh'}" in why and "not found from" in why
    # The CLI: named on stderr as not checked, exit 0 (nothing checked, nothing failed).
    result = run(["check", "--gpu", "h100", "--skip-unknown", str(root / "run.sh")], cwd=root)
    assert result.returncode == 0 and "not checked: " in result.stderr and result.stdout == ""


def test_a_script_that_submits_a_training_script_is_not_checked(tmp_path, monkeypatch):
    root = sc21(tmp_path)
    monkeypatch.chdir(root)
    why = api.not_a_training_input(str(root / "SBATCH.sh"))
    assert why == "not checked: it runs SRUN.sh, which launches ${MEGATRON_CODE_DIR}/pretrain_gpt.py, which this " \
                  "check does not follow from it"
    # CONFIG.sh alone launches nothing: still a fragment (no launcher, no program, nothing sourced).
    assert api.not_a_training_input(str(root / "CONFIG.sh")).startswith("launches nothing: it sets Megatron flags")


def test_a_fragment_that_sources_a_fragment_is_still_skipped(tmp_path, monkeypatch):
    # Megatron-LM's examples/rl/model_configs/*.sh idiom: `source $(dirname $SCRIPT_PATH)/common.sh`.
    write(tmp_path / "cfg" / "common.sh", 'COMMON="--tensor-model-parallel-size 1 --bf16"\n')
    model = write(tmp_path / "cfg" / "model.sh", """
        SCRIPT_PATH="${BASH_SOURCE[0]}"
        source $(dirname $SCRIPT_PATH)/common.sh
        MODEL_OPTIONS="--num-layers 36 --hidden-size 4096 --num-attention-heads 32"
    """)
    monkeypatch.chdir(tmp_path)
    assert api.not_a_training_input(str(model)) == (
        "launches nothing: it sets Megatron flags for a script that sources it (no launcher, python or program in "
        "it or in the files it sources)")


@pytest.mark.parametrize("body, said", [
    # Pai-Megatron-Patch examples/llama3/entry.sh: `python $*`
    ("export CUDA_DEVICE_MAX_CONNECTIONS=1\npython $*\n", "runs `$*`, a program named only when it runs"),
    # Megatron-LM examples/post_training/modelopt/slurm/sbatch.sh: `srun ... bash ${1}`
    ("srun -l --mpi=pmix \\\n    bash ${1}\n", "it runs `bash ${1}`, a script named only when it runs"),
])
def test_a_wrapper_of_a_program_named_at_run_time_is_not_checked(tmp_path, monkeypatch, body, said):
    path = write(tmp_path / "wrap.sh", "#!/bin/bash\n" + body)
    monkeypatch.chdir(tmp_path)
    why = api.not_a_training_input(str(path))
    assert why.startswith("not checked: ") and said in why


def test_a_flag_line_after_a_line_without_its_backslash_is_named(tmp_path):
    # Line 3 ends without `\`: bash ends the torchrun command there and runs line 4 on its own,
    # `--num-layers 2 ...` as a program (command not found), so Megatron never gets those flags.
    flags = MODEL.split()
    path = write(tmp_path / "train.sh", "#!/bin/bash\n"
                 "torchrun --nproc_per_node 8 pretrain_gpt.py \\\n"
                 f"  {' '.join(flags[6:])}\n"
                 f"  {' '.join(flags[:6])}\n")
    if shutil.which("bash") is not None:      # what bash does with it: line 4 is a command of its own
        stub = write(tmp_path / "bin" / "torchrun", "#!/bin/sh\nexit 0\n")
        stub.chmod(0o755)
        done = subprocess.run(["bash", str(path)], capture_output=True, text=True, cwd=tmp_path,
                              env={**os.environ, "PATH": f"{stub.parent}{os.pathsep}{os.environ['PATH']}"})
        assert "line 4: --num-layers: command not found" in done.stderr
    inp, problems = api.input_from_file(str(path), environ={"CUDA_DEVICE_MAX_CONNECTIONS": "1"})
    hint = [p for p in problems if p.code == "missing-continuation"]
    assert len(hint) == 1 and hint[0].location == f"{path}:4"
    assert hint[0].message == (
        f"line 4 starts with a flag (--num-layers): bash runs it as a command of its own (command not found), so its "
        f"6 word(s) never reach the launch at {path}:2; is the `\\` missing at the end of line 3?")


def test_the_same_launch_with_its_backslash_has_no_such_problem(tmp_path):
    flags = MODEL.split()
    path = write(tmp_path / "train.sh", "#!/bin/bash\n"
                 "torchrun --nproc_per_node 8 pretrain_gpt.py \\\n"
                 f"  {' '.join(flags[6:])} \\\n"
                 f"  {' '.join(flags[:6])}\n")
    _inp, problems = api.input_from_file(str(path), environ={"CUDA_DEVICE_MAX_CONNECTIONS": "1"})
    assert problems == ()


# -- slime's patched Megatron-LM ----------------------------------------------------------------

def test_slime_patch_flags_are_not_stock_megatron_flags():
    # THUDM/slime docker/patch/<release>/megatron.patch adds these to megatron/training/arguments.py;
    # no Megatron-LM release registers them, so the table never claims a stock flag.
    source, patched = patched_megatron_flags("slime_megatron_patch_flags.tsv")
    assert source.startswith("THUDM/slime@")
    assert set(patched) == {"--post-self-attn-layernorm", "--post-mlp-layernorm", "--use-gated-attention"}
    for release in ("main", "0.16.1", "0.14.0"):
        table = flag_table(release)
        assert not any(flag in table for flag in patched), release


def test_slime_launch_with_patched_megatron_flags_is_one_honest_refusal(tmp_path):
    argv = ["python3", "train.py", "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "8", *MODEL.split(),
            "--use-gated-attention", "--post-mlp-layernorm", "--num-layerz", "3"]
    inp, problems, _command = api.input_from_launch(argv, environ={"PWD": str(tmp_path)})
    stack = [p for p in problems if p.code == "unsupported-stack"]
    assert len(stack) == 1
    message = stack[0].message
    assert message.startswith("--use-gated-attention, --post-mlp-layernorm: flags only slime's patched Megatron-LM "
                              "has (docker/patch/{")
    assert "remove them to estimate the stock-Megatron model" in message and "did you mean" not in message
    # the typo is still a typo, on its own
    unknown = [p for p in problems if p.code == "unknown-flag"]
    assert len(unknown) == 1 and "--num-layerz" in unknown[0].message and "gated" not in unknown[0].message


# -- Pai-Megatron-Patch -------------------------------------------------------------------------

def pai_tree(tmp_path, minor):
    """A Pai checkout: examples/m/run_mcore_m.sh runs pretrain_m_250624.py (not in the tree, as
    examples/deepseek_v3/run_mcore_deepseek_lite.sh names one its commit no longer has) with
    backends/megatron/Megatron-LM-X on the job's PYTHONPATH, a tree stating 0.<minor>.0rc0."""
    pai = tmp_path / "Pai-Megatron-Patch"
    write(pai / "backends" / "megatron" / "Megatron-LM-X" / "megatron" / "core" / "package_info.py",
          f"MAJOR = 0\nMINOR = {minor}\nPATCH = 0\nPRE_RELEASE = 'rc0'\n")
    return write(pai / "examples" / "m" / "run_mcore_m.sh", f"""
        #!/bin/bash
        CURRENT_DIR="$( cd "$( dirname "$0" )" && pwd )"
        MEGATRON_PATCH_PATH=$( dirname $( dirname ${{CURRENT_DIR}}))
        export PYTHONPATH=${{MEGATRON_PATCH_PATH}}:${{MEGATRON_PATCH_PATH}}/backends/megatron/Megatron-LM-X:$PYTHONPATH
        export CUDA_DEVICE_MAX_CONNECTIONS=1
        torchrun --nproc_per_node 8 --nnodes 1 pretrain_m_250624.py \\
          {MODEL.replace('--tokenizer-type NullTokenizer ', '')} \\
          --extra-vocab-size 24 --patch-tokenizer-type Qwen2Tokenizer --dataset mmap
    """)


def test_pai_entry_program_run_from_its_example_folder_is_recognised(tmp_path):
    script = pai_tree(tmp_path, 14)
    inp, problems = api.input_from_file(str(script), environ={"CUDA_DEVICE_MAX_CONNECTIONS": "1"})
    assert [p for p in problems if p.code == "unknown-flag"] == []
    # megatron_patch/tokenizer: padded_vocab_size = 1000 (--vocab-size) + 24 (--extra-vocab-size)
    verdict = api.evaluate(inp, problems=problems, environ={"CUDA_DEVICE_MAX_CONNECTIONS": "1"})
    assert verdict.problems == () and verdict.estimate.model.padded_vocab_size == 1024
    assert "Pai-Megatron-Patch" in verdict.family.source


def test_pai_tree_older_than_the_supported_releases_is_one_unsupported_release(tmp_path):
    script = pai_tree(tmp_path, 10)
    result = run(["check", "--gpu", "h100", str(script)], cwd=script.parent)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stdout.count("error: ") == 1 and result.stdout.count("[unsupported-release]") == 1
    # 0.10 < 0.14.0, the oldest row of data/megatron_releases.tsv
    assert ("Megatron-LM-X/megatron/core/package_info.py (a Megatron-LM tree on the PYTHONPATH the launch at "
            in result.stdout)
    assert ("says: Megatron 0.10.0rc0 is not a supported release: it is older than 0.14.0, the oldest the estimator "
            "supports (supported: 0.14.0, ") in result.stdout
