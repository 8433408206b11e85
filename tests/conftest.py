"""Shared helpers: build configurations and estimates from real Megatron flags."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# The workplace's shared data: beside the checkout, or (for a fresh clone elsewhere, as CI
# makes) at the workplace's own location.  Tests that need it skip, naming it, when neither is.
SHARED = next((p for p in (REPO.parent / "shared", Path("/work/shared")) if p.is_dir()), REPO.parent / "shared")
CALIBRATION_TSV = SHARED / "calibration" / "megatron-ci-dev.tsv"

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
def shared_calibration():
    if not CALIBRATION_TSV.is_file():
        pytest.skip(f"{CALIBRATION_TSV} is not on this machine (the calibration data lives in ../shared)")
    return CALIBRATION_TSV

