"""ModelOpt knowledge distillation: the teacher's weights and the distillation loss's buffers.

The configuration's ``Distillation`` (config/distillation.py) holds the teacher's shape.

Teacher weights: ModelOpt freezes the teacher (modelopt/torch/distill/distillation_model.py
``self._teacher_model.requires_grad_(False)``), so it has no gradients, no main-grad buffer
and no optimizer states; its parameters are in the params dtype (the teacher is a submodule
of the student that Megatron's Float16Module casts).  Each pipeline rank holds the teacher's
layers of its own stage: it is built with the student's ``pre_process``/``post_process`` and
parallel state (megatron/post_training/model_builder.py ``_build_teacher_model``).

Loss: the teacher runs its forward under ``torch.no_grad()`` first (distillation_model.py
``forward``), keeping only the outputs its forward hooks capture: its 16-bit logits
[s, b, V/t] and one [s, b, h] output per intermediate layer pair.  Then ``loss_func``
(megatron/post_training/loss_func.py) calls ``compute_kd_loss``; ModelOpt's ``LogitsKLLoss``
(modelopt/torch/distill/plugins/megatron.py) casts both logits to fp32 and builds the
log-softmaxes and the KL terms out of place.  Its fullest moment, measured on CPU by tracking
every storage its forward and backward create (a ``TorchDispatchMode``; ModelOpt 0.39.0 and
0.47.0 alike), holds ``KD_LOGITS_BUFFERS`` fp32 [s, b, V/t] tensors beyond the two 16-bit
logits: 8 with tensor parallelism (the global softmax through explicit max / exp / log
steps), 7 without (``F.log_softmax``); its backward holds at most 3, after the forward's
local tensors are freed.  This is on the last stage, with the microbatch's saved activations.
With ``skip_lm_loss`` (ModelOpt's default) the student's cross entropy is not run while
training (``adjust_distillation_model_for_mcore`` returns zeros), so its fp32 softmax is not
kept (model/activations.py ``loss_activations``).
"""

from __future__ import annotations

from dataclasses import replace

from megatron_estimator.config.typed import EstimatorConfig
from megatron_estimator.model import activations as act
from megatron_estimator.model.layout import StageLayout, pipeline_stages
from megatron_estimator.model.parameters import chunk_blocks, chunk_structure
from megatron_estimator.model.states import DTYPE_BYTES

# fp32 [s, b, V/t] tensors alive at once in LogitsKLLoss.forward (see the module docstring).
KD_LOGITS_BUFFERS = {True: 8, False: 7}     # tensor parallel or not


def kd_logits_buffers(tp: int) -> int:
    """fp32 [s, b, V/t] buffers at the KL loss's fullest moment."""
    return KD_LOGITS_BUFFERS[tp > 1]


def teacher_config(config: EstimatorConfig) -> EstimatorConfig:
    """The configuration the teacher is built with: the student's, with the teacher's shape."""
    return replace(config, model=config.distillation.teacher, distillation=None)


def teacher_parameters(config: EstimatorConfig, stage: StageLayout) -> int:
    """The teacher's parameters on this stage's GPU (the same pipeline rank's layers, sharded
    by the same tensor / expert parallelism as the student's)."""
    teacher = teacher_config(config)
    t_stage = pipeline_stages(teacher)[stage.pp_rank]
    return sum(b.repeats * t.numel * t.count
               for chunk in t_stage.chunks for b in chunk_blocks(teacher, chunk_structure(teacher, chunk))
               for t in b.records)


def teacher_weight_bytes(config: EstimatorConfig, stage: StageLayout) -> int:
    """Bytes of the teacher's (frozen) weights on this stage; 0 without distillation."""
    if config.distillation is None:
        return 0
    return teacher_parameters(config, stage) * DTYPE_BYTES[config.precision.params_dtype]


def kd_loss_transient(config: EstimatorConfig) -> int:
    """Bytes at the distillation loss on the last stage beyond the microbatch's saved
    activations: both models' 16-bit logits, the teacher's intermediate outputs and the KL
    loss's fp32 buffers; 0 without distillation."""
    kd = config.distillation
    if kd is None:
        return 0
    d = act.dims(config)
    logits = d.tokens * config.model.padded_vocab_size // d.t      # the teacher's vocab is the student's
    intermediate = kd.intermediate_pairs * d.act * d.tokens_r * kd.teacher.hidden_size
    return 2 * d.act * logits + intermediate + 4 * logits * kd_logits_buffers(d.t)
