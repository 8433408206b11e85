"""Test-only child harness: the parameters megatron-core itself gives a hybrid 'G' or 'D' layer.

Run as ``python tests/mcore_main_gd.py TREE`` with one JSON request per stdin line
(``{"kind": "G"|"D", "tp": int, ...}``); answers one JSON line per request: ``{"params":
{name: numel}}`` or ``{"error": text}``.  ``TREE`` is a Megatron-LM checkout (main d98e8a64 has
the gated delta net and DSA modules; the installed megatron-core 0.16.1 does not), put first on
``sys.path`` in this child only, so the test process keeps its own megatron-core.

What is megatron-core's own code here: GatedDeltaNet / GatedDeltaNet2
(megatron/core/ssm/gated_delta_net/), AbsorbedMLASelfAttention
(transformer/experimental_attention_variant/absorbed_mla.py) with its DSAttention core and
DSAIndexer (dsa.py), the local ColumnParallelLinear / RowParallelLinear (tensor_parallel/layers.py,
which shard by the TP size of ``parallel_state`` on torch's single-process ``fake`` backend) and
Stand-ins (Transformer Engine is not installed here), each the shape Transformer Engine gives:
TENorm is a weight (and a bias for LayerNorm) of its hidden size; the fused
TELayerNormColumnParallelLinear is a ColumnParallelLinear plus ``layer_norm_weight`` (and
``layer_norm_bias`` for LayerNorm) of the input size; TELinear with ``parallel_mode="duplicated"``
is a full, unsplit weight.  Stubs: modules importing triton and flash-linear-attention (``fla``)
become no-op modules (kernels only run in forward, which is not run).  Parameters are created on
the meta device.
"""

from __future__ import annotations

import json
import os
import sys
import types


def _noop(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return lambda *a, **k: None


def _stub_kernels(tree: str) -> None:
    for root, _dirs, files in os.walk(os.path.join(tree, "megatron")):
        for fname in files:
            if not fname.endswith(".py"):
                continue
            path = os.path.join(root, fname)
            with open(path, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
            if "\nimport triton" not in text and "\nfrom triton" not in text:
                continue
            modname = os.path.relpath(path, tree)[:-3].replace(os.sep, ".")
            if modname.endswith(".__init__"):
                continue
            stub = types.ModuleType(modname)
            stub.__file__ = path
            stub.__getattr__ = _noop
            sys.modules[modname] = stub
    for name in ("fla", "fla.modules", "fla.modules.convolution", "fla.modules.l2norm", "fla.ops",
                 "fla.ops.gated_delta_rule", "fla.ops.gdn2", "fla.ops.gdn2.chunk"):
        stub = types.ModuleType(name)
        stub.__getattr__ = _noop
        sys.modules[name] = stub
    import typing
    if not hasattr(typing, "override"):
        typing.override = lambda f: f


def _stand_ins():
    import torch
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear

    class LayerNormColumnParallelLinear(ColumnParallelLinear):
        """TELayerNormColumnParallelLinear's parameters: the norm (not split) + the column-parallel weight."""

        def __init__(self, input_size, output_size, *, config, **kwargs):
            kwargs.pop("tp_comm_buffer_name", None)
            kwargs.pop("name", None)
            super().__init__(input_size, output_size, config=config, **kwargs)
            self.layer_norm_weight = torch.nn.Parameter(torch.empty(input_size, device="meta"))
            if config.normalization == "LayerNorm":
                self.layer_norm_bias = torch.nn.Parameter(torch.empty(input_size, device="meta"))

    class DuplicatedLinear(torch.nn.Module):
        """TELinear(parallel_mode="duplicated"): the whole weight on every TP rank."""

        def __init__(self, input_size, output_size, *, bias=False, **kwargs):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.empty(output_size, input_size, device="meta"))
            if bias:
                self.bias = torch.nn.Parameter(torch.empty(output_size, device="meta"))

    class Norm(torch.nn.Module):
        """TENorm: weight (and bias for LayerNorm) of the hidden size, by the config's normalization."""

        def __init__(self, config, hidden_size, eps=1e-5, **kwargs):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.empty(hidden_size, device="meta"))
            if config.normalization == "LayerNorm":
                self.bias = torch.nn.Parameter(torch.empty(hidden_size, device="meta"))

    return LayerNormColumnParallelLinear, DuplicatedLinear, Norm


def _config(req):
    import torch
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    common = dict(num_layers=req.get("num_layers", 4), hidden_size=req["hidden"],
                  num_attention_heads=req["heads"], tensor_model_parallel_size=req["tp"],
                  context_parallel_size=req.get("cp", 1), sequence_parallel=req["tp"] > 1,
                  normalization=req.get("normalization", "LayerNorm"), add_bias_linear=False,
                  params_dtype=torch.bfloat16, bf16=True, use_cpu_initialization=True,
                  perform_initialization=False)
    if req["kind"] == "G":
        return TransformerConfig(**common, linear_num_key_heads=req["key_heads"],
                                 linear_num_value_heads=req["value_heads"],
                                 linear_key_head_dim=req["key_head_dim"],
                                 linear_value_head_dim=req["value_head_dim"],
                                 linear_conv_kernel_dim=req.get("conv", 4),
                                 experimental_attention_variant=req.get("variant"))
    return MLATransformerConfig(**common, multi_latent_attention=True, q_lora_rank=req["q_lora"],
                                kv_lora_rank=req["kv_lora"], qk_head_dim=req["qk_head_dim"],
                                qk_pos_emb_head_dim=req["pe"], v_head_dim=req["v_head_dim"],
                                rope_type="rope", apply_rope_fusion=False, qk_layernorm=req.get("qk_norm", False),
                                experimental_attention_variant="dsa",
                                dsa_indexer_n_heads=req["index_heads"], dsa_indexer_head_dim=req["index_head_dim"],
                                dsa_indexer_topk=req["topk"], dsa_indexer_topk_freq=req.get("topk_freq", 1))


def _build(req):
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from megatron.core import parallel_state as ps
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.spec_utils import ModuleSpec

    tp, cp = req["tp"], req.get("cp", 1)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=tp * cp)
    try:
        ps.initialize_model_parallel(tensor_model_parallel_size=tp, context_parallel_size=cp,
                                     create_gloo_process_groups=False)
        pgs = ProcessGroupCollection.use_mpu_process_groups()
        config = _config(req)
        norm_linear, duplicated, norm = _stand_ins()
        if req["kind"] == "G":
            from megatron.core.ssm.gated_delta_net import (
                GatedDeltaNet, GatedDeltaNet2, GatedDeltaNetSubmodules)
            cls = GatedDeltaNet2 if req.get("variant") == "gdn2" else GatedDeltaNet
            module = cls(config, GatedDeltaNetSubmodules(in_proj=norm_linear, out_norm=norm,
                                                         out_proj=RowParallelLinear),
                         layer_number=1, pg_collection=pgs)
            prefix = "self_attention."
            extra = {}
        else:
            from megatron.core.transformer.experimental_attention_variant import absorbed_mla
            from megatron.core.transformer.experimental_attention_variant.dsa import (
                DSAIndexer, DSAIndexerSubmodules, DSAttention, DSAttentionSubmodules)
            from megatron.core.transformer.identity_op import IdentityOp
            absorbed_mla.TELinear = duplicated      # the hybrid spec's TELinear: duplicated down projections
            submodules = absorbed_mla.AbsorbedMLASelfAttentionSubmodules(
                linear_q_proj=ColumnParallelLinear, linear_q_down_proj=duplicated,
                linear_q_up_proj=ColumnParallelLinear, linear_kv_down_proj=duplicated,
                linear_kv_up_proj=ColumnParallelLinear,
                core_attention=ModuleSpec(module=DSAttention, submodules=DSAttentionSubmodules(
                    indexer=ModuleSpec(module=DSAIndexer, submodules=DSAIndexerSubmodules(
                        linear_wq_b=duplicated, linear_wk=duplicated, k_norm=norm,
                        linear_weights_proj=duplicated)))),
                linear_proj=RowParallelLinear, q_layernorm=IdentityOp, kv_layernorm=IdentityOp)
            module = absorbed_mla.AbsorbedMLASelfAttention(config, submodules, layer_number=req.get("layer_number", 1),
                                                           attn_mask_type=AttnMaskType.causal, pg_collection=pgs)
            prefix = "self_attention."
            # the dsa_layer's TransformerLayer input_layernorm (TENorm): a norm of the hidden size
            extra = {"input_layernorm.weight": req["hidden"]}
            if config.normalization == "LayerNorm":
                extra["input_layernorm.bias"] = req["hidden"]
        params = {prefix + name: p.numel() for name, p in module.named_parameters()}
        params.update(extra)
        return params
    finally:
        ps.destroy_model_parallel()
        dist.destroy_process_group()


def _dsa_core_saved(req) -> dict:
    """What dsa.py's PyTorch sparse attention (``_run_sparse_attention`` on the absorbed path:
    ``_unfused_absorbed_dsa_fn`` and the V up-projection einsum) saves for backward, run for
    real on the CPU in bf16 under ``saved_tensors_hooks``: bytes per storage, counted once,
    parameters (the kv up-projection weight) excluded."""
    import types as _types

    import torch
    from megatron.core.transformer.experimental_attention_variant.dsa import _run_sparse_attention

    s, b, n, L, P, v, qk = (req[k] for k in ("s", "b", "n", "kv_lora", "pe", "v_head_dim", "qk_head_dim"))
    skv, topk = req.get("skv", s), req["topk"]
    query = torch.randn(s, b, n, L + P, dtype=torch.bfloat16, requires_grad=True)
    key = torch.randn(skv, b, 1, L + P, dtype=torch.bfloat16, requires_grad=True)
    weight = torch.nn.Parameter(torch.randn(n * (qk + v), L, dtype=torch.bfloat16))
    topk_indices = torch.randint(0, skv, (b, s, topk))
    config = _types.SimpleNamespace(kv_lora_rank=L, attention_backend="unfused", dsa_kernel_backend="none")
    seen, params = {}, {weight.untyped_storage().data_ptr()}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        # DSAttention.forward: the V up weight is a view of linear_kv_up_proj's, made contiguous
        up_v = weight.view(n, qk + v, L)[:, qk:, :].to(dtype=query.dtype).contiguous()
        out = _run_sparse_attention(absorbed_mla=True, query=query, key=key, value=None, up_v_weight=up_v,
                                    topk_indices=topk_indices, softmax_scale=0.1, config=config, mask=None,
                                    varlen_starts=None, varlen_ends=None, key_positions=None)
    out.sum().backward()          # the graph is whole: every saved tensor was needed
    return {"saved_bytes": sum(seen.values()), "tensors": len(seen)}


def main() -> None:
    tree = sys.argv[1]
    sys.path.insert(0, tree)
    _stub_kernels(tree)
    import warnings
    warnings.simplefilter("ignore")
    import torch
    torch.cuda.current_device = lambda: "meta"      # modules place their own tensors on the current device
    for line in sys.stdin:
        req = json.loads(line)
        try:
            answer = _dsa_core_saved(req) if req["kind"] == "dsa_core" else {"params": _build(req)}
        except Exception as exc:   # reported to the test, which fails with it
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
