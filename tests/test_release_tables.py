"""The per-release flag history (data/megatron_flag_history.tsv, written by scripts/megatron_releases).

Expanded for one release (the rows whose first..last interval holds it, in table order), it must
give: for main, data/megatron_flags.tsv row for row; for every release with a reference table in
../shared/megatron/by-release/ (read from each tag's own argparse parser, independently of this
project), the same flag specs and the same relative order of flags sharing a dest.  Where the
shared folder is absent, the comparison is with the tables' digests that
``scripts/record_megatron_checks --shared ../shared`` recorded in tests/data/shared_records.json.
"""

from __future__ import annotations

import ast
import hashlib
import json
import importlib.machinery
import importlib.util
import signal
from pathlib import Path

import pytest

from conftest import REPO, SHARED, SHARED_ENV, shared_records

DATA = REPO / "megatron_estimator" / "data"
BY_RELEASE = SHARED / "megatron" / "by-release"
COLUMNS = ("flag", "aliases", "dest", "action", "type", "nargs", "default", "choices", "const", "conditional")


def _rows(path: Path) -> list[list[str]]:
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line and not line.startswith("#")]
    return [line.split("\t") for line in lines]


def _releases() -> list[dict[str, str]]:
    header, *rows = _rows(DATA / "megatron_releases.tsv")
    return [dict(zip(header, row)) for row in rows]


LABELS = [release["label"] for release in _releases()]


def expand(label: str) -> list[tuple[str, ...]]:
    """The flag rows (megatron_flags.tsv's columns) of one release, in table order."""
    order = {name: i for i, name in enumerate(LABELS)}
    header, *rows = _rows(DATA / "megatron_flag_history.tsv")
    assert header == [*COLUMNS, "first", "last"]
    at = order[label]
    return [tuple(row[:len(COLUMNS)]) for row in rows if order[row[-2]] <= at <= order[row[-1]]]


def _dest_orders(rows) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for row in rows:
        groups.setdefault(row[2], []).append(row[0])
    return groups


def test_releases_are_ordered_oldest_first_with_main_last():
    releases = _releases()
    assert [r["order"] for r in releases] == [str(i) for i in range(len(releases))]
    assert LABELS[-1] == "main" and releases[-1]["commit"].startswith("d98e8a64")
    numbered = [tuple(map(int, label.split("."))) for label in LABELS[:-1]]
    assert numbered == sorted(numbered) and len(set(numbered)) == len(numbered)
    assert {"0.14.0", "0.15.3", "0.16.1", "0.17.0", "0.17.1", "0.18.0", "0.19.0"} <= set(LABELS)
    for release in releases[:-1]:
        assert release["tag"] == f"core_v{release['label']}"
        assert len(release["commit"]) == 40


def test_intervals_are_valid_and_one_spec_per_flag_per_release():
    order = {name: i for i, name in enumerate(LABELS)}
    _, *rows = _rows(DATA / "megatron_flag_history.tsv")
    for row in rows:
        assert len(row) == len(COLUMNS) + 2
        assert order[row[-2]] <= order[row[-1]], row
    for label in LABELS:
        flags = [row[0] for row in expand(label)]
        assert len(flags) == len(set(flags)), label


def test_main_expansion_is_the_flag_table_row_for_row():
    _, *table = _rows(DATA / "megatron_flags.tsv")
    assert expand("main") == [tuple(row) for row in table]


def test_the_history_is_compact():
    """Each spec is stored once per unbroken run of releases, not once per release."""
    _, *rows = _rows(DATA / "megatron_flag_history.tsv")
    per_release = sum(len(expand(label)) for label in LABELS)
    assert len(rows) < per_release / 4
    assert len(set(tuple(row) for row in rows)) == len(rows)


# --- against the shared reference tables ------------------------------------------------------

_REFERENCE_TYPES = {"--attention-backend": "AttnBackend", "--exit-signal": "signal.Signals",
                    "--cuda-graph-scope": "cuda_graph_scope"}


def _enum_name(text: str) -> str:
    """'<AttnBackend.auto: 5>' -> 'auto'."""
    return text.strip("'<>").split(":")[0].split(".")[1]


def _reference_style(row: tuple[str, ...]) -> tuple[str, ...]:
    """One of our rows as the reference writes it: the default of a list-valued flag joined
    with '|' (['p2p'] -> p2p, [] -> empty), BooleanOptionalAction by its class name, nargs 0
    and const True/False for store_true/store_false."""
    flag, aliases, dest, action, kind, nargs, default, choices, const = row[:9]
    if default.startswith("["):
        default = "|".join(str(value) for value in ast.literal_eval(default))
    if action in ("store_true", "store_false"):
        nargs, const = "0", str(action == "store_true")
    elif action == "argparse.BooleanOptionalAction":
        action, nargs = "BooleanOptionalAction", "0"
    return flag, aliases, dest, action, kind, nargs, default, choices, const


def _normalise_reference(row: list[str]) -> tuple[str, ...]:
    """The reference's raw argparse renderings of enum-typed flags, as our table writes them
    (by member name; the named converter in place of enum_type_handler / a lambda)."""
    flag, aliases, dest, action, kind, nargs, default, choices, const = row[:9]
    if kind in ("enum_type_handler", "<lambda>") and flag in _REFERENCE_TYPES:
        kind = _REFERENCE_TYPES[flag]
    if kind == "AttnBackend":
        default = repr(_enum_name(default))
        choices = "|".join(_enum_name(c) for c in choices.split("|"))
    elif kind == "signal.Signals":
        default = repr(signal.Signals(int(default)).name)
        choices = "|".join(signal.Signals(int(c)).name for c in choices.split("|"))
    return flag, aliases, dest, action, kind, nargs, default, choices, const


RECORDS = shared_records()
SAMPLE_FLAGS = ("--attention-backend", "--exit-signal", "--cp-comm-type", "--sequence-parallel")
NO_SHARED = f"{BY_RELEASE} is absent (set {SHARED_ENV}); the recorded digests were checked"


def _reference_file(release: dict[str, str], by_release: Path = BY_RELEASE) -> Path:
    if release["label"] == "main":
        return by_release / f"main-{release['commit'][:8]}.tsv"
    return by_release / f"{release['tag']}.tsv"


def digest(rows) -> dict:
    """What the comparison below asks of a table, in a form that can be recorded: the row
    count, the set of specs and each dest's flag order, hashed."""
    def sha(text: str) -> str:
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    return {"rows": len(rows), "specs": sha("\n".join(sorted("\t".join(row) for row in set(rows)))),
            "dest_orders": sha(json.dumps(_dest_orders(rows), sort_keys=True))}


def _ours(label: str) -> list[tuple[str, ...]]:
    # The reference leaves out the optional extensions' flags (modelopt, kitchen).
    return [_reference_style(row) for row in expand(label) if not row[9]]


@pytest.mark.parametrize("label", sorted(RECORDS.get("by_release", ())))
def test_release_matches_the_recorded_reference(label):
    assert digest(_ours(label)) == RECORDS["by_release"][label], (
        f"{label}: the per-release table differs from ../shared/megatron/by-release; set {SHARED_ENV} "
        "and run test_release_matches_the_shared_reference for the rows")


def test_every_release_but_0_17_1_has_a_recorded_reference():
    # by-release holds no core_v0.17.1 table
    assert set(LABELS) - set(RECORDS["by_release"]) == {"0.17.1"}


@pytest.mark.parametrize("label", sorted(RECORDS.get("by_release", ())))
def test_release_matches_the_shared_reference(label):
    if not BY_RELEASE.is_dir():
        pytest.skip(NO_SHARED)
    release = next(r for r in _releases() if r["label"] == label)
    reference_path = _reference_file(release)
    header, *reference_rows = _rows(reference_path)
    assert header == list(COLUMNS[:9])
    reference = [_normalise_reference(row) for row in reference_rows]
    assert digest(reference) == RECORDS["by_release"][label], "the record is stale: rerun scripts/record_megatron_checks"
    ours = _ours(label)
    assert len(ours) == len(reference)
    assert sorted(set(ours) - set(reference)) == [] and sorted(set(reference) - set(ours)) == []
    assert _dest_orders(ours) == _dest_orders(reference)


def test_reference_normalisation_is_not_vacuous():
    """The style conversions above act on rows the reference really has (recorded from
    ../shared/megatron/by-release/core_v0.16.1.tsv)."""
    by_flag = {row[0]: row for row in RECORDS["core_v0.16.1_rows"]}
    assert set(by_flag) == set(SAMPLE_FLAGS)
    assert _normalise_reference(by_flag["--attention-backend"])[4:8] == (
        "AttnBackend", "", "'auto'", "flash|fused|unfused|local|auto")
    assert _normalise_reference(by_flag["--exit-signal"])[6] == "'SIGTERM'"
    ours = {row[0]: row for row in expand("0.16.1")}
    assert _reference_style(ours["--cp-comm-type"])[6] == "p2p" == by_flag["--cp-comm-type"][6]
    assert _reference_style(ours["--sequence-parallel"]) == tuple(by_flag["--sequence-parallel"])


# --- the generator's merge, on small hand-made releases ---------------------------------------

def _generator():
    path = REPO / "scripts" / "megatron_releases"
    loader = importlib.machinery.SourceFileLoader("megatron_releases_script", str(path))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _spec(flag: str, dest: str | None = None, default: str = "None") -> tuple[str, ...]:
    return (flag, "", dest or flag[2:].replace("-", "_"), "store", "int", "", default, "", "", "")


def test_generator_merges_releases_into_intervals():
    gen = _generator()
    a, b, c, d = _spec("--a"), _spec("--b"), _spec("--c"), _spec("--d")
    b_old = _spec("--b", default="1")
    x_first, x_second = _spec("--x", dest="shared"), _spec("--y", dest="shared")
    labels = ["0.1.0", "0.2.0", "0.3.0", "main"]
    dumps = [
        [a, b_old, c, x_first, x_second],  # 0.1.0: --b defaulted to 1
        [a, b, x_first, x_second],         # 0.2.0: --c removed
        [a, b, x_first, x_second, c],      # 0.3.0: --c back, at the end
        [a, d, b, x_first, x_second],      # main: --d added, --c gone again
    ]
    table = gen.build(labels, dumps)
    assert gen.expand(table, 3) == dumps[3]
    for index, rows in enumerate(dumps):
        got = gen.expand(table, index)
        assert sorted(got) == sorted(rows)
        assert gen.dest_orders(got) == gen.dest_orders(rows)
    intervals = {(row[0], row[6], row[-2], row[-1]) for row in table}
    assert ("--b", "1", 0, 0) in intervals and ("--b", "None", 1, 3) in intervals
    assert ("--c", "None", 0, 0) in intervals and ("--c", "None", 2, 2) in intervals
    assert ("--d", "None", 3, 3) in intervals and ("--a", "None", 0, 3) in intervals
    assert len(table) == 8
    # The old --b spec sits right after the current one.
    at = [i for i, row in enumerate(table) if row[0] == "--b"]
    assert at == [at[0], at[0] + 1]
