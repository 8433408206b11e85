"""Where the project's data files are, installed or in a source checkout.

The JSON Schemas live in the repository's top-level ``schemas/`` folder and are installed as
the package data folder ``megatron_estimator/schemas`` (setup.cfg maps one onto the other).

Plain ``os.path`` strings: ``pathlib`` (with ``urllib`` and ``ipaddress`` behind it) is not
imported on the start-up path of every estimate; ``data_path`` gives a ``Path`` for callers
that want one.
"""

from __future__ import annotations

import os

_PACKAGE = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))


def schema_file(name: str) -> str:
    installed = os.path.join(_PACKAGE, "schemas", name)
    if os.path.isfile(installed):
        return installed
    return os.path.join(os.path.dirname(_PACKAGE), "schemas", name)


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
