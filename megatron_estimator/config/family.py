"""Which model families the estimator models, and the refusal of the others.

The memory model (``model/``) builds GPT decoders (megatron/core/models/gpt/gpt_model.py) and
hybrid Mamba models (megatron/core/models/hybrid, megatron/core/models/mamba).  Every other
family Megatron-LM trains is refused with one ``unsupported-model`` problem that names the
family and what modelling it would take; its configuration is never estimated as a GPT
decoder.  ``inputs.entry_script.model_family`` tells the family.
"""

from __future__ import annotations

from megatron_estimator.core.problems import Problem
from megatron_estimator.inputs.entry_script import ModelFamily

MODELLED = "the estimator models GPT decoders (pretrain_gpt.py) and hybrid Mamba models (pretrain_hybrid.py, " \
           "pretrain_mamba.py)"

# family -> (its name in a sentence, what modelling it would need); from the megatron-core
# model each family's entry script builds.
UNSUPPORTED: dict[str, tuple[str, str]] = {
    "bert": ("BERT", "an encoder with a binary (sentence-order) head, a pooler and an LM head with its own "
                     "dense and layernorm transform (megatron/core/models/bert/bert_model.py)"),
    "t5": ("T5", "an encoder-decoder whose decoder layers add cross-attention over the encoder output, with "
                 "--encoder-num-layers / --decoder-num-layers and separate encoder and decoder sequence lengths "
                 "(megatron/core/models/T5/t5_model.py)"),
    "multimodal": ("multimodal (LLaVA)", "a vision encoder (CLIP ViT, SigLIP, InternViT, RADIO), a projection into "
                                         "the language model and the image tokens it adds to the sequence, around a "
                                         "GPT language model (megatron/core/models/multimodal/llava_model.py)"),
    "vision": ("vision transformer", "a patch embedding, a ViT backbone and a classification, DINO or inpainting "
                                     "head over image-sized sequences (megatron/core/models/vision)"),
    "mimo": ("MiMo", "each modality encoder and the language model with its own parallel layout, possibly on "
                     "separate GPUs (megatron/core/models/mimo)"),
    "retro": ("RETRO", "a retrieval encoder over the retrieved neighbours and chunked cross-attention layers in the "
                       "GPT decoder (megatron/core/models/retro)"),
    "ict": ("ICT biencoder", "two BERT encoders (query and context towers) with an in-batch contrastive loss "
                             "(pretrain_ict.py, megatron/legacy/model/biencoder_model.py)"),
}


def unsupported_model(family: ModelFamily) -> Problem | None:
    """The ``unsupported-model`` problem for a family the estimator does not model, else None."""
    if family.modelled:
        return None
    label, needs = UNSUPPORTED.get(family.name, (family.name, "its own model builder"))
    entry = family.entry
    location = entry.location if entry is not None else "<command>"
    message = (f"{label} models are not modelled ({family.source}): estimating one needs {needs}; "
               f"{MODELLED}, and gives no GPT estimate for a {label} model")
    if entry is not None and entry.unread_flags:
        count = len(entry.unread_flags)
        message += (f"; {count} flag{'s' if count != 1 else ''} unknown to Megatron "
                    f"({', '.join(entry.unread_flags)}) {'are' if count != 1 else 'is'} presumably {entry.script}'s own "
                    f"(the script could not be read: {entry.unread_reason})")
    return Problem("unsupported-model", location, message)


def family_refusal(raw, entry) -> tuple:
    """The ``unsupported-model`` problem of an input (its raw settings and entry script) whose
    model family is not modelled, as a tuple of at most one: the planner lays out GPT decoders
    and hybrid models, never another family as a GPT decoder."""
    from megatron_estimator.inputs.entry_script import model_family

    refusal = unsupported_model(model_family(raw, entry))
    return (refusal,) if refusal is not None else ()
