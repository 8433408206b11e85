"""Test-only child harness: the parameters Megatron-LM's own MLASelfAttention has (main, or a
release tree: before 4464d1c197 there is no resolver and the spec's modules are built as given).

Run as ``python tests/mcore_main_mla.py TREE`` with one JSON request per stdin line
(``{"spec": "gpt"|"hybrid"|"local", "tp": int, "q_lora": int|null, "qk_norm": bool, ...}``);
answers one JSON line per request: ``{"params": {name: numel}}`` or ``{"error": text}``.
``TREE`` is a Megatron-LM checkout (main d98e8a64 has megatron/core/transformer/
mla_qk_norm_config.py; the installed megatron-core 0.16.1 does not), first on ``sys.path`` in
this child only, as in tests/mcore_main_gd.py, whose stubs and Transformer Engine stand-ins it
reuses.

Megatron-core's own code here: MLASelfAttention (megatron/core/transformer/
multi_latent_attention.py) and QKNormConfigResolver (mla_qk_norm_config.py), which decides
which q / kv norms and projections are built; the local ColumnParallelLinear /
RowParallelLinear; core attention (TEDotProductAttention / DotProductAttention, no parameters)
is an empty module.  The submodules are those of the specs, written
here with the stand-ins in the Transformer Engine classes' places:

- ``gpt``: gpt_layer_specs.py's TE MLA spec (linear_q_proj a column-parallel linear, the down
  projections TELinear, linear_q_up_proj / linear_kv_up_proj the fused norm + linear when
  ``qk_norm``, IdentityOp norms, a separate input norm);
- ``hybrid``: hybrid_layer_specs.py's mla_layer (TEColumnParallelLinear q / up projections,
  TELinear down projections, IdentityOp norms, a TENorm input norm);
- ``local``: gpt_layer_specs.py's local MLA spec (ColumnParallelLinear everywhere, the q / kv
  norms the backend's norm when ``qk_norm``) on the real LocalSpecProvider.

The resolver asks ``get_backend(config.transformer_impl)`` for its linears and norms; for
``transformer_engine`` this harness answers with a LocalSpecProvider whose column-parallel
linear, fused norm + linear and norm are the stand-ins the spec names (Transformer Engine is
not installed), so the resolver's identity checks see the spec's own classes.
"""

from __future__ import annotations

import json
import sys
import types


def _backend(norm_linear, norm, local: bool):
    from megatron.core.models.backends import LocalSpecProvider
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear

    if local:
        return LocalSpecProvider()

    class TEStandIns(LocalSpecProvider):
        def column_parallel_linear(self):
            return ColumnParallelLinear

        def column_parallel_layer_norm_linear(self):
            return norm_linear

        def layer_norm(self, rms_norm: bool = False, for_qk: bool = False, has_residual: bool = False):
            return norm

    return TEStandIns()


def _config(req):
    import torch
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    return MLATransformerConfig(
        num_layers=2, hidden_size=req["hidden"], num_attention_heads=req["heads"],
        tensor_model_parallel_size=req["tp"], sequence_parallel=req.get("sp", req["tp"] > 1),
        normalization=req.get("normalization", "LayerNorm"), add_bias_linear=False,
        params_dtype=torch.bfloat16, bf16=True, use_cpu_initialization=True, perform_initialization=False,
        multi_latent_attention=True, q_lora_rank=req["q_lora"], kv_lora_rank=req["kv_lora"],
        qk_head_dim=req["qk_head_dim"], qk_pos_emb_head_dim=req["pe"], v_head_dim=req["v_head_dim"],
        rope_type="rope", apply_rope_fusion=False, qk_layernorm=req.get("qk_norm", False),
        qk_l2_norm=req.get("qk_l2_norm", False),
        transformer_impl="local" if req["spec"] == "local" or req.get("backend") == "local" else "transformer_engine")


def _build(req):
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from megatron.core import parallel_state as ps
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
    try:
        from megatron.core.transformer import mla_qk_norm_config
    except ImportError:            # a release before 4464d1c197: the spec's modules are built as given
        mla_qk_norm_config = types.SimpleNamespace()
    from megatron.core.transformer import multi_latent_attention as mla_module
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.identity_op import IdentityOp

    from mcore_main_gd import _stand_ins

    import torch

    class DotProductAttention(torch.nn.Module):
        """TEDotProductAttention's place: core attention holds no parameters."""

        def __init__(self, *args, **kwargs):
            super().__init__()

    tp = req["tp"]
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=tp)
    try:
        ps.initialize_model_parallel(tensor_model_parallel_size=tp, create_gloo_process_groups=False)
        pgs = ProcessGroupCollection.use_mpu_process_groups()
        config = _config(req)
        norm_linear, duplicated, norm = _stand_ins()
        spec, qk_norm = req["spec"], req.get("qk_norm", False)
        local = config.transformer_impl == "local"
        backend = _backend(norm_linear, norm, local)
        mla_qk_norm_config.get_backend = lambda impl: backend
        if spec == "local":
            qk = backend.layer_norm(rms_norm=config.normalization == "RMSNorm", for_qk=True)
            submodules = mla_module.MLASelfAttentionSubmodules(
                linear_q_proj=ColumnParallelLinear, linear_q_down_proj=ColumnParallelLinear,
                linear_q_up_proj=ColumnParallelLinear, linear_kv_down_proj=ColumnParallelLinear,
                linear_kv_up_proj=ColumnParallelLinear, core_attention=DotProductAttention,
                linear_proj=RowParallelLinear, q_layernorm=qk if qk_norm else IdentityOp,
                kv_layernorm=qk if qk_norm else IdentityOp)
        else:
            mla_module.TELinear = duplicated         # the specs' TELinear: duplicated down projections
            up = norm_linear if spec == "gpt" and qk_norm else ColumnParallelLinear
            submodules = mla_module.MLASelfAttentionSubmodules(
                linear_q_proj=ColumnParallelLinear, linear_q_down_proj=duplicated, linear_q_up_proj=up,
                linear_kv_down_proj=duplicated, linear_kv_up_proj=up, core_attention=DotProductAttention,
                linear_proj=RowParallelLinear, q_layernorm=IdentityOp, kv_layernorm=IdentityOp)
        module = mla_module.MLASelfAttention(config, submodules, layer_number=1,
                                             attn_mask_type=AttnMaskType.causal, pg_collection=pgs)
        params = {"self_attention." + name: p.numel() for name, p in module.named_parameters()}
        # the layer's input norm (TENorm / the local norm): a norm of the hidden size
        params["input_layernorm.weight"] = req["hidden"]
        if config.normalization == "LayerNorm":
            params["input_layernorm.bias"] = req["hidden"]
        return params
    finally:
        ps.destroy_model_parallel()
        dist.destroy_process_group()


def main() -> None:
    tree = sys.argv[1]
    sys.path.insert(0, tree)
    from mcore_main_gd import _stub_kernels

    _stub_kernels(tree)
    import warnings
    warnings.simplefilter("ignore")
    import torch
    torch.cuda.current_device = lambda: "meta"      # modules place their own tensors on the current device
    for line in sys.stdin:
        req = json.loads(line)
        try:
            answer = {"params": _build(req)}
        except Exception as exc:   # reported to the test, which checks or fails with it
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
