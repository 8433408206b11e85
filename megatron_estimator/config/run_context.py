"""What the run knows beyond its flags: the GPU, the Megatron-LM release, the job's software
stack and environment, whether it resumes from a checkpoint, and where it is launched.

``RunContext`` is built once, by ``resolve.resolve_config``, and travels on the typed
configuration (``EstimatorConfig.run``); the memory model reads it there and nowhere else.
Every field is a fact (a number, a flag, a name), never a sentence: report/assumptions.py
says them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping
from megatron_estimator.megatron.releases import DEFAULT_RELEASE, ChosenRelease

# Megatron's tracker file in a checkpoint directory (megatron/training/checkpointing.py
# get_checkpoint_tracker_filename): a run whose --load directory has it resumes from it.
TRACKER_FILE = "latest_checkpointed_iteration.txt"

RESUME_CHOICES = ("auto", "yes", "no")


@dataclass(frozen=True)
class Resume:
    """Whether the run resumes from a checkpoint, and why.

    ``requested``: the user's ``--resume``: ``yes``, ``no``, or ``auto`` (the run resumes
    when its ``--load`` directory holds a checkpoint, as Megatron finds one).  ``load``: the
    ``--load`` directory (None: none given).  ``found``: under ``auto``, what was found there
    (the tracker file or the ``iter_NNNNNNN`` directory of ``--ckpt-step``), None if nothing."""
    requested: str = "no"
    load: str | None = None
    found: str | None = None

    @property
    def resumes(self) -> bool:
        if self.requested == "no" or self.load is None:
            return False
        return self.requested == "yes" or self.found is not None


def resume_of(namespace: Mapping[str, Any], requested: str = "auto") -> Resume:
    """The run's ``Resume``: ``requested`` as the user says it; under ``auto`` the ``--load``
    directory is read relative to the working directory, as Megatron reads it."""
    load = namespace.get("load")
    load = load if isinstance(load, str) and load else None
    if requested != "auto" or load is None:
        return Resume(requested, load)
    step = namespace.get("ckpt_step")
    found = None
    try:
        if os.path.isfile(os.path.join(load, TRACKER_FILE)):
            found = TRACKER_FILE
        elif isinstance(step, int) and os.path.isdir(os.path.join(load, f"iter_{step:07d}")):
            found = f"iter_{step:07d}"
    except (OSError, ValueError):
        found = None
    return Resume(requested, load, found)


@dataclass(frozen=True)
class RunContext:
    """The facts of one run that its Megatron flags do not say.

    ``gpu_compute_capability``: the compute capability of the GPU the user named (None: not
    named; checks and kernel choices that depend on the GPU run only when it is known; the
    workspaces' sizes assume ``Overheads.compute_capability``, Hopper by default).
    ``flash_attn``: the job's flash-attn version, ``"none"``, or None (>= 2.4.1 assumed).
    ``resume``: whether the run resumes from a checkpoint (``Resume``).
    ``job_environment``: the environment read is the launched job's own (``run``, launch
    scripts); for config files it is only the checking shell's, so environment rules are notes.
    ``launch_location``: file:line of a launch script's launch, where its environment applies.
    ``transformer_engine``: the job's Transformer Engine version (``run`` reads it from the job's
    package metadata); None: not known, and the rules on its version do not run.
    ``release``: the Megatron-LM release the run is checked against (a ``ChosenRelease``): the
    rules, the flag table and the release-dependent behaviour read it here and nowhere else.
    ``assumed_compute_capability``: when no GPU is named, the generation that the rules which
    depend on it assume (``Overheads.compute_capability``, Hopper by default); they say so."""
    gpu_compute_capability: float | None = None
    flash_attn: str | None = None
    resume: Resume = Resume()
    job_environment: bool = False
    launch_location: str | None = None
    transformer_engine: str | None = None
    release: ChosenRelease = DEFAULT_RELEASE
    assumed_compute_capability: float | None = None
