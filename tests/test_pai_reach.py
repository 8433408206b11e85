"""Pai-Megatron-Patch launch scripts as `check --skip-unknown` meets them (issue 27): what was
a traceback, what was wrongly skipped, and what was wrongly refused.

The scripts are written here; they reproduce idioms of alibaba/Pai-Megatron-Patch
examples/*/run_*.sh only (no file of that repository is copied).
"""

from __future__ import annotations

import textwrap

from test_cli import run
from test_framework_launch_idioms import _argv_from, _bash_runs


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


# Pai's run_evaluate_megatron_qwen_moe.sh sets NUM_LAYERS only in a `case $MODEL_SIZE` branch;
# without the size argument the variable is unset when the MoE flags reach the launch.
_UNSET_REQUIRED_MOE = """
    MODEL_SIZE=$1
    if [ $MODEL_SIZE = 1.8B ]; then
    NUM_LAYERS=24
    fi
    torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers ${NUM_LAYERS} --hidden-size 64 \\
        --num-attention-heads 4 --seq-length 128 --max-position-embeddings 128 --micro-batch-size 1 \\
        --global-batch-size 8 --bf16 --tokenizer-type NullTokenizer --vocab-size 1000 \\
        --num-experts 4 --moe-router-topk 2
"""


def test_required_flag_from_an_unset_variable_is_one_located_problem(tmp_path):
    script = write(tmp_path / "run_moe.sh", _UNSET_REQUIRED_MOE)
    # What bash passes: the unset variable is no word, so Megatron's argparse would see
    # `--num-layers --hidden-size` and refuse (`expected one argument`).
    argv = _argv_from(_bash_runs(tmp_path, script, ["7B"])[0], "pretrain_gpt.py")
    assert argv[1:3] == ("--num-layers", "--hidden-size")
    result = run(["check", "--gpu", "h100", "--skip-unknown", str(script), "--script-arg", "7B"], cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr
    errors = [line for line in result.stdout.splitlines() if line.strip().startswith("error:")]
    # One problem: the variable, at the line where the launch takes it (line 5 of the script).
    assert len(errors) == 1, result.stdout
    assert f"{script}:5 NUM_LAYERS" in errors[0] and "[unresolved-variable]" in errors[0]
    # With the size that sets it, the same launch is estimated (24 layers; 24 % 1 MoE layer freq).
    result = run(["check", "--gpu", "h100", "--skip-unknown", str(script), "--script-arg", "1.8B"], cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


# Pai's examples/<model>/run_mcore_*_chatlearn.sh: a GRPO job through ChatLearn's entry program,
# its Megatron settings as Hydra overrides of ChatLearn's config tree, not Megatron flags.
_CHATLEARN = """
    export WORLD_SIZE=${WORLD_SIZE:-1}
    export GPUS_PER_NODE=${KUBERNETES_CONTAINER_RESOURCE_GPU:-8}
    python {entry} grpo --config-file chatlearn_configs/grpo_megatron.yaml \\
        runtime_args.train_backend=megatron \\
        models.policy_trainer.num_gpu=$(($WORLD_SIZE * $GPUS_PER_NODE)) \\
        models.policy_trainer.tensor_model_parallel_size=4 \\
        models.policy.load=/mnt/ckpts/hf/model
"""


def test_chatlearn_launch_is_not_checked_never_skipped_as_no_training(tmp_path):
    for entry, source in (("chatlearn_entrypoint.py", "from chatlearn.algorithm.base_algo import BaseAlgorithm\n"),
                          ("../absent/chatlearn_entrypoint.py", None)):
        folder = tmp_path / ("qwen3" if source else "moonlight")
        script = write(folder / "run_chatlearn.sh", _CHATLEARN.replace("{entry}", entry))
        if source:
            write(folder / "chatlearn_entrypoint.py", source)
        result = run(["check", "--gpu", "h100", "--skip-unknown", str(script)], cwd=folder)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "not checked: a ChatLearn training launch" in result.stderr, result.stderr
        assert "launches no" not in result.stderr and result.stdout == ""
        # Without --skip-unknown: one unsupported-stack refusal, no estimate of something else.
        result = run(["check", "--gpu", "h100", str(script)], cwd=folder)
        assert result.returncode == 2 and result.stdout.count("error:") == 1, result.stdout
        assert "[unsupported-stack]" in result.stdout and "ChatLearn" in result.stdout


# Pai's examples/<model>/run_evaluate_*.sh, run_ds_train_huggingface_*.sh and run_mcore_*.sh
# idioms: `torchrun $DISTRIBUTED_ARGS evaluate_megatron_<m>.py <Megatron flags>` (an evaluation
# loop, Megatron's forward only), `torchrun ds_train_huggingface_<m>.py --train-data ... --deepspeed` (a
# transformers + DeepSpeed trainer), `torchrun pretrain_<m>.py` (Megatron's pretrain()).
_MODEL = ("--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 128 --max-position-embeddings 128 "
          "--micro-batch-size 1 --global-batch-size 8 --bf16 --tokenizer-type NullTokenizer --vocab-size 1000")


def test_pai_programs_that_train_no_megatron_model_are_skipped_named(tmp_path):
    folder = tmp_path / "examples" / "qwen"
    write(folder / "evaluate_megatron_qwen.py", "from megatron_patch.arguments import get_patch_args\n")
    write(folder / "ds_train_huggingface_qwen.py", "import deepspeed\nimport transformers\n")
    write(tmp_path / "examples" / "llama2" / "generate_text_megatron_llama.py", "import megatron\n")
    write(folder / "lm_evaluate_megatron_qwen.py", "import megatron\n")
    write(folder / "pretrain_qwen.py", "from megatron_patch.arguments import get_patch_args\n"
                                       "from megatron.training import pretrain\n")
    cases = {
        "run_evaluate.sh": ("torchrun --nproc_per_node 8 evaluate_megatron_qwen.py " + _MODEL,
                            "starts no training: ", "evaluate_megatron_qwen.py, an evaluation (Pai-Megatron-Patch)"),
        # a sibling example's program, as Pai's deepseek/ and yi/ scripts run llama2's
        "run_generate.sh": ("torchrun --nproc_per_node 8 ../llama2/generate_text_megatron_llama.py " + _MODEL,
                            "starts no training: ", "generate_text_megatron_llama.py, text generation"),
        # a launcher the reader does not take for a launch (accelerate): the program named decides
        "run_lm_eval.sh": ("accelerate launch --multi_gpu lm_evaluate_megatron_qwen.py " + _MODEL,
                           "starts no training: it runs lm_evaluate_megatron_qwen.py, an evaluation", ""),
        "run_ds.sh": (("torchrun --nproc_per_node 8 ds_train_huggingface_qwen.py --train-data /mnt/d.json --num-layers 2 --hidden-size 64 "
                       "--num-attention-heads 4 --intermediate-size 256 --epochs 1"),
                      "starts no Megatron training: ", "a DeepSpeed trainer of a HuggingFace transformers model"),
    }
    for name, (launch, start, what) in cases.items():
        script = write(folder / name, launch + "\n")
        result = run(["check", "--gpu", "h100", "--skip-unknown", str(script)], cwd=folder)
        assert result.returncode == 0 and result.stdout == "", result.stdout + result.stderr
        assert f"skipped {script}: {start}" in result.stderr and what in result.stderr, result.stderr
    # The same folder's pretrain program is a training launch: checked, and estimated
    # (8 GPUs from torchrun; tp = pp = 1, so dp 8 divides the global batch of 8).
    script = write(folder / "run_pretrain.sh", "torchrun --nproc_per_node 8 pretrain_qwen.py " + _MODEL + "\n")
    result = run(["check", "--gpu", "h100", "--skip-unknown", str(script)], cwd=folder)
    assert result.returncode == 0 and "skipped" not in result.stderr, result.stdout + result.stderr
    assert "world size 8" in result.stdout


def test_sft_tokenizer_has_the_size_of_the_huggingface_tokenizer_it_loads():
    # Megatron-LM's examples/post_training/modelopt/train.sh: --tokenizer-type SFTTokenizer with a
    # Llama 3 model; SFTTokenizer's vocab_size is len(AutoTokenizer) as HuggingFaceTokenizer's:
    # Llama 3's 128,000 BPE tokens + 256 reserved special tokens = 128,256 (Meta's model card),
    # already a multiple of 128 x tp 2 = 256 (128256 / 256 = 501), so no padding rows.
    from megatron_estimator.config.vocab import resolve_vocabulary

    for kind in ("SFTTokenizer", "HuggingFaceTokenizer"):
        vocab = resolve_vocabulary(vocab_size=None, padded_vocab_size=None, tokenizer_type=kind, vocab_file=None,
                                   tokenizer_model="meta-llama/Llama-3.2-1B-Instruct",
                                   make_vocab_size_divisible_by=128, tp=2)
        assert vocab is not None and (vocab.size, vocab.padded_size) == (128256, 128256), kind


def test_a_training_launch_whose_flags_come_from_an_unset_variable_is_not_checked(tmp_path):
    # Megatron-LM's examples/academic_paper_scripts/sc21/SRUN.sh idiom: the caller exports the
    # flags; the script alone passes none (bash expands the unset variable to no word at all).
    script = write(tmp_path / "SRUN.sh", """
        CMD="python -u ${CODE_DIR}/pretrain_gpt.py ${MEGATRON_PARAMS}"
        srun -l sh -c "${CMD}"
    """)
    result = run(["check", "--gpu", "h100", "--skip-unknown", str(script)], cwd=tmp_path)
    assert result.returncode == 0 and result.stdout == "", result.stdout + result.stderr
    assert "not checked: " in result.stderr and "${MEGATRON_PARAMS}, not set here" in result.stderr
    # With the caller's variable set, it is checked: 8 tasks (srun -n 8) x the model below.
    env = {"MEGATRON_PARAMS": _MODEL, "CODE_DIR": str(tmp_path)}
    script.write_text(script.read_text().replace("srun -l", "srun -l -n 8"))
    result = run(["check", "--gpu", "h100", "--skip-unknown", str(script)], env=env, cwd=tmp_path)
    assert result.returncode == 0 and "skipped" not in result.stderr, result.stdout + result.stderr
    assert "world size 8" in result.stdout


def test_flags_from_a_file_sourced_by_a_script_argument_are_checked_with_it(tmp_path):
    # Megatron-LM's examples/post_training/modelopt/finetune.sh idiom: `source conf/${1}.sh`
    # sets the model's flags; with the argument given (--script-arg), the launch is checked.
    write(tmp_path / "conf" / "tiny.sh", f'MODEL_ARGS="{_MODEL}"\n')
    script = write(tmp_path / "finetune.sh", """
        SCRIPT_DIR="$(dirname "$(readlink -f "$0")")"
        source "${SCRIPT_DIR}/conf/${1}.sh"
        torchrun --nproc_per_node 8 pretrain_gpt.py ${MODEL_ARGS}
    """)
    result = run(["check", "--gpu", "h100", "--skip-unknown", "--script-arg", "tiny", str(script)], cwd=tmp_path)
    assert result.returncode == 0 and "skipped" not in result.stderr, result.stdout + result.stderr
    assert "world size 8" in result.stdout and "2 layers" in result.stdout
