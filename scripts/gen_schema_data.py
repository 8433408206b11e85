"""Regenerate megatron_estimator/config/schema_data.py from schemas/config.schema.json and
megatron_estimator/inputs/seed_schema_data.py from schemas/seed-config.schema.json.

    python scripts/gen_schema_data.py

The configuration schema is checked on every estimate, the seed schema on every seed YAML
file; as Python literals they load from the modules' bytecode, without importing ``json``
(which imports ``re``) at start-up.  The JSON files stay the source: tests/test_schema_data.py
fails when a module is not its copy.
"""

from __future__ import annotations

import json
import pprint
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "schemas" / "config.schema.json"
TARGET = ROOT / "megatron_estimator" / "config" / "schema_data.py"
SEED_SOURCE = ROOT / "schemas" / "seed-config.schema.json"
SEED_TARGET = ROOT / "megatron_estimator" / "inputs" / "seed_schema_data.py"

HEADER = '''"""schemas/config.schema.json as a Python literal (written by scripts/gen_schema_data.py; do not
edit: edit the JSON file and rerun the script).  config/schema.py loads it without ``json``."""

'''


def render() -> str:
    schema = json.loads(SOURCE.read_text(encoding="utf-8"))
    return HEADER + "CONFIG_SCHEMA = " + pprint.pformat(schema, width=110, sort_dicts=False) + "\n"


SEED_HEADER = '''"""schemas/seed-config.schema.json as a Python literal (written by scripts/gen_schema_data.py; do
not edit: edit the JSON file and rerun the script).  inputs/seed_yaml.py loads it without ``json``."""

'''


def render_seed() -> str:
    schema = json.loads(SEED_SOURCE.read_text(encoding="utf-8"))
    return SEED_HEADER + "SEED_SCHEMA = " + pprint.pformat(schema, width=110, sort_dicts=False) + "\n"


def main() -> int:
    for target, text in ((TARGET, render()), (SEED_TARGET, render_seed())):
        target.write_text(text, encoding="utf-8")
        print(f"wrote {target.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
