"""Where ``--hf-config`` finds its config.json text: a local file or directory, an inline JSON
object, or a HuggingFace hub model id.

The argument's form is decided by these rules, in order; the first that applies wins:

1. an existing file, or an existing directory (its ``config.json``): read locally (a
   ``pathlib.Path`` or other ``os.PathLike`` is always a path);
2. text starting with ``{`` (after blanks): the JSON object itself, located as
   ``<inline>:LINE key``;
3. ``OWNER/NAME`` or ``OWNER/NAME@REVISION``: the ``config.json`` of that model repository on
   the hub, through ``huggingface_hub.hf_hub_download`` (its cache, ``HF_HOME`` /
   ``HF_HUB_CACHE``, ``HF_HUB_OFFLINE`` and token apply), located as
   ``OWNER/NAME[@REVISION]/config.json:LINE key``.  OWNER and NAME are spelled as the hub
   spells repository ids (``huggingface_hub/utils/_validators.py``, ``validate_repo_id``):
   letters, digits, ``-``, ``_`` and ``.``, neither starting nor ending with ``-`` or ``.``,
   no ``--`` or ``..``, 96 characters at most; a NAME ending in ``.json`` is taken as a
   missing file, and a single NAME (legacy ids such as ``gpt2``) is not looked up;
4. anything else: one problem, ``hf-config-not-found``.

``read_hf_source`` never raises on bad input and imports ``huggingface_hub`` only for a hub id.
"""

from __future__ import annotations

import os

from megatron_estimator.core.problems import Problem
from megatron_estimator.core.resources import read_input_text

INLINE = "<inline>"

_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")
_INSTALL = "pip install 'megatron-estimator[hub]'"


def read_hf_source(value: str | os.PathLike) -> tuple[str | None, str, Problem | None]:
    """(config.json text, the source its locations name, None), or (None, source, the problem)."""
    if isinstance(value, os.PathLike):
        return _read_local(os.fspath(value))
    if os.path.exists(value):
        return _read_local(value)
    if value.lstrip().startswith("{"):
        return value, INLINE, None
    repo_id, revision = hub_model_id(value)
    if repo_id is None:
        return None, value, Problem(
            "hf-config-not-found", value,
            "no such file or directory, and not a HuggingFace hub model id OWNER/NAME[@REVISION]; give a "
            "config.json, the directory holding one, an inline JSON object {...} or a hub model id",
        )
    return _read_hub(repo_id, revision)


def hub_model_id(value: str) -> tuple[str | None, str | None]:
    """(``OWNER/NAME``, revision or None) when ``value`` is spelled as a hub model id (rule 3
    above), else (None, None)."""
    repo_id, at, revision = value.partition("@")
    if at and (not revision or any(char.isspace() for char in revision)):
        return None, None
    parts = repo_id.split("/")
    if len(parts) != 2 or len(repo_id) > 96 or parts[1].lower().endswith(".json"):
        return None, None
    for part in parts:
        if (not part or not set(part) <= _NAME_CHARS or part[0] in "-." or part[-1] in "-."
                or "--" in part or ".." in part):
            return None, None
    return repo_id, (revision if at else None)


def _read_local(given: str) -> tuple[str | None, str, Problem | None]:
    file = os.path.join(given, "config.json") if os.path.isdir(given) else given
    if not os.path.exists(file):
        if os.path.isdir(given):
            message = f"no config.json in directory {given}"
        else:
            message = f"no such file: {given} (give a config.json or the directory holding it)"
        return None, file, Problem("hf-config-not-found", given, message)
    try:
        return read_input_text(file, "hf-config", bom=True), file, None
    except UnicodeDecodeError as error:
        return None, file, Problem("hf-config-unreadable", file, f"not UTF-8 text: {error}")
    except OSError as error:
        return None, file, Problem("hf-config-unreadable", file, f"cannot read: {error.strerror or error}")


def _read_hub(repo_id: str, revision: str | None) -> tuple[str | None, str, Problem | None]:
    shown = repo_id if revision is None else f"{repo_id}@{revision}"
    source = f"{shown}/config.json"
    fallback = "or download its config.json and give the file's path"
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        return None, source, Problem(
            "hf-hub-unavailable", shown,
            f"a HuggingFace hub model id (not a local path), and reading it needs huggingface_hub, which is "
            f"not installed: {_INSTALL}, {fallback}",
        )
    try:
        path = hf_hub_download(repo_id, "config.json", revision=revision)
    except Exception as error:  # the hub client's errors differ across its releases: sorted by name below
        return None, source, Problem(*_hub_problem(error, shown, fallback))
    text, _, problem = _read_local(path)
    return text, source, problem


def _hub_problem(error: Exception, shown: str, fallback: str) -> tuple[str, str, str]:
    """(code, location, message) for an error of ``hf_hub_download``, by its class's name (the
    same names from huggingface_hub 0.x to 2.x; LocalEntryNotFoundError subclasses
    EntryNotFoundError, GatedRepoError RepositoryNotFoundError, hence the order)."""
    names = {cls.__name__ for cls in type(error).__mro__}
    if "LocalEntryNotFoundError" in names or "OfflineModeIsEnabled" in names:
        if _hub_offline():
            why = "HF_HUB_OFFLINE is set and the model's config.json is not in the HuggingFace cache"
        else:
            why = "the hub cannot be reached and the model's config.json is not in the HuggingFace cache"
        return "hf-hub-unavailable", shown, f"{why} (HF_HOME / HF_HUB_CACHE): fetch it once where the hub is " \
                                            f"reachable, {fallback}"
    if "GatedRepoError" in names:
        return "hf-hub-not-found", shown, "a gated repository: accept its terms on the hub and " \
                                          f"log in (hf auth login or HF_TOKEN), {fallback}"
    if "RepositoryNotFoundError" in names:
        return "hf-hub-not-found", shown, "no such file or directory, and no model repository " \
                                          f"{shown.partition('@')[0]} on the HuggingFace hub (or it is private: " \
                                          "log in with hf auth login or HF_TOKEN)"
    if "RevisionNotFoundError" in names:
        return "hf-hub-not-found", shown, "no such revision in the repository"
    if "EntryNotFoundError" in names:
        return "hf-hub-not-found", shown, "the repository has no config.json"
    first_line = str(error).strip().split("\n", 1)[0]
    return "hf-hub-unavailable", shown, "cannot fetch the model's config.json: " \
                                        f"{type(error).__name__}: {first_line}; {fallback}"


def _hub_offline() -> bool:
    try:
        from huggingface_hub import constants
    except ImportError:
        return False
    return bool(getattr(constants, "HF_HUB_OFFLINE", False))
