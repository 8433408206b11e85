"""The quick schema check (core/plain_schema.py) says "valid" only where jsonschema does.

Every leaf of the bundled seed YAML examples is replaced in turn by values of other types,
out of range and off the choices, and every key is dropped and one is added; wherever the quick
check answers "valid", jsonschema (the reference implementation) must find no error.  The
bundled examples themselves must be answered "valid" quickly, or the quick path saves nothing.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from megatron_estimator.core.plain_schema import plainly_valid

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((ROOT / "schemas" / "seed-config.schema.json").read_text(encoding="utf-8"))
SAMPLES = [None, True, False, 0, 1, 2, -1, 1.0, 0.5, "", "x", "bf16", "core_attn", [], [0], [1, 0], [2],
           ["core_attn"], ["core_attn", "core_attn"], [True], {}, {"a": 1}]


def seed_examples() -> list[Path]:
    found = []
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        if isinstance(doc, dict) and "world_size" in doc and "model" in doc:
            found.append(path)
    return found


def variants(doc: dict):
    yield doc
    for section, body in doc.items():
        trimmed = {k: v for k, v in doc.items() if k != section}
        yield trimmed
        yield {**doc, "extra_section": {}}
        if not isinstance(body, dict):
            for sample in SAMPLES:
                yield {**doc, section: sample}
            continue
        for key in body:
            yield {**doc, section: {k: v for k, v in body.items() if k != key}}
            for sample in SAMPLES:
                changed = copy.deepcopy(doc)
                changed[section][key] = sample
                yield changed
        yield {**doc, section: {**body, "unknown_key": 1}}
        for sample in SAMPLES:
            yield {**doc, section: sample}


@pytest.mark.parametrize("path", seed_examples(), ids=lambda p: p.name)
def test_quick_check_agrees_with_jsonschema(path):
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    validator = jsonschema.Draft202012Validator(SCHEMA)
    assert plainly_valid(doc, SCHEMA)          # the bundled example takes the quick path
    checked = 0
    for variant in variants(doc):
        if plainly_valid(variant, SCHEMA):
            assert list(validator.iter_errors(variant)) == [], variant
        checked += 1
    assert checked > 100


def test_quick_check_leaves_json_equality_to_jsonschema():
    # JSON Schema tells true from 1 in an enum and in uniqueItems; Python's == does not.
    assert not plainly_valid(True, {"enum": [0, 1]})
    assert plainly_valid(1, {"enum": [0, 1]})
    assert not plainly_valid([1, 1.0], {"uniqueItems": True})
    assert not plainly_valid(3, {"not": {"type": "string"}})      # a keyword it does not know
    assert not plainly_valid(1, {"oneOf": [{"type": "integer"}, {"minimum": 0}]})  # both match


def test_compiled_checks_answer_as_plainly_valid():
    # config/schema.py compiles each config.schema.json property into one function; it must
    # answer as plainly_valid does, for values of every type, at and around each bound and choice.
    from megatron_estimator.config.schema import compiled_check, load_schema

    properties = load_schema("config.schema.json")["properties"]
    values = [None, True, False, 0, 1, -1, 2, 7, 1 << 40, 0.0, 0.5, 1.0, -0.5, 2.0, float("inf"), float("nan"),
              "", "x", "1", "core_attn", "flash", [], [0], [1, 0], ["mlp"], ["mlp", "mlp"], {}, (1,)]
    for schema in properties.values():
        for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            if key in schema:
                bound = schema[key]
                values += [bound, bound - 1, bound + 1, float(bound), bound - 0.5, bound + 0.5]
        for choice in schema.get("enum", ()):
            values += [choice, str(choice), choice if not isinstance(choice, str) else choice.upper()]
    compared = 0
    for dest, schema in properties.items():
        check = compiled_check(schema, dest)
        for value in values:
            assert check(value) == plainly_valid(value, schema), (dest, value)
            compared += 1
    assert compared > 10_000
