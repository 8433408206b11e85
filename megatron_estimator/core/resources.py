"""Where the project's data files are, installed or in a source checkout.

The JSON Schemas live in the repository's top-level ``schemas/`` folder and are installed as
the package data folder ``megatron_estimator/schemas`` (setup.cfg maps one onto the other).
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parents[1]


def schema_path(name: str) -> Path:
    installed = _PACKAGE / "schemas" / name
    if installed.is_file():
        return installed
    return _PACKAGE.parent / "schemas" / name


def data_path(*parts: str) -> Path:
    return _PACKAGE.joinpath("data", *parts)
