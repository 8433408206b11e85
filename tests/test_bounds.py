"""Issue 30's bounds, each at its edge: values worked out by hand beside each assertion."""

from __future__ import annotations

import os

import pytest

from megatron_estimator.core.limits import MAX_WORLD_SIZE
from megatron_estimator.core.problems import Problem, escape_text
from megatron_estimator.core.resources import InputFileError, read_input_bytes, read_input_text
from megatron_estimator.inputs.yamlpos import MAX_DEPTH, MAX_NODES, parse_yaml_with_lines


def test_only_regular_files_are_read(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for path, what in ((fifo, "a FIFO"), (tmp_path, "a directory"), ("/dev/null", "a character device")):
        with pytest.raises(InputFileError, match=what):      # opened without blocking, refused by its kind
            read_input_bytes(path, "yaml")


def test_the_size_cap_is_exact_and_raised_by_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("MEGATRON_ESTIMATOR_MAX_FILE_MB", "1")
    edge = tmp_path / "edge.yaml"
    edge.write_bytes(b"a" * (1 << 20))                           # 1 MiB = 1,048,576 bytes: at the cap
    assert len(read_input_bytes(edge, "yaml")) == 1 << 20
    edge.write_bytes(b"a" * ((1 << 20) + 1))                     # one byte over
    with pytest.raises(InputFileError, match="larger than 1 MiB"):
        read_input_bytes(edge, "yaml")
    assert read_input_bytes(edge, "yaml", head=4) == b"aaaa"     # a head read never errs
    edge.write_bytes(b"x\r\ny\rz")
    assert read_input_text(edge, "yaml") == "x\ny\nz"            # universal newlines, as open() reads


def _nested(levels: int) -> str:
    return "a: " + "[" * (levels - 1) + "]" * (levels - 1) + "\n"


def test_yaml_nesting_bound():
    # the root mapping is level 1, so MAX_DEPTH - 1 brackets inside it reach MAX_DEPTH levels
    assert parse_yaml_with_lines(_nested(MAX_DEPTH), "f.yaml").problems == ()
    [problem] = parse_yaml_with_lines(_nested(MAX_DEPTH + 1), "f.yaml").problems
    assert (problem.code, problem.location) == ("yaml-too-deep", "f.yaml:1")


def _laughs(levels: int) -> str:
    lines = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, levels):
        prev, name = chr(96 + i), chr(97 + i)
        lines.append(f"{name}: &{name} [{', '.join(['*' + prev] * 10)}]")
    return "\n".join(lines) + "\n"


def test_alias_expansion_bound():
    # level k expands to 1 + 10 * (level k-1) values: 11, 111, 1111, 11111, 111111, 1111111.
    # Four levels: 11 + 111 + 1111 + 11111 = 12,344 values (+ 4 keys, + the root): read.
    assert MAX_NODES == 200_000
    assert parse_yaml_with_lines(_laughs(4), "f.yaml").root.value["d"][0][0][0][0] == "x"   # d > c > b > a > x
    # Six levels: 111,111 + 1,111,111 > 200,000: refused at the sixth line
    [problem] = parse_yaml_with_lines(_laughs(6), "f.yaml").problems
    assert (problem.code, problem.location) == ("yaml-too-large", "f.yaml:6")


def test_a_recursive_alias_is_refused_where_it_is():
    [problem] = parse_yaml_with_lines("x: 1\ny: &r\n  z: *r\n", "f.yaml").problems
    assert (problem.code, problem.location) == ("yaml-recursive-alias", "f.yaml:3")


def test_yaml_reader_errors_get_a_line():
    # \x07 is the 5th character of line 2 ("b: 2" + BEL)
    [problem] = parse_yaml_with_lines("a: 1\nb: 2\x07\n", "f.yaml").problems
    assert problem.location == "f.yaml:2" and "#x07" in problem.message and "(column 5)" in problem.message


def test_world_size_bound():
    from megatron_estimator.api import world_size_for

    assert MAX_WORLD_SIZE == 16_777_216                         # 2^24
    assert world_size_for(None, MAX_WORLD_SIZE)[0].value == MAX_WORLD_SIZE
    value, [problem] = world_size_for(None, 10 ** 40)
    assert value is None and problem.code == "world-size-out-of-range" and "41-digit" in problem.message


def test_a_doubling_function_ends_with_a_located_problem(tmp_path):
    from megatron_estimator.inputs.launch.script import load_launch_script

    script = tmp_path / "train.sh"
    script.write_text('#!/bin/bash\ng(){ g "$@" "$@"; }\ng a\ntorchrun --nproc-per-node 8 pretrain_gpt.py\n')
    _, problems = load_launch_script(str(script), environ={})
    # the words double on each call: 2^17 = 131,072 > 100,000 words on the 18th call, at line 2
    assert any(p.location == f"{script}:2" and "100,000 words" in p.message for p in problems), problems


def test_untrusted_text_is_escaped_on_one_line():
    problem = Problem("x", "a\nb.yaml", "value \x1b[31m\t\u2028")
    assert str(problem) == "a\\nb.yaml: value \\x1b[31m\\t\\u2028"
    assert escape_text("plain é") == "plain é"
