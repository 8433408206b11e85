"""Installed Python distributions, found by their metadata read as text (never imported).

``find_distribution(names, path)`` looks through the folders of ``path`` (a ``sys.path``) in
order for a ``NAME-VERSION.dist-info`` or ``NAME[-VERSION...].egg-info`` whose normalized name
is one of ``names`` and returns its ``Version:`` header (``METADATA`` / ``PKG-INFO``) and its
folder: the distribution ``importlib.metadata`` would find first.  It reads the folders with ``os``.
``job_path(environ)`` is the path a job's interpreter searches: its ``PYTHONPATH`` entries, then
this interpreter's ``sys.path`` (its site-packages).
"""

from __future__ import annotations

import os
import re
import sys
from megatron_estimator.core.resources import read_input_text

from typing import Iterable, Mapping, Sequence



# NAME[-VERSION[-REST]].dist-info / .egg-info, as importlib.metadata's folders are named.
_METADATA_FOLDER = re.compile(r"(?P<name>[A-Za-z0-9][A-Za-z0-9._]*?)(?:-(?P<version>[^-]+?)(?:-[^/]*)?)?"
                              r"\.(?P<kind>dist-info|egg-info)\Z", re.IGNORECASE)


def normalized(name: str) -> str:
    """``Flash-Attn`` -> ``flash_attn``: a distribution name as its metadata folders spell it
    (each run of '-', '_' and '.' becomes one '_')."""
    return re.sub(r"[-_.]+", "_", name).lower()


def metadata_folder_name(entry: str) -> tuple[str, str] | None:
    """``(name, kind)`` of a metadata folder's name ``NAME[-VERSION[-REST]].dist-info`` /
    ``.egg-info`` (kind case-blind), else None."""
    found = _METADATA_FOLDER.match(entry)
    return (found.group("name"), found.group("kind").lower()) if found else None


def job_path(environ: Mapping[str, str] | None = None) -> list[str]:
    """The folders a job's interpreter searches: ``$PYTHONPATH`` of ``environ``, then ``sys.path``."""
    entries = [e for e in (environ or {}).get("PYTHONPATH", "").split(os.pathsep) if e]
    return entries + [e for e in sys.path if e not in entries]


def _version_in(folder: str, kind: str) -> str | None:
    meta = os.path.join(folder, "METADATA" if kind.lower() == "dist-info" else "PKG-INFO")
    try:
        # the headers come first: a long description past the first MiB is never read
        for line in read_input_text(meta, "metadata", head=1 << 20).splitlines(keepends=True):
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
            if not line.strip():
                break       # the headers end at the first blank line
    except (OSError, UnicodeDecodeError):
        return None
    return None


def find_distribution(names: Iterable[str], path: Sequence[str] | None = None) -> tuple[str, str] | None:
    """``(version, metadata folder)`` of the first distribution on ``path`` (default
    ``sys.path``) named one of ``names``; None when there is none."""
    return find_distributions({"one": tuple(names)}, path)["one"]


def find_distributions(wanted: Mapping[str, Iterable[str]],
                       path: Sequence[str] | None = None) -> dict[str, tuple[str, str] | None]:
    """``find_distribution`` for several packages at once (``{key: names}``), listing each
    folder of ``path`` once."""
    keys = {normalized(n): key for key, names in wanted.items() for n in names}
    found: dict[str, tuple[str, str] | None] = {key: None for key in wanted}
    for entry in (sys.path if path is None else path):
        if all(found.values()):
            break
        try:
            names = sorted(os.listdir(entry or "."))
        except OSError:
            continue
        for name in names:
            if not name.endswith(("-info", "-INFO")):
                continue
            parsed = metadata_folder_name(name)
            key = keys.get(normalized(parsed[0])) if parsed else None
            if key is None or found[key] is not None:
                continue
            folder = os.path.join(entry or ".", name)
            version = _version_in(folder, parsed[1])
            if version:
                found[key] = (version, folder)
    return found
