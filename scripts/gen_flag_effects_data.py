"""Regenerate megatron_estimator/megatron/flag_effects_data.py from data/flag_effects.tsv and
data/flag_effect_categories.tsv.

    python scripts/gen_flag_effects_data.py

Every estimate reads the flag-effect tables (megatron/flag_effects.py); as Python literals they
load from the module's bytecode instead of 900 rows parsed at every start.  The TSV files stay
the source (edit them, then rerun this script): ``flag_effects._load`` checks and reads them
here, and tests/test_flag_effects.py fails when the module is not their copy.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET = ROOT / "megatron_estimator" / "megatron" / "flag_effects_data.py"

HEADER = '''"""data/flag_effects.tsv and data/flag_effect_categories.tsv as Python literals (written by
scripts/gen_flag_effects_data.py; do not edit: edit the TSV files and rerun the script).
megatron/flag_effects.py loads its tables from here."""

'''


def render() -> str:
    sys.path.insert(0, str(ROOT))
    from megatron_estimator.megatron.flag_effects import _load

    categories, modelled, not_modelled, no_memory_effect = _load()
    parts = [HEADER]
    for name, value in (("CATEGORIES", dict(categories)), ("MODELLED", tuple(sorted(modelled))),
                        ("NOT_MODELLED", dict(not_modelled)), ("NO_MEMORY_EFFECT", dict(no_memory_effect))):
        if isinstance(value, dict):
            items, brackets = [f"{k!r}: {v!r}" for k, v in value.items()], "{}"
        else:
            items, brackets = [repr(v) for v in value] + [""], "()"   # a trailing comma
        parts.append(f"{name} = {brackets[0]}" + _packed(items) + f"{brackets[1]}\n")
    return "".join(parts)


def _packed(items: list[str], width: int = 110) -> str:
    """Items joined by ", ", as many to a line as fit in ``width`` (one alone when longer)."""
    lines, line = [], ""
    for item in items:
        if line and len(line) + 2 + len(item) > width - 4:
            lines.append(line + ",")
            line = item
        else:
            line = f"{line}, {item}" if line else item
    lines.append(line)
    return "\n    ".join(lines)


def main() -> int:
    TARGET.write_text(render(), encoding="utf-8")
    print(f"wrote {TARGET.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
