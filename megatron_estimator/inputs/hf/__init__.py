"""Read a HuggingFace ``config.json`` into the Megatron flags that rebuild the same model.

``load_hf_config(path)`` reads a local file (or the ``config.json`` inside a directory; never
the network) and returns an ``HfImport``: the Megatron settings as a ``RawArgs`` (dest -> value,
located at ``config.json:LINE key``), the same settings as command-line tokens, the mapping
``(hf_key, flag, value)`` that says which key supplied which flag, the problems that stop the
import, and notes for what is approximated or assumed.  Nothing here raises on bad input.

The mapping reproduces the model as megatron-core builds it (``GPTModel`` with the layer specs
in ``megatron/core/models/gpt/gpt_layer_specs.py``), so that parameter counts match the
published sizes.  Conventions follow Megatron-LM's own launch scripts (``examples/mixtral``,
``examples/llama``) and the flags in ``megatron/training/arguments.py``:

- ``vocab_size`` -> ``--vocab-size``; Megatron pads it to a multiple of
  ``--make-vocab-size-divisible-by`` x TP (``megatron/training/models/gpt.py``).
- ``tie_word_embeddings`` false -> ``--untie-embeddings-and-output-weights``.
- SiLU-gated MLP (``hidden_act`` silu) -> ``--swiglu``; RMSNorm -> ``--normalization RMSNorm``
  with ``rms_norm_eps`` -> ``--norm-epsilon``.
- Bias-free linears -> ``--disable-bias-linear``; Qwen2's q/k/v biases -> ``--add-qkv-bias``.
- ``num_key_value_heads`` < heads -> ``--group-query-attention --num-query-groups``.
- MLA (DeepSeek-V2/V3) -> ``--multi-latent-attention`` with ``--q-lora-rank``,
  ``--kv-lora-rank``, ``--qk-head-dim`` (qk_nope_head_dim), ``--qk-pos-emb-head-dim``
  (qk_rope_head_dim), ``--v-head-dim`` and ``--qk-layernorm`` (the q/kv low-rank norms:
  ``megatron/core/transformer/multi_latent_attention.py``).
- Dense/MoE layer patterns -> ``--moe-layer-freq`` in Megatron's list syntax
  (``moe_freq_type`` in ``megatron/training/arguments.py``), e.g. ``([0]*3+[1]*58)``.

The package, by responsibility: ``load`` (reading the file, choosing the architecture's
mapper), ``reader`` (one config's keys: values checked, locations, problems and notes),
``result`` (``HfImport``, ``MappedFlag``, the flags an import may supply and how they are
written), ``shape`` and ``rope`` (mapping steps shared by architectures), and one module per
architecture family: ``decoder`` (LLaMA, Mistral, Mixtral, Qwen2/3 and their MoE variants),
``deepseek`` (DeepSeek-V2/V3/V3.2, Kimi-K2), ``glm`` (GLM-4.5), ``gpt`` (GPT-2, GPT-NeoX),
``gpt_oss`` (gpt-oss), ``nemotron`` (Nemotron-H) and ``qwen3_next`` (Qwen3-Next).
"""

from megatron_estimator.inputs.hf.load import SUPPORTED_MODEL_TYPES, load_hf_config, parse_hf_config
from megatron_estimator.inputs.hf.result import HfImport, MappedFlag

__all__ = ["SUPPORTED_MODEL_TYPES", "HfImport", "MappedFlag", "load_hf_config", "parse_hf_config"]
