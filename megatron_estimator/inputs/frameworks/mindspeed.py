"""MindSpeed-LLM (Ascend/MindSpeed-LLM): Megatron patched on import for Ascend NPUs.

Its entry programs (``pretrain_gpt.py``, ``posttrain_gpt.py`` ... at its root) first import
``mindspeed_llm.megatron_adaptor``, which replaces Megatron's parser, kernels and attention with
MindSpeed's own for NPUs.  The estimator models CUDA GPUs and Megatron's kernels: such a launch
is one ``unsupported-stack`` problem.  Without the entry program's source it is recognised by
a flag only MindSpeed registers (``data/frameworks/mindspeed_llm_flags.tsv``).
"""

from __future__ import annotations

from megatron_estimator.inputs.frameworks.adapter import Framework

FRAMEWORK = Framework(
    name="MindSpeed-LLM",
    entry_patterns=(),
    flag_table="mindspeed_llm_flags.tsv",
    imports=("mindspeed_llm", "mindspeed"),
    unsupported=("MindSpeed-LLM patches Megatron on import for Ascend NPUs (its own parser, fused NPU "
                 "kernels and attention); the estimator models Megatron-LM on CUDA GPUs only, so it gives "
                 "no estimate for this stack"),
)
