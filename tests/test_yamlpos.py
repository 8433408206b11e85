"""YAML with line numbers: values as yaml.safe_load builds them, lines for keys and values."""

from __future__ import annotations


import yaml

from megatron_estimator.inputs.yamlpos import parse_yaml_with_lines


DOC = """\
# comment
base: &base
  hidden_size: 64
  eps: 1.0e-5
model:
  <<: *base
  hidden_size: 128
  tag: "quoted"
  flag: yes
  text: 1e-5
  layers:
    - 1
    - 2
  nested: {a: 1, b: [x, y]}
  multi: >
    folded
    text
empty:
"""


def test_values_match_safe_load_and_lines_are_exact():
    doc = parse_yaml_with_lines(DOC, "d.yaml")
    assert doc.problems == ()
    assert doc.root.value == yaml.safe_load(DOC)
    model = doc.root.entries["model"]
    assert (doc.root.line, model.line, model.value_line) == (2, 5, 6)
    entries = model.entries
    assert entries["hidden_size"].value == 128 and entries["hidden_size"].line == 7    # explicit key wins
    assert entries["eps"].line == 4 and entries["eps"].value == 1.0e-5                # merged from the anchor
    assert (entries["tag"].plain, entries["flag"].plain, entries["flag"].value) == (False, True, True)
    assert entries["text"].value == "1e-5" and entries["text"].text == "1e-5"
    assert (entries["layers"].line, entries["layers"].value_line, entries["layers"].value) == (11, 12, [1, 2])
    assert entries["nested"].entries["b"].value == ["x", "y"] and entries["nested"].entries["b"].line == 14
    assert entries["multi"].value == "folded text\n"
    assert doc.root.entries["empty"].value is None and doc.root.entries["empty"].line == 18


def test_duplicate_keys_at_any_depth():
    doc = parse_yaml_with_lines("a: 1\nb:\n  c: 1\n  c: 2\na: 3\n", "d.yaml")
    assert [(p.code, p.location) for p in doc.problems] == [
        ("duplicate-key", "d.yaml:4 b.c"), ("duplicate-key", "d.yaml:5 a")]
    assert doc.root.value == {"a": 3, "b": {"c": 2}}


def test_syntax_errors_and_empty_documents():
    doc = parse_yaml_with_lines("a: 1\n\tb: 2\n", "d.yaml")
    assert [(p.code, p.location) for p in doc.problems] == [("yaml-syntax", "d.yaml:2")]
    assert doc.problems[0].message.startswith("YAML syntax error: ")
    two = parse_yaml_with_lines("a: 1\n---\nb: 2\n", "d.yaml")
    assert [(p.code, p.location) for p in two.problems] == [("yaml-syntax", "d.yaml:2")]
    assert "expected a single document" in two.problems[0].message
    empty = parse_yaml_with_lines("# only a comment\n", "d.yaml")
    assert empty.root is None and empty.problems == ()


def test_a_non_printable_character_is_reported_as_pyyaml_reports_it():
    # BEL (U+0007) is outside YAML 1.1's printable set (spec section 5.1); PyYAML's reader
    # (yaml/reader.py check_printable) rejects it with "special characters are not allowed".
    doc = parse_yaml_with_lines("model:\n  hidden_size: 4\x07096\n", "x.yaml")
    assert doc.root is None
    assert [p.code for p in doc.problems] == ["yaml-syntax"]
    assert "special characters are not allowed" in doc.problems[0].message
