"""Shared helpers: build configurations and estimates from real Megatron flags."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data"
# The workplace's shared folder (reference data too large or not ours to commit): beside the
# checkout, or where ESTIMATOR_SHARED_DIR names.  Tests that need it skip, naming both.
SHARED_ENV = "ESTIMATOR_SHARED_DIR"
SHARED = Path(os.environ.get(SHARED_ENV) or REPO.parent / "shared")
# A Megatron-LM checkout for the live cross-checks (scripts/record_megatron_checks records
# their outcomes in tests/data, which the tests read when no tree is given).
TREE_ENV = "MEGATRON_LM_TREE"
# Megatron-LM CI's measured peaks (tests/data/megatron-ci-dev.tsv.md says where from).
CALIBRATION_TSV = DATA / "megatron-ci-dev.tsv.gz"


def shared_file(*parts: str) -> Path:
    """A file of the shared folder, or a skip naming where it was looked for and how to give it."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} is absent: set {SHARED_ENV} to the shared folder (default ../shared beside the checkout)")
    return path


def megatron_tree(marker: str) -> Path | None:
    """The Megatron-LM checkout named by MEGATRON_LM_TREE, when it holds ``marker``."""
    tree = os.environ.get(TREE_ENV)
    return Path(tree) if tree and (Path(tree) / marker).exists() else None


def shared_records() -> dict:
    """tests/data/shared_records.json: facts of the shared folder that
    ``scripts/record_megatron_checks --shared ../shared`` recorded (empty before the first record)."""
    import json

    path = DATA / "shared_records.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def read_tsv_rows(path: Path) -> list[dict]:
    """The rows of a tab-separated file with a header (gzip-compressed when it ends in .gz)."""
    import csv
    import gzip

    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))


def recorded_answers(name: str, requests: list[dict]) -> list[dict]:
    """Megatron-LM's answers to a harness's requests, as ``scripts/record_megatron_checks``
    recorded them in tests/data/megatron_answers.json; fails when the test's requests changed
    since (the record is stale: rerun the script)."""
    import json

    record = json.loads((DATA / "megatron_answers.json").read_text(encoding="utf-8"))[name]
    recorded = [case["request"] for case in record["cases"]]
    assert recorded == json.loads(json.dumps(requests)), (
        f"tests/data/megatron_answers.json [{name}] was recorded for other requests: "
        "rerun scripts/record_megatron_checks with a Megatron-LM tree")
    return [case["answer"] for case in record["cases"]]


# LLaMA-3-8B as Megatron flags (published size 8,030,261,248).
LLAMA3_8B = (
    "--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 "
    "--group-query-attention --num-query-groups 8 --swiglu --normalization RMSNorm "
    "--disable-bias-linear --untie-embeddings-and-output-weights --position-embedding-type rope "
    "--vocab-size 128256 --max-position-embeddings 8192 --seq-length 8192 --micro-batch-size 1 --bf16"
)
# LLaMA-3-70B (published size 70,553,706,496).
LLAMA3_70B = (
    "--num-layers 80 --hidden-size 8192 --ffn-hidden-size 28672 --num-attention-heads 64 "
    "--group-query-attention --num-query-groups 8 --swiglu --normalization RMSNorm "
    "--disable-bias-linear --untie-embeddings-and-output-weights --position-embedding-type rope "
    "--vocab-size 128256 --max-position-embeddings 8192 --seq-length 8192 --micro-batch-size 1 --bf16"
)
# A tiny GPT (LayerNorm, GeLU, biases, learned positions, tied, dropout 0.1).
TINY_GPT = (
    "--num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 32 "
    "--max-position-embeddings 32 --micro-batch-size 2 --vocab-size 1000 --bf16"
)


def load_script(name: str):
    """A file under scripts/ (no .py suffix) imported as a module."""
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.SourceFileLoader(name.replace("-", "_"), str(REPO / "scripts" / name))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def flags(text: str, extra: str = "") -> list[str]:
    return shlex.split(text + " " + extra)


def resolve(text: str, world_size: int = 1, environ: dict | None = None, extra: str = "", release: str = "main"):
    """The EstimatorConfig of Megatron flags ``text``, read and checked against ``release``."""
    from megatron_estimator.inputs.argv import parse_megatron_argv
    from megatron_estimator.config.resolve import resolve_config
    from megatron_estimator.megatron.releases import release_of

    raw, problems = parse_megatron_argv(flags(text, extra), release=release)
    assert not problems, problems
    return resolve_config(raw, world_size=world_size, world_size_source="test", environ=environ or {},
                          release=release_of(release, "test"))


def estimate(text: str, world_size: int = 1, extra: str = "", budget: int | None = None, environ: dict | None = None,
             release: str = "main"):
    from megatron_estimator.results.estimate import build_estimate as run

    return run(resolve(text, world_size, environ, extra, release), budget=budget, environ=environ or {})


def model_caches() -> list:
    """Every ``functools.lru_cache`` of ``megatron_estimator.model`` (found by exact type: an
    ``isinstance`` check would touch torch's deprecated objects and warn)."""
    import functools
    import gc

    return [o for o in gc.get_objects() if type(o) is functools._lru_cache_wrapper
            and getattr(o, "__module__", "").startswith("megatron_estimator.model")]


def problems_of(text: str, world_size: int | None = 1, environ: dict | None = None, release: str = "main"):
    """The problems validation reports (against ``release``), as (code, location) pairs plus the messages."""
    from megatron_estimator.core.problems import InvalidInput
    from megatron_estimator.inputs.argv import parse_megatron_argv
    from megatron_estimator.config.resolve import resolve_config
    from megatron_estimator.megatron.releases import release_of

    raw, parse_problems = parse_megatron_argv(shlex.split(text), release=release)
    if parse_problems:
        return list(parse_problems)
    try:
        resolve_config(raw, world_size=world_size, world_size_source="test", environ=environ or {},
                       release=release_of(release, "test"))
    except InvalidInput as err:
        return list(err.problems)
    return []


@pytest.fixture(scope="session")
def calibration_rows() -> list[dict]:
    return read_tsv_rows(CALIBRATION_TSV)

