"""Pai-Megatron-Patch (alibaba/Pai-Megatron-Patch): model ports trained with Megatron's ``pretrain``.

Its entry programs are ``examples/<model>/pretrain_*.py``; each passes
``extra_args_provider=get_patch_args`` (``megatron_patch/arguments.py``), which registers the
patch's flags with ``add_argument`` and ``patch_if_not_exist``.  The world size, the micro
batch and the precision are Megatron's own (torchrun launches it), so the adapter adds flags only.
"""

from __future__ import annotations

from megatron_estimator.inputs.frameworks import Framework

FRAMEWORK = Framework(
    name="Pai-Megatron-Patch",
    entry_patterns=("examples/*/pretrain_*.py",),
    flag_table="pai_megatron_patch_flags.tsv",
    provider_files=("megatron_patch/arguments.py",),
    imports=("megatron_patch",),
)
