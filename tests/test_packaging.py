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
