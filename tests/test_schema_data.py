"""config/schema_data.py is schemas/config.schema.json and inputs/seed_schema_data.py is
schemas/seed-config.schema.json, key order included (they are loaded in place of the JSON files
at start-up; scripts/gen_schema_data.py writes them)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from megatron_estimator.config.schema import load_schema
from megatron_estimator.config.schema_data import CONFIG_SCHEMA
from megatron_estimator.inputs.seed_schema_data import SEED_SCHEMA
from megatron_estimator.inputs.seed_yaml import SEED_SCHEMA_PATH, seed_schema

ROOT = Path(__file__).resolve().parents[1]


def test_schema_data_is_the_json_file():
    source = json.loads((ROOT / "schemas" / "config.schema.json").read_text(encoding="utf-8"))
    assert json.dumps(CONFIG_SCHEMA) == json.dumps(source), "stale: run python scripts/gen_schema_data.py"
    assert load_schema("config.schema.json") == source


def test_seed_schema_data_is_the_json_file():
    source = json.loads((ROOT / "schemas" / "seed-config.schema.json").read_text(encoding="utf-8"))
    assert json.dumps(SEED_SCHEMA) == json.dumps(source), "stale: run python scripts/gen_schema_data.py"
    assert seed_schema() == source
    assert json.loads(SEED_SCHEMA_PATH.read_text(encoding="utf-8")) == source


def test_generator_writes_the_modules():
    script = ROOT / "scripts" / "gen_schema_data.py"
    code = compile(script.read_text(encoding="utf-8"), str(script), "exec")
    namespace: dict = {"__name__": "gen_schema_data", "__file__": str(script)}
    exec(code, namespace)
    assert namespace["render"]() == (ROOT / "megatron_estimator" / "config" / "schema_data.py").read_text(
        encoding="utf-8")
    assert namespace["render_seed"]() == (ROOT / "megatron_estimator" / "inputs" / "seed_schema_data.py").read_text(
        encoding="utf-8")
