"""What ``pip install .`` puts in place: every package folder of the source tree is listed in
setup.cfg's ``packages`` (an unlisted one installs without its modules, and the installed tool
fails on the first input that needs them)."""

from __future__ import annotations

import configparser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_setup_cfg_lists_every_package_folder():
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    listed = {line.strip() for line in parser["options"]["packages"].splitlines() if line.strip()}
    folders = {".".join(init.parent.relative_to(ROOT).parts)
               for init in (ROOT / "megatron_estimator").rglob("__init__.py")}
    assert folders - listed == set(), "add these to setup.cfg [options] packages"


def test_package_data_ships_every_data_file():
    # The schemas, the GPU catalog and the flag tables are read at run time from
    # megatron_estimator/data and schemas/ (installed as megatron_estimator/schemas): each file
    # there must match a setup.cfg [options.package_data] pattern, or an installed tool lacks it.
    import fnmatch

    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    data = parser["options.package_data"]
    globs = {package: [g.strip() for g in data[package].splitlines() if g.strip()] for package in data}
    shipped = [("megatron_estimator", path.relative_to(ROOT / "megatron_estimator"))
               for path in (ROOT / "megatron_estimator" / "data").rglob("*") if path.is_file()]
    shipped += [("megatron_estimator.schemas", path.relative_to(ROOT / "schemas"))
                for path in (ROOT / "schemas").glob("*.json")]
    assert ("megatron_estimator", Path("data/gpus.tsv")) in shipped
    missing = [f"{package}: {rel}" for package, rel in shipped
               if "__pycache__" not in rel.parts
               and not any(fnmatch.fnmatch(rel.as_posix(), g) for g in globs.get(package, []))]
    assert missing == [], "add these to setup.cfg [options.package_data]"
