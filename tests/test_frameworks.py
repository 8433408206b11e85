"""Frameworks that launch Megatron through their own entry programs (inputs/frameworks/).

The fixtures are written here; they reproduce the launch idioms of THUDM/slime
(``python3 train.py --actor-num-nodes N --actor-num-gpus-per-node G --colocate ...``, its flags
registered by a factory's nested functions in slime/utils/arguments.py),
alibaba/Pai-Megatron-Patch (``torchrun ... examples/qwen2/pretrain_qwen.py`` with
``extra_args_provider=get_patch_args``) and Ascend/MindSpeed-LLM (``pretrain_gpt.py`` importing
``mindspeed_llm.megatron_adaptor``).  Each expected verdict is the one a stock Megatron launch
gets with the flags the framework hands Megatron, written out by hand from the framework's source.
"""

from __future__ import annotations

import textwrap

import pytest

from conftest import TINY_GPT
from megatron_estimator import api
from megatron_estimator.inputs.frameworks import load_flag_table, table_release

# Shape only: 4 layers, hidden 64, 4 heads, vocab 1000 (conftest.TINY_GPT, less its batch and precision).
MODEL = "--num-layers 4 --hidden-size 64 --num-attention-heads 4 --vocab-size 1000"


def launch(argv, cwd, accept=()):
    inp, problems, _command = api.input_from_launch(argv, environ={"PWD": str(cwd)}, accept_flags=accept)
    # The launch's environment is the job's; with no GPU named Hopper is assumed, where TP / CP need
    # CUDA_DEVICE_MAX_CONNECTIONS=1 (megatron/training/arguments.py validate_args): the job sets it.
    return api.evaluate(inp, problems=problems, environ={"CUDA_DEVICE_MAX_CONNECTIONS": "1"})


def codes(verdict):
    return [p.code for p in verdict.problems]


def peak(verdict):
    assert verdict.problems == (), verdict.problems
    return [s.device_peak_bytes for s in verdict.estimate.stages]


# -- slime ------------------------------------------------------------------------------------

def test_slime_world_size_is_actor_nodes_times_gpus_and_dynamic_batches_pack_max_tokens(tmp_path):
    # train.py is not on disk: slime's flags come from its flag table.
    argv = ["python3", "train.py", "--actor-num-nodes", "2", "--actor-num-gpus-per-node", "4",
            "--tensor-model-parallel-size", "2", "--context-parallel-size", "2",
            "--use-dynamic-batch-size", "--max-tokens-per-gpu", "1024", "--rollout-batch-size", "16",
            "--n-samples-per-prompt", "4", "--global-batch-size", "64", "--colocate", *MODEL.split()]
    verdict = launch(argv, tmp_path)
    est = verdict.estimate
    assert verdict.problems == ()
    # slime/backends/megatron_utils/arguments.py: world_size = actor_num_nodes x actor_num_gpus_per_node = 2 x 4
    assert est.world_size == 8
    # dp = 8 / (tp 2 x cp 2) = 2
    assert est.parallelism["dp"] == 2
    # slime/utils/dp_schedule.py: a packed micro batch holds max_tokens_per_gpu x cp = 1024 x 2 tokens
    assert (est.model.micro_batch_size, est.model.seq_length) == (1, 2048)
    # What Megatron gets from slime: the same model on 8 GPUs, --micro-batch-size 1 --seq-length 2048,
    # the distributed optimizer and bf16 forced (_set_default_megatron_args), max_position_embeddings =
    # seq_length.
    stock = launch(["torchrun", "--nproc-per-node", "4", "--nnodes", "2", "pretrain_gpt.py", *MODEL.split(),
                    "--tensor-model-parallel-size", "2", "--context-parallel-size", "2", "--micro-batch-size", "1",
                    "--seq-length", "2048", "--max-position-embeddings", "2048", "--global-batch-size", "64",
                    "--use-distributed-optimizer", "--bf16"], tmp_path)
    assert peak(verdict) == peak(stock)
    said = " ".join(a.text for a in est.assumptions)
    assert "framework: slime" in said and "THUDM/slime@" in said
    assert "--colocate" in said and "--offload-rollout" in said


def test_slime_without_dynamic_batches_takes_its_default_seq_length(tmp_path):
    argv = ["python3", "train.py", "--actor-num-gpus-per-node", "2", "--micro-batch-size", "2",
            "--global-batch-size", "8", *MODEL.split()]
    est = launch(argv, tmp_path).estimate
    # --actor-num-nodes defaults to 1 (slime/utils/arguments.py add_cluster_arguments): 1 x 2 GPUs
    assert est.world_size == 2
    # _set_default_megatron_args: seq_length 4096 when not given
    assert (est.model.micro_batch_size, est.model.seq_length) == (2, 4096)


def test_slime_colocated_rollout_that_keeps_its_memory_is_said(tmp_path):
    argv = ["python3", "train.py", "--colocate", "--no-offload-rollout", "--actor-num-gpus-per-node", "1",
            "--global-batch-size", "1", "--micro-batch-size", "1", *MODEL.split()]
    said = " ".join(a.text for a in launch(argv, tmp_path).estimate.assumptions)
    assert "NOT counted" in said and "--sglang-mem-fraction-static" in said


SLIME_ARGUMENTS = '''
def reset_arg(parser, name, **kwargs):
    parser.add_argument(name, **kwargs)


def get_slime_extra_args_provider(add_custom_arguments=None):
    def add_slime_arguments(parser):
        def add_cluster_arguments(parser):
            parser.add_argument("--actor-num-nodes", type=int, default=1)
            parser.add_argument("--actor-num-gpus-per-node", type=int, default=8)
            return parser

        def add_new_arguments(parser):
            parser.add_argument("--a-flag-of-a-newer-release", type=int, default=0)
            reset_arg(parser, "--lr", type=float, default=1e-6)
            return parser

        parser = add_cluster_arguments(parser)
        parser = add_new_arguments(parser)
        return parser
    return add_slime_arguments
'''


def test_slime_flags_are_read_from_its_source_when_the_job_tree_has_it(tmp_path):
    (tmp_path / "slime" / "utils").mkdir(parents=True)
    (tmp_path / "slime" / "utils" / "arguments.py").write_text(SLIME_ARGUMENTS)
    (tmp_path / "train.py").write_text("from slime.utils.arguments import parse_args\n")
    base = ["python3", "train.py", "--actor-num-gpus-per-node", "2", "--global-batch-size", "4",
            "--micro-batch-size", "1", "--seq-length", "64", "--max-position-embeddings", "64", *MODEL.split()]
    verdict = launch(base + ["--a-flag-of-a-newer-release", "3"], tmp_path)
    assert verdict.problems == ()
    assert verdict.estimate.world_size == 2
    said = " ".join(a.text for a in verdict.estimate.assumptions)
    assert "slime/utils/arguments.py" in said and "flag table" not in said
    # A flag in neither Megatron nor this slime source: one problem naming it, saying how to supply it.
    refused = launch(base + ["--my-provider-flag", "1"], tmp_path)
    assert codes(refused) == ["unknown-flag"]
    assert "--my-provider-flag" in refused.problems[0].message and "accept-flags" in refused.problems[0].message
    assert launch(base + ["--my-provider-flag", "1"], tmp_path, accept=("--my-provider-flag",)).problems == ()


def test_a_train_py_that_is_not_slimes_is_not_taken_for_slime(tmp_path):
    # Megatron-LM's examples/multimodal/train.py stays Megatron's; an unreadable train.py with
    # no slime flag keeps torchrun's world size.
    verdict = launch(["torchrun", "--nproc-per-node", "4", "train.py", *TINY_GPT.split(), "--global-batch-size", "8"],
                     tmp_path)
    assert verdict.estimate.world_size == 4
    assert "slime" not in " ".join(a.text for a in verdict.estimate.assumptions)
    assert launch(["torchrun", "examples/multimodal/train.py", *TINY_GPT.split()], tmp_path).family.name == "multimodal"


# -- Pai-Megatron-Patch ---------------------------------------------------------------------

def test_pai_pretrain_script_takes_its_patch_flags_and_extra_vocabulary(tmp_path):
    common = ["--nproc_per_node", "8", "--nnodes", "1"]
    shape = [*TINY_GPT.replace("--vocab-size 1000", "").split(), "--tensor-model-parallel-size", "2",
             "--global-batch-size", "16"]
    verdict = launch(["torchrun", *common, "examples/qwen2/pretrain_qwen.py", *shape, "--vocab-size", "1000",
                      "--extra-vocab-size", "24", "--patch-tokenizer-type", "Qwen2Tokenizer",
                      "--dataset", "LLama-Pretrain-Idxmap", "--rotary-base", "1000000"], tmp_path)
    # megatron_patch/tokenizer: padded_vocab_size = tokenizer vocab 1000 + extra 24 = 1024 rows,
    # the same model as a stock launch of --vocab-size 1024 (1024 = 4 x 128 x tp 2: no Megatron padding).
    stock = launch(["torchrun", *common, "pretrain_gpt.py", *shape, "--vocab-size", "1024"], tmp_path)
    assert verdict.estimate.world_size == 8 and verdict.estimate.parallelism["dp"] == 4
    assert verdict.estimate.model.padded_vocab_size == 1024
    assert peak(verdict) == peak(stock)
    assert "Pai-Megatron-Patch" in verdict.family.source


# -- stacks not modelled --------------------------------------------------------------------

def test_mindspeed_llm_entry_program_is_one_unsupported_stack_refusal(tmp_path):
    (tmp_path / "pretrain_gpt.py").write_text(textwrap.dedent("""\
        from mindspeed_llm import megatron_adaptor
        from megatron.training import pretrain
    """))
    verdict = launch(["torchrun", "pretrain_gpt.py", *TINY_GPT.split(), "--use-mcore-models",
                      "--use-fused-rotary-pos-emb", "--use-fused-swiglu"], tmp_path)
    assert codes(verdict) == ["unsupported-stack"]
    assert "MindSpeed-LLM" in verdict.problems[0].message and "NPU" in verdict.problems[0].message


def test_mindspeed_llm_flags_without_its_source_are_one_unsupported_stack_refusal(tmp_path):
    verdict = launch(["torchrun", "pretrain_gpt.py", *TINY_GPT.split(), "--tokenizer-name-or-path", "/m",
                      "--use-fused-rotary-pos-emb"], tmp_path)
    assert codes(verdict) == ["unsupported-stack"]
    assert "--use-fused-rotary-pos-emb" in verdict.problems[0].message


def test_a_typo_after_pretrain_gpt_is_still_a_typo_not_a_stack(tmp_path):
    # --variable-seq-lengths is one of MindSpeed-LLM's flags (Megatron sets the attribute in code):
    # one such flag alone is an unknown flag, not a MindSpeed launch.
    verdict = launch(["torchrun", "pretrain_gpt.py", *TINY_GPT.split(), "--num-layer", "4",
                      "--variable-seq-lengths"], tmp_path)
    assert codes(verdict) == ["unknown-flag", "unknown-flag"]


# -- the flag tables ------------------------------------------------------------------------

@pytest.mark.parametrize("table, repository, flag, dest, default", [
    # slime/utils/arguments.py add_cluster_arguments: --actor-num-gpus-per-node, type=int, default=8
    ("slime_flags.tsv", "THUDM/slime@", "--actor-num-gpus-per-node", "actor_num_gpus_per_node", 8),
    ("slime_flags.tsv", "THUDM/slime@", "--max-tokens-per-gpu", "max_tokens_per_gpu", None),
    # megatron_patch/arguments.py get_patch_args: --extra-vocab-size, type=int, default=0
    ("pai_megatron_patch_flags.tsv", "alibaba/Pai-Megatron-Patch@", "--extra-vocab-size", "extra_vocab_size", 0),
])
def test_flag_tables_state_their_source_and_hold_the_frameworks_flags(table, repository, flag, dest, default):
    assert table_release(table).startswith(repository)
    spec = next(s for s in load_flag_table(table) if flag in s.option_strings)
    assert (spec.dest, spec.default) == (dest, default)


def test_slime_global_batch_comes_from_its_rollout_and_micro_batch_defaults_to_one(tmp_path):
    argv = ["python3", "train.py", "--actor-num-gpus-per-node", "2", "--rollout-batch-size", "8",
            "--n-samples-per-prompt", "4", "--num-steps-per-rollout", "2", "--seq-length", "64",
            "--max-position-embeddings", "64", *MODEL.split()]
    model = launch(argv, tmp_path).estimate.model
    # slime_validate_args: global batch = 8 x 4 // 2 = 16; reset_arg: micro batch 1; dp 2 -> 16 / (1 x 2) = 8
    assert (model.global_batch_size, model.micro_batch_size, model.num_microbatches) == (16, 1, 8)


def test_slime_reference_model_is_a_cpu_backup_not_a_second_gpu_copy(tmp_path):
    # slime/utils/tensor_backper.py:61 backs --ref-load up in pinned CPU memory and
    # backends/megatron_utils/actor.py:435-438 swaps it into the actor's parameters for the
    # reference log-probs: while the actor trains no second copy is on the GPU, so the peak is
    # the one without --ref-load, and the report says why.
    base = ["python3", "train.py", "--actor-num-gpus-per-node", "2", "--global-batch-size", "8",
            "--micro-batch-size", "1", "--tensor-model-parallel-size", "2", *MODEL.split()]
    with_ref = launch(base + ["--ref-load", "/ckpt/ref"], tmp_path)
    assert peak(with_ref) == peak(launch(base, tmp_path))
    said = [a.text for a in with_ref.estimate.assumptions]
    assert any(t.startswith("slime reference model (--ref-load): offloaded to the CPU")
               and "tensor_backper.py:61" in t for t in said)
