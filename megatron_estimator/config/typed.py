"""The validated configuration: frozen, typed, with Megatron's defaults and derived values.

``EstimatorConfig`` is built only from a namespace that validation accepted
(``resolve.resolve_config``); it never checks or defaults its inputs itself beyond reading
the derived namespace.  Raw input (``rawargs.RawArgs``) and this are different types.  The
memory model reads this configuration and nothing else: every Megatron setting it needs is a
typed field of one of the groups below, and what the run knows beyond its flags (the GPU, the
job's environment, a resume) is ``run`` (config/run_context.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Mapping

from megatron_estimator.config.derive import optimizer_sharding
from megatron_estimator.config.hybrid import HybridConfig, hybrid_config
from megatron_estimator.config.parallel import ParallelDims
from megatron_estimator.config.run_context import RunContext
from megatron_estimator.megatron.releases import ChosenRelease


@dataclass(frozen=True)
class MoeConfig:
    num_experts: int
    ffn_hidden_size: int
    router_topk: int
    shared_expert_intermediate_size: int | None
    shared_expert_gate: bool
    layer_pattern: tuple[bool, ...]          # per decoder layer: True where the MLP is MoE
    grouped_gemm: bool
    token_dispatcher_type: str
    expert_capacity_factor: float | None
    pad_expert_input_to_capacity: bool
    router_enable_expert_bias: bool
    router_dtype: str | None
    latent_size: int | None
    apply_probs_on_input: bool                # --moe-apply-probs-on-input
    score_function: str = "softmax"           # --moe-router-score-function: softmax | sigmoid


@dataclass(frozen=True)
class MlaConfig:
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_head_dim: int
    qk_pos_emb_head_dim: int
    v_head_dim: int
    # --qk-layernorm without --q-lora-rank: linear_q_proj is a fused norm + linear, its norm over
    # the hidden size (mla_qk_norm_config.py, from 4464d1c197 / 0.19.0; a plain linear before).
    q_proj_norm: bool = False


@dataclass(frozen=True)
class ModelConfig:
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    kv_channels: int
    ffn_hidden_size: int
    vocab_size: int | None
    padded_vocab_size: int
    vocab_source: str
    max_position_embeddings: int
    position_embedding_type: str
    normalization: str
    activation: str                           # gelu | swiglu | squared_relu | quick_geglu | ...
    gated_linear_unit: bool
    add_bias_linear: bool
    add_qkv_bias: bool
    qk_layernorm: bool
    untie_embeddings_and_output_weights: bool
    hidden_dropout: float
    attention_dropout: float
    attention_output_gate: bool               # --attention-output-gate: a gate projection beside Q, K, V
    softmax_type: str = "vanilla"             # --softmax-type: learnable adds one offset per head
    moe: MoeConfig | None = None
    mla: MlaConfig | None = None
    mtp_num_layers: int = 0
    family: str = "gpt"                       # "gpt"; "hybrid" (inputs/entry_script.py model_family)
    hybrid: HybridConfig | None = None        # a hybrid model's layer kinds and Mamba shape (config/hybrid.py)

    def is_moe_layer(self, layer_index: int) -> bool:
        return self.moe is not None and self.moe.layer_pattern[layer_index]

    def layer_kind(self, layer_index: int) -> str | None:
        """A hybrid decoder layer's pattern symbol (M * + - E); None for a GPT layer."""
        return self.hybrid.layer_kinds[layer_index] if self.hybrid is not None else None


@dataclass(frozen=True)
class PipelineSplit:
    """How Megatron splits the decoder over pipeline stages."""
    first_stage_layers: int | None
    last_stage_layers: int | None
    account_for_embedding: bool
    account_for_loss: bool
    layout: str | None
    microbatch_group_size: int


@dataclass(frozen=True)
class TrainingConfig:
    micro_batch_size: int
    global_batch_size: int
    num_microbatches: int
    seq_length: int
    sequence_parallel: bool
    recompute_granularity: str | None
    recompute_method: str | None
    recompute_num_layers: int | None
    recompute_modules: tuple[str, ...]
    distribute_saved_activations: bool
    cpu_offloading_num_layers: int
    overlap_p2p_comm: bool
    calculate_per_token_loss: bool
    cross_entropy_loss_fusion: bool
    cross_entropy_fusion_impl: str
    fp32_residual_connection: bool
    defer_embedding_wgrad_compute: bool
    wgrad_deferral_limit: int                 # 0: every microbatch's wgrad is deferred
    create_attention_mask_in_dataloader: bool
    overlap_moe_expert_parallel_comm: bool    # combined 1F1B: a forward beside a backward
    deterministic_mode: bool


@dataclass(frozen=True)
class OffloadConfig:
    """--fine-grained-activation-offloading: saved tensors of some modules go to the host."""
    fine_grained: bool
    modules: tuple[str, ...]                  # --offload-modules
    fraction: float                           # --activation-offload-fraction
    min_tensor_size: int                      # --min-offloaded-tensor-size (elements)


@dataclass(frozen=True)
class PrecisionConfig:
    params_dtype: str                         # fp32 | bf16 | fp16
    main_grads_dtype: str                     # fp32 | bf16 (dtype of the DDP grad buffer)
    fp8: str | None
    fp8_recipe: str
    fp8_param_gather: bool
    fp8_amax_history_len: int
    attention_softmax_in_fp32: bool


@dataclass(frozen=True)
class OptimizerConfig:
    """The optimizer, and how its states, the gradients and the parameters are sharded: the
    distributed optimizer, DDP's buffers, Megatron-FSDP."""
    optimizer: str                            # adam | sgd | lion | muon | ... (dist_muon derived to muon)
    main_params_dtype: str
    exp_avg_dtype: str
    exp_avg_sq_dtype: str
    use_precision_aware_optimizer: bool
    use_distributed_optimizer: bool
    use_layer_wise_distributed_optimizer: bool   # emerging optimizers' (Muon's) sharding
    use_layer_wise_param_layout: bool
    num_distributed_optimizer_instances: int
    optimizer_cpu_offload: bool
    optimizer_offload_fraction: float
    sgd_momentum: float
    overlap_grad_reduce: bool
    overlap_param_gather: bool
    ddp_bucket_size: int | None
    use_megatron_fsdp: bool
    data_parallel_sharding_strategy: str


@dataclass(frozen=True)
class CheckpointConfig:
    """How a resumed run loads its checkpoint (megatron/training/checkpointing.py)."""
    ckpt_format: str | None
    fully_parallel_load: bool                 # --ckpt-fully-parallel-load
    exchange_algo: str                        # --ckpt-fully-parallel-load-exchange-algo
    load_process_group: str | None            # --ckpt-fully-parallel-load-process-group: dp | ep_dp
    optim_fully_reshardable: bool             # --dist-ckpt-optim-fully-reshardable
    no_load_optim: bool
    finetune: bool


@dataclass(frozen=True)
class KernelConfig:
    transformer_impl: str                     # transformer_engine | local | inference_optimized
    attention_backend: str                    # flash | fused | unfused | local (resolved)
    attention_backend_source: str
    masked_softmax_fusion: bool
    bias_gelu_fusion: bool
    bias_swiglu_fusion: bool
    bias_dropout_fusion: bool
    gradient_accumulation_fusion: bool
    apply_rope_fusion: bool
    tp_comm_overlap: bool                     # TE userbuffers: three more GEMM workspaces
    te_activation_func: bool                  # --use-te-activation-func
    fused_weighted_squared_relu: bool         # --use-fused-weighted-squared-relu


@dataclass(frozen=True)
class Distillation:
    """ModelOpt knowledge distillation (--export-kd-teacher-load): what the memory model needs
    of the teacher and of the distillation config (config/distillation.py builds it).

    ``teacher``: the teacher's model shape, built with the student's parallel layout (Megatron
    builds it from the student's arguments overlaid with the teacher's model_config.yaml,
    megatron/post_training/model_builder.py ``_load_teacher_model_config``);
    ``teacher_source``: where that shape came from; ``teacher_overrides``: the dests the
    teacher's file set.  ``skip_lm_loss``, ``intermediate_pairs``, ``kd_cfg_source``: from
    --export-kd-cfg (ModelOpt's ``DistillationConfig`` defaults when it is not readable here)."""
    teacher: ModelConfig
    teacher_source: str
    teacher_overrides: tuple[str, ...]
    skip_lm_loss: bool
    intermediate_pairs: int
    kd_cfg_source: str


@dataclass(frozen=True)
class EstimatorConfig:
    model: ModelConfig
    parallel: ParallelDims
    split: PipelineSplit
    training: TrainingConfig
    precision: PrecisionConfig
    optimizer: OptimizerConfig
    kernels: KernelConfig
    offload: OffloadConfig
    checkpoint: CheckpointConfig
    world_size_source: str
    run: RunContext = RunContext()
    notes: tuple[str, ...] = ()
    # (flag, what it changes) for each flag the user set, away from Megatron's default, that
    # changes memory but is not modelled (megatron/flag_effects.py ``memory_assumptions``).
    not_modelled: tuple[tuple[str, str], ...] = ()
    distillation: Distillation | None = None
    # Models an RL framework keeps on the GPU beside the actor (inputs/co_resident.CoResident).
    co_resident: tuple = ()
    given: frozenset = field(default=frozenset(), compare=False, repr=False)   # dests the user set

    def __hash__(self) -> int:
        return self._hash_value

    @cached_property
    def _hash_value(self) -> int:
        # The memory model caches per configuration; hashing the nested dataclasses (the MoE
        # layer pattern, ...) on every lookup would cost more than the arithmetic, so the hash
        # of this immutable object is computed once (cached_property keeps it in the instance's
        # __dict__, which a frozen dataclass allows).
        return hash((self.model, self.parallel, self.split, self.training, self.precision,
                     self.optimizer, self.kernels, self.offload, self.checkpoint,
                     self.world_size_source, self.run, self.notes, self.not_modelled,
                     self.distillation, self.co_resident))


def with_distributed_optimizer(config: EstimatorConfig, do: bool) -> EstimatorConfig:
    """``config`` with --use-distributed-optimizer on or off, as validate_args applies it
    (``derive.optimizer_sharding``: emerging optimizers get the layer-wise one instead)."""
    opt = config.optimizer
    distributed, layer_wise = optimizer_sharding(opt.optimizer, do)
    if (opt.use_distributed_optimizer, opt.use_layer_wise_distributed_optimizer) == (distributed, layer_wise):
        return config
    return replace(config, optimizer=replace(opt, use_distributed_optimizer=distributed,
                                             use_layer_wise_distributed_optimizer=layer_wise))


def expand_moe_layer_freq(freq: Any, num_layers: int) -> tuple[bool, ...]:
    """``--moe-layer-freq``: an int k makes every k-th layer MoE (layer i when i % k == 0);
    a list gives one 0/1 per layer (megatron/core/models/gpt/moe_module_specs / gpt_layer_specs)."""
    if isinstance(freq, int):
        return tuple([i % freq == 0 for i in range(num_layers)])
    return tuple(map(bool, freq))


def resolve_activation(ns: Mapping[str, Any]) -> tuple[str, bool]:
    """(activation name, gated) as core_transformer_config_from_args sets them."""
    if ns.get("swiglu"):
        return "swiglu", True
    if ns.get("squared_relu"):
        return "squared_relu", False
    if ns.get("quick_geglu"):
        return "quick_geglu", True
    return "gelu", False


def resolve_attention_backend(ns: Mapping[str, Any], environ: Mapping[str, str],
                              run: RunContext = RunContext()) -> tuple[str, str]:
    """The attention kernel the job will run, and why.

    ``--transformer-impl local`` always runs megatron-core's own DotProductAttention
    (unfused: it materializes the s x s scores).  With Transformer Engine,
    ``--attention-backend`` sets NVTE_FLASH_ATTN / NVTE_FUSED_ATTN / NVTE_UNFUSED_ATTN
    (megatron/core/models/common/language_module/language_module.py ``_set_attention_backend``);
    with ``auto`` TE picks flash or fused attention, both linear in s, unless the environment
    turns both off, or deterministic training rules both out (``deterministic_fallback``).
    """
    impl = ns.get("transformer_impl", "transformer_engine")
    backend = ns.get("attention_backend", "auto")
    if impl == "local" or backend == "local":
        return "unfused", f"--transformer-impl {impl}: megatron-core DotProductAttention (unfused)"
    if backend in ("flash", "fused", "unfused"):
        return backend, f"--attention-backend {backend}"
    flash = environ.get("NVTE_FLASH_ATTN", "1") != "0"
    fused = environ.get("NVTE_FUSED_ATTN", "1") != "0"
    if flash or fused:
        fallback = deterministic_fallback(ns, environ, run)
        if fallback is not None:
            return "unfused", fallback
        return ("flash" if flash else "fused"), "--attention-backend auto: Transformer Engine flash/fused attention"
    return "unfused", "NVTE_FLASH_ATTN=0 and NVTE_FUSED_ATTN=0 in the environment: TE unfused attention"


FLASH_ATTN_DETERMINISTIC = (2, 4, 1)


def flash_attn_version_tuple(text: str) -> tuple[int, ...] | None:
    """``2.7.4.post1`` -> ``(2, 7, 4)``; None when it is not a version."""
    from megatron_estimator.core.versions import version_tuple

    return version_tuple(text)


def is_deterministic(deterministic_mode: bool, environ: Mapping[str, str]) -> bool:
    """Transformer Engine's ``deterministic``: NVTE_ALLOW_NONDETERMINISTIC_ALGO=0, or torch's
    deterministic algorithms, which --deterministic-mode turns on
    (megatron/training/initialize.py)."""
    return bool(deterministic_mode) or environ.get("NVTE_ALLOW_NONDETERMINISTIC_ALGO") == "0"


def deterministic_fallback(ns: Mapping[str, Any], environ: Mapping[str, str],
                           run: RunContext = RunContext()) -> str | None:
    """Why Transformer Engine runs unfused attention under ``--attention-backend auto``, or None.

    transformer_engine/pytorch/attention/dot_product_attention/utils.py
    ``get_attention_backend``: in deterministic training it disables cuDNN's fused attention
    (F16_arbitrary_seqlen) before compute capability 9.0, and flash-attn unless it is
    installed at >= 2.4.1; with both gone only UnfusedDotProductAttention is left.  Decided
    only when the GPU is known (``run.gpu_compute_capability``) and the job's flash-attn is
    said (``run.flash_attn``: a version or "none"; None assumes >= 2.4.1).
    """
    capability, flash_attn = run.gpu_compute_capability, run.flash_attn
    if capability is None or capability >= 9.0 or flash_attn is None \
            or not is_deterministic(ns.get("deterministic_mode"), environ):
        return None
    if flash_attn != "none":
        version = flash_attn_version_tuple(flash_attn)
        if version is None or version + (0,) * (3 - len(version)) >= FLASH_ATTN_DETERMINISTIC:
            return None
    installed = "no flash-attn" if flash_attn == "none" else f"flash-attn {flash_attn} (< 2.4.1)"
    return (f"--attention-backend auto in deterministic mode on compute capability {capability:g} with "
            f"{installed}: Transformer Engine rules out fused and flash attention and runs unfused "
            f"attention (s^2 memory)")


# The hybrid stack specs Megatron-LM's hybrid entry scripts are given with --spec (hybrid_builders.py
# imports args.spec; megatron/core/models/hybrid/hybrid_layer_specs.py defines hybrid_stack_spec and its
# alias mamba_stack_spec; megatron/core/models/mamba/mamba_layer_specs.py before the hybrid rename):
# the layers config/hybrid.py and the model count.
HYBRID_STACK_SPECS = frozenset({
    ("megatron.core.models.hybrid.hybrid_layer_specs", "hybrid_stack_spec"),
    ("megatron.core.models.hybrid.hybrid_layer_specs", "mamba_stack_spec"),
    ("megatron.core.models.mamba.mamba_layer_specs", "mamba_stack_spec"),
})


def _mla_q_proj_norm(ns: Mapping[str, Any], release: ChosenRelease) -> bool:
    """Whether MLA's linear_q_proj carries the q norm (a fused norm + linear over the hidden size).

    From Megatron-LM 4464d1c197 (0.19.0; data/megatron_behaviour.tsv ``mla_qk_norm_resolved``)
    megatron/core/transformer/mla_qk_norm_config.py ``QKNormConfigResolver`` gives
    ``linear_q_proj`` the backend's fused norm + linear whenever --qk-layernorm is set and
    --q-lora-rank is not (the GPT and hybrid specs name a plain linear there); before it the
    spec's plain linear was built and the q norm did not exist.  The local backend has no fused
    layer: that combination is refused (config/rules/attention.py ``mla_qk_norm``)."""
    from megatron_estimator.megatron.behaviour import behaviour

    return (bool(ns.get("qk_layernorm")) and ns.get("q_lora_rank") is None
            and ns.get("transformer_impl", "transformer_engine") != "local"
            and behaviour("mla_qk_norm_resolved", release) == "1")


def build_config(ns: Mapping[str, Any], vocab, world_size_source: str, environ: Mapping[str, str],
                 notes: tuple[str, ...] = (), given: frozenset = frozenset(),
                 run: RunContext = RunContext(), family: str = "gpt") -> EstimatorConfig:
    """An EstimatorConfig from a derived namespace that validation accepted.  ``environ``:
    the job's environment (it picks the attention kernel); ``given``: the dests the user set."""
    num_layers = ns["num_layers"]
    activation, gated = resolve_activation(ns)
    hybrid = hybrid_config(ns) if family == "hybrid" else None
    moe = None
    if ns.get("num_experts"):
        moe = MoeConfig(
            num_experts=ns["num_experts"],
            ffn_hidden_size=ns["moe_ffn_hidden_size"],
            router_topk=ns["moe_router_topk"],
            shared_expert_intermediate_size=ns.get("moe_shared_expert_intermediate_size"),
            shared_expert_gate=bool(ns.get("moe_shared_expert_gate")),
            layer_pattern=(tuple(k == "E" for k in hybrid.layer_kinds) if hybrid is not None
                           else expand_moe_layer_freq(ns.get("moe_layer_freq", 1), num_layers)),
            grouped_gemm=bool(ns.get("moe_grouped_gemm")),
            token_dispatcher_type=ns.get("moe_token_dispatcher_type", "allgather"),
            expert_capacity_factor=ns.get("moe_expert_capacity_factor"),
            pad_expert_input_to_capacity=bool(ns.get("moe_pad_expert_input_to_capacity")),
            router_enable_expert_bias=bool(ns.get("moe_router_enable_expert_bias")),
            router_dtype=ns.get("moe_router_dtype"),
            latent_size=ns.get("moe_latent_size"),
            apply_probs_on_input=bool(ns.get("moe_apply_probs_on_input")),
            score_function=ns.get("moe_router_score_function") or "softmax",
        )
    mla = None
    if ns.get("multi_latent_attention"):
        mla = MlaConfig(
            q_lora_rank=ns.get("q_lora_rank"),
            kv_lora_rank=ns["kv_lora_rank"],
            qk_head_dim=ns["qk_head_dim"],
            qk_pos_emb_head_dim=ns["qk_pos_emb_head_dim"],
            v_head_dim=ns["v_head_dim"],
            q_proj_norm=_mla_q_proj_norm(ns, run.release),
        )
    model = ModelConfig(
        num_layers=num_layers,
        hidden_size=ns["hidden_size"],
        num_attention_heads=ns["num_attention_heads"],
        num_query_groups=ns["num_query_groups"],
        kv_channels=ns["kv_channels"],
        ffn_hidden_size=ns["ffn_hidden_size"],
        vocab_size=vocab.size,
        padded_vocab_size=vocab.padded_size,
        vocab_source=vocab.source,
        max_position_embeddings=ns["max_position_embeddings"],
        position_embedding_type=ns["position_embedding_type"],
        normalization=ns["normalization"],
        activation=activation,
        gated_linear_unit=gated,
        add_bias_linear=bool(ns["add_bias_linear"]),
        add_qkv_bias=bool(ns["add_qkv_bias"]),
        # MLA (GPT and hybrid '+' / 'D' layers): the q / kv norms exist with --qk-layernorm, as
        # standalone norms or fused into the up projections (mla_qk_norm_config.py).
        qk_layernorm=bool(ns.get("qk_layernorm")),
        untie_embeddings_and_output_weights=bool(ns["untie_embeddings_and_output_weights"]),
        hidden_dropout=float(ns["hidden_dropout"]),
        attention_dropout=float(ns["attention_dropout"]),
        attention_output_gate=bool(ns.get("attention_output_gate")),
        softmax_type=ns.get("softmax_type") or "vanilla",
        moe=moe,
        mla=mla,
        mtp_num_layers=ns.get("mtp_num_layers") or 0,
        family=family,
        hybrid=hybrid,
    )
    parallel = ParallelDims(
        world_size=ns["world_size"],
        tp=ns["tensor_model_parallel_size"],
        pp=ns["pipeline_model_parallel_size"],
        cp=ns["context_parallel_size"],
        ep=ns["expert_model_parallel_size"],
        etp=ns["expert_tensor_parallel_size"],
        vpp=ns.get("virtual_pipeline_model_parallel_size"),
    )
    split = PipelineSplit(
        first_stage_layers=ns.get("decoder_first_pipeline_num_layers"),
        last_stage_layers=ns.get("decoder_last_pipeline_num_layers"),
        account_for_embedding=bool(ns.get("account_for_embedding_in_pipeline_split")),
        account_for_loss=bool(ns.get("account_for_loss_in_pipeline_split")),
        layout=ns.get("pipeline_model_parallel_layout"),
        microbatch_group_size=ns["microbatch_group_size_per_vp_stage"],
    )
    training = TrainingConfig(
        micro_batch_size=ns["micro_batch_size"],
        global_batch_size=ns["global_batch_size"],
        num_microbatches=ns["num_microbatches"],
        seq_length=ns["seq_length"],
        sequence_parallel=bool(ns["sequence_parallel"]),
        recompute_granularity=ns.get("recompute_granularity"),
        recompute_method=ns.get("recompute_method"),
        recompute_num_layers=ns.get("recompute_num_layers"),
        recompute_modules=tuple(ns.get("recompute_modules") or ()),
        distribute_saved_activations=bool(ns.get("distribute_saved_activations")),
        # megatron/core/models/hybrid/hybrid_block.py (HybridStack) never enters the CPU
        # offload context transformer_block.py gives its layers: a hybrid model ignores it.
        cpu_offloading_num_layers=(ns.get("cpu_offloading_num_layers") or 0) if hybrid is None else 0,
        overlap_p2p_comm=bool(ns.get("overlap_p2p_comm")),
        calculate_per_token_loss=bool(ns.get("calculate_per_token_loss")),
        cross_entropy_loss_fusion=bool(ns.get("cross_entropy_loss_fusion")),
        cross_entropy_fusion_impl=ns.get("cross_entropy_fusion_impl", "native"),
        fp32_residual_connection=bool(ns.get("fp32_residual_connection")),
        defer_embedding_wgrad_compute=bool(ns.get("defer_embedding_wgrad_compute")),
        wgrad_deferral_limit=ns.get("wgrad_deferral_limit") or 0,
        create_attention_mask_in_dataloader=bool(ns.get("create_attention_mask_in_dataloader", True)),
        overlap_moe_expert_parallel_comm=bool(ns.get("overlap_moe_expert_parallel_comm")),
        deterministic_mode=bool(ns.get("deterministic_mode")),
    )
    offload = OffloadConfig(
        fine_grained=bool(ns.get("fine_grained_activation_offloading")),
        modules=tuple(ns.get("offload_modules") or ()),
        fraction=float(ns.get("activation_offload_fraction", 1.0)),
        min_tensor_size=int(ns.get("min_offloaded_tensor_size") or 0),
    )
    params_dtype = ns["params_dtype"]
    if params_dtype == "bf16":
        main_grads = "fp32" if ns.get("accumulate_allreduce_grads_in_fp32") else "bf16"
    elif params_dtype == "fp16":
        main_grads = "fp32" if ns.get("accumulate_allreduce_grads_in_fp32") else "fp16"
    else:
        main_grads = "fp32"
    precision = PrecisionConfig(
        params_dtype=params_dtype,
        main_grads_dtype=main_grads,
        fp8=ns.get("fp8"),
        fp8_recipe=ns.get("fp8_recipe", "delayed"),
        fp8_param_gather=bool(ns.get("fp8_param_gather")),
        fp8_amax_history_len=ns.get("fp8_amax_history_len") or 1,
        attention_softmax_in_fp32=bool(ns.get("attention_softmax_in_fp32")),
    )
    optimizer = OptimizerConfig(
        optimizer=ns.get("optimizer", "adam"),
        main_params_dtype=ns.get("main_params_dtype", "fp32"),
        exp_avg_dtype=ns.get("exp_avg_dtype", "fp32"),
        exp_avg_sq_dtype=ns.get("exp_avg_sq_dtype", "fp32"),
        use_precision_aware_optimizer=bool(ns.get("use_precision_aware_optimizer")),
        use_distributed_optimizer=bool(ns.get("use_distributed_optimizer")),
        use_layer_wise_distributed_optimizer=bool(ns.get("use_layer_wise_distributed_optimizer")),
        use_layer_wise_param_layout=bool(ns.get("use_layer_wise_param_layout", True)),
        num_distributed_optimizer_instances=ns.get("num_distributed_optimizer_instances") or 1,
        optimizer_cpu_offload=bool(ns.get("optimizer_cpu_offload")),
        optimizer_offload_fraction=float(ns.get("optimizer_offload_fraction", 1.0)),
        sgd_momentum=float(ns.get("sgd_momentum") or 0),
        overlap_grad_reduce=bool(ns.get("overlap_grad_reduce")),
        overlap_param_gather=bool(ns.get("overlap_param_gather")),
        ddp_bucket_size=ns.get("ddp_bucket_size"),
        use_megatron_fsdp=bool(ns.get("use_megatron_fsdp")),
        data_parallel_sharding_strategy=ns.get("data_parallel_sharding_strategy", "optim_grads_params"),
    )
    checkpoint = CheckpointConfig(
        ckpt_format=ns.get("ckpt_format"),
        fully_parallel_load=bool(ns.get("ckpt_fully_parallel_load")),
        exchange_algo=ns.get("ckpt_fully_parallel_load_exchange_algo") or "broadcast",
        load_process_group=ns.get("ckpt_fully_parallel_load_process_group"),
        optim_fully_reshardable=bool(ns.get("dist_ckpt_optim_fully_reshardable")),
        no_load_optim=bool(ns.get("no_load_optim")),
        finetune=bool(ns.get("finetune")),
    )
    backend, backend_source = resolve_attention_backend(ns, environ, run)
    kernels = KernelConfig(
        transformer_impl=ns.get("transformer_impl", "transformer_engine"),
        attention_backend=backend,
        attention_backend_source=backend_source,
        masked_softmax_fusion=bool(ns.get("masked_softmax_fusion", True)),
        bias_gelu_fusion=bool(ns.get("bias_gelu_fusion", True)),
        bias_swiglu_fusion=bool(ns.get("bias_swiglu_fusion", True)),
        bias_dropout_fusion=bool(ns.get("bias_dropout_fusion", True)),
        gradient_accumulation_fusion=bool(ns.get("gradient_accumulation_fusion", True)),
        apply_rope_fusion=bool(ns.get("apply_rope_fusion", True)),
        tp_comm_overlap=bool(ns.get("tp_comm_overlap")),
        te_activation_func=bool(ns.get("use_te_activation_func")),
        fused_weighted_squared_relu=bool(ns.get("use_fused_weighted_squared_relu")),
    )
    not_modelled = ()
    if hybrid is not None and (ns.get("cpu_offloading_num_layers") or 0) > 0:
        notes = tuple(notes) + (
            f"--cpu-offloading-num-layers {ns['cpu_offloading_num_layers']} offloads nothing on a hybrid model: "
            "megatron/core/models/hybrid/hybrid_block.py runs its layers outside the CPU offload context "
            "(only transformer_block.py enters it)",)
    if hybrid is not None and tuple(ns.get("spec") or ()) in HYBRID_STACK_SPECS:
        given = [dest for dest in given if dest != "spec"]     # the layer spec the hybrid model is built with
    if given:
        from megatron_estimator.megatron.flag_effects import memory_assumptions

        not_modelled = tuple(memory_assumptions(given, {dest: ns.get(dest) for dest in given},
                                                release=run.release.version))
    return interned(EstimatorConfig(
        model=model, parallel=parallel, split=split, training=training, precision=precision,
        optimizer=optimizer, kernels=kernels, offload=offload, checkpoint=checkpoint,
        world_size_source=world_size_source, run=run, notes=tuple(notes), not_modelled=not_modelled,
        given=frozenset(given),
    ))


# Configurations built before, by value: the memory model memoises per configuration
# (``functools.lru_cache`` keyed on it), and a lookup with an equal but distinct object
# compares every nested field, about a hundred times per estimate.  Handing back the object
# built before for an equal configuration makes each lookup an identity check.  The key holds
# ``given`` too, the one field equality leaves out.
_INTERNED: dict[tuple["EstimatorConfig", frozenset], "EstimatorConfig"] = {}
_INTERNED_MAX = 256


def interned(config: "EstimatorConfig") -> "EstimatorConfig":
    """The configuration built before that equals ``config`` (``given`` included), else ``config``."""
    key = (config, config.given)
    found = _INTERNED.get(key)
    if found is not None:
        return found
    if len(_INTERNED) >= _INTERNED_MAX:
        _INTERNED.clear()
    _INTERNED[key] = config
    return config
