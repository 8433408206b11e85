"""The plain path of ``inputs/argv.py`` (``_plain_reading``) reads what the general path
(``_read_argv``) reads, or gives the line to it.

The corpus: Megatron-LM CI's command lines (tests/data/megatron_validation.jsonl, valid and
invalid), the presets' flags, and lines made invalid token by token (a value dropped, a stray
value, a misspelled flag, ``--flag=value``, a negative number, ``--``, help).  For each line the
reading through ``read_megatron_argv`` (plain path first) must equal the general path's: the same
settings with the same values, types and locations in the same order, the same problems in the
same order, the same unknown flags.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from megatron_estimator.inputs import argv as argv_module
from megatron_estimator.inputs.argv import _plain_reading, _read_argv, read_megatron_argv
from megatron_estimator.inputs.presets import load_preset, preset_names
from megatron_estimator.megatron.flags import flag_table

CORPUS = Path(__file__).parent / "data" / "megatron_validation.jsonl"


def _ci_lines() -> list[list[str]]:
    lines = []
    with open(CORPUS, encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            if "argv" in record:
                lines.append(list(record["argv"]))
    return lines


def _preset_lines() -> list[list[str]]:
    return [list(load_preset(name).flags) for name in preset_names()]


def _variants(tokens: list[str]) -> list[list[str]]:
    """Lines made invalid (or unusual) from a valid one."""
    out = []
    options = [i for i, t in enumerate(tokens) if t.startswith("--")]
    if not options:
        return out
    first, last = options[0], options[-1]
    out.append(tokens[:-1])                                      # a value dropped at the end
    out.append(tokens + ["stray"])                               # a stray value
    out.append(["stray"] + tokens)                               # a value before any flag
    out.append(tokens[:first] + [tokens[first] + "x"] + tokens[first + 1:])   # unknown flag
    out.append(tokens[:first] + [tokens[first].replace("-", "_", 3)] + tokens[first + 1:])
    out.append(tokens + ["--bf16=1"])                            # explicit value on a plain flag
    out.append(tokens + ["--num-layers=4"])                      # explicit value
    out.append(tokens + ["--lr", "-1"])                          # a negative number
    out.append(tokens + ["--lr", "-1e-5"])                       # not a number to argparse
    out.append(tokens + ["--num-layers", "four"])                # wrong type
    out.append(tokens + ["--num-layers", ""])                    # empty value
    out.append(tokens + ["--attention-backend", "flsh"])         # bad choice
    out.append(tokens + ["--", "x"])
    out.append(tokens + ["-h"])
    out.append(tokens + ["--no-persist-layer-norm", "--num-layers", "2", "--num-layers", "3"])   # repeats
    out.append(tokens[:last] + tokens[last + 1:])                # a flag dropped: its value strays
    out.append(tokens + ["--moe-layer-freq", "([0]*1+[1]*3)"])   # a list value
    out.append(tokens + ["--cuda-graph-modules", "attn", "mlp"])  # nargs '+'
    return out


def _corpus() -> list[list[str]]:
    lines = _ci_lines() + _preset_lines()
    return lines + [v for line in lines[:25] + _preset_lines() for v in _variants(line)]


def _as_comparable(reading):
    raw = reading.raw
    return ([(d, s.dest, type(s.value), s.value, s.location) for d, s in raw.settings.items()],
            raw.source, raw.opaque, list(reading.problems),
            [(u.spelled, u.suggestions, u.problem) for u in reading.unknown])


def test_corpus_is_large_and_mixed():
    lines = _corpus()
    table = flag_table()
    plain = sum(_plain_reading(line, table, None, "command line") is not None for line in lines)
    assert len(lines) > 900
    assert 300 < plain < len(lines) - 300      # both paths are exercised


@pytest.mark.parametrize("release", ["main", "0.16.1"])
def test_plain_path_reads_as_the_general_path(release):
    table = flag_table(release)
    for index, line in enumerate(_corpus()):
        # every other line located as a launch script's tokens are
        located = [f"run.sh:{k + 1}" for k in range(len(line))] if index % 2 else None
        for locations in (located,):
            general = _read_argv(list(line), table, locations, "command line", (), (), (), release)
            assert _as_comparable(read_megatron_argv(line, locations=locations, release=release)) \
                == _as_comparable(general), line
            plain = _plain_reading(list(line), table, locations, "command line")
            if plain is not None:
                assert not general.problems and not general.unknown, line
                assert _as_comparable(plain) == _as_comparable(general), line


def test_plain_path_gives_fresh_lists():
    line = ["--moe-layer-freq", "([0]*1+[1]*3)", "--num-layers", "4"]
    first = read_megatron_argv(line).raw.value("moe_layer_freq")
    first.append(7)
    assert read_megatron_argv(line).raw.value("moe_layer_freq") == [0, 1, 1, 1]


def test_plain_path_is_taken_for_plain_lines(monkeypatch):
    calls = []
    monkeypatch.setattr(argv_module, "_read_argv", lambda *a: calls.append(a))
    reading = read_megatron_argv(["--num-layers", "4", "--bf16", "--no-persist-layer-norm"])
    assert not calls
    assert reading.raw.value("num_layers") == 4 and reading.raw.value("bf16") is True
    assert reading.raw.location("num_layers") == "--num-layers"
