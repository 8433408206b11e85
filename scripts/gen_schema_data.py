"""Regenerate megatron_estimator/config/schema_data.py from schemas/config.schema.json.

    python scripts/gen_schema_data.py

The configuration schema is checked on every estimate; as a Python literal it loads from the
module's bytecode, without importing ``json`` (which imports ``re``) at start-up.  The JSON file
stays the source: tests/test_schema_data.py fails when the module is not its copy.
"""

from __future__ import annotations

import json
import pprint
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "schemas" / "config.schema.json"
TARGET = ROOT / "megatron_estimator" / "config" / "schema_data.py"

HEADER = '''"""schemas/config.schema.json as a Python literal (written by scripts/gen_schema_data.py; do not
edit: edit the JSON file and rerun the script).  config/schema.py loads it without ``json``."""

'''


def render() -> str:
    schema = json.loads(SOURCE.read_text(encoding="utf-8"))
    return HEADER + "CONFIG_SCHEMA = " + pprint.pformat(schema, width=110, sort_dicts=False) + "\n"


def main() -> int:
    TARGET.write_text(render(), encoding="utf-8")
    print(f"wrote {TARGET.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
