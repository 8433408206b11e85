"""Candidates: a fitting layout as the record ``report`` renders, with the Megatron flags that
select it, checked against the normal path.

``candidate`` turns a fitting layout into a ``results.plan.Candidate``; with a ``verify``
function (``api.plan`` passes ``api.evaluate`` on the candidate's settings) every reported
candidate is re-estimated through the normal path, and its figures must agree.
``candidate_flags``, ``candidate_raw``, ``candidate_argv`` and ``layout_raw`` edit the input
to select a layout.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Mapping, Sequence

from megatron_estimator.inputs.rawargs import RawArgs, RawSetting
from megatron_estimator.planner.space import PLANNED_DESTS, extra_dests, family_settings
from megatron_estimator.results.estimate import Verdict
from megatron_estimator.results.plan import Candidate

# What re-estimates a candidate through the normal path: its settings -> the verdict.
Verifier = Callable[[RawArgs], Verdict]


def _flag_tokens(dest: str, value: Any, release: str) -> list[str]:
    from megatron_estimator.megatron.flags import flag_table

    spec = flag_table(release).by_dest(dest)
    if spec.action == "store_true":
        return [spec.flag]
    if isinstance(value, (list, tuple)):
        return [spec.flag, *[str(v) for v in value]]
    return [spec.flag, str(value)]


def _input_value(raw: RawArgs, dest: str, release: str) -> Any:
    from megatron_estimator.megatron.flags import flag_table

    return raw.value(dest) if raw.given(dest) else flag_table(release).default(dest)


def _unset(value: Any) -> bool:
    return value is None or value is False


def candidate_flags(raw: RawArgs, settings: Mapping[str, Any], release: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(flags to add, flags to remove) that turn the input ``raw`` into this layout: only the
    planned settings whose value differs from what the input gives (a flag or Megatron's
    default).  A setting the layout leaves unset is removed where the input sets it: no flag
    unsets it.  ``--expert-tensor-parallel-size`` unset means tp, so it is compared as given.
    ``release``: the label of the release whose flags and defaults are compared."""
    from megatron_estimator.megatron.flags import flag_table

    table = flag_table(release)
    add: list[str] = []
    remove: list[str] = []
    # Besides the planned dests, a hybrid split's layer pattern (space.extra_dests).
    extra = tuple(d for d in ("hybrid_layer_pattern", "hybrid_override_pattern") if d in settings)
    for dest in PLANNED_DESTS + extra:
        value = settings.get(dest)
        if dest == "recompute_modules" and settings.get("recompute_granularity") != "selective":
            continue              # only selective recompute reads the module list
        before = _input_value(raw, dest, release)
        if _unset(value):
            if raw.given(dest) and not _unset(raw.value(dest)):
                remove.append(table.by_dest(dest).flag)
            continue
        if isinstance(before, list):
            before = tuple(before)
        if (tuple(value) if isinstance(value, list) else value) == before:
            continue
        add += _flag_tokens(dest, value, release)
    return tuple(add), tuple(remove)


def candidate_raw(raw: RawArgs, candidate: Candidate, release: str) -> RawArgs:
    """The input's settings with this candidate's layout: what the verifier re-estimates."""
    return layout_raw(raw, dict(candidate.settings), release)


def candidate_argv(argv: Sequence[str], candidate: Candidate, release: str) -> list[str]:
    """Megatron flags ``argv`` edited to select this candidate: the flags it removes or sets are
    taken out with their values, then ``candidate.flags`` are appended (``release``: the label
    of the release whose flags ``argv`` holds)."""
    from megatron_estimator.megatron.flags import flag_table

    table = flag_table(release)
    touched = {table.by_option(f).dest for f in candidate.remove_flags}
    touched.update(spec.dest for spec in map(table.by_option, candidate.flags) if spec is not None)
    out: list[str] = []
    tokens = list(argv)
    i = 0
    while i < len(tokens):
        token = tokens[i]
        spec = table.by_option(token.split("=", 1)[0]) if token.startswith("--") else None
        i += 1
        if spec is None or spec.dest not in touched:
            out.append(token)
            continue
        if "=" in token or not spec.takes_value:
            continue
        if spec.nargs in ("+", "*", "?"):
            while i < len(tokens) and not tokens[i].startswith("--"):
                i += 1
                if spec.nargs == "?":
                    break
        else:
            i += spec.nargs if isinstance(spec.nargs, int) else 1
    return out + list(candidate.flags)



def layout_raw(raw: RawArgs, settings: Mapping[str, Any], release: str) -> RawArgs:
    """The input's settings with these planned settings instead of its own."""
    out = {d: s for d, s in raw.settings.items() if d not in PLANNED_DESTS and d not in settings}
    for dest, value in settings.items():
        if value is None or value is False:
            continue
        if dest == "recompute_modules" and settings.get("recompute_granularity") != "selective" and raw.given(dest):
            out[dest] = raw.settings[dest]
            continue
        out[dest] = RawSetting(dest, value, _flag_tokens(dest, value, release)[0])
    return RawArgs(out, raw.source)


def candidate_settings(search: "_Search", fit: "_Fit") -> dict[str, Any]:
    """Every planned dest -> the value this fitting layout uses."""
    layout = fit.memory.layout
    settings: dict[str, Any] = family_settings(layout.tp, layout.cp, layout.pp, layout.pipeline)
    settings.update({"expert_model_parallel_size": layout.ep,
                     "expert_tensor_parallel_size": layout.etp if search.moe and layout.etp != layout.tp else None,
                     "micro_batch_size": fit.micro_batch_size, "global_batch_size": search.gbs,
                     "use_distributed_optimizer": fit.chosen_optimizer,
                     "sequence_parallel": fit.sequence_parallel})
    settings.update(fit.recompute.settings())
    return settings


def candidate(search: "_Search", fit: "_Fit", verify: Verifier | None = None) -> Candidate:
    """The Candidate of a fitting layout; with ``verify`` its figures must match the normal
    path's estimate of its settings (``Candidate.estimate``)."""
    layout = fit.memory.layout
    device, allocated, rank = fit.resolve()
    settings = candidate_settings(search, fit)
    proxy = fit.cost.proxy(fit.micro_batch_size, fit.num_microbatches, fit.recompute, fit.sequence_parallel,
                           fit.distributed_optimizer)
    flags, remove = candidate_flags(search.inp.raw, settings, search.megatron.version)
    found = Candidate(
        parallel=fit.memory.dims, pipeline=layout.pipeline, micro_batch_size=fit.micro_batch_size,
        num_microbatches=fit.num_microbatches, sequence_parallel=fit.sequence_parallel, recompute=fit.recompute,
        distributed_optimizer=fit.chosen_optimizer, peak_stage=rank, device_peak_bytes=device,
        allocated_peak_bytes=allocated, headroom_bytes=search.budget - device, proxy=proxy,
        settings=tuple((d, settings.get(d)) for d in PLANNED_DESTS + extra_dests(layout.pipeline)), flags=flags,
        remove_flags=remove)
    if verify is None:
        return found
    verdict = verify(candidate_raw(search.inp.raw, found, search.megatron.version))
    if verdict.estimate is None:
        raise RuntimeError(f"planner: layout {' '.join(flags)} passed the rules but the estimator rejects it: "
                           + "; ".join(f"{p.location}: {p.message}" for p in verdict.problems))
    peak = verdict.estimate.peak_stage
    if (peak.device_peak_bytes, peak.allocated_peak_bytes, peak.pipeline_rank) != (device, allocated, rank):
        raise RuntimeError(f"planner: the fast estimate of {' '.join(flags) or 'the input layout'} ({device} "
                           f"bytes on stage {rank}) differs from the estimator's "
                           f"({peak.device_peak_bytes} bytes on stage {peak.pipeline_rank})")
    return replace(found, estimate=verdict.estimate)
