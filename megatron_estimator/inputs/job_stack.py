"""The job's software stack, from its package metadata (``run``: the environment is the job's).

``detect_job_stack(path)`` finds PyTorch, Transformer Engine and flash-attn on the job's path
(``core.distributions.job_path``: the launch's ``PYTHONPATH``, then this interpreter's
``sys.path``) by their ``*.dist-info`` / ``*.egg-info`` folders read as text, the way the
installed megatron-core is found; nothing is imported.  ``stack_facts`` turns what was found,
and the ``flash-attn`` setting when one was given (it wins), into the one fact the estimate
takes (the job's flash-attn: a version, ``"none"``, or None for the default assumption) and one
``StackPackage`` record per package for the reports, each saying where it came from and what it
changes for memory:

- flash-attn: Transformer Engine's attention backend selection
  (transformer_engine/pytorch/attention/dot_product_attention/utils.py ``get_attention_backend``)
  uses flash-attn for its FlashAttention backend and, in deterministic training, only from
  2.4.1; before compute capability 9.0 it also rules out cuDNN fused attention there, so
  without flash-attn >= 2.4.1 deterministic training runs unfused attention (s^2 memory:
  ``config.typed.deterministic_fallback``).  Found: its version; not found while PyTorch was
  found (the job's site-packages were seen): ``none``.
- Transformer Engine: ``--transformer-impl transformer_engine`` (the default) builds its layers
  from Transformer Engine (megatron/core/models/gpt/gpt_layer_specs.py, ``HAVE_TE``), and
  ``--attention-backend auto`` lets it pick flash or fused attention; the estimate models that
  stack whatever its version, so for memory a found version is context only; it becomes
  ``Overheads.transformer_engine`` for the rules on its version (config/rules/environment.py
  ``te_version``: validate_args' ``is_te_min_version`` checks); not found is said.
- PyTorch: context only (the estimate's allocator model does not depend on its version).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

# name as reported -> distribution names, first found wins
PACKAGES = {
    "torch": ("torch",),
    "transformer-engine": ("transformer_engine", "transformer_engine_torch"),
    "flash-attn": ("flash_attn",),
}


@dataclass(frozen=True)
class StackPackage:
    """One package of the job's stack as the estimate used it."""

    name: str                 # torch | transformer-engine | flash-attn
    version: str | None       # None: not known (not found, or nothing was looked at)
    source: str               # "installed: /.../flash_attn-2.7.4.dist-info", "--flash-attn", ...
    effect: str               # what it changes for the estimate, or "context only: ..."

    def __str__(self) -> str:
        said = f" {self.version}" if self.version is not None else ""
        return f"{self.name}{said} ({self.source}): {self.effect}"

    def to_json(self) -> dict:
        return {"name": self.name, "version": self.version, "source": self.source, "effect": self.effect}


def detect_job_stack(path: Sequence[str]) -> dict[str, tuple[str, str] | None]:
    """``{name: (version, metadata folder) or None}`` for each of ``PACKAGES`` on ``path``."""
    from megatron_estimator.core.distributions import find_distributions

    return find_distributions(PACKAGES, path)


FLASH_EFFECT = ("Transformer Engine's flash attention; deterministic training before compute capability 9.0 "
                "needs flash-attn >= 2.4.1, else unfused attention (s^2 memory)")


def stated_found(stated: dict[str, str]) -> dict[str, tuple[str, str] | None]:
    """``parse_stack``'s answer in ``detect_job_stack``'s form: a package stated ``none`` is not
    installed, one not stated is not known (absent)."""
    return {name: (None if version == "none" else (version, "")) for name, version in stated.items()}


def stack_facts(found: dict[str, tuple[str, str] | None], flash_setting: str | None = None,
                flash_source: str = "the flash-attn setting", stated: str | None = None
                ) -> tuple[str | None, str | None, tuple[StackPackage, ...]]:
    """``(flash_attn, transformer_engine for the estimate, records)`` from ``detect_job_stack``'s
    answer (or ``stated_found``'s, with ``stated`` naming where the user stated it: then a
    package not named stays unknown) and the ``flash-attn`` setting (None: not given; given, it
    wins over what was found)."""
    def origin(entry) -> str:
        return stated if stated is not None else f"installed: {entry[1]}"

    torch, te, flash = found.get("torch"), found.get("transformer-engine"), found.get("flash-attn")
    seen = torch is not None if stated is None else None    # the job's site-packages were looked at
    records = []
    if torch is not None:
        records.append(StackPackage("torch", torch[0], origin(torch),
                                    "context only: the estimate does not depend on the PyTorch version"))
    elif stated is None:
        records.append(StackPackage("torch", None, "not found on the job's path",
                                    "no package metadata of the job's stack was seen; the estimate assumes "
                                    "Transformer Engine and flash-attn >= 2.4.1 as without detection"))
    if te is not None:
        records.append(StackPackage("transformer-engine", te[0], origin(te),
                                    "its version is checked where Megatron's validate_args asks for a minimum; "
                                    "for memory context only: --transformer-impl transformer_engine and "
                                    "--attention-backend auto (flash or fused attention) are modelled whatever "
                                    "its version"))
    elif seen or (stated is not None and "transformer-engine" in found):
        records.append(StackPackage("transformer-engine", None, stated or "not installed (no metadata on the job's path)",
                                    "--transformer-impl transformer_engine needs it (megatron/core/models/gpt/"
                                    "gpt_layer_specs.py); the estimate still assumes it, or give "
                                    "--transformer-impl local (unfused attention, s^2 memory)"))
    # a stated series (2.x) answers no minimum-version question: the default assumption holds
    te_version = te[0] if te is not None and not te[0].endswith(".x") else None
    if flash_setting is not None:
        detected = f"; installed {flash[0]} not used" if flash is not None and flash[0] != flash_setting else ""
        records.append(StackPackage("flash-attn", flash_setting, flash_source + detected, FLASH_EFFECT))
        return flash_setting, te_version, tuple(records)
    if flash is not None:
        records.append(StackPackage("flash-attn", flash[0], origin(flash), FLASH_EFFECT))
        return (None if flash[0].endswith(".x") else flash[0]), te_version, tuple(records)
    if seen or (stated is not None and "flash-attn" in found):
        records.append(StackPackage("flash-attn", "none", stated or "not installed (no metadata on the job's path)",
                                    FLASH_EFFECT))
        return "none", te_version, tuple(records)
    return None, te_version, tuple(records)


def with_stack(overheads, found: dict, settings=None, stated: str | None = None):
    """``(overheads with the stack's flash-attn and Transformer Engine facts, records)``: the one
    mapping from a stack (``detect_job_stack``'s or ``stated_found``'s) to what the estimate
    takes; ``settings``' flash-attn, when given, wins."""
    flash = settings.entry("flash-attn") if settings is not None else None
    given = (settings.flash_attn, flash.source) if flash is not None and flash.given else (None,)
    flash_attn, te, records = stack_facts(found, *given, stated=stated)
    return replace(overheads, flash_attn=flash_attn, transformer_engine=te), records
