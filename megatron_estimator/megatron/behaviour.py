"""Megatron behaviour that depends on the release: ``data/megatron_behaviour.tsv``.

One row per rule and unbroken run of releases (``first``..``last``, labels of
``data/megatron_releases.tsv``), with the value the rule takes there and the commit that
changed it.  ``behaviour(rule)`` answers for the chosen release (``megatron.releases``);
``behaviour(rule, label)`` for another.  Edit the data file, not this loader.  Rules whose value
is a flag default (``fsdp_sharding_default``, ``muon_tp_mode_default``) are there for the record:
the chosen release's flag table already supplies those defaults.
"""

from __future__ import annotations

from megatron_estimator.core.dataclass import dataclass
from functools import cache

from megatron_estimator.core.resources import read_data_text

BEHAVIOUR_FILE = "megatron_behaviour.tsv"


@dataclass(frozen=True)
class BehaviourRow:
    rule: str
    first: str
    last: str
    value: str
    commit: str
    file: str


@cache
def behaviour_rows() -> tuple[BehaviourRow, ...]:
    lines = [line for line in read_data_text(BEHAVIOUR_FILE).splitlines() if line and not line.startswith("#")]
    return tuple(BehaviourRow(*line.split("\t")[:6]) for line in lines[1:])


def behaviour_row(rule: str, label: str | None = None) -> BehaviourRow:
    """The row of ``rule`` that covers release ``label`` (default: the chosen one)."""
    from megatron_estimator.megatron.releases import chosen_release, order_of

    at = order_of(chosen_release().version if label is None else label)
    for row in behaviour_rows():
        if row.rule == rule and order_of(row.first) <= at <= order_of(row.last):
            return row
    raise KeyError(f"{BEHAVIOUR_FILE}: no row for {rule!r} at release order {at}")


def behaviour(rule: str, label: str | None = None) -> str:
    return behaviour_row(rule, label).value
