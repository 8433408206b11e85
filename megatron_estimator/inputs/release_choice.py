"""Which Megatron-LM release a run is checked against, from what its launch and environment say.

``choose_megatron_release`` (the order: a version given, the launched Megatron-LM tree's
``megatron/core/package_info.py`` or one on ``PYTHONPATH``, the ``megatron-version`` setting, a
NeMo container tag, for ``run`` the installed megatron-core's metadata, else ``main``) and
``launched_tree_release`` (the tree of the entry script a launch script runs, for ``check``).
Everything is read as text; nothing of Megatron is imported.  ``api`` re-exports both.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any, Mapping, Sequence
from megatron_estimator.core.resources import read_input_text


def choose_megatron_release(given: str | None = None, environ: Mapping[str, str] | None = None, *,
                            launch: Sequence[str] | None = None, setting: tuple[str, str] | None = None,
                            given_source: str = "--megatron-version", environment_is_jobs: bool = False):
    """The Megatron release a run is checked against (a ``ChosenRelease``), first match wins:
    ``given`` (``--megatron-version``); the setting (``setting``, else
    ``$MEGATRON_ESTIMATOR_MEGATRON_VERSION``); ``megatron/core/package_info.py`` of the
    Megatron-LM tree that holds a launched ``*.py`` of ``launch`` (or of a ``PYTHONPATH``
    entry); with ``environment_is_jobs`` only (``run``: the checking environment is the job's),
    the installed megatron-core's metadata; a NeMo container tag (``nvcr.io/nvidia/nemo:YY.MM``)
    in ``launch`` or in a launch script it names, by ``data/nemo_containers.tsv``; else the
    newest supported release.  Without ``environment_is_jobs`` the installed megatron-core is
    not consulted, so the API, tests and calibration stay deterministic.  The caller passes the
    answer on to the readers and to ``evaluate`` (``TrainingInput.release``).  Raises ``ValueError``
    (``UnknownRelease``) naming the supported releases.  ``given_source`` names where
    ``given`` came from (the pytest fixture's argument or option)."""
    from megatron_estimator.megatron.releases import (
        ENV_VAR, default_release, installed_megatron_core, nemo_container_release, read_package_info, release_of)

    environ = os.environ if environ is None else environ
    chosen, notes = None, []
    if given:
        chosen = release_of(given, given_source)
    if chosen is None and setting is not None:          # (value, source) of the settings
        chosen = release_of(*setting)
    elif chosen is None and environ.get(ENV_VAR):
        chosen = release_of(environ[ENV_VAR], ENV_VAR)
    if chosen is None:
        for path in _package_info_candidates(launch or (), environ):
            version = read_package_info(path)
            if version:
                chosen = release_of(version, path, detected=True)
                break
    if chosen is None and environment_is_jobs:
        from megatron_estimator.core.distributions import job_path

        version = installed_megatron_core(job_path(environ))
        try:
            chosen = release_of(version, f"the checking environment's megatron-core {version} "
                                         "(its installed metadata)", detected=True) if version else None
        except ValueError as error:     # detection, not a request: fall through, saying why
            notes.append(f"the checking environment's megatron-core is not used: {error}")
    if chosen is None and launch:
        chosen, note = nemo_container_release(_nemo_tags_of(launch))
        notes += [note] if note else []
    if chosen is not None and notes:
        chosen = replace(chosen, warning="; ".join(([chosen.warning] if chosen.warning else []) + notes))
    elif chosen is None and notes:
        chosen = replace(default_release(), warning="; ".join(notes))
    return chosen if chosen is not None else default_release()


def _nemo_tags_of(launch: Sequence[str]) -> list:
    """The NeMo container images a launch command names, and those in the files it names."""
    from megatron_estimator.megatron.releases import nemo_tags

    tokens = [t for t in launch if isinstance(t, str)]
    found = nemo_tags("\n".join(tokens), "the launch command") if tokens else []
    found = [(image, "the launch command") for image, _where in found]
    for token in tokens:
        if token.endswith(".py") or not os.path.isfile(token):
            continue
        try:
            if os.path.getsize(token) > (1 << 20):
                continue
            found += nemo_tags(read_input_text(token, "script"), token)
        except (OSError, UnicodeDecodeError):
            continue
    return found


def _package_info_candidates(launch: Sequence[str], environ: Mapping[str, str]):
    from megatron_estimator.megatron.releases import package_info_in_tree

    seen = set()
    for token in launch:
        if not isinstance(token, str) or not token.endswith(".py"):
            continue
        directory = os.path.dirname(os.path.abspath(token))
        for _ in range(3):                       # the script's folder and two above (examples/x/)
            if directory not in seen:
                seen.add(directory)
                found = package_info_in_tree(directory)
                if found:
                    yield found
            directory = os.path.dirname(directory)
    for entry in environ.get("PYTHONPATH", "").split(os.pathsep):
        if entry and entry not in seen:
            seen.add(entry)
            found = package_info_in_tree(entry)
            if found:
                yield found


def launched_tree_release(inp: Any):
    """``check`` of a launch script: the release (a ``ChosenRelease``) of the Megatron-LM tree
    that holds the entry script it launches (``inp.entry``, a path after expansion, found under
    ``inp.entry_dirs``: the working directory the script's ``cd`` leaves, then the checking
    shell's and the script's own directory; or absolute), else of a tree on the ``PYTHONPATH``
    the launch exports to the job, by that tree's ``megatron/core/package_info.py``; None when
    there is none.  Raises ``UnknownRelease`` (a ``ValueError``) naming the tree's
    ``package_info.py`` when the release it states is not supported."""
    from megatron_estimator.inputs.entry_script import find_script_file
    from megatron_estimator.megatron.releases import read_package_info, release_of

    entry = getattr(inp, "entry", None)
    if entry is None or entry.is_module:
        return None
    path = entry.path or find_script_file(entry.script, False, getattr(inp, "entry_dirs", ()))
    # The entry script's own tree first; else a tree on the PYTHONPATH the launch gives the job
    # (Pai-Megatron-Patch exports backends/megatron/Megatron-LM-YYMMDD), not the checking shell's;
    # that one also where the entry script is not on this machine.
    job_path = {"PYTHONPATH": str((getattr(inp, "environment", None) or {}).get("PYTHONPATH") or "")}
    for found in _package_info_candidates([path] if path is not None else [], job_path):
        version = read_package_info(found)
        if version:
            whose = f"the Megatron-LM tree of {entry.script} at {entry.location}" if not _under_path(found, job_path) \
                else f"a Megatron-LM tree on the PYTHONPATH the launch at {entry.location} gives the job"
            try:
                return release_of(version, f"{found} ({whose})", detected=True)
            except ValueError as error:     # UnknownRelease: said with where the tree is
                raise type(error)(f"{found} ({whose}) says: {error}") from None
    return None


def _under_path(found: str, environ: Mapping[str, str]) -> bool:
    return any(entry and found.startswith(os.path.join(entry, "megatron"))
               for entry in environ.get("PYTHONPATH", "").split(os.pathsep))
