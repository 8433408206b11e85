"""The message helpers every reader shares (megatron_estimator/core/hints.py)."""

from __future__ import annotations

import pytest

from megatron_estimator.core.hints import (
    JSON, PYTHON, TOML, YAML, close_matches, closest, describe_value, did_you_mean, expected_kind,
)


def test_closest_ignores_case_and_prefers_a_case_only_difference():
    # difflib's ratio of "Adam" and "adam" is 2*3/8 = 0.75; folded, "adam" is an exact match.
    assert closest("ADAM", ["adamw", "adam", "sgd"]) == "adam"
    assert closest("NONE", ["none", "full"]) == "none"
    # case-sensitive, "NONE" and "none" share no character: no suggestion
    assert closest("NONE", ["none", "full"], fold_case=False) is None
    assert closest("xyz", ["adam", "sgd"]) is None


def test_close_matches_best_first_and_at_most_n():
    # difflib ratios 2M/T against "--num-layer" (11 chars): --num-layers 22/23, --num-layers-x 22/25
    assert close_matches("--num-layer", ["--num-layers-x", "--num-layers", "--hidden-size"], n=2,
                         fold_case=False) == ["--num-layers", "--num-layers-x"]
    assert close_matches("--num-layer", ["--num-layers-x", "--num-layers"], n=1) == ["--num-layers"]


def test_did_you_mean_is_empty_for_the_word_itself_and_for_nothing_close():
    assert did_you_mean("gpt", ["gpt2", "llama3-8b"]) == "; did you mean gpt2?"
    assert did_you_mean("gpt2", ["gpt2"]) == ""
    assert did_you_mean("zzz", ["gpt2"]) == ""


@pytest.mark.parametrize("value, yaml, toml, json_text, python", [
    (None, "null", "NoneType None", "null", "null"),
    (True, "the boolean true", "the boolean true", "true", "true"),
    ("x", "the string 'x'", "'x'", '"x"', "'x'"),
    (3, "the integer 3", "int 3", "3", "3"),
    (1e-05, "the number 1e-05", "float 1e-05", "1e-05", "1e-05"),
    ({"a": 1}, "a mapping", "a table", '{"a": 1}', '{"a": 1}'),
    ([1, 2], "a list", "an array", "[1, 2]", "[1, 2]"),
])
def test_describe_value_in_each_formats_words(value, yaml, toml, json_text, python):
    assert [describe_value(value, words) for words in (YAML, TOML, JSON, PYTHON)] == [yaml, toml, json_text, python]
    assert describe_value(value) == yaml


def test_expected_kind_names_json_schema_types():
    assert expected_kind("integer") == "an integer"
    assert expected_kind(["integer", "null"]) == "an integer (or null)"
    assert expected_kind(["string", "array"]) == "a string or a list"
    assert expected_kind("frobnicate") == "frobnicate"
