"""The throughput proxy: the relative step time the planner ranks layouts by (lower is
better; 1.0 is compute alone)::

    step = (1 + R + (T_tp + T_cp + T_ep) / C) x (1 + bubble) + T_dp / C

- C, the compute per GPU and step: F / (world x ``achieved_flops``), F = tokens x 3 x
  (sum over the layers of 2 x active parameters + the causal core attention s x a x (d_qk
  + d_v)) + the output layers' 6 x V x h (MTP included);
- bubble = (p - 1) / (v x M), M microbatches per step (megatron/core/pipeline_parallel/schedules.py);
- R, recompute: full recompute re-runs a layer's forward, a third of its forward and
  backward: R = forward flops of the recomputed layers / step flops (uniform: all layers;
  block n: the first n layers of each model chunk); selective ``core_attn`` re-runs only the
  core attention: R = its forward flops / step flops;
- T_g = V_g / bandwidth, V_g the bytes each GPU sends per step (ring collectives: all-reduce
  2(n-1)/n, all-gather and reduce-scatter (n-1)/n of the full tensor), X = s/cp x b x h
  activation bytes:
  TP: per layer and microbatch two collectives forward and two backward, 8(t-1)/t x X (the
  same with sequence parallelism, all-gather + reduce-scatter for all-reduce); the MoE block
  over etp with top-k times the tokens; a fully recomputed layer adds its forward ones again;
  CP: per layer and microbatch the ring passes the local K and V (cp-1) times forward and K,
  V and their gradients (cp-1) times backward: 3(cp-1) x local K+V bytes;
  EP: per MoE layer and microbatch dispatch and combine, forward and backward: 4 all-to-alls
  of (ep-1)/ep x tokens x top-k x h (tokens / t under sequence parallelism);
  DP: per step the gradients of the GPU's parameters, all-reduced over dp x cp (dense) and
  expert dp (experts), or with the distributed optimizer reduce-scattered, with the
  parameters all-gathered;
- a hybrid model (config/hybrid.py) counts per layer kind: one TP block per Mamba, attention
  or MLP layer (a MoE layer only its experts' etp term), the CP ring in its attention layers
  only, and for each Mamba layer the all-to-alls of megatron/core/ssm/mamba_context_parallel.py
  (before the scan the zxBCdt input, after it the output: (cp-1)/cp x tokens x (zxBCdt +
  d_inner) / t, forward and backward); core attention only in attention layers, the scan's
  flops not counted;
- the bandwidth is ``intra_node_bandwidth`` when the group's ranks lie in one node under
  Megatron's rank order (tp-cp-ep-dp-pp: a group of n ranks at stride k spans n x k
  consecutive ranks), else ``inter_node_bandwidth``.  Pipeline send/receive is not counted
  and communication is not assumed to overlap compute.

Ties go to the lower device peak (``planner.search``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from megatron_estimator.config.parallel import ParallelDims
from megatron_estimator.model.states import DTYPE_BYTES
from megatron_estimator.results.plan import ProxyBreakdown, Recompute


class LayoutCost:
    """The throughput proxy of one layout (tp, cp, pp, ep, etp, split), cached per inner choice.

    What the layout alone fixes (``_layout_terms``) is computed once; each inner choice then
    multiplies it by its recompute factors, with the operations in the order of the formula
    (the floats are the ones computing it whole gives)."""
    __slots__ = ("search", "layout", "family", "dims", "_proxy", "_steps", "_fixed")     # one per layout searched

    def __init__(self, search: "_Search", layout, family, dims: ParallelDims):
        self.search, self.layout, self.family, self.dims = search, layout, family, dims
        self._proxy: dict[tuple, tuple] = {}
        self._steps: dict[tuple, tuple[float, float]] = {}
        self._fixed: tuple | None = None

    def recomputed_fraction(self, rec: Recompute) -> float:
        """Forward flops of the layers full recompute re-runs / forward flops of all decoder
        layers: they depend on the split (the family) and the recompute choice only."""
        key = self.search.recompute_id(rec)
        cached = self.family.recomputed.get(key)
        if cached is None:
            model = self.search.proxy_model
            pattern = self.search.layer_kinds()
            forward = dict(model.kind_forward)
            total = sum(forward[k] for k in pattern) or 1.0
            again = 0.0
            for stage in self.family.stages:
                for chunk in stage.chunks:
                    layers = chunk.layers if rec.method == "uniform" else chunk.layers[:rec.num_layers or 0]
                    again += sum(forward[pattern[i]] for i in layers)
            cached = self.family.recomputed[key] = again / total
        return cached

    def proxy(self, mbs: int, m: int, rec: Recompute, sp: bool, do: bool) -> ProxyBreakdown:
        """The throughput proxy of the module docstring."""
        terms = self._proxy_terms(rec, sp, do)
        r, tp_c, cp_c, ep_c, dp_c, c, volumes = terms
        bubble = (self.layout.pp - 1) / ((self.family.vpp or 1) * m)
        step = (1 + r + tp_c + cp_c + ep_c) * (1 + bubble) + dp_c
        return ProxyBreakdown(step, bubble, r, tp_c, cp_c, ep_c, dp_c, c, *volumes)

    def step(self, m: int, r: int, rec: Recompute, sp: bool, do: bool) -> float:
        """The proxy's relative step time alone (for ranking every layout that fits); ``r``
        is ``rec``'s index among the family's recompute choices."""
        return self.steps(m, do, ((r, rec, sp),))[0]

    def steps(self, m: int, do: bool, choices) -> list[float]:
        """``step`` of each (r, recompute, sequence parallel, ...) of ``choices`` with M
        microbatches and this optimizer choice."""
        bubble = 1 + (self.layout.pp - 1) / ((self.family.vpp or 1) * m)
        cache = self._steps
        out = []
        get, append = cache.get, out.append
        for choice in choices:
            key = (choice[0], choice[2], do)                 # (r, sp, do)
            head = get(key)
            if head is None:
                rr, tp_c, cp_c, ep_c, dp_c, _, _ = self._proxy_terms(choice[1], choice[2], do)
                head = cache[key] = (1 + rr + tp_c + cp_c + ep_c, dp_c)
            append(head[0] * bubble + head[1])
        return out

    def _layout_terms(self) -> tuple:
        """What the layout fixes of ``_proxy_terms``: (the tp bytes, the cp ring's bytes and a
        hybrid's Mamba all-to-all bytes before their recompute factors, the ep bytes before theirs by sequence parallelism, the dp
        seconds and bytes by the distributed optimizer, the bandwidths of tp, cp and ep, C)."""
        if self._fixed is not None:
            return self._fixed
        search = self.search
        model = search.proxy_model
        a, node = search.proxy_assumptions, search.space.gpus_per_node
        d = self.dims
        tp, cp, pp, ep, etp, dp, edp = d.tp, d.cp, d.pp, d.ep, d.etp, d.dp, d.edp
        s_local = model.seq_length // cp
        tokens_per_step = s_local * search.gbs / dp                   # M x b tokens through each GPU
        x = tokens_per_step * model.hidden * model.act_bytes          # M x one [s/cp, b, h] activation
        dense_layers, moe_layers = model.dense_layers / pp, model.moe_layers / pp

        def bandwidth(size: int, stride: int) -> float:
            return a.intra_node_bandwidth if size * stride <= node else a.inter_node_bandwidth

        tp_bytes = 0.0
        if tp > 1:                                     # attention blocks and dense MLP blocks
            blocks = (dense_layers + moe_layers + dense_layers) if model.tp_blocks is None else model.tp_blocks / pp
            tp_bytes += blocks * 4 * (tp - 1) / tp * x
        if etp > 1 and moe_layers:
            tp_bytes += moe_layers * 4 * (etp - 1) / etp * x * model.topk
        cp_bytes = None
        mamba_bytes = 0.0             # a hybrid's Mamba all-to-alls, before their recompute factor
        if cp > 1:
            kv = tokens_per_step * model.kv_width * model.act_bytes / tp
            ring = (dense_layers + moe_layers) if model.cp_ring_layers is None else model.cp_ring_layers / pp
            cp_bytes = ring * (cp - 1) * kv
            if model.mamba_layers:
                mamba_bytes = (model.mamba_layers / pp * 2 * (cp - 1) / cp * tokens_per_step * model.mamba_a2a_width
                               / tp * model.act_bytes)
        ep_bytes = {}
        if ep > 1 and moe_layers:
            for sp in (False, True):
                tokens = tokens_per_step / (tp if sp else 1)
                ep_bytes[sp] = moe_layers * 4 * (ep - 1) / ep * tokens * model.topk * model.hidden * model.act_bytes
        c = model.flops_per_gpu / a.achieved_flops
        n_dense = dp * cp
        dp_terms = {}
        for do in (False, True):
            per = (model.grad_bytes + model.param_bytes) if do else 2 * model.grad_bytes
            dp_dense = (n_dense - 1) / n_dense * model.dense_params / (tp * pp) * per
            dp_expert = (edp - 1) / edp * model.expert_params / (ep * etp * pp) * per
            dp_s = dp_dense / bandwidth(n_dense, tp) + dp_expert / bandwidth(edp, etp * ep)
            dp_terms[do] = (dp_s, int(dp_dense + dp_expert))
        self._fixed = (tp_bytes, cp_bytes, mamba_bytes, ep_bytes, dp_terms, bandwidth(tp, 1), bandwidth(cp, tp),
                       bandwidth(ep, etp), c)
        return self._fixed

    def _proxy_terms(self, rec: Recompute, sp: bool, do: bool) -> tuple:
        """(R, T_tp/C, T_cp/C, T_ep/C, T_dp/C, C, bytes sent per step by tp, cp, ep, dp).

        The volumes per microbatch grow with the micro batch b and there are M = gbs / (b dp)
        microbatches: the step's volumes do not depend on b, only the bubble does."""
        key = (rec, sp, do)
        terms = self._proxy.get(key)
        if terms is not None:
            return terms
        model = self.search.proxy_model
        tp_base, cp_base, mamba_base, ep_base, dp_terms, tp_bw, cp_bw, ep_bw, c = self._fixed or self._layout_terms()
        again = self.recomputed_fraction(rec) if rec.granularity == "full" else 0.0
        tp_bytes = tp_base * (1 + 0.5 * again)
        cp_bytes = 0.0 if cp_base is None else cp_base * (3 + again)
        if mamba_base:
            cp_bytes += mamba_base * (1 + 0.5 * again)
        ep_bytes = ep_base[sp] * (1 + 0.5 * again) if ep_base else 0.0
        dp_s, dp_bytes = dp_terms[do]
        if rec.granularity == "full":
            r = model.layer_forward_share * again
        elif rec.granularity == "selective":
            r = model.core_attention_share
        else:
            r = 0.0
        terms = self._proxy[key] = (
            r, tp_bytes / tp_bw / c, cp_bytes / cp_bw / c, ep_bytes / ep_bw / c,
            dp_s / c, c, (int(tp_bytes), int(cp_bytes), int(ep_bytes), dp_bytes))
        return terms



@dataclass(frozen=True)
class ProxyModel:
    """What the proxy needs of the model, computed once per plan."""
    seq_length: int
    hidden: int
    act_bytes: int
    param_bytes: int
    grad_bytes: int
    kv_width: int                  # K + V elements per token, all heads
    topk: int
    dense_layers: int
    moe_layers: int
    dense_params: int              # one copy of the non-expert parameters
    expert_params: int             # one copy of the expert parameters
    flops_per_gpu: float           # model flops per GPU and step
    layer_forward_share: float     # the decoder layers' forward flops / step flops
    core_attention_share: float    # the core attention's forward flops / step flops
    layer_forward: tuple[float, float]   # forward flops per token of a (dense, MoE) layer
    kind_forward: tuple = ()             # (layer kind, forward flops per token) per _Search.layer_kinds kind
    tp_blocks: int | None = None         # hybrid: layers with a TP block (None: GPT's 2 per dense layer, 1 per MoE)
    cp_ring_layers: int | None = None    # hybrid: attention layers (None: every layer)
    mamba_layers: int = 0
    mamba_a2a_width: int = 0             # zxBCdt + d_inner elements per token at tp 1


def proxy_model(search: "_Search") -> ProxyModel:
    from megatron_estimator.model.parameters import count, embedding_tensors, mtp_tensors

    config = search.reference
    m = config.model
    pattern = search.layer_kinds()
    hybrid = m.hybrid is not None
    s = config.training.seq_length
    a = m.num_attention_heads
    if m.mla is not None:
        d_qk, d_v = m.mla.qk_head_dim + m.mla.qk_pos_emb_head_dim, m.mla.v_head_dim
        kv_width = a * (d_qk + d_v)
    else:
        d_qk = d_v = m.kv_channels
        kv_width = 2 * m.num_query_groups * m.kv_channels
    # Core attention per token, forward: QK^T and PV, 2 flops per multiply-add, s/2 keys on
    # average under the causal mask: 2 x 2 x s/2 x a x d.
    core = s * a * (d_qk + d_v)
    one = replace(config, parallel=ParallelDims(search.world, 1, 1, 1, 1, 1))
    forward: dict[bool, float] = {}
    dense_params = expert_params = 0
    for kind in sorted(set(pattern)):
        dense, expert, _, _ = search.layer_counts(1, 1, 1, kind)
        active = dense + (expert * m.moe.router_topk / m.moe.num_experts if expert else 0)
        # A hybrid's Mamba, MLP and MoE layers have no core attention (the scan is not counted).
        forward[kind] = 2 * active + (core if not hybrid or kind in ("*", "+") else 0)
        dense_params += pattern.count(kind) * dense
        expert_params += pattern.count(kind) * expert
    output = m.padded_vocab_size * m.hidden_size
    dense_params += count(embedding_tensors(one)).total + (output if m.untie_embeddings_and_output_weights else 0)
    mtp_forward = 0.0
    for j in range(m.mtp_num_layers):
        c = count(mtp_tensors(one, j))
        dense_params += c.dense
        expert_params += c.expert
        if hybrid:      # its own pattern (eh_proj among its parameters)
            mtp_forward += (2 * (c.dense + (c.expert * m.moe.router_topk / m.moe.num_experts if m.moe else 0))
                            + core * sum(k in ("*", "+") for k in m.hybrid.mtp_kinds) + 2 * output)
            continue
        mtp_forward += forward[pattern[-1]] + 2 * 2 * m.hidden_size * m.hidden_size + 2 * output
    layers_forward = sum(forward[k] * pattern.count(k) for k in forward)
    step_per_token = 3 * (layers_forward + 2 * output + mtp_forward)
    prec = config.precision
    return ProxyModel(
        seq_length=s, hidden=m.hidden_size, act_bytes=2 if prec.params_dtype != "fp32" else 4,
        param_bytes=DTYPE_BYTES[prec.params_dtype], grad_bytes=DTYPE_BYTES[prec.main_grads_dtype],
        kv_width=kv_width, topk=m.moe.router_topk if m.moe else 0,
        dense_layers=search.layer_pattern().count(False), moe_layers=search.layer_pattern().count(True),
        dense_params=dense_params, expert_params=expert_params,
        flops_per_gpu=step_per_token * search.gbs * s / search.world,
        layer_forward_share=layers_forward / step_per_token,
        core_attention_share=core * (sum(k in ("*", "+") for k in pattern) if hybrid else m.num_layers) / step_per_token,
        layer_forward=(forward.get(False, 0.0), forward.get(True, 0.0)), kind_forward=tuple(forward.items()),
        **(_hybrid_proxy_terms(m) if hybrid else {}),
    )


def _hybrid_proxy_terms(m) -> dict:
    """The hybrid ``ProxyModel`` fields: layers counted by kind (the module docstring)."""
    hy, kinds = m.hybrid, m.hybrid.layer_kinds
    return {"tp_blocks": sum(k != "E" for k in kinds), "cp_ring_layers": sum(k in ("*", "+") for k in kinds),
            "mamba_layers": kinds.count("M"),
            "mamba_a2a_width": 2 * hy.d_inner + 2 * hy.num_groups * hy.state_dim + hy.num_heads + hy.d_inner}


