"""Differential parity with Megatron-LM's own checks (scripts/megatron_validate).

tests/data/megatron_validation.jsonl holds generated cases (the CI command lines of
megatron-ci-dev.tsv with their environment and GPU, and one-setting mutations of them) and
Megatron's outcome for each on CPU: the stage that refused (parse_args, validate_args, the
TransformerConfig __post_init__ of core_transformer_config_from_args, the meta-device model build
of pretrain_gpt.py's provider, or the first training step's MoE sequence-parallel check evaluated
on the built model) and Megatron's message; this test needs no Megatron.  A case Megatron
refused only because the CPU harness has no CUDA (``Torch not compiled with CUDA``) is skipped.
KNOWN (tests/data/megatron_parity_known.json): disagreements still open, each with Megatron's
reason; a disagreement not listed fails, and so does a listed one that now agrees.

The agreement matrix (regenerate the data: ``/work/venv/bin/python scripts/megatron_validate``;
print the matrix: ``PYTHONPATH=. python tests/test_megatron_parity.py``), main d98e8a64:

                                  before (validate_args only,   after (+ config, meta build,   + the config audit's
                                  504 cases, no environment)    first-step check; 594 cases    mutations; 721
                                                                with the CI environment and GPU) cases)
    Megatron accepts, estimator accepts      152                      268                        317
    Megatron accepts, estimator refuses       38                        0                          0
    Megatron refuses, estimator accepts        1                        0                          0
    Megatron refuses, estimator refuses      291                      326                        404
    (skipped: Megatron refused only for want of CUDA)  22               0                          0

Megatron's refusals by stage (721 cases): validate 262, config 133, build 2, train 7.  The audit's
mutations (--moe-router-topk 1, --defer-embedding-wgrad-compute, --overlap-p2p-communication-warmup-flush,
--moe-router-enable-expert-bias, --moe-shared-expert-overlap, --first-last-layers-bf16) found that the
router checks apply to dense models too.
"""
import json
from dataclasses import replace
from pathlib import Path

from conftest import CALIBRATION_TSV
from megatron_estimator.api import evaluate, input_from_flags
from megatron_estimator.model.overhead import Overheads

DATA = Path(__file__).parent / "data"

# (Megatron, estimator) -> cases; what scripts/megatron_validate last recorded.
MATRIX = {("accept", "accept"): 317, ("accept", "refuse"): 0,
          ("refuse", "accept"): 0, ("refuse", "refuse"): 404}


def cases():
    lines = (DATA / "megatron_validation.jsonl").read_text().splitlines()
    return [json.loads(l) for l in lines[1:]]


def estimator_refuses(case) -> bool:
    env = case.get("env", {})
    inp, problems = input_from_flags(case["argv"], environ=env, source="case")
    inp = replace(inp, job_environment=True)   # the case's environment is the job's (the CI row's)
    # the CI row's GPU generation: the checks Megatron makes only before Blackwell run
    overheads = Overheads(compute_capability=float(case.get("device_arch", 10)), gpu_known=True)
    verdict = evaluate(inp, world_size=case["world_size"], world_size_source="case", environ=env,
                       problems=problems, overheads=overheads)
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
            disagreements[case["case"]] = f"megatron {case['outcome']} ({case.get('stage', '')}): {case['error']}"
    return counts, disagreements


def test_estimator_agrees_with_megatron_or_the_disagreement_is_known():
    counts, disagreements = matrix()
    known = json.loads((DATA / "megatron_parity_known.json").read_text())
    assert sorted(set(disagreements) - set(known)) == []
    assert sorted(set(known) - set(disagreements)) == []     # a fixed disagreement leaves the list
    assert counts == {k: v for k, v in MATRIX.items() if v}


def test_every_case_names_the_stage_megatron_refused_at():
    for case in cases():
        assert case["stage"] in ("parse", "validate", "config", "build", "train", "none"), case["case"]
        assert (case["stage"] == "none") == (case["outcome"] == "accept"), case["case"]


if __name__ == "__main__":
    counts, disagreements = matrix()
    for (megatron, mine), n in sorted(counts.items()):
        print(f"megatron {megatron:6} estimator {mine:6} {n}")
    for name, why in sorted(disagreements.items()):
        print(f"  {name}: {why}")


def test_the_data_holds_the_cases_the_generator_makes():
    # scripts/megatron_validate's cases() over the calibration TSV: the same cases, in order, so a
    # change to MUTATIONS without regenerating the data fails here (Megatron is not needed)
    import importlib.util
    from importlib.machinery import SourceFileLoader

    script = Path(__file__).parent.parent / "scripts" / "megatron_validate"
    loader = SourceFileLoader("megatron_validate", str(script))
    generator = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(generator)
    made = generator.cases(CALIBRATION_TSV, 16)
    stored = cases()
    assert [c["case"] for c in made] == [c["case"] for c in stored]
    keys = ("argv", "world_size", "env", "gpu", "device_arch")
    assert [tuple(c[k] for k in keys) for c in made] == [tuple(c[k] for k in keys) for c in stored]
