"""Test-only reference harness for hybrid (Mamba) models: what megatron-core 0.16.1's
``MambaModel`` / ``MambaStack`` / ``MambaMixer`` build, per pipeline rank, on the meta device.

megatron-core's Mamba modules import kernels from ``mamba_ssm`` and ``causal_conv1d`` (Triton /
CUDA packages that do not install here), ``einops``, and its dynamic-inference Triton helpers.  A
parameter build calls none of them: ``install_kernel_stubs`` puts test-only modules under those
names that hold the imported *names* only (each kernel raises if called) plus one module class,
mamba_ssm's gated ``RMSNorm``, whose single parameter (``weight``, ``[hidden_size]``) is the one
tensor the stubs create.  Every other parameter comes from megatron-core's own
``MambaMixer.__init__`` and the layers it builds.

0.16.1's ``mamba_stack_spec`` is the Transformer Engine spec (megatron/core/models/mamba/
mamba_layer_specs.py).  Without Transformer Engine, ``local_mamba_stack_spec`` builds the same
modules with the local equivalents, as gpt_layer_specs.py's local spec does for GPT: the norm
TE fuses into ``linear_qkv`` / ``linear_fc1`` / the mixer's ``in_proj`` becomes the layer's own
norm (``input_layernorm`` / ``pre_mlp_layernorm`` / ``MambaLayer.norm``), with the same shape,
and the stack's final ``TENorm`` becomes the local norm.  Counts are therefore those of the TE
spec on the same GPU.

0.16.1 reads the layer pattern as ``hybrid_override_pattern`` (no ``|`` or ``/``) and splits
layers over pipeline ranks evenly (or by the first / last stage sizes); no virtual pipeline.
"""

from __future__ import annotations

import contextlib
import sys
import types
from typing import Any, Iterator, Mapping

import mcore_reference as ref

STUB_MODULES = (
    "mamba_ssm", "mamba_ssm.ops", "mamba_ssm.ops.triton", "mamba_ssm.ops.triton.selective_state_update",
    "mamba_ssm.ops.triton.layernorm_gated", "mamba_ssm.ops.triton.ssd_combined",
    "causal_conv1d", "causal_conv1d.causal_conv1d_varlen", "einops",
)
TRITON_HELPERS = "megatron.core.inference.contexts.attention_context.triton.tensor_ops"


def _kernel(*args, **kwargs):
    raise RuntimeError("test-only stub of a Mamba kernel: the reference builds parameters, it runs no forward pass")


@contextlib.contextmanager
def install_kernel_stubs() -> Iterator[None]:
    """The stub modules in ``sys.modules`` while megatron-core's Mamba modules are imported;
    removed afterwards (the imported megatron-core modules keep the names they bound)."""
    import torch

    class GatedRMSNorm(torch.nn.Module):
        """mamba_ssm.ops.triton.layernorm_gated.RMSNorm's parameter: weight [hidden_size]."""

        def __init__(self, hidden_size, eps=1e-5, group_size=None, norm_before_gate=True, device=None, dtype=None):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.empty(hidden_size, device=device, dtype=dtype))

    names = {
        "mamba_ssm.ops.triton.selective_state_update": {"selective_state_update": _kernel},
        "mamba_ssm.ops.triton.layernorm_gated": {"RMSNorm": GatedRMSNorm},
        "mamba_ssm.ops.triton.ssd_combined": {"mamba_chunk_scan_combined": _kernel,
                                              "mamba_split_conv1d_scan_combined": _kernel},
        "causal_conv1d": {"causal_conv1d_fn": _kernel, "causal_conv1d_update": _kernel},
        "causal_conv1d.causal_conv1d_varlen": {"causal_conv1d_varlen_states": _kernel},
        "einops": {"rearrange": _kernel, "repeat": _kernel},
    }
    modules = list(STUB_MODULES)
    try:
        import triton  # noqa: F401
    except ImportError:
        modules.append(TRITON_HELPERS)
        names[TRITON_HELPERS] = {"tensor_get_slice_after": _kernel, "tensor_masked_update": _kernel,
                                 "tensor_merge": _kernel}
    installed = []
    for name in modules:
        if name in sys.modules:
            continue
        module = types.ModuleType(name)
        module.__dict__.update(names.get(name, {}))
        sys.modules[name] = module
        installed.append(name)
    try:
        yield
    finally:
        for name in installed:
            sys.modules.pop(name, None)


def mamba_available() -> tuple[bool, str]:
    """(True, version) when megatron-core's MambaModel imports with the kernel stubs, else why not."""
    ok, why = ref.megatron_core_available()
    if not ok:
        return ok, why
    try:
        with ref._quiet(), install_kernel_stubs():
            import megatron.core.models.mamba.mamba_model  # noqa: F401
            import megatron.core.ssm.mamba_mixer as mixer
    except Exception as exc:
        return False, f"megatron-core's Mamba modules do not import with the kernel stubs: {exc}"
    if not (mixer.HAVE_MAMBA_SSM and mixer.HAVE_EINOPS):
        return False, "megatron-core's MambaMixer did not take the stubbed mamba_ssm / einops"
    return True, why


def local_mamba_stack_spec(config):
    """0.16.1's mamba_stack_spec with the local modules in place of Transformer Engine's."""
    from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
    from megatron.core.models.gpt.gpt_layer_specs import get_mlp_module_spec
    from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec
    from megatron.core.ssm.mamba_block import MambaStack, MambaStackSubmodules
    from megatron.core.ssm.mamba_layer import MambaLayer, MambaLayerSubmodules
    from megatron.core.ssm.mamba_mixer import MambaMixer, MambaMixerSubmodules
    from megatron.core.ssm.mlp_layer import MLPLayer
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.attention import SelfAttention, SelfAttentionSubmodules
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.torch_norm import WrappedTorchNorm
    from megatron.core.transformer.transformer_layer import TransformerLayer, TransformerLayerSubmodules

    norm = WrappedTorchNorm
    moe = get_moe_module_spec(use_te=False, num_experts=config.num_moe_experts or 8,
                              moe_grouped_gemm=config.moe_grouped_gemm)
    return ModuleSpec(module=MambaStack, submodules=MambaStackSubmodules(
        mamba_layer=ModuleSpec(module=MambaLayer, submodules=MambaLayerSubmodules(
            norm=norm,
            mixer=ModuleSpec(module=MambaMixer, submodules=MambaMixerSubmodules(
                in_proj=ColumnParallelLinear, out_proj=RowParallelLinear)),
            mamba_bda=get_bias_dropout_add)),
        attention_layer=ModuleSpec(module=TransformerLayer, submodules=TransformerLayerSubmodules(
            input_layernorm=norm,
            self_attention=ModuleSpec(module=SelfAttention, params={"attn_mask_type": AttnMaskType.causal},
                                      submodules=SelfAttentionSubmodules(
                                          linear_qkv=ColumnParallelLinear, core_attention=DotProductAttention,
                                          linear_proj=RowParallelLinear)),
            self_attn_bda=get_bias_dropout_add)),
        mlp_layer=ModuleSpec(module=MLPLayer, submodules=TransformerLayerSubmodules(
            pre_mlp_layernorm=norm, mlp=get_mlp_module_spec(use_te=False), mlp_bda=get_bias_dropout_add)),
        moe_layer=ModuleSpec(module=TransformerLayer, submodules=TransformerLayerSubmodules(
            pre_mlp_layernorm=norm, mlp=moe, mlp_bda=get_bias_dropout_add)),
    ))


@contextlib.contextmanager
def _local_final_norm() -> Iterator[None]:
    """MambaStack builds its final norm as TENorm directly; the local norm stands in for it."""
    from megatron.core.ssm import mamba_block
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    saved = mamba_block.TENorm
    mamba_block.TENorm = WrappedTorchNorm
    try:
        yield
    finally:
        mamba_block.TENorm = saved


def reference_hybrid_parameter_counts(spec: Mapping[str, Any]) -> list[int]:
    """Parameters one GPU of each pipeline rank holds, as megatron-core 0.16.1 builds the
    hybrid model (``hybrid_override_pattern``, the Mamba mixer keys, TP/PP/EP/ETP)."""
    import torch

    spec = dict(spec)
    pattern = spec.pop("hybrid_override_pattern")
    spec["num_layers"] = len(pattern)
    with ref._quiet(), install_kernel_stubs():
        from megatron.core.models.mamba.mamba_model import MambaModel

        ref._import_megatron()
        norm = ref._normalize(spec)
        counts = []
        for rank in range(norm.pp):
            with ref._parallel_state(norm, rank), ref._cpu_only_megatron(), _local_final_norm():
                config = ref._make_config(norm, perform_initialization=False, sequence_parallel=False,
                                          is_hybrid_model=True)
                with torch.device("meta"):
                    try:
                        model = MambaModel(
                            config=config, mamba_stack_spec=local_mamba_stack_spec(config),
                            vocab_size=norm.vocab_size, max_sequence_length=norm.max_sequence_length,
                            pre_process=rank == 0, post_process=rank == norm.pp - 1,
                            hybrid_override_pattern=pattern,
                            share_embeddings_and_output_weights=norm.share_embeddings_and_output_weights,
                            position_embedding_type=norm.position_embedding_type)
                    except (AssertionError, ValueError) as exc:
                        raise ref.SpecError(f"megatron-core rejects the configuration: {exc}") from exc
                counts.append(sum(p.numel() for p in model.parameters()))
                del model
    return counts
