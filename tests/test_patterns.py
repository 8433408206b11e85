"""The start-up paths answer without ``re`` what a regular expression answered before (issue 14):
each replacement is compared with the regular expression itself (the reference) over the
table's own cells and over generated strings."""

from __future__ import annotations

import ast
import itertools
import random
import re
from contextlib import nullcontext

import pytest

from megatron_estimator.core.patterns import LazyPattern, is_shell_assignment, might_be_negative_number
from megatron_estimator.core.resources import read_data_text
from megatron_estimator.megatron import flags, releases
from megatron_estimator.model.overhead import _size_count_pairs

INT = re.compile(r"-?\d+\Z")
FLOAT = re.compile(r"-?(\d+\.\d*|\d*\.\d+)(e[-+]?\d+)?\Z|-?\d+e[-+]?\d+\Z")
PLAIN_STR = re.compile(r"'[^'\\]*'\Z")

ALPHABET = "0123456789-+.eE'\\ ,[]x:\n٣"      # ٣: an Arabic-Indic digit, which \d also matches


def strings(seed: int, count: int, longest: int = 7):
    rng = random.Random(seed)
    short = ["".join(p) for n in range(4) for p in itertools.product("0-.e'", repeat=n)]
    return short + ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, longest))) for _ in range(count)]


def test_literal_forms_as_the_patterns():
    for text in strings(1, 3000):
        assert flags._is_int_literal(text) == bool(INT.match(text)), text
        assert flags._is_float_literal(text) == bool(FLOAT.match(text)), text
        assert flags._is_plain_str_literal(text) == bool(PLAIN_STR.match(text)), text


def test_every_literal_of_the_tables_reads_as_literal_eval():
    cells = set()
    for name in ("megatron_flags.tsv", "megatron_flag_history.tsv"):
        for line in read_data_text(name).splitlines()[1:]:
            row = line.split("\t")
            if len(row) > 8 and not line.startswith("#"):
                cells.update(c for c in (row[6], row[8]) if c)
    cells -= {"default", "const"}
    assert len(cells) > 20
    for cell in sorted(cells):
        assert flags.read_literal(cell) == ast.literal_eval(cell), cell
        assert type(flags.read_literal(cell)) is type(ast.literal_eval(cell)), cell
    for text in ("['a', 'b']", "['a,b', 'c']", "['a, b']", "[1, 2]", "['x']", "[0]", "[-3, 10]", "[True]"):
        assert flags.read_literal(text) == ast.literal_eval(text)
    for text in ("[01]", "[٣]", "[1,2]"):       # not Python's spelling of a list of ints: literal_eval decides
        with pytest.raises((ValueError, SyntaxError)) if text != "[1,2]" else nullcontext():
            assert flags.read_literal(text) == ast.literal_eval(text)


def test_cublas_pairs_as_findall():
    for text in strings(2, 2000, longest=14) + [":4096:8", ":4096:2:16:8", "::1:2", ":1:2:3", ":٣:٣"]:
        assert _size_count_pairs(text) == re.findall(r":(\d+):(\d+)", text), text


def test_negative_number_prefilter_is_sound():
    # Where the prefilter says no, neither of argparse's patterns matches.
    for token in strings(3, 2000) + ["-1", "-.5", "--x", "-x", "-", "-1e5", "-٣", "-5\n"]:
        if not might_be_negative_number(token):
            assert not re.match(r"^-\d+$|^-\d*\.\d+$", token), token
            assert not re.match(r"-\.?\d", token), token


def test_lazy_pattern_is_the_compiled_pattern():
    lazy = LazyPattern(r"^(a+)(b)?$", "MULTILINE", "IGNORECASE")
    real = re.compile(r"^(a+)(b)?$", re.MULTILINE | re.IGNORECASE)
    text = "aab\nAA\nc"
    assert [m.groups() for m in lazy.finditer(text)] == [m.groups() for m in real.finditer(text)]
    assert lazy.findall(text) == real.findall(text) and lazy.pattern == real.pattern and lazy.flags == real.flags


def test_shell_assignment_as_the_pattern():
    words = strings(5, 2000) + ["A=1", "_x=", "9a=1", "a-b=1", "é=1", "=1", "a", "ab_9=x=y", "A B=1", "a\n=1"]
    rng = random.Random(6)
    words += ["".join(rng.choice("aZ_9=-é ") for _ in range(rng.randint(0, 6))) for _ in range(3000)]
    for word in words:
        assert is_shell_assignment(word) == bool(re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", word)), word


def test_literal_prefix_answers_as_the_pattern():
    lazy = LazyPattern(r"^python(\d+(\.\d+)*)?[a-z]?$", literal_prefix="python")
    for name in ("python", "python3", "python3.11", "python3m", "pythonx", "pytho", "ipython", "python3.", "python\n"):
        found, expected = lazy.match(name), re.match(r"^python(\d+(\.\d+)*)?[a-z]?$", name)
        assert (found and found.group(0)) == (expected and expected.group(0)), name


def test_version_groups_as_the_pattern():
    pattern = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?([.+-]?(?:rc|dev|a|b|post)[0-9a-z.+-]*)?\Z")
    texts = ["0.16", "0.16.1", "v0.16.1", "0.18.0rc0", "1.2.3.4", "1..2", "٣.1", "0.16.1+x", "vv1.2", "1.2.", ".1.2",
             "01.002", "0.16.dev1", "12.34.56"]
    texts += strings(7, 2000)
    for text in texts:
        found = pattern.match(text)
        assert releases._version_groups(text) == (found.groups() if found else None), text


def test_entry_script_name_as_the_pattern():
    from megatron_estimator.inputs.launch.script import _is_entry_name

    entry = re.compile(r"^pretrain\w*\.py$")
    rng = random.Random(14)
    alphabet = "pretain_.y-Ü٣ \n/x"
    names = ["pretrain.py", "pretrain_gpt.py", "pretrain_gpt.py\n", "pretrain_gpt.py\n\n", "pretrain.p", "pretrainpy",
             "pretrain_ü٣.py", "pretrain-gpt.py", "xpretrain.py", "pretrain.py.py", "pretrain..py", "", "pretrain"]
    names += ["pretrain" + "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6))) + tail
              for _ in range(3000) for tail in ("", ".py", ".py\n")]
    for name in names:
        assert _is_entry_name(name) == bool(entry.match(name)), repr(name)


def test_shell_name_pattern_as_the_regex():
    from megatron_estimator.core.patterns import NamePattern

    name, ours = re.compile(r"[A-Za-z_][A-Za-z0-9_]*"), NamePattern()
    rng = random.Random(7)
    texts = ["", "a", "_", "9", "a9_", "Ab c", "ü", "a-b", "$HOME", "x٣"]
    texts += ["".join(rng.choice("aZ_9-$ {[ü٣\n") for _ in range(rng.randint(0, 6))) for _ in range(3000)]
    for text in texts:
        for pos in range(-1, len(text) + 2):
            for endpos in (None, pos, pos + 1, len(text) - 1, len(text) + 1):
                args = (text, pos) if endpos is None else (text, pos, endpos)
                for method in ("match", "fullmatch"):
                    want, got = getattr(name, method)(*args), getattr(ours, method)(*args)
                    assert (want is None) == (got is None), (method, args)
                    if want is not None:
                        assert (got.group(), got.group(0), got.start(), got.end(), got.span()) == \
                            (want.group(), want.group(0), want.start(), want.end(), want.span()), (method, args)


def test_posix_split_as_shlex():
    import shlex

    from megatron_estimator.core.patterns import split_posix_comments

    rng = random.Random(11)
    texts = ["", " ", "a b", " --nodes=2 # two", "'a b' \"c d\"", "''", '""', "a''b", "\\", "'a", '"a\\"b"', "a#b c",
             "#x\ny z", "a\\ b", '"\\$x\\\\\\q"', "'\\''", "x\t\ry\n", "--gres=gpu:8"]
    texts += ["".join(rng.choice("ab '\"\\#\n\t-=") for _ in range(rng.randint(0, 10))) for _ in range(20000)]
    for text in texts:
        try:
            want = shlex.split(text, comments=True)
        except ValueError:
            with pytest.raises(ValueError):
                split_posix_comments(text)
            continue
        assert split_posix_comments(text) == want, repr(text)


def test_plain_shell_matches_as_the_patterns():
    from megatron_estimator.inputs.bash.parser import _empty_parens
    from megatron_estimator.inputs.launch.sbatch import _before_first

    parens, brace = re.compile(r"\([ \t]*\)"), re.compile(r"\{[^{}\s]*(,|\.\.)[^{}\s]*\}")
    rng = random.Random(5)
    texts = ["".join(rng.choice("() \t\nx{},.-") for _ in range(rng.randint(0, 8))) for _ in range(5000)]
    for text in texts:
        for at in range(len(text) + 1):
            want = parens.match(text, at)
            got = _empty_parens(text, at)
            assert (want is None) == (got is None) and (want is None or want.end() == got.end()), (text, at)
        assert _before_first(text, "-,") == re.split(r"[-,]", text, maxsplit=1)[0], text
        if brace.search(text):        # the guard expansion.py asks first holds for every match
            assert "{" in text and "}" in text and ("," in text or ".." in text), text
