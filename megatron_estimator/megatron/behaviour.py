"""Megatron behaviour that depends on the release: ``data/megatron_behaviour.tsv``.

One row per rule and unbroken run of releases (``first``..``last``, labels of
``data/megatron_releases.tsv``), with the value the rule takes there, the commit that
changed it and, on every row but a rule's oldest, ``date``: the commit date (UTC) from which
the row's value holds on Megatron-LM's main branch.  ``behaviour(rule, release)`` answers for a run's
release (``RunContext.release``, a ``ChosenRelease``); ``behaviour_row(rule, label)`` for a label.  A ``main`` with
an ``as_of`` date (``ChosenRelease.as_of``: a main-branch commit of that day, as
``scripts/calibrate`` checks each measured row) steps back from a row whose ``date`` is later
than that day to the row before it.  Edit the data file, not this loader.  Rules whose value
is a flag default (``fsdp_sharding_default``, ``muon_tp_mode_default``) are there for the record:
the chosen release's flag table already supplies those defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from megatron_estimator.core.resources import read_data_text
from megatron_estimator.megatron.releases import ChosenRelease

BEHAVIOUR_FILE = "megatron_behaviour.tsv"


@dataclass(frozen=True)
class BehaviourRow:
    rule: str
    first: str
    last: str
    value: str
    commit: str
    date: str       # YYYY-MM-DD from which the value holds on main; "" on a rule's oldest row
    file: str


@cache
def behaviour_rows() -> tuple[BehaviourRow, ...]:
    lines = [line for line in read_data_text(BEHAVIOUR_FILE).splitlines() if line and not line.startswith("#")]
    return tuple(BehaviourRow(*line.split("\t")[:7]) for line in lines[1:])


def _covering(rule: str, at: int) -> BehaviourRow:
    from megatron_estimator.megatron.releases import order_of

    for row in behaviour_rows():
        if row.rule == rule and order_of(row.first) <= at <= order_of(row.last):
            return row
    raise KeyError(f"{BEHAVIOUR_FILE}: no row for {rule!r} at release order {at}")


def behaviour_row(rule: str, label: str, as_of: str | None = None) -> BehaviourRow:
    """The row of ``rule`` that covers release ``label``, or, for ``main`` as of a day
    (``YYYY-MM-DD``), the row in force on the main branch that day."""
    return _row_in_force(rule, label, as_of)


@cache
def _row_in_force(rule: str, label: str, as_of: str | None) -> BehaviourRow:
    # The table is read once (behaviour_rows), so each answer is fixed: kept, since every
    # estimate's release rules ask (an unknown rule's KeyError is not kept).
    from megatron_estimator.megatron.releases import NEWEST, order_of

    row = _covering(rule, order_of(label))
    if label != NEWEST or not as_of:
        return row
    while row.date and row.date > as_of and order_of(row.first) > 0:
        row = _covering(rule, order_of(row.first) - 1)
    return row


def behaviour(rule: str, release: ChosenRelease) -> str:
    """``rule``'s value for the run's release (``RunContext.release``: its label and, for main,
    its ``as_of`` day)."""
    return behaviour_row(rule, release.version, release.as_of or None).value
