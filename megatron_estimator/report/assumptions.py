"""The assumptions of an estimate as the report states them.

The memory model records what it took as given as facts (``results.estimate.Assumed``: a
code, a figure, the names and numbers behind it); this module says each as a sentence, and
converts bytes to MiB or GiB only here.  ``state`` gives the ``Assumption`` (key, text,
value) the text, markdown and JSON reports print.
"""

from __future__ import annotations

from typing import Callable, Iterable

from megatron_estimator.config.run_context import TRACKER_FILE, Resume
from megatron_estimator.core.units import GiB, MiB
from megatron_estimator.results.estimate import Assumed, Assumption

# The JSON key of each code that is not its own key.
KEYS = {"tp_comm_overlap": "not_modelled"}


def size(n: int) -> str:
    """Bytes as the assumptions say them: ``2.1 MiB``, ``1.50 GiB``."""
    return f"{n / GiB:.2f} GiB" if n >= GiB else f"{n / MiB:.1f} MiB"


def resume_note(resume: Resume) -> str | None:
    """What the report says about whether the run resumes (None: nothing to say)."""
    if resume.requested == "no":
        return None
    if resume.load is None:
        return "resume: --resume yes, but there is no --load: nothing is loaded" if resume.requested == "yes" else None
    if resume.requested == "yes":
        return f"resume: from the checkpoint in --load {resume.load} (--resume yes)"
    if resume.found is not None:
        return f"resume: from the checkpoint in --load {resume.load} ({resume.found} is there)"
    return (f"resume: --load {resume.load} holds no checkpoint ({TRACKER_FILE} is not there): estimated as a "
            f"first run; say --resume yes for a run that will find one")


# model/checkpoint.py ``ResumeLoad.path``: what each load path costs, as the report says it.
LOAD_PATHS = {
    "fsdp_dtensor": "the Megatron-FSDP (fsdp_dtensor) load's memory is not modelled",
    "in_place": "the load reads into the model's and optimizer's own tensors; nothing is added",
    "exchange_algo": "the fully parallel load's {algo} exchange buffers are not modelled",
    "fully_reshardable": ("the fully parallel load of a fully reshardable optimizer checkpoint "
                          "(--dist-ckpt-optim-fully-reshardable) is not modelled"),
    "broadcast": ("--ckpt-fully-parallel-load: the broadcast buffers of checkpoint shards that other ranks of "
                  "its group hold stay allocated into the first training step (counted, an upper bound)"),
}


def _attention_backend(a: Assumed) -> str:
    text = f"attention kernel: {a.value} ({a.facts['source']})"
    if a.facts["deterministic_flash_attn_assumed"]:
        text += ("; deterministic mode on this GPU assumes flash-attn >= 2.4.1 in the job's "
                 "software stack; without it Transformer Engine falls back to unfused attention "
                 "(s^2 memory): say --flash-attn none")
    return text


def _schedule(a: Assumed) -> str:
    return ("activations held per the pipeline schedule at the 1F1B steady state"
            + (" (interleaved)" if a.facts["interleaved"] else ""))


def _cublas_workspace(a: Assumed) -> str:
    f = a.facts
    return (f"cuBLAS workspaces {a.value / MiB:g} MiB ({f['source']}) and "
            f"Transformer Engine's workspace for compute capability {f['compute_capability']:g}"
            + (" (and one per grouped-GEMM stream)" if f["grouped_gemm"] else "")
            + (" (and three for the TP-overlap GEMMs)" if f["tp_comm_overlap"] else ""))


def _cuda_context(a: Assumed) -> str:
    return f"CUDA context {a.value / MiB:g} MiB per GPU, outside the allocator"


def _nccl_buffers(a: Assumed) -> str:
    return (f"NCCL buffers {a.value / MiB:g} MiB per communicator "
            f"({', '.join(a.facts['communicators']) or 'none'})")


def _fragmentation(a: Assumed) -> str:
    return f"allocator fragmentation {a.value:.0%} of allocated memory"


def _optimizer(a: Assumed) -> str:
    return f"--optimizer {a.facts['optimizer']}: its states are counted as Adam's (preconditioners not modelled)"


def _routing(a: Assumed) -> str:
    if a.value:
        return (f"MoE routing imbalance: every stage is estimated for its busiest expert rank, whose "
                f"experts receive {a.value:.0%} more than the even share of routed tokens (--routing-imbalance; "
                "the routed-token activations grow with it, within the capacity factor)")
    return "MoE tokens spread evenly over the expert ranks (--routing-imbalance F: the busiest rank receives F more)"


def _resume(a: Assumed) -> str:
    f = a.facts
    load = f["load"]
    text = resume_note(f["resume"]) or ""
    if load is not None:
        text += "; " + LOAD_PATHS[load.path].format(algo=load.exchange_algo)
    if load is not None and load.exchanges:
        most, fewer = f["most_bytes"], f["ep_dp_bytes"]
        if most:
            text += f": {size(most)} on stage {f['stage']}"
            if fewer is not None and fewer < most:
                text += f" (with --ckpt-fully-parallel-load-process-group ep_dp: {size(fewer) if fewer else 'none'})"
        else:
            text += ": none here (every shard its group exchanges is one this rank holds)"
    return text


def _tp_comm_overlap(a: Assumed) -> str:
    return ("--tp-comm-overlap: the GEMM workspaces it adds are counted; Transformer Engine's userbuffers are "
            "allocated outside PyTorch's allocator and are not in the device peak")


def _mamba_kernels(a: Assumed) -> str:
    return (f"Mamba layers ({a.facts['layers']}): activations are what mamba_ssm 2.x's fused kernels save for "
            "backward (mamba_split_conv1d_scan_combined: zxbcdt and the scan output; the gated RMSNorm's input "
            "and fp32 statistics), on the memory-efficient path; "
            "mamba_ssm is outside megatron-core and its version is not checked")


def _gdn_kernels(a: Assumed) -> str:
    return (f"gated delta net layers ({a.facts['layers']}, {a.facts['variant']}): activations are what "
            "flash-linear-attention's kernels are assumed to save for backward (causal_conv1d: its input, a view "
            "of in_proj's output; l2norm: the normalized q, k and fp32 rstd; chunk_gated_delta_rule: q, k, v, "
            "fp32 g, beta and the chunk's 64-wide triangular solve); fla is outside megatron-core and its version "
            "is not checked; fine-grained activation offloading is taken to move nothing from these layers"
            + ("; --deterministic-mode runs megatron-core's torch conv1d and chunked delta rule instead, whose saved "
               "tensors are not modelled separately (the fla figures are used)" if a.facts.get("deterministic") else ""))


def _dsa_kernels(a: Assumed) -> str:
    if a.facts["backend"] == "none" or a.facts["unfused"]:
        core = ("the PyTorch sparse attention (dsa.py _unfused_absorbed_dsa_fn, megatron-core's own code) keeps "
                "tensors the size of the full scores, per head, query and key position: the fp32 exponentials and "
                "probabilities, the probabilities in the training dtype and three bool masks")
    else:
        core = (f"the {a.facts['backend']} kernel is assumed to save its query, key, latent output, fp32 "
                "log-sum-exp and int32 top-k indices (it is outside megatron-core)")
    return (f"DeepSeek sparse attention layers ({a.facts['layers']}): {core}; the indexer runs under no_grad "
            "(its loss, --dsa-indexer-loss-coeff, and the top-k shared across layers are not counted); "
            "fine-grained activation offloading is taken to move nothing from these layers")


def _distillation(a: Assumed) -> str:
    f = a.facts
    changed = f" (its file sets {', '.join(f['teacher_overrides'])})" if f["teacher_overrides"] else ""
    lm = ("the student's cross entropy is not run (skip_lm_loss)" if f["skip_lm_loss"]
          else "the student's cross entropy runs too (skip_lm_loss false)")
    pairs = f", {f['intermediate_pairs']} intermediate layer pair(s)" if f["intermediate_pairs"] else ""
    return (f"knowledge distillation: the teacher's shape is {f['teacher_source']}{changed}; its frozen weights "
            f"({size(f['teacher_bytes'])} on the fullest stage) are sharded like the student's, with no gradients "
            f"or optimizer states; ModelOpt's LogitsKLLoss holds {a.value} fp32 [s, b, V/tp] buffers at once "
            f"beside both models' 16-bit logits (measured with ModelOpt 0.39 and 0.47, "
            f"{'with' if f['tp'] > 1 else 'without'} tensor parallelism); {lm}{pairs} (distillation config: {f['kd_cfg_source']})")


def _co_resident(a: Assumed) -> str:
    f = a.facts
    held = [w for w, on in (("weights", f["weights"]), ("gradient buffer", f["gradients"]),
                            ("optimizer states", f["optimizer"])) if on]
    where = f" ({f['location']})" if f["location"] else ""
    if not held:
        return (f"{f['role']}{where}: offloaded to the CPU while the actor trains, none counted on the GPU "
                f"({f['source']})")
    return (f"{f['role']}{where}: its {', '.join(held)} stay on the GPU while the actor trains, "
            f"{size(a.value)} per GPU (the actor's shape at TP {f['tp']} x PP {f['pp']}, its fullest stage), "
            f"counted on every stage ({f['source']})")


def _megatron_derived(a: Assumed) -> str:
    return a.facts["note"]


def _not_modelled(a: Assumed) -> str:
    return f"{a.facts['flag']}: {a.facts['what']}"


SENTENCES: dict[str, Callable[[Assumed], str]] = {
    "attention_backend": _attention_backend,
    "schedule": _schedule,
    "cublas_workspace": _cublas_workspace,
    "cuda_context": _cuda_context,
    "nccl_buffers": _nccl_buffers,
    "fragmentation": _fragmentation,
    "optimizer": _optimizer,
    "routing": _routing,
    "resume": _resume,
    "tp_comm_overlap": _tp_comm_overlap,
    "mamba_kernels": _mamba_kernels,
    "gdn_kernels": _gdn_kernels,
    "dsa_kernels": _dsa_kernels,
    "distillation": _distillation,
    "co_resident": _co_resident,
    "megatron_derived": _megatron_derived,
    "not_modelled": _not_modelled,
}


def seed_defaults(words: Iterable[str]) -> Assumption:
    """The seed-style defaults an estimate took (api.with_options): ``micro batch 1, ...``."""
    return Assumption("seed_defaults", "seed-style defaults (no Megatron flags after '--'): " + ", ".join(words))


def state(a: Assumed) -> Assumption:
    """One assumption as the report states it."""
    return Assumption(KEYS.get(a.code, a.code), SENTENCES[a.code](a), a.value)


def state_all(assumed: Iterable[Assumed]) -> tuple[Assumption, ...]:
    return tuple(state(a) for a in assumed)
