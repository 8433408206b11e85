"""Byte quantities as people write them and as reports print them (megatron_estimator/core/units.py)."""

from __future__ import annotations

import pytest

from megatron_estimator.core.problems import InvalidInput
from megatron_estimator.core.units import GiB, MiB, TiB, byte_size, format_bytes, gib, parse_bytes


@pytest.mark.parametrize("text, expected", [
    ("80GiB", 85_899_345_920),
    ("80GB", 80_000_000_000),
    ("81920MiB", 85_899_345_920),
    ("80 GiB", 85_899_345_920),
    ("1.5TiB", 1_649_267_441_664),
    ("85520809984B", 85_520_809_984),
    ("85520809984b", 85_520_809_984),
    ("80", 85_899_345_920),                 # a bare number is GiB
    ("0.5", 536_870_912),
    ("79.18gib", 85_018_877_624),           # 7918 * 2**30 / 100 = ...624.32: the nearest byte
    ("0.1GiB", 107_374_182),
    ("500MiB", 524_288_000),
    ("600mb", 600_000_000),
    ("64KiB", 65_536),
    ("2Ki", 2_048),
    ("1.5Gi", 1_610_612_736),
    ("1TB", 10**12),
    ("1e9B", 10**9),
    ("1.5e3MiB", 1_572_864_000),
    ("1_000MB", 10**9),
    ("  80GiB  ", 85_899_345_920),
    (".5GiB", 536_870_912),
    ("+8GiB", 8 * GiB),
    ("0B", 0),
    (80, 85_899_345_920),                   # TOML and callers may pass numbers: GiB too
    (1.5, 1_610_612_736),
])
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text, message", [
    ("80G", "'80G': unknown unit 'G' (write GB for powers of 10 or GiB for powers of 2)"),
    ("80 gigs", "'80 gigs': unknown unit 'gigs' (units: B, KB, MB, GB, TB (powers of 10) or KiB, MiB, "
                "GiB, TiB (powers of 2); a number without a unit is GiB)"),
    ("-1GiB", "a byte size cannot be negative ('-1GiB')"),
    ("abc", "'abc' is not a byte size (write a number and a unit: B, KB, MB, GB, TB (powers of 10) or "
            "KiB, MiB, GiB, TiB (powers of 2); a number without a unit is GiB)"),
    ("", "an empty value is not a byte size (write e.g. 80GiB; units: B, KB, MB, GB, TB (powers of 10) or "
         "KiB, MiB, GiB, TiB (powers of 2); a number without a unit is GiB)"),
    ("1.5B", "'1.5B': a count of bytes must be a whole number"),
    ("1__0GiB", "'1__0GiB' is not a byte size (write a number and a unit: B, KB, MB, GB, TB (powers of 10) or "
                "KiB, MiB, GiB, TiB (powers of 2); a number without a unit is GiB)"),
    ("1.2.3GiB", "'1.2.3GiB' is not a byte size (write a number and a unit: B, KB, MB, GB, TB (powers of 10) or "
                 "KiB, MiB, GiB, TiB (powers of 2); a number without a unit is GiB)"),
    (True, "a byte size must be text such as 80GiB, not bool True"),
    (-3, "a byte size cannot be negative (-3)"),
])
def test_parse_bytes_rejects_with_one_problem_at_the_given_location(text, message):
    with pytest.raises(InvalidInput) as raised:
        parse_bytes(text, "--budget")
    assert [(p.code, p.location, p.message) for p in raised.value.problems] == [("invalid-budget", "--budget", message)]


def test_parse_bytes_takes_the_callers_problem_code():
    with pytest.raises(InvalidInput) as raised:
        parse_bytes("lots", "train.toml:3 budget", code="invalid-setting")
    assert [(p.code, p.location) for p in raised.value.problems] == [("invalid-setting", "train.toml:3 budget")]


def test_format_bytes():
    assert format_bytes(81082 * MiB) == "79.18 GiB"
    assert format_bytes(81082 * MiB, exact=True) == "79.18 GiB (85,020,639,232 bytes)"
    assert format_bytes(0) == "0.00 GiB"
    assert format_bytes(2 * TiB) == "2048.00 GiB"
    assert parse_bytes(format_bytes(80 * GiB)) == 80 * GiB


@pytest.mark.parametrize("text", ["1e400", "1e30GiB", "1048577TiB"])
def test_byte_sizes_beyond_one_exbibyte_are_refused(text):
    with pytest.raises(InvalidInput) as raised:
        parse_bytes(text, location="--budget")
    (problem,) = raised.value.problems
    assert (problem.code, problem.location) == ("invalid-budget", "--budget")
    assert problem.message == f"{text!r} is more than 1 EiB, more memory than any device has"
    assert parse_bytes("1048576TiB") == 1 << 60


def test_gib_is_the_two_decimal_figure_reports_print():
    assert gib(81082 * MiB) == "79.18"        # 81082 / 1024 = 79.1816...
    assert gib(3 * GiB // 2) == "1.50"
    assert gib(0) == "0.00"


def test_byte_size_is_parse_bytes_without_the_problem():
    assert byte_size("512MiB") == 512 * MiB
    with pytest.raises(ValueError, match=r"^'12 parsecs': unknown unit 'parsecs'"):
        byte_size("12 parsecs")
