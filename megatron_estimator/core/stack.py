"""The ``stack`` setting (``--stack torch=2.8,flash-attn=none,te=2.x``): the job's packages
as the user states them where ``run`` cannot read their metadata (inputs/job_stack.py turns
them into the estimate's facts).  String methods only: no ``re`` on the start-up paths."""

from __future__ import annotations

# --stack NAME=VERSION,...: the names a user may state, each as PACKAGES names it
STACK_NAMES = {"torch": "torch", "pytorch": "torch", "te": "transformer-engine",
               "transformer-engine": "transformer-engine", "transformer_engine": "transformer-engine",
               "flash-attn": "flash-attn", "flash_attn": "flash-attn"}


def _stated_version(text: str) -> bool:
    """``2``, ``2.8``, ``2.7.4``, ``2.7.4.post1``, ``2.x``: digits first, dot-separated parts,
    the last may be ``x`` (any) or carry a local suffix."""
    parts = text.split(".")
    if not parts[0].isdecimal():
        return False
    for i, part in enumerate(parts[1:], start=1):
        last = i == len(parts) - 1
        if not (part.isdecimal() or (last and (part == "x" or (part[:1].isalpha() and part.isalnum())))):
            return False
    return True


def parse_stack(text: str) -> dict[str, str]:
    """``torch=2.8,flash-attn=none,te=2.x`` -> ``{"torch": "2.8", "flash-attn": "none",
    "transformer-engine": "2.x"}``; ValueError names every unknown package or bad version."""
    stated: dict[str, str] = {}
    bad: list[str] = []
    for item in str(text).split(","):
        name, sep, version = (part.strip().lower() for part in item.partition("="))
        package = STACK_NAMES.get(name)
        if package is None:
            bad.append(f"unknown package {name!r} (known: torch, transformer-engine (te), flash-attn)"
                       if name else f"{item.strip()!r} is not NAME=VERSION")
        elif not sep or not (version == "none" or _stated_version(version)):
            bad.append(f"{name}={version or ''}: the version must be like 2.8, 2.7.4 or 2.x, or none")
        elif package in stated:
            bad.append(f"{package} is given twice")
        else:
            stated[package] = version
    if bad:
        raise ValueError("; ".join(bad))
    return stated


