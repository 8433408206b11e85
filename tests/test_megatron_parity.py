"""Differential parity with Megatron-LM's own argument validation (scripts/megatron_validate).

tests/data/megatron_validation.jsonl holds generated cases and Megatron's outcome (parse_args +
validate_args of the recorded commit, on CPU); this test needs no Megatron.  A case Megatron
refused only because the CPU harness has no CUDA (``Torch not compiled with CUDA``) is skipped.
KNOWN (tests/data/megatron_parity_known.json): disagreements still open, each with Megatron's
reason; a disagreement not listed fails.
"""
import json
from pathlib import Path

from megatron_estimator.api import evaluate, input_from_flags

DATA = Path(__file__).parent / "data"


def cases():
    lines = (DATA / "megatron_validation.jsonl").read_text().splitlines()
    return [json.loads(l) for l in lines[1:]]


def estimator_refuses(case) -> bool:
    inp, problems = input_from_flags(case["argv"], environ={}, source="case")
    verdict = evaluate(inp, world_size=case["world_size"], world_size_source="case", environ={},
                       problems=problems)
    return verdict.status == "invalid"         # the CLI's exit 2


def matrix():
    counts, disagreements = {}, {}
    for case in cases():
        if "not compiled with CUDA" in case["error"]:
            continue
        mine = "refuse" if estimator_refuses(case) else "accept"
        key = (case["outcome"], mine)
        counts[key] = counts.get(key, 0) + 1
        if case["outcome"] != mine:
            disagreements[case["case"]] = f"megatron {case['outcome']}: {case['error']}"
    return counts, disagreements


def test_estimator_agrees_with_megatron_or_the_disagreement_is_known():
    counts, disagreements = matrix()
    known = json.loads((DATA / "megatron_parity_known.json").read_text())
    assert sorted(set(disagreements) - set(known)) == []
