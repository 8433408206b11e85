"""The Megatron-LM releases the estimator knows, and the one a run is checked against.

``data/megatron_releases.tsv`` (written by ``scripts/megatron_releases``) lists the releases in
order, ``main`` last.  ``choose_release(text)`` maps a version string (``0.16``, ``0.16.1``,
``0.18.0rc2``, ``main``) to a known label: ``X.Y`` to that minor's newest known release, an
unknown patch or an rc/dev string to the nearest known release of its minor (with a warning);
anything else raises ``UnknownRelease`` naming the supported ones.

The release a run is checked against is part of its run context: each front chooses it once
(``inputs/release_choice.py``) and passes it to the readers (``megatron.flags.flag_table(label)``)
and to validation and the model (``RunContext.release``).  Nothing here is process state; a
caller that chooses none gets ``DEFAULT_RELEASE``, the newest supported release, ``main``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

from megatron_estimator.core.problems import InvalidInput, Problem
from megatron_estimator.core.resources import read_data_text, read_input_text

RELEASES_FILE = "megatron_releases.tsv"
NEWEST = "main"
ENV_VAR = "MEGATRON_ESTIMATOR_MEGATRON_VERSION"


@dataclass(frozen=True)
class Release:
    label: str          # "0.16.1" or "main"
    tag: str
    commit: str
    order: int

    @property
    def numbers(self) -> tuple[int, ...] | None:
        return None if self.label == NEWEST else tuple(int(x) for x in self.label.split("."))


@dataclass(frozen=True)
class ChosenRelease:
    """The release a run is checked against and how it was chosen."""

    version: str        # a label of megatron_releases.tsv
    source: str         # "--megatron-version", "megatron/core/package_info.py at ...", "default: ..."
    warning: str = ""   # set when the version asked for was mapped to a nearby release
    as_of: str = ""     # with "main": a main-branch commit of this day (YYYY-MM-DD), for behaviour

    def as_json(self) -> dict:
        out = {"version": self.version, "source": self.source}
        if self.as_of:
            out["as_of"] = self.as_of
        if self.warning:
            out["warning"] = self.warning
        return out


class UnknownRelease(InvalidInput, ValueError):
    """A version string that names no supported release: a ``ValueError`` whose text is the
    sentence, and an ``InvalidInput`` (one problem at ``location``) for the API's callers."""

    def __init__(self, message: str, location: str = "megatron version"):
        super().__init__([Problem("unknown-megatron-version", location, message)])
        self.args = (message,)

    def __str__(self) -> str:
        return self.args[0]


@cache
def releases() -> tuple[Release, ...]:
    rows = [line.split("\t") for line in read_data_text(RELEASES_FILE).splitlines()
            if line and not line.startswith("#")]
    return tuple(Release(label=r[0], tag=r[1], commit=r[2], order=int(r[4])) for r in rows[1:])


def labels() -> tuple[str, ...]:
    return tuple(r.label for r in releases())


def order_of(label: str) -> int:
    return labels().index(label)


def release(label: str) -> Release:
    return releases()[order_of(label)]


_VERSION = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?([.+-]?(?:rc|dev|a|b|post)[0-9a-z.+-]*)?\Z")


def _version_groups(text: str) -> tuple | None:
    found = _VERSION.match(text)
    return found.groups() if found else None


def choose_release(text: str, detected: bool = False) -> tuple[str, str]:
    """``(label, warning)`` for a version string; raises ``UnknownRelease``.  ``detected``: the
    version was read from a Megatron-LM tree or an installed megatron-core, not asked for: one
    newer than the newest release is a main-branch checkout (main's package_info.py names the
    next release: 0.20.0 at d98e8a64), checked as main with a warning."""
    text = text.strip()
    if text.lower() == NEWEST or text[:len("core_v")] == "core_v" and text[6:] in labels():
        return (NEWEST if text.lower() == NEWEST else text[6:]), ""
    found = _version_groups(text)
    supported = ", ".join(labels())
    if not found:
        raise UnknownRelease(f"{text!r} is not a Megatron version (supported: {supported})")
    major, minor = int(found[0]), int(found[1])
    patch = None if found[2] is None else int(found[2])
    suffix = found[3] or ""
    same_minor = [r for r in releases() if r.numbers and r.numbers[:2] == (major, minor)]
    if not same_minor:
        newest = max((r for r in releases() if r.numbers), key=lambda r: r.numbers)
        if (major, minor) > newest.numbers[:2] and suffix:
            # a development version after the newest release: the main branch
            return NEWEST, f"Megatron {text} is a development version; checked as main ({release(NEWEST).tag})"
        if (major, minor) > newest.numbers[:2] and detected:
            return NEWEST, (f"Megatron {text} is newer than {newest.label}, the newest release the estimator "
                            f"knows (a main-branch checkout names the next release); checked as main "
                            f"({release(NEWEST).tag})")
        oldest = min((r for r in releases() if r.numbers), key=lambda r: r.numbers)
        if (major, minor) < oldest.numbers[:2]:
            raise UnknownRelease(f"Megatron {text} is not a supported release: it is older than {oldest.label}, the "
                                 f"oldest the estimator supports (supported: {supported})")
        raise UnknownRelease(f"Megatron {text} is not a supported release (supported: {supported})")
    if patch is not None and not suffix:
        exact = [r for r in same_minor if r.numbers[2] == patch]
        if exact:
            return exact[0].label, ""
    nearest = min(same_minor, key=lambda r: (abs(r.numbers[2] - (patch or 0)), -r.numbers[2])) \
        if patch is not None else same_minor[-1]
    if patch is None and not suffix:
        return nearest.label, ""
    return nearest.label, f"Megatron {text} is not a release the estimator knows; checked as {nearest.label}"


# -- the default -------------------------------------------------------------------------------
# A release is never process state: every lookup is given the release it answers for (the run
# context's ``release``, config/run_context.py).  A caller that chooses none checks against main.

DEFAULT_RELEASE = ChosenRelease(NEWEST, "default: the newest supported release (none was detected or given)")


def default_release() -> ChosenRelease:
    """The release checked against when none is chosen (``main``, saying so)."""
    return DEFAULT_RELEASE


def release_of(text: str, source: str, detected: bool = False) -> ChosenRelease:
    label, warning = choose_release(text, detected)
    return ChosenRelease(label, source, warning)


# -- detection without importing Megatron -----------------------------------------------------

_PACKAGE_INFO = re.compile(r"^(MAJOR|MINOR|PATCH|PRE_RELEASE)\s*=\s*(['\"]?)([^'\"\n#]*)\2", re.MULTILINE)


def read_package_info(path: str) -> str | None:
    """The version ``megatron/core/package_info.py`` states (``0.16.1``, ``0.18.0rc0``), read as
    text; None when the file is absent or says no version."""
    try:
        text = read_input_text(path, "python")
    except (OSError, UnicodeDecodeError):
        return None
    values = {m.group(1): m.group(3).strip() for m in _PACKAGE_INFO.finditer(text)}
    if not {"MAJOR", "MINOR", "PATCH"} <= set(values):
        return None
    return f"{values['MAJOR']}.{values['MINOR']}.{values['PATCH']}{values.get('PRE_RELEASE', '')}"


def package_info_in_tree(directory: str) -> str | None:
    """``megatron/core/package_info.py`` under ``directory`` when there is one."""
    import os
    path = os.path.join(directory, "megatron", "core", "package_info.py")
    return path if os.path.isfile(path) else None


def installed_megatron_core(path: list[str] | None = None) -> str | None:
    """The installed megatron-core's version from its metadata (never imported): the first
    ``megatron_core-*.dist-info`` (or ``.egg-info``) on ``path`` (default ``sys.path``), its
    ``METADATA`` / ``PKG-INFO`` ``Version:`` header, which is how ``importlib.metadata.version``
    finds a path distribution (``core.distributions.find_distribution``, ``os`` alone)."""
    from megatron_estimator.core.distributions import find_distribution

    found = find_distribution(("megatron-core",), path)
    return found[0] if found else None


# -- NGC NeMo containers ----------------------------------------------------------------------

NEMO_CONTAINERS_FILE = "nemo_containers.tsv"
_NEMO_TAG = re.compile(r"nvcr\.io/nvidia/nemo:(\d{2}\.\d{2})([0-9A-Za-z._-]*)")


@cache
def nemo_containers() -> dict[str, tuple[str, str]]:
    """``{"25.09": (what the table says, version string to choose)}`` from ``nemo_containers.tsv``."""
    rows = [line.split("\t") for line in read_data_text(NEMO_CONTAINERS_FILE).splitlines()
            if line and not line.startswith("#")]
    return {r[0]: (r[1], r[2]) for r in rows[1:]}


def nemo_tags(text: str, display: str) -> list[tuple[str, str]]:
    """``[(image, "display:LINE")]``: each NeMo container image a launch script or command names,
    outside comments other than ``#SBATCH`` lines."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.lstrip()
        if stripped.startswith("#") and not stripped.startswith("#SBATCH"):
            continue
        if "nvcr.io/nvidia/nemo:" not in line:     # what a match starts with: re is not needed
            continue
        for match in _NEMO_TAG.finditer(line):
            found.append((match.group(0), f"{display}:{number}"))
    return found


def nemo_container_release(found: list[tuple[str, str]]) -> tuple[ChosenRelease | None, str]:
    """The release the NeMo container images ``found`` (``nemo_tags``) hold, by
    ``nemo_containers.tsv``, and a warning; None when there is none, when a tag is not in the
    table, or when the images disagree."""
    if not found:
        return None, ""
    table = nemo_containers()
    chosen: dict[str, tuple[str, str]] = {}
    for image, where in found:
        tag = _NEMO_TAG.match(image).group(1)
        if tag not in table:
            known = ", ".join(table)
            return None, (f"{where}: {image} is a NeMo container whose Megatron-LM release the estimator "
                          f"does not know (known tags: {known}); not used")
        label, _warning = choose_release(table[tag][1])
        chosen.setdefault(label, (image, where))
    if len(chosen) > 1:
        named = "; ".join(f"{image} ({where})" for image, where in chosen.values())
        return None, f"the launch names NeMo containers of different Megatron-LM releases: {named}; none used"
    label, (image, where) = next(iter(chosen.items()))
    tag = _NEMO_TAG.match(image).group(1)
    said, as_checked = table[tag]
    release_label, warning = choose_release(as_checked)
    warning = (f"the NeMo container {image} holds Megatron {said}; checked as {release_label}"
               if warning else "")
    return ChosenRelease(release_label, f"NeMo container {image} at {where}", warning), ""
