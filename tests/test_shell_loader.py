"""megatron_estimator.inputs.launch.script (over inputs.bash): launch scripts resolved statically, as bash would run them."""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap

import pytest

from conftest import TREE_ENV, megatron_tree
from megatron_estimator.core.problems import Problem
from megatron_estimator.inputs.launch.sbatch import SbatchHeaders
from megatron_estimator.inputs.launch.script import ScriptEnvVar, load_launch_script
from megatron_estimator.inputs.launch.shell_string import split_command_string

TESTS = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(TESTS, "fixtures", "scripts")
EXAMPLE = os.path.join(os.path.dirname(TESTS), "examples", "llama3_8b_pretrain.sh")


def fixture(name: str) -> str:
    return os.path.join(FIXTURES, name)


def load(name: str, environ: dict | None = None, **kwargs):
    return load_launch_script(fixture(name), {"PWD": FIXTURES} if environ is None else environ, **kwargs)


def script(tmp_path, text: str, name: str = "train.sh") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return str(path)


def flags(launch) -> list[str]:
    return list(launch.megatron_argv)


# ---- the Megatron-LM example idioms ------------------------------------------------------

def test_distributed_args_arrays_like_megatron_examples():
    path = fixture("gpt_distributed.sh")
    launch, problems = load("gpt_distributed.sh")
    assert problems == ()
    assert launch.location == f"{path}:56"
    assert launch.command.launcher == "torchrun"
    assert launch.command.script == "pretrain_gpt.py"
    assert launch.command.argv[:12] == ("torchrun", "--nproc_per_node", "4", "--nnodes", "2", "--node_rank", "0",
                                        "--master_addr", "localhost", "--master_port", "6000", "pretrain_gpt.py")
    assert flags(launch) == [
        "--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "8", "--seq-length", "512",
        "--max-position-embeddings", "512", "--attention-backend", "auto",
        "--micro-batch-size", "2", "--global-batch-size", "32", "--train-iters", "100", "--lr", "1.0e-4", "--bf16",
        "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
        "--data-path", "/data/my-corpus_text_document", "--tokenizer-type", "NullTokenizer", "--vocab-size", "32000",
        "--split", "949,50,1", "--save", "/ckpt/gpt-small", "--load", "/ckpt/gpt-small"]
    assert launch.world_size == 8
    assert launch.world_size_source == f"torchrun --nproc_per_node 4 ({path}:20) x --nnodes 2 ({path}:21)"
    assert launch.environment == (ScriptEnvVar("CUDA_DEVICE_MAX_CONNECTIONS", "1", f"{path}:5"),
                                  ScriptEnvVar("NVTE_FLASH_ATTN", "0", f"{path}:6"))
    assert launch.environment_dict == {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "NVTE_FLASH_ATTN": "0"}


def test_each_token_keeps_where_it_was_written():
    path = fixture("gpt_distributed.sh")
    launch, _ = load("gpt_distributed.sh")
    by_text = {}
    for token in launch.megatron_tokens:
        by_text.setdefault(token.text, token)
    assert by_text["--num-layers"].location == f"{path}:28"          # in GPT_MODEL_ARGS
    assert by_text["--num-layers"].word_location == f"{path}:57"     # ${GPT_MODEL_ARGS[@]} on the launch
    assert by_text["--tensor-model-parallel-size"].location == f"{path}:45"
    assert by_text["/data/my-corpus_text_document"].location == f"{path}:17"   # DATA_PATH=...
    assert by_text["--save"].location == f"{path}:61"
    assert by_text["/ckpt/gpt-small"].location == f"{path}:16"          # ${1:-default}
    assert launch.megatron_locations[:2] == (f"{path}:28", f"{path}:28")
    assert all(t.unresolved is None for t in launch.megatron_tokens)


def test_environment_and_script_arguments_are_used():
    launch, problems = load("gpt_distributed.sh", {"NODE_RANK": "1", "MASTER_ADDR": "n0"}, script_args=("/ckpt/run7",))
    assert problems == ()
    assert launch.command.argv[5:9] == ("--node_rank", "1", "--master_addr", "n0")
    assert flags(launch)[-4:] == ["--save", "/ckpt/run7", "--load", "/ckpt/run7"]


def test_llama_style_conditions_and_grown_arrays():
    path = fixture("llama_conditional.sh")
    launch, problems = load("llama_conditional.sh")
    assert problems == ()
    assert launch.location == f"{path}:76"
    assert launch.command.script == "pretrain_gpt.py"     # from "$PRETRAIN_SCRIPT_PATH"
    assert flags(launch) == [
        "--num-layers", "8", "--hidden-size", "1024", "--ffn-hidden-size", "2816", "--num-attention-heads", "16",
        "--group-query-attention", "--num-query-groups", "4", "--seq-length", "4096",
        "--max-position-embeddings", "4096", "--swiglu", "--normalization", "RMSNorm",
        "--micro-batch-size", "1", "--global-batch-size", "64", "--bf16",
        "--use-distributed-optimizer", "--overlap-grad-reduce",
        # "--fp8-format hybrid" is one array element, split because ${DTYPE_ARGS[@]} is unquoted
        "--fp8-format", "hybrid", "--fp8-amax-history-len", "1024", "--fp8-param-gather",
        "--tensor-model-parallel-size", "2", "--sequence-parallel",
        # quotes inside a value stay in it, as bash leaves them
        "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "128256", "--split", "'99,1,0'",
        "--save", "checkpoints/llama_small"]
    assert (launch.world_size, launch.world_size_source) == (
        8, f"torchrun --nproc_per_node 8 ({path}:18) x --nnodes 1 ({path}:19)")
    fp8 = [t for t in launch.megatron_tokens if t.text == "--fp8-amax-history-len"][0]
    assert (fp8.location, fp8.word_location) == (f"{path}:45", f"{path}:80")


def test_llama_style_other_branch_with_script_arguments():
    launch, problems = load("llama_conditional.sh", script_args=("/ckpt/llama", "meta-llama/Meta-Llama-3-8B"))
    assert problems == ()
    assert flags(launch)[-6:] == ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
                                  "meta-llama/Meta-Llama-3-8B", "--save", "/ckpt/llama"]


def test_options_string_with_case_and_line_continuations():
    path = fixture("options_string.sh")
    launch, problems = load("options_string.sh")
    assert problems == ()
    assert launch.command.script == "../../pretrain_mamba.py"
    assert flags(launch) == [
        "--tensor-model-parallel-size", "1", "--num-layers", "12", "--hidden-size", "512",
        "--num-attention-heads", "8", "--seq-length", "2048", "--max-position-embeddings", "2048",
        "--train-samples", "1000000", "--micro-batch-size", "4", "--global-batch-size", "64",
        "--hybrid-layer-pattern", "M-M-*-M-", "--bf16"]
    tokens = {t.text: t for t in launch.megatron_tokens}
    assert tokens["--num-layers"].location == f"{path}:30"      # the line inside the multi-line string
    assert tokens["512"].location == f"{path}:10"               # HIDDEN_SIZE=512 in the "small" case
    assert launch.environment == (ScriptEnvVar("NCCL_IB_SL", "1", f"{path}:24"),)
    large, _ = load("options_string.sh", script_args=("large",))
    assert flags(large)[:6] == ["--tensor-model-parallel-size", "4", "--num-layers", "12", "--hidden-size", "4096"]


def test_script_that_exits_before_its_launch():
    path = fixture("options_string.sh")
    launch, problems = load("options_string.sh", script_args=("huge",))
    assert launch is None
    assert problems == (Problem(
        "no-launch-line", path,
        "no command in the script starts a training script (torchrun, srun, mpirun or python with a *.py); "
        f"the script exits at {path}:20 before it reaches a launch"),)


# ---- sbatch files ---------------------------------------------------------------------------

def test_sbatch_headers_give_srun_its_world_size():
    path = fixture("job.sbatch")
    launch, problems = load("job.sbatch")
    assert problems == ()
    assert launch.location == f"{path}:31"
    assert launch.command.launcher == "srun"
    assert launch.command.launchers == ("srun", "python")
    assert launch.command.script == "/opt/megatron-lm/pretrain_gpt.py"
    assert launch.command.argv[:9] == ("srun", "-l", "--container-image", "nvcr.io/nvidia/pytorch:24.05-py3",
                                       "--container-mounts", "/data:/data", "--output=logs/%x_%j.log",
                                       "python", "-u")
    assert flags(launch)[:4] == ["--num-layers", "4", "--hidden-size", "256"]
    assert launch.world_size == 16
    assert launch.world_size_source == (f"srun with SLURM_NTASKS=16 from #SBATCH --nodes=2 ({path}:3) "
                                        f"--ntasks-per-node=8 ({path}:4)")
    assert launch.sbatch == SbatchHeaders(nodes=2, ntasks=None, ntasks_per_node=8, gpus_per_node=8, gpus=None,
                                          given=(("nodes", ("2", f"{path}:3", "--nodes=2")),
                                                 ("ntasks-per-node", ("8", f"{path}:4", "--ntasks-per-node=8")),
                                                 ("gpus-per-node", ("8", f"{path}:4", "--gpus-per-node=8"))))
    assert launch.environment == (ScriptEnvVar("NVTE_FUSED_ATTN", "0", f"{path}:29"),)


def test_the_headers_win_over_the_checking_shells_allocation(tmp_path):
    # Slurm sets SLURM_* in the job from the script's #SBATCH headers; the checking shell's own
    # (an salloc session, a CI runner) do not describe the job.
    path = fixture("job.sbatch")
    launch, problems = load("job.sbatch", {"SLURM_NTASKS": "32", "SLURM_NNODES": "4"})
    assert problems == ()
    assert launch.world_size == 16
    assert launch.world_size_source.startswith(f"srun with SLURM_NTASKS=16 from #SBATCH --nodes=2 ({path}:3)")
    # Without headers, the environment is all there is.
    plain = script(tmp_path, """
        srun python pretrain_gpt.py --num-layers 2
        """)
    launch, problems = load_launch_script(plain, {"SLURM_NTASKS": "32"})
    assert (launch.world_size, launch.world_size_source) == (32, "srun with SLURM_NTASKS=32 in the environment")


def test_sbatch_with_torchrun_inside_bash_c():
    path = fixture("sbatch_torchrun.sbatch")
    launch, problems = load("sbatch_torchrun.sbatch")
    assert problems == ()                       # $SLURM_NODEID is unknown, but only names this node's rank
    assert launch.command.launchers == ("srun", "sh -c", "torchrun")
    assert launch.command.argv[:4] == ("srun", "--ntasks-per-node=1", "bash", "-c")
    assert launch.command.tokens[4:11] == ("torchrun", "--nnodes", "4", "--nproc-per-node", "8", "--node-rank",
                                           "$SLURM_NODEID")
    assert flags(launch) == [
        "--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "8", "--seq-length", "512",
        "--max-position-embeddings", "512", "--micro-batch-size", "1", "--global-batch-size", "32",
        "--pipeline-model-parallel-size", "4", "--vocab-size", "32000"]
    assert launch.world_size == 32
    assert launch.world_size_source == (
        f"torchrun --nproc-per-node 8 ({path}:15, $SLURM_GPUS_PER_NODE from #SBATCH --gpus-per-node=8 ({path}:4)) "
        f"x --nnodes 4 ({path}:15, $SLURM_NNODES from #SBATCH -N 4 ({path}:2))")
    tokens = {t.text: t for t in launch.megatron_tokens}
    assert tokens["--max-position-embeddings"].location == f"{path}:9"   # the second MODEL_ARGS line
    assert tokens["--pipeline-model-parallel-size"].location == f"{path}:10"
    assert launch.environment == (ScriptEnvVar("MASTER_ADDR", "node001", f"{path}:12"),)


@pytest.mark.parametrize("headers, size, source", [
    ("#SBATCH -N2\n#SBATCH --ntasks-per-node 4\n", 8,
     "srun with SLURM_NTASKS=8 from #SBATCH -N2 ({p}:2) --ntasks-per-node 4 ({p}:3)"),
    ("#SBATCH --ntasks=12 --gres=gpu:a100:4\n", 12, "srun with SLURM_NTASKS=12 from #SBATCH --ntasks=12 ({p}:2)"),
    ("#SBATCH --nodes 2-4  # a range: the minimum counts\n#SBATCH --ntasks-per-node=2\n", 4,
     "srun with SLURM_NTASKS=4 from #SBATCH --nodes 2-4 ({p}:2) --ntasks-per-node=2 ({p}:3)"),
    ("#SBATCH --nodes=3\n", 3, "srun with SLURM_NNODES=3 from #SBATCH --nodes=3 ({p}:2): 1 task per node"),
])
def test_sbatch_header_spellings(tmp_path, headers, size, source):
    path = script(tmp_path, "#!/bin/bash\n" + headers + "srun python pretrain_gpt.py\n#SBATCH --nodes=99\n")
    launch, problems = load_launch_script(path, {})
    assert problems == ()
    assert (launch.world_size, launch.world_size_source) == (size, source.format(p=path))


def test_sbatch_headers_stop_at_the_first_command_and_bad_counts_are_problems(tmp_path):
    path = script(tmp_path, """
        #!/bin/bash
        #SBATCH --nodes=abc --gpus-per-node=8
        echo start
        #SBATCH --ntasks=64
        srun python pretrain_gpt.py
        """)
    launch, problems = load_launch_script(path, {})
    assert launch.sbatch.nodes is None and launch.sbatch.ntasks is None and launch.sbatch.gpus_per_node == 8
    assert problems == (Problem("invalid-launcher-option", f"{path}:2 --nodes", "#SBATCH --nodes=abc is not a positive count"),)
    assert (launch.world_size, launch.world_size_source) == (
        1, "srun with no task or node count, outside a Slurm allocation: 1 task")


def test_srun_options_resolved_through_variables(tmp_path):
    path = script(tmp_path, """
        NODES=4
        PER_NODE=8
        srun -N $NODES --ntasks-per-node=$PER_NODE python pretrain_gpt.py --num-layers 2
        """)
    launch, problems = load_launch_script(path, {})
    assert problems == ()
    assert (launch.world_size, launch.world_size_source) == (
        32, f"srun -N 4 ({path}:3) --ntasks-per-node 8 ({path}:3)")


# ---- what cannot be resolved statically ---------------------------------------------------

def test_unresolved_values_are_problems_where_they_matter_and_notices_elsewhere():
    path = fixture("unresolved.sh")
    launch, problems = load("unresolved.sh")
    assert launch.world_size is None
    assert launch.world_size_source == (
        f"torchrun --nnodes ${{SLURM_NNODES}} ({path}:11) is not known statically: SLURM_NNODES is not set in the "
        "script or the environment (bash would expand it to nothing)")
    assert flags(launch) == ["--num-layers", "$NUM_LAYERS", "--hidden-size", "1024", "--save", "/ckpt/$(hostname)",
                             "${LAYER_ARGS[@]}", "--load", "$1"]
    unresolved = [t.text for t in launch.megatron_tokens if t.unresolved]
    assert unresolved == ["$NUM_LAYERS", "/ckpt/$(hostname)", "${LAYER_ARGS[@]}", "$1"]
    # --num-layers decides the model, an array of unknown flags may be any flag, the world size
    # decides the layout: problems.  --save and --load are locations: notices.
    assert problems == (
        Problem("unresolved-variable", f"{path}:12 NUM_LAYERS",
                "NUM_LAYERS is not set in the script or the environment (bash would expand it to nothing)"),
        Problem("unsupported-shell-construct", f"{path}:7 LAYER_ARGS",
                f"LAYER_ARGS is built in the `while` loop at {path}:7, whose iterations cannot be known statically; "
                f"the launch at {path}:15 gets `${{LAYER_ARGS[@]}}` from it"),
        Problem("unresolved-variable", f"{path}:4 SLURM_NNODES",
                "SLURM_NNODES is not set in the script or the environment (bash would expand it to nothing); "
                f"the launch at {path}:11 gets `${{SLURM_NNODES}}` from it (it decides the world size)"),
    )
    assert launch.notices == (
        f"{path}:5 $(hostname): `$(hostname)` runs `hostname`; its output cannot be known without running it; "
        f"--save at {path}:14 gets `/ckpt/$(hostname)` from it (checkpointing: it changes neither validation nor "
        "memory); the check goes on without it",
        f"{path}:16 $1: $1 is the script's argument 1, which was not given (bash would expand it to nothing); "
        f"--load at {path}:16 gets `$1` from it (a location the job reads on its own machines, not this check); "
        "the check goes on without it",
    )


def test_unresolved_become_resolved_when_the_environment_gives_them():
    path = fixture("unresolved.sh")
    launch, problems = load("unresolved.sh", {"SLURM_NNODES": "2", "NUM_LAYERS": "24"}, script_args=("/ckpt/x",))
    assert (launch.world_size, launch.world_size_source) == (
        16, f"torchrun --nproc_per_node 8 ({path}:11) x --nnodes 2 ({path}:11)")
    assert [p.location.rsplit(" ", 1)[-1] for p in problems] == ["LAYER_ARGS"]
    assert [n.split(":", 2)[1] for n in launch.notices] == ["5 $(hostname)"]   # --save: a notice
    assert flags(launch)[:2] == ["--num-layers", "24"]


def test_command_substitution_in_the_world_size(tmp_path):
    path = script(tmp_path, """
        GPUS=$(nvidia-smi -L | wc -l)
        torchrun --nproc_per_node $GPUS pretrain_gpt.py --num-layers 2
        """)
    launch, problems = load_launch_script(path, {})
    assert launch.world_size is None
    assert problems == (Problem(
        "unsupported-shell-construct", f"{path}:1 $(nvidia-smi -L | wc -l)",
        # the node's GPU count: the check's machine is not the job's (inputs/launch/machine.py)
        "`$(nvidia-smi -L | wc -l)`: it prints the number of GPUs of the node the job runs on, which the "
        "check cannot see; give the node's GPU count with --gpus-per-node N; "
        f"the launch at {path}:2 gets `$(nvidia-smi -L | wc -l)` from it (it decides the world size)"),)


def test_required_variable_and_brace_expansion(tmp_path):
    path = script(tmp_path, """
        torchrun --nproc_per_node 2 pretrain_gpt.py --num-layers ${LAYERS:?set LAYERS} --split {1,2}
        """)
    launch, problems = load_launch_script(path, {})
    assert flags(launch) == ["--num-layers", "${LAYERS:?set LAYERS}", "--split", "{1,2}"]
    assert problems == (
        Problem("unresolved-variable", f"{path}:1 LAYERS",
                "the script requires LAYERS (`${LAYERS:?set LAYERS}`: set LAYERS) and it is not set; "
                "bash would stop the script here"),
    )
    # --split is data loading: its unknown value is a notice
    assert launch.notices == (
        f"{path}:1 {{1,2}}: `{{1,2}}` uses brace expansion, which this tool does not do; --split at {path}:1 gets "
        "`{1,2}` from it (data loading: it changes neither validation nor memory); the check goes on without it",)


def test_value_decided_by_an_unknown_condition(tmp_path):
    path = script(tmp_path, """
        if [ -d /scratch ]; then TP=4; else TP=8; fi
        if [ -d /scratch ]; then EXTRA=--a; else EXTRA=--a; fi
        torchrun --nproc_per_node 8 pretrain_gpt.py --tensor-model-parallel-size $TP $EXTRA
        """)
    launch, problems = load_launch_script(path, {})
    assert flags(launch) == ["--tensor-model-parallel-size", "$TP", "--a"]   # the same in both branches: known
    assert problems == (Problem(
        "unsupported-shell-construct", f"{path}:1 TP",
        f"TP is set differently depending on `[ -d /scratch ]` at {path}:1, which cannot be decided statically "
        f"(set at {path}:1, {path}:1); the launch at {path}:3 gets `$TP` from it"),)


def test_program_that_cannot_be_resolved(tmp_path):
    path = script(tmp_path, """
        $LAUNCHER pretrain_gpt.py --num-layers 2
        """)
    launch, problems = load_launch_script(path, {})
    assert launch is None
    assert [p.code for p in problems] == ["no-launch-line", "unresolved-variable"]
    assert problems[1] == Problem("unresolved-variable", f"{path}:1 LAUNCHER",
                                  "LAUNCHER is not set in the script or the environment (bash would expand it to nothing)")


def test_syntax_errors_and_unreadable_files(tmp_path):
    path = script(tmp_path, """
        ARGS=(--num-layers 2
        torchrun --nproc_per_node 2 pretrain_gpt.py "${ARGS[@]}"
        echo "unclosed
        """)
    launch, problems = load_launch_script(path, {})
    assert launch is None
    assert problems == (Problem("shell-syntax-error", f"{path}:3", "a double quote is not closed"),)
    missing = str(tmp_path / "missing.sh")
    assert load_launch_script(missing, {}) == (None, (Problem(
        "unreadable-file", missing, "cannot read the launch script: No such file or directory"),))


# ---- choosing the launch ---------------------------------------------------------------------

def test_training_launch_is_preferred_over_other_python_commands():
    path = fixture("two_launches.sh")
    launch, problems = load("two_launches.sh")
    assert problems == ()
    assert (launch.location, launch.command.launcher, launch.world_size) == (f"{path}:9", "torchrun", 8)
    srun, problems = load("two_launches.sh", {"USE_SRUN": "1"})
    assert problems == ()
    assert (srun.location, srun.command.launcher, srun.world_size) == (f"{path}:7", "srun", 16)
    prep, problems = load("two_launches.sh", line=4)
    assert problems == ()
    assert (prep.command.script, flags(prep)) == (
        "tools/preprocess_data.py", ["--input", "corpus.jsonl", "--output-prefix", "corpus"])


def test_ambiguous_launches_are_reported_and_a_line_picks_one():
    path = fixture("ambiguous.sh")
    launch, problems = load("ambiguous.sh")
    assert problems == (Problem(
        "ambiguous-launch-line", path,
        f"more than one command starts the training script: {path}:4 (when `[ -f /etc/cluster-a ]` at {path}:3); "
        f"{path}:6 (when `[ -f /etc/cluster-a ]` at {path}:3); say which line is the launch"),)
    chosen, problems = load("ambiguous.sh", line=6)
    assert problems == ()
    assert (chosen.world_size, flags(chosen)) == (4, ["--num-layers", "16"])
    none, problems = load("ambiguous.sh", line=5)
    assert none is None
    assert problems == (Problem("no-launch-line", f"{path}:5",
                                f"no command that starts a training script runs at {path}:5"),)


# ---- expansions, builtins, functions, sourced files ------------------------------------------

def test_expansions_functions_loops_and_sourced_files():
    path = fixture("expansions.sh")
    common = fixture("common.sh")
    launch, problems = load("expansions.sh", {"PWD": "/elsewhere"})
    assert problems == ()
    assert launch.command.argv[:5] == ("env", "NCCL_DEBUG=WARN", "torchrun", "--standalone", "--nproc-per-node=4")
    assert flags(launch) == [
        "--seq-length", "1024", "--max-position-embeddings", "1024",    # from common.sh
        "--micro-batch-size", "1",                                      # set -- ... then "$@"
        "--num-layers", "12",                                           # $(( 6 * PP )) with PP=${PP:-2}
        "--hidden-size", "1024",                                        # declare -i HIDDEN=64*HEADS
        "--num-attention-heads", "16",                                  # a function with local
        "--bf16", "--use-flash-attn",                                   # a for loop
        "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
        "--wandb-exp-name", "run_tp2",                                  # ${NAME%.log}
        "--split", "98,2,0"]                                            # $'...'
    assert (launch.world_size, launch.world_size_source) == (
        4, f"torchrun --nproc-per-node 4 ({path}:29) x default --nnodes 1")
    assert launch.megatron_tokens[0].location == f"{common}:3"
    assert launch.environment == (ScriptEnvVar("NVTE_FUSED_ATTN", "0", f"{common}:2"),
                                  ScriptEnvVar("NCCL_DEBUG", "WARN", f"{path}:29"))
    tp2, _ = load("expansions.sh", {"TP": "1", "PP": "4"})
    assert flags(tp2)[6:8] == ["--num-layers", "24"]
    assert tp2.world_size == 4


@pytest.mark.parametrize("body, expected", [
    ('X=/a/b/model.tar.gz\nRUN --s1 ${X%%.*} --s2 ${X##*/} --s3 ${X/model/m} --up ${X^^} --sub ${X:1:3}',
     ["--s1", "/a/b/model", "--s2", "model.tar.gz", "--s3", "/a/b/m.tar.gz", "--up", "/A/B/MODEL.TAR.GZ", "--sub", "a/b"]),
    ('ARR=(--a "b c" d)\nRUN "${ARR[@]}" --n ${#ARR[@]} --j "${ARR[*]}" --k ${ARR[1]}',
     ["--a", "b c", "d", "--n", "3", "--j", "--a b c d", "--k", "b", "c"]),
    ("RUN --q '$HOME' --d \"$HOME\" --e \\$HOME --t $'a\\tb'", ["--q", "$HOME", "--d", "/nowhere/u", "--e", "$HOME", "--t", "a\tb"]),
    (': "${N:=3}"\nRUN --n $N --m ${M:-$N} --p ${N:+set} --u ${UNSET:+x}end', ["--n", "3", "--m", "3", "--p", "set", "--u", "end"]),
    ('A=4\nB=2\nRUN --x $(( A * B + 1 )) --y $((A/B)) --z $(( A > B ? A : B )) --w $[A-B]',
     ["--x", "9", "--y", "2", "--z", "4", "--w", "2"]),
    ('RUN --b $(basename /x/y.py .py) --d "$(dirname /x/y.py)" --e $(echo hi there) --p $(printf %s-%s a b)',
     ["--b", "y", "--d", "/x", "--e", "hi", "there", "--p", "a-b"]),
    ('case "gpu-large" in\n  cpu*|small) S=1 ;;\n  gpu-*) S=8 ;;\nesac\n[[ -n "$S" ]] && T=yes || T=no\nRUN --s $S --t $T',
     ["--s", "8", "--t", "yes"]),
    ('export A=1 B=2\nreadonly R=ro\nunset A\nRUN --a x${A:-}x --b $B --r $R', ["--a", "xx", "--b", "2", "--r", "ro"]),
    ('cat > out.txt <<EOF\ntorchrun --nproc_per_node 9 other.py\nEOF\nRUN --after heredoc', ["--after", "heredoc"]),
    ('CMD="--from eval"\neval "RUN $CMD --more"', ["--from", "eval", "--more"]),
    ('i=0\nwhile [ $i -lt 3 ]; do L+=(--l$i); i=$((i+1)); done\nRUN "${L[@]}"', ["--l0", "--l1", "--l2"]),
    ('IFS=,\nV="a,b"\nRUN $V', ["a", "b"]),
])
def test_bash_expansions(tmp_path, body, expected):
    text = body.replace("RUN ", "torchrun --nproc_per_node 1 pretrain_gpt.py ")
    path = script(tmp_path, text + "\n")
    launch, problems = load_launch_script(path, {"HOME": "/nowhere/u"})
    assert problems == ()
    assert flags(launch) == expected


def test_prefix_assignments_reach_the_launch(tmp_path):
    path = script(tmp_path, """
        NVTE_FLASH_ATTN=0 PET_NNODES=2 torchrun --nproc_per_node 4 pretrain_gpt.py --num-layers 2 2>&1 | tee log.txt
        """)
    launch, problems = load_launch_script(path, {})
    assert problems == ()
    assert launch.environment == (ScriptEnvVar("NVTE_FLASH_ATTN", "0", f"{path}:1"),
                                  ScriptEnvVar("PET_NNODES", "2", f"{path}:1"))
    assert (launch.world_size, launch.world_size_source) == (
        8, f"torchrun --nproc_per_node 4 ({path}:1) x PET_NNODES=2 set on the launch line at {path}:1")


def test_set_a_exports_and_unexported_variables_do_not(tmp_path):
    path = script(tmp_path, """
        NOT_EXPORTED=1
        set -a
        NVTE_FUSED_ATTN=0
        set +a
        python pretrain_gpt.py
        """)
    launch, problems = load_launch_script(path, {})
    assert problems == ()
    assert launch.environment == (ScriptEnvVar("NVTE_FUSED_ATTN", "0", f"{path}:3"),)


def test_plain_python_reads_world_size_exported_by_the_script(tmp_path):
    path = script(tmp_path, """
        export WORLD_SIZE=$((2 * 4))
        python pretrain_gpt.py --num-layers 2
        """)
    launch, problems = load_launch_script(path, {})
    assert problems == ()
    assert (launch.world_size, launch.world_size_source) == (8, f"WORLD_SIZE=8 exported at {path}:1")


def test_split_command_string_reads_like_sh_c():
    commands, problems = split_command_string(
        'cd /w && export X=1; A=2 torchrun --nproc-per-node $N pretrain_gpt.py "$@"', {"N": "4"}, ("sh", "--a", "b c"))
    assert problems == ()
    assert [c.tokens for c in commands] == [("torchrun", "--nproc-per-node", "4", "pretrain_gpt.py", "--a", "b c")]
    assert commands[0].environment == (("X", "1"), ("A", "2"))


def test_the_example_launch_script_resolves_without_problems():
    launch, problems = load_launch_script(EXAMPLE, {})
    assert problems == ()
    assert launch.command.launchers == ("srun", "torchrun")
    assert launch.command.script == "/opt/megatron-lm/pretrain_gpt.py"
    assert launch.world_size == 16
    assert launch.world_size_source == (
        f"torchrun --nproc_per_node 8 ({EXAMPLE}:39) x --nnodes 2 ({EXAMPLE}:40, $SLURM_NNODES from "
        f"#SBATCH --nodes=2 ({EXAMPLE}:3))")
    argv = flags(launch)
    for flag, value in (("--num-layers", "32"), ("--hidden-size", "4096"), ("--num-query-groups", "8"),
                        ("--tensor-model-parallel-size", "2"), ("--pipeline-model-parallel-size", "1"),
                        ("--vocab-size", "128256"), ("--seq-length", "8192"), ("--global-batch-size", "128")):
        assert argv[argv.index(flag) + 1] == value
    assert "--bf16" in argv and "--use-distributed-optimizer" in argv
    assert {v.name for v in launch.environment} == {
        "CUDA_DEVICE_MAX_CONNECTIONS", "NVTE_FWD_LAYERNORM_SM_MARGIN", "NVTE_BWD_LAYERNORM_SM_MARGIN"}


# ---- the same scripts under real bash --------------------------------------------------------

_STUB = """#!/bin/sh
printf '%s\\0' "$(basename "$0")" "$@" >> "$STUB_LOG"
printf '\\n' >> "$STUB_LOG"
env > "$STUB_LOG.env"
"""


@pytest.mark.parametrize("name, environ, args", [
    ("gpt_distributed.sh", {}, ()),
    ("gpt_distributed.sh", {"NODE_RANK": "3"}, ("/ckpt/a b",)),
    ("llama_conditional.sh", {}, ()),
    ("llama_conditional.sh", {}, ("ck/x", "meta-llama/Meta-Llama-3-8B")),
    ("options_string.sh", {}, ("large",)),
    ("expansions.sh", {"TP": "4"}, ()),
    ("job.sbatch", {}, ()),
    ("sbatch_torchrun.sbatch", {"SLURM_NNODES": "4", "SLURM_GPUS_PER_NODE": "8"}, ()),
    ("two_launches.sh", {"USE_SRUN": "1"}, ()),
    ("heredoc_args.sh", {}, ()),
    ("heredoc_args.sh", {"TP": "4"}, ()),
])
def test_resolution_matches_bash(tmp_path, name, environ, args):
    bash = shutil.which("bash")
    assert bash is not None, "bash is needed to check the loader against the shell it imitates"
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for program in ("torchrun", "srun", "python", "python3", "mpirun"):
        stub = stubs / program
        stub.write_text(_STUB)
        stub.chmod(0o755)
    work = tmp_path / "work"
    shutil.copytree(FIXTURES, work)
    (work / "pretrain_gpt.py").write_text("")       # llama_conditional.sh checks that it exists
    log = tmp_path / "log"
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "HOME": str(tmp_path), "PWD": str(work), "STUB_LOG": str(log), **environ}
    subprocess.run([bash, str(work / name), *args], cwd=work, env=env, check=True, timeout=60,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # each run: its arguments, each ended by NUL, then a newline
    runs = [tuple(record.split("\0")) for record in log.read_text().split("\0\n") if record]
    launch, problems = load_launch_script(str(work / name), env, script_args=args)
    assert problems == ()
    argv = launch.command.argv
    start = next(i for i, token in enumerate(argv) if os.path.basename(token) in ("torchrun", "srun", "python", "python3"))
    assert argv[start:] == runs[-1]
    seen_env = dict(line.split("=", 1) for line in (tmp_path / "log.env").read_text().splitlines() if "=" in line)
    for var in launch.environment:
        assert seen_env.get(var.name) == var.value, var


def test_constructs_around_the_launch_are_read(tmp_path):
    path = script(tmp_path, """
        #!/bin/bash
        set -euo pipefail
        trap 'echo done' EXIT
        exec > >(tee -a train.log) 2>&1
        mapfile -t KEYS < <(yq 'keys' params.yaml)
        CONTENT=$(< params.yaml)
        function banner { echo "== $1 =="; }
        banner start
        local NOT_IN_A_FUNCTION=1
        count=0
        (( count++ ))
        if [[ "v1.2" =~ ^v[0-9]+\\.[0-9]+$ ]]; then VERSION_OK=yes; fi
        { echo grouped; } > /dev/null
        ( cd /tmp && echo sub )
        return
        torchrun --nproc_per_node 2 pretrain_gpt.py --count $count --ok $VERSION_OK &
        wait
        """)
    launch, problems = load_launch_script(path, {})
    assert problems == ()
    assert flags(launch) == ["--count", "1", "--ok", "yes"]
    assert launch.location == f"{path}:16"


def test_the_scripts_own_arguments_not_given_are_none(tmp_path):
    path = script(tmp_path, """
        #!/bin/bash
        run_it() { echo "$@"; }
        run_it --quiet
        torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 2 "$@"
        """)
    launch, problems = load_launch_script(path, {})
    # Not given, the arguments are none, as bash has them: a notice, no problem.
    assert problems == ()
    assert launch.megatron_argv == ("--num-layers", "2")
    assert launch.notices == (
        f"{path}:4 $@: $@ passes on the arguments the script is run with, which are not known here (bash would "
        "pass none when it runs without arguments); give them with --script-arg; "
        f"the launch at {path}:4 gets no word from `$@`",)
    # Given the arguments, they are the launch's.
    launch, problems = load_launch_script(path, {}, script_args=["--hidden-size", "64"])
    assert problems == ()
    assert launch.megatron_argv == ("--num-layers", "2", "--hidden-size", "64")


def test_a_world_size_given_by_the_caller_needs_no_launcher_count(tmp_path):
    path = script(tmp_path, """
        torchrun --nproc_per_node 8 --nnodes $1 pretrain_gpt.py --num-layers 2
        """)
    launch, problems = load_launch_script(path, {})
    assert [(p.code, p.location) for p in problems] == [("unresolved-variable", f"{path}:1 $1")]
    assert launch.world_size is None
    launch, problems = load_launch_script(path, {}, world_size_given=True)
    assert problems == ()
    launch, problems = load_launch_script(path, {}, script_args=["4"])
    assert problems == () and launch.world_size == 32


def test_megatron_example_style_script_arguments_and_optional_flags_are_notices(tmp_path):
    # The idioms of Megatron-LM's examples/gpt3/train_gpt3_175b_distributed.sh: paths from
    # $1.., an optional ${EXTRA_ARGS}, a save location stamped with $(date +%s).
    path = script(tmp_path, """
        CHECKPOINT_PATH=$1 #<Specify path>
        VOCAB_FILE=$3
        torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 2 --use-mcore-models ${EXTRA_ARGS} \\
            --save /ckpt/$(date +%s) --load $CHECKPOINT_PATH --vocab-file $VOCAB_FILE --train-iters $ITERS
        """)
    launch, problems = load_launch_script(path, {})
    assert problems == ()
    # the unset ${EXTRA_ARGS} is no word: it is not the value of --use-mcore-models
    assert launch.megatron_argv == ("--num-layers", "2", "--use-mcore-models", "--save", "/ckpt/$(date +%s)",
                                    "--load", "$1", "--vocab-file", "$3", "--train-iters", "$ITERS")
    assert [n.split(": ", 1)[0] for n in launch.notices] == [
        f"{path}:3 EXTRA_ARGS", f"{path}:4 $(date +%s)", f"{path}:1 $1", f"{path}:2 $3", f"{path}:4 ITERS"]
    assert launch.notices[0] == (
        f"{path}:3 EXTRA_ARGS: EXTRA_ARGS is not set in the script or the environment (bash would expand it to "
        f"nothing); the launch at {path}:3 gets no word from `${{EXTRA_ARGS}}`")
    assert launch.opaque_indexes == frozenset({4, 6, 8, 10})


def test_an_unset_value_of_a_list_flag_is_dropped_as_bash_drops_it(tmp_path):
    # Megatron-LM's examples/mamba/train.sh: DATA_PATH=$1 ... --data-path ${DATA_PATH}; --data-path
    # takes nargs='*' (megatron/training/arguments.py), so with $1 not given bash passes no word and
    # Megatron gets --data-path with an empty list.
    path = script(tmp_path, """
        DATA_PATH=$1
        torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 2 \\
            --data-path ${DATA_PATH} --split 99,1,0
        """)
    launch, problems = load_launch_script(path, {})
    assert problems == ()
    assert launch.megatron_argv == ("--num-layers", "2", "--data-path", "--split", "99,1,0")
    assert launch.notices == (
        f"{path}:1 $1: $1 is the script's argument 1, which was not given (bash would expand it to nothing); "
        f"--data-path at {path}:3 gets no value from `$1` (bash drops the empty word)",)


def test_an_unknown_value_that_decides_the_model_stays_one_problem(tmp_path):
    path = script(tmp_path, """
        torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers $NL --hidden-size 64
        """)
    launch, problems = load_launch_script(path, {})
    assert problems == (Problem("unresolved-variable", f"{path}:1 NL",
                                "NL is not set in the script or the environment (bash would expand it to nothing)"),)
    # read as flags, the value is neither converted (a second error) nor missing (a third)
    from megatron_estimator.api import input_from_file

    inp, all_problems = input_from_file(path, environ={})
    assert [p.code for p in all_problems] == ["unresolved-variable"]
    assert inp.raw.opaque == frozenset({"num_layers"})


def test_set_u_makes_an_unset_variable_unknown_not_empty(tmp_path):
    path = script(tmp_path, """
        set -euo pipefail
        torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 2 ${EXTRA_ARGS}
        """)
    launch, problems = load_launch_script(path, {})
    assert problems == (Problem(
        "unresolved-variable", f"{path}:2 EXTRA_ARGS",
        f"EXTRA_ARGS is not set in the script or the environment; the script runs `set -u` ({path}:1), so bash "
        "would stop here unless it is set when the job runs"),)


def test_a_guard_on_an_unset_variable_is_assumed_to_pass(tmp_path):
    # examples/multimodal/pretrain_mistral_clip.sh and the `[ -z $1 ] && exit` idiom
    path = script(tmp_path, """
        if [[ -z $WORKSPACE ]]; then
            echo "Please set WORKSPACE"
            exit 1
        fi
        [ -z "$1" ] && exit 1
        torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 2 --save "$WORKSPACE/ckpt"
        """)
    launch, problems = load_launch_script(path, {})
    assert problems == ()
    assert launch.location == f"{path}:6"
    assert launch.notices[:2] == (
        f"{path}:1 WORKSPACE: the script stops when `[[ -z $WORKSPACE ]]` at {path}:1 holds, which it does here "
        "only because WORKSPACE is not set; the check assumes the job sets it and goes on",
        f"{path}:5 $1: the script stops when `[ -z \"$1\" ]` at {path}:5 holds, which it does here only because "
        "$1 is not set; the check assumes the job sets it and goes on",
    )
    # a default for an unset variable is not a guard: bash's own reading stays
    path = script(tmp_path, """
        if [ -z "$NNODES" ]; then NNODES=2; fi
        torchrun --nproc_per_node 8 --nnodes $NNODES pretrain_gpt.py --num-layers 2
        """)
    launch, problems = load_launch_script(path, {})
    assert (problems, launch.world_size, launch.notices) == ((), 16, ())


# ---- here-documents read as the script they feed ----------------------------------------

def test_a_launch_in_an_sbatch_here_document_is_the_jobs(tmp_path):
    # sbatch with no script file reads the script from standard input (sbatch(1)); the unquoted
    # delimiter expands $LAYERS where the here-document is written (bash(1), Here Documents).
    path = script(tmp_path, """
        #!/bin/bash
        LAYERS=4
        sbatch <<EOF
        #!/bin/bash
        #SBATCH --nodes=2
        #SBATCH --ntasks-per-node=8
        srun python pretrain_gpt.py --num-layers $LAYERS --hidden-size 256 \\
            --micro-batch-size 1
        EOF
        """)
    launch, problems = load_launch_script(path, {"PWD": str(tmp_path)})
    assert problems == ()
    assert launch.location == f"{path}:7"
    assert launch.command.argv == ("srun", "python", "pretrain_gpt.py", "--num-layers", "4", "--hidden-size", "256",
                                   "--micro-batch-size", "1")
    # 2 nodes x 8 tasks per node
    assert launch.world_size == 16
    assert launch.world_size_source == (f"srun with SLURM_NTASKS=16 from #SBATCH --nodes=2 ({path}:5) "
                                        f"--ntasks-per-node=8 ({path}:6)")
    assert launch.sbatch == SbatchHeaders(nodes=2, ntasks_per_node=8,
                                          given=(("nodes", ("2", f"{path}:5", "--nodes=2")),
                                                 ("ntasks-per-node", ("8", f"{path}:6", "--ntasks-per-node=8"))))
    # each flag where it is written inside the here-document; the value 4 where it was set
    assert list(zip(launch.megatron_argv, launch.megatron_locations)) == [
        ("--num-layers", f"{path}:7"), ("4", f"{path}:2"), ("--hidden-size", f"{path}:7"), ("256", f"{path}:7"),
        ("--micro-batch-size", f"{path}:8"), ("1", f"{path}:8")]


def test_a_quoted_delimiter_leaves_the_here_document_to_the_job(tmp_path):
    # <<"EOF": no expansion where it is written; the job's shell expands $LAYERS from its
    # environment (exported, so sbatch passes it on) and finds $HIDDEN unset (not exported).
    # sbatch's own -N 4 wins over the #SBATCH line (sbatch(1)).
    path = script(tmp_path, """
        export LAYERS=4
        HIDDEN=256
        sbatch -N 4 <<"EOF"
        #SBATCH --nodes=2
        #SBATCH --ntasks-per-node=8
        srun python pretrain_gpt.py --num-layers $LAYERS --hidden-size $HIDDEN
        EOF
        """)
    launch, problems = load_launch_script(path, {"PWD": str(tmp_path)})
    assert [(p.code, p.location) for p in problems] == [("unresolved-variable", f"{path}:6 HIDDEN")]
    assert launch.megatron_argv == ("--num-layers", "4", "--hidden-size", "$HIDDEN")
    assert launch.megatron_locations == (f"{path}:6",) * 4
    assert launch.world_size == 32
    assert launch.world_size_source == (f"srun with SLURM_NTASKS=32 from #SBATCH -N 4 ({path}:3) "
                                        f"--ntasks-per-node=8 ({path}:5)")


def test_bash_and_srun_bash_s_read_a_here_document_as_their_script(tmp_path):
    # <<- removes the leading tabs; `srun bash -s` and plain `bash` read the script from stdin.
    path = script(tmp_path, "L=2\nsrun -N 1 bash -s <<-EOF\n\ttorchrun --nproc-per-node 8 pretrain_gpt.py "
                            "--num-layers $L\n\tEOF\n")
    launch, problems = load_launch_script(path, {"PWD": str(tmp_path)})
    assert problems == ()
    assert launch.location == f"{path}:3"
    assert launch.world_size == 8
    assert list(zip(launch.megatron_argv, launch.megatron_locations)) == [("--num-layers", f"{path}:3"),
                                                                          ("2", f"{path}:1")]
    plain = script(tmp_path, "bash -x <<'EOF'\npython pretrain_gpt.py --num-layers 2\nEOF\n", "plain.sh")
    launch, problems = load_launch_script(plain, {"PWD": str(tmp_path)})
    assert problems == () and launch.location == f"{plain}:2" and launch.megatron_argv == ("--num-layers", "2")


@pytest.mark.parametrize("line", ["sbatch job.sh <<EOF", "bash run.sh <<EOF", "bash -c 'cat' <<EOF", "cat <<EOF"])
def test_a_here_document_that_is_not_the_script_is_not_read_as_one(tmp_path, line):
    path = script(tmp_path, f"{line}\nsrun python pretrain_gpt.py --num-layers 2\nEOF\n")
    launch, problems = load_launch_script(path, {"PWD": str(tmp_path)})
    assert launch is None
    assert [p.code for p in problems] == ["no-launch-line"]


def test_megatron_fsdp_example_submits_its_launch_in_a_here_document():
    tree = megatron_tree("examples/megatron_fsdp/sbatch_mfsdp_deepseek_v3.sh")
    if tree is None:
        pytest.skip(f"set {TREE_ENV} to a Megatron-LM checkout (its examples/ are not ours to commit)")
    example = str(tree / "examples/megatron_fsdp/sbatch_mfsdp_deepseek_v3.sh")
    launch, problems = load_launch_script(example, {"PWD": "/tmp"})
    # its #SBATCH lines are placeholders: each is a located problem, and the launch is still found
    with open(example) as handle:
        lines = handle.read().splitlines()
    nodes = next(n for n, text in enumerate(lines, 1) if text.startswith("#SBATCH --nodes="))
    assert [(p.code, p.location) for p in problems] == [
        ("invalid-launcher-option", f"{example}:{nodes + 2} --gres"),
        ("invalid-launcher-option", f"{example}:{nodes} --nodes"),
        ("invalid-launcher-option", f"{example}:{nodes + 1} --ntasks-per-node")]
    assert launch is not None and launch.command.script.endswith("/pretrain_gpt.py")
    assert launch.command.launcher == "srun"
    assert launch.megatron_argv[:2] == ("--distributed-timeout-minutes", "60")


# ---- here-documents inside $(...), srun bash -s (issue 12) -----------------------------------

def test_a_here_document_cat_reads_inside_command_substitution_is_its_output():
    # ARGS=$(cat <<EOF ... EOF): the output is the body, expanded where it is written (unquoted
    # delimiter) or as written ('EOF'); <<- drops the tabs.  Each flag keeps its line in the
    # here-document; an expanded value keeps where its variable was set.
    launch, problems = load("heredoc_args.sh")
    assert problems == ()
    path = fixture("heredoc_args.sh")
    pairs = list(zip(launch.megatron_argv, launch.megatron_locations))
    assert pairs[:8] == [("--num-layers", f"{path}:10"), ("32", f"{path}:10"), ("--hidden-size", f"{path}:10"),
                         ("4096", f"{path}:10"), ("--num-attention-heads", f"{path}:10"), ("32", f"{path}:10"),
                         ("--seq-length", f"{path}:11"), ("4096", f"{path}:7")]
    assert pairs[13:18] == [("--tensor-model-parallel-size", f"{path}:16"), ("2", f"{path}:6"),
                            ("--pipeline-model-parallel-size", f"{path}:17"), ("2", f"{path}:17"),
                            ("--sequence-parallel", f"{path}:18")]
    assert pairs[-2:] == [("--vocab-size", f"{path}:24"), ("128256", f"{path}:24")]


def test_an_unknown_value_in_a_command_substitution_here_document_stays_located(tmp_path):
    path = script(tmp_path, """
        ARGS=$(cat <<EOF
        --num-layers 2 --hidden-size 64
        --save $CKPT_DIR
        EOF
        )
        python pretrain_gpt.py $ARGS
        """)
    launch, problems = load_launch_script(path, {"PWD": str(tmp_path)})
    assert launch.megatron_argv == ("--num-layers", "2", "--hidden-size", "64", "--save", "$CKPT_DIR")
    assert launch.megatron_locations[4:] == (f"{path}:3", f"{path}:3")
    # a checkpoint path changes neither validation nor memory: a notice where it is written
    assert problems == ()
    assert launch.notices == (
        f"{path}:3 CKPT_DIR: CKPT_DIR is not set in the script or the environment (bash would expand it "
        f"to nothing); --save at {path}:6 gets `$CKPT_DIR` from it (checkpointing: it changes neither "
        "validation nor memory); the check goes on without it",)


def test_a_command_substitution_of_cat_with_a_file_is_still_not_known(tmp_path):
    path = script(tmp_path, "ARGS=$(cat args.txt)\npython pretrain_gpt.py --num-layers 2 $ARGS\n")
    launch, problems = load_launch_script(path, {"PWD": str(tmp_path)})
    assert [p.code for p in problems] == ["unsupported-shell-construct"]


def test_srun_bash_s_counts_srun_tasks_for_a_plain_python_launch(tmp_path):
    # srun starts 2 x 8 tasks, each running the here-document's python: 16 processes
    path = script(tmp_path, """
        #!/bin/bash
        #SBATCH --nodes=2
        #SBATCH --gpus-per-node=8
        srun -N 2 --ntasks-per-node=8 bash -s <<EOF
        python pretrain_gpt.py --num-layers 4 \\
          --tensor-model-parallel-size 2
        EOF
        """)
    launch, problems = load_launch_script(path, {"PWD": str(tmp_path)})
    assert problems == ()
    assert launch.location == f"{path}:5"
    assert launch.command.launcher == "srun"
    assert launch.world_size == 16
    assert launch.world_size_source == f"srun -N 2 ({path}:4) --ntasks-per-node 8 ({path}:4)"
    assert list(zip(launch.megatron_argv, launch.megatron_locations)) == [
        ("--num-layers", f"{path}:5"), ("4", f"{path}:5"),
        ("--tensor-model-parallel-size", f"{path}:6"), ("2", f"{path}:6")]


def test_srun_bash_s_without_counts_runs_the_allocation_from_the_sbatch_lines(tmp_path):
    # srun with no -N / -n inside a job runs SLURM_NTASKS tasks (#SBATCH --nodes x --ntasks-per-node)
    path = script(tmp_path, """
        #!/bin/bash
        #SBATCH --nodes=4
        #SBATCH --ntasks-per-node=8
        srun bash -s <<'EOF'
        python pretrain_gpt.py --num-layers 4
        EOF
        """)
    launch, problems = load_launch_script(path, {"PWD": str(tmp_path)})
    assert problems == ()
    assert launch.world_size == 32
    assert launch.world_size_source == (f"srun with SLURM_NTASKS=32 from #SBATCH --nodes=4 ({path}:2) "
                                        f"--ntasks-per-node=8 ({path}:3)")


def test_srun_bash_s_with_torchrun_inside_counts_torchrun(tmp_path):
    # one srun task per node, each a torchrun of 8: torchrun's nodes x processes
    path = script(tmp_path, """
        #!/bin/bash
        #SBATCH --nodes=4
        srun -N 4 --ntasks-per-node=1 bash -s <<EOF
        torchrun --nnodes \\$SLURM_NNODES --nproc-per-node 8 pretrain_gpt.py --num-layers 4
        EOF
        """)
    launch, problems = load_launch_script(path, {"PWD": str(tmp_path)})
    assert problems == ()
    assert launch.world_size == 32


# ---- the environment bash gives the launch: unset, and $PWD at start-up ---------------------

def _bash_prints(tmp_path, text: str, env: dict, cwd) -> str:
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("bash is not on this machine")
    path = tmp_path / "probe.sh"
    path.write_text(text)
    return subprocess.run([bash, str(path)], cwd=cwd, env=env, check=True, capture_output=True, text=True,
                          timeout=30).stdout


def test_unset_removes_a_variable_the_script_inherited(tmp_path, monkeypatch):
    # Megatron-LM's examples/megatron_fsdp/train_llama3_8b_fsdp_h100_fp8.sh idiom: the FSDP branch
    # unsets CUDA_DEVICE_MAX_CONNECTIONS, which the calling shell may have set to 1.
    path = script(tmp_path, """
        #!/bin/bash
        USE_FSDP=1
        if [ "${USE_FSDP}" = 1 ]; then
            unset CUDA_DEVICE_MAX_CONNECTIONS
        fi
        export -n KEPT_LOCAL
        torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 2
        """)
    env = {"PATH": "/usr/bin:/bin", "CUDA_DEVICE_MAX_CONNECTIONS": "1", "KEPT_LOCAL": "x", "OTHER": "y"}
    monkeypatch.chdir(tmp_path)
    launch, problems = load_launch_script(path, env)
    assert problems == ()
    assert set(launch.removed_environment) == {"CUDA_DEVICE_MAX_CONNECTIONS", "KEPT_LOCAL"}
    # bash itself: neither reaches a program the script runs; OTHER does
    seen = _bash_prints(tmp_path, "unset CUDA_DEVICE_MAX_CONNECTIONS\nexport -n KEPT_LOCAL\nenv\n", env, tmp_path)
    names = {line.split("=", 1)[0] for line in seen.splitlines()}
    assert "OTHER" in names and not names & {"CUDA_DEVICE_MAX_CONNECTIONS", "KEPT_LOCAL"}


def test_a_stale_inherited_pwd_is_not_the_scripts_directory(tmp_path, monkeypatch):
    # `check sub/train.sh` run from tmp_path by a caller whose PWD names another directory (a
    # tool that changed directory without updating PWD): bash resets PWD to the real directory
    # at start-up, so "$0"-relative sources resolve from tmp_path.
    (tmp_path / "sub").mkdir()
    (tmp_path / "elsewhere" / "sub").mkdir(parents=True)
    (tmp_path / "sub" / "model.sh").write_text("MODEL_ARGS='--num-layers 4'\n")
    (tmp_path / "elsewhere" / "sub" / "model.sh").write_text("MODEL_ARGS='--num-layers 99'\n")
    script(tmp_path, """
        #!/bin/bash
        DIR="$(cd "$(dirname "$(readlink -f "$0")")" && pwd)"
        source "$DIR/model.sh"
        torchrun --nproc_per_node 8 pretrain_gpt.py $MODEL_ARGS --save "$PWD/ckpt"
        """, name="sub/train.sh")
    stale = {"PATH": "/usr/bin:/bin", "PWD": str(tmp_path / "elsewhere")}
    monkeypatch.chdir(tmp_path)
    launch, problems = load_launch_script("sub/train.sh", stale)
    assert problems == ()
    assert flags(launch) == ["--num-layers", "4", "--save", f"{tmp_path}/ckpt"]
    # what bash does with the same stale PWD, started in tmp_path
    assert _bash_prints(tmp_path, 'echo "$PWD"\n', stale, tmp_path).strip() == str(tmp_path)
    # an inherited PWD that names the directory through a symbolic link is kept as written
    (tmp_path / "link").symlink_to(tmp_path, target_is_directory=True)
    linked = {**stale, "PWD": str(tmp_path / "link")}
    launch, problems = load_launch_script("sub/train.sh", linked)
    assert flags(launch)[-1] == f"{tmp_path}/link/ckpt"
    assert _bash_prints(tmp_path, 'echo "$PWD"\n', linked, tmp_path).strip() == str(tmp_path / "link")
