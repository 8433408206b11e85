"""Pai-Megatron-Patch (alibaba/Pai-Megatron-Patch): model ports trained with Megatron's ``pretrain``.

Its entry programs are ``examples/<model>/pretrain_*.py``; each passes
``extra_args_provider=get_patch_args`` (``megatron_patch/arguments.py``), which registers the
patch's flags with ``add_argument`` and ``patch_if_not_exist``.  The world size, the micro
batch and the precision are Megatron's own (torchrun launches it).  Its tokenizers set
``padded_vocab_size = tokenizer.vocab_size + --extra-vocab-size`` (megatron_patch/tokenizer/__init__.py):
with ``--vocab-size`` given, the tokenizer's size is taken to be it.
"""

from __future__ import annotations

from megatron_estimator.inputs.frameworks.adapter import Adaptation, Framework, FrameworkFlags


def _adapt(flags: FrameworkFlags) -> Adaptation:
    extra = flags.value("--extra-vocab-size", 0)
    try:
        vocab, extra = int(flags.value("--vocab-size", -1)), int(extra)
    except (TypeError, ValueError):
        return Adaptation()
    if extra <= 0 or vocab <= 0:
        return Adaptation()
    return Adaptation(settings={"vocab_size": vocab + extra}, assumptions=(
        f"Pai-Megatron-Patch --extra-vocab-size {extra}: the vocabulary is the tokenizer's {vocab} (--vocab-size) "
        f"+ {extra} = {vocab + extra} rows (megatron_patch/tokenizer/__init__.py padded_vocab_size); Megatron's "
        "padding to a multiple of --make-vocab-size-divisible-by x tp is kept, which Pai's tokenizers skip",))

FRAMEWORK = Framework(
    name="Pai-Megatron-Patch",
    entry_patterns=("examples/*/pretrain_*.py",),
    flag_table="pai_megatron_patch_flags.tsv",
    provider_files=("megatron_patch/arguments.py",),
    imports=("megatron_patch",),
    adapt=_adapt,
    # Its example programs that train no Megatron model (alibaba/Pai-Megatron-Patch@a098ca5acbde
    # examples/<model>/): the evaluations and text generation run Megatron's forward only; the
    # ds_train_huggingface_*.py trainers import transformers and deepspeed, no Megatron.
    non_training=(
        ("examples/*/evaluate_*.py", "an evaluation"),
        ("examples/*/lm_evaluate_*.py", "an evaluation"),
        ("examples/*/generate_text_*.py", "text generation"),
        ("examples/*/text_generation_*.py", "text generation"),
        ("examples/*/ds_train_huggingface_*.py", "a DeepSpeed trainer of a HuggingFace transformers model (no Megatron)"),
    ),
)
