"""Where the project's data files are, installed or in a source checkout.

The JSON Schemas live in the repository's top-level ``schemas/`` folder and are installed as
the package data folder ``megatron_estimator/schemas`` (setup.cfg maps one onto the other).

Plain ``os.path`` strings: ``pathlib`` (with ``urllib`` and ``ipaddress`` behind it) is not
imported on the start-up path of every estimate; ``data_path`` gives a ``Path`` for callers
that want one.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache

_PACKAGE = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))


def schema_file(name: str) -> str:
    installed = os.path.join(_PACKAGE, "schemas", name)
    if os.path.isfile(installed):
        return installed
    return os.path.join(os.path.dirname(_PACKAGE), "schemas", name)


@lru_cache(maxsize=None)
def load_schema(name: str) -> dict:
    """A JSON Schema file of schemas/, read once per process."""
    with open(schema_file(name), encoding="utf-8") as f:
        return json.load(f)


@lru_cache(maxsize=None)
def schema_validator(name: str):
    """One jsonschema validator per schema file, built once per process."""
    import jsonschema

    schema = load_schema(name)
    return jsonschema.validators.validator_for(schema)(schema)


def data_file(*parts: str) -> str:
    return os.path.join(_PACKAGE, "data", *parts)


def read_data_text(*parts: str) -> str:
    with open(data_file(*parts), encoding="utf-8") as f:
        return f.read()


def schema_path(name: str):
    from pathlib import Path

    return Path(schema_file(name))


def data_path(*parts: str):
    from pathlib import Path

    return Path(data_file(*parts))


def path_string(path) -> str:
    """``str(pathlib.Path(path))`` without pathlib: "" is ".", repeated slashes, "." parts and
    trailing slashes go, a leading "//" (exactly two) stays, ".." stays.  The file checks on
    the start-up paths test this string with ``os.path``, so they answer as ``Path`` did
    (``Path("file.yaml/").exists()`` is True, ``os.path.exists("file.yaml/")`` is not)."""
    text = os.fspath(path)
    root = ""
    if text.startswith("/"):
        root = "//" if text.startswith("//") and not text.startswith("///") else "/"
    return (root + "/".join(part for part in text.split("/") if part and part != ".")) or "."


def path_suffix(path) -> str:
    """``pathlib.Path(path).suffix``: the last part's final ".xxx", "" when it has none or the
    part starts or ends with that dot."""
    name = path_string(path).rsplit("/", 1)[-1]
    if name in (".", ".."):
        return ""
    dot = name.rfind(".")
    return name[dot:] if 0 < dot < len(name) - 1 else ""
