"""One request, one way from input to verdict: every front (``estimate``, ``run``, ``check``,
``plan``'s input side, ``api.estimate``, ``api.evaluate``, the pytest plugin, the suggestions'
re-estimates) reads its input, builds a ``Request`` and calls ``verdict_of``; they differ only in
the fields they fill (where the world size and the budget come from, the overheads)."""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from megatron_estimator.core.problems import OPAQUE_REQUIRED, InvalidInput, Problem
from megatron_estimator.core.sourced import Sourced
from megatron_estimator.config.world_size import world_size_for
from megatron_estimator.inputs.rawargs import RawArgs
from megatron_estimator.inputs.seed_options import SEED_WORLD_SIZE, SEED_WORLD_SOURCE
from megatron_estimator.results.estimate import Assumption, Estimate, Verdict


@dataclass(frozen=True)
class Request:
    """What one check asks: the input as read (``api.TrainingInput``, its release ``inp.release``)
    and the problems reading it found, with

    - ``world_size``: the size given to the estimator (``--world-size``, the ``world_size``
      argument) and its source text; None: the environment's ``WORLD_SIZE`` when ``world_environ``
      is given (the fronts whose shell is the job's own), else the input's own
      (``config.world_size.world_size_for``); ``world_size_location``: where a bad given size is
      reported (default its source); ``say_launch``: the source also names what the launch says;
    - ``budget``: bytes and where they came from (None: no budget, nothing checked);
    - ``overheads`` (``model.overhead.Overheads``; None: the defaults) and ``environ``, the job's
      environment (None: this process's);
    - ``suggest``: a refusal carries the nearest changes that fit; ``fits_on``: the catalog GPUs
      on which every stage fits (the planner's and the suggestions' re-estimates leave it out)."""
    inp: Any
    problems: tuple[Problem, ...] = ()
    world_size: Sourced | None = None
    world_size_location: str | None = None
    say_launch: bool = False
    world_environ: Mapping[str, str] | None = None
    budget: Sourced | None = None
    overheads: Any = None
    environ: Mapping[str, str] | None = None
    suggest: bool = False
    fits_on: bool = True


def verdict_of(request: Request) -> Verdict:
    """The verdict on ``request``: its world size (``world_size_for``, whose problems follow the
    input's), then validation and the estimate against ``inp.release`` (named as
    ``Verdict.megatron``); never raises for bad input (the verdict holds the problems).

    A refused input's verdict keeps the input's notices (``Verdict.notes``: the unknown values
    it assumed, each with its file:line), which a valid one states among its assumptions."""
    from megatron_estimator.results.estimate import build_estimate as estimate_memory
    from megatron_estimator.model.overhead import Overheads
    from megatron_estimator.config.resolve import resolve_config
    from megatron_estimator.inputs.entry_script import model_family
    from megatron_estimator.report.assumptions import state_all

    inp = request.inp
    given = request.world_size
    world, world_problems = world_size_for(inp, given.value if given else None, given.source if given else None,
                                           environ=request.world_environ, say_launch=request.say_launch,
                                           location=request.world_size_location)
    world_size, world_size_source = world if world is not None else (None, None)
    problems = tuple(request.problems) + world_problems
    budget, budget_source = request.budget if request.budget is not None else (None, None)
    environ = request.environ
    family = model_family(inp.raw, inp.entry)
    # The seed-style defaults taken: an assumption of the estimate, a notice of a refusal.
    defaults = default_words(inp, world_size_source if world_size is not None else inp.world_size_source)
    said: tuple[Assumption, ...] = ()
    if defaults:
        from megatron_estimator.report.assumptions import seed_defaults

        said = (seed_defaults(defaults),)
    notices = tuple(a.text for a in said) + inp.notes
    if problems and not inp.raw.settings:
        if inp.entry is None:
            return Verdict(inp.source, megatron=inp.release, problems=problems, notes=notices)
        # A launch of a family the estimator does not model is refused as such, whatever else.
        from megatron_estimator.config.family import unsupported_model

        refusal = unsupported_model(family)
        return Verdict(inp.source, megatron=inp.release, problems=problems + ((refusal,) if refusal else ()),
                       family=family, notes=notices)
    env = job_environ(environ, inp.environment)
    if world_size is None:
        world_size, world_size_source = inp.world_size, inp.world_size_source
    if world_size is None and inp.world_size_unknown is not None and inp.world_size_unknown not in problems:
        problems = problems + (inp.world_size_unknown,)
    overheads = request.overheads or Overheads()

    def resolve(compute_capability: float | None):
        return resolve_config(inp.raw, world_size=world_size, world_size_source=world_size_source, environ=env,
                              compute_capability=compute_capability, flash_attn=overheads.flash_attn,
                              resume=overheads.resume, transformer_engine=overheads.transformer_engine,
                              launch_location=inp.launch_location, job_environment=inp.job_environment, family=family,
                              release=inp.release,
                              assumed_compute_capability=None if compute_capability else overheads.compute_capability)

    try:
        config = resolve(overheads.compute_capability if overheads.gpu_known else None)
    except InvalidInput as err:
        # A key the input already reported (missing, mistyped) makes validation miss it too:
        # one message per problem, the input's own.
        reported = {p.location for p in problems}
        found = tuple(p for p in err.problems if p not in problems and p.location not in reported
                      and not (problems and p.code == OPAQUE_REQUIRED))   # its cause is reported already
        # An unsupported model family is said first: the rest is only what its command line holds.
        refusals = tuple(p for p in err.problems if p.code == "unsupported-model")
        problems = refusals + problems + tuple(p for p in found if p not in refusals)
        return Verdict(inp.source, megatron=inp.release, problems=problems, family=family, notes=notices)
    if problems:
        # The input had problems of its own (an unknown flag, a bad value): report them, with
        # whatever validation found in the rest, instead of an estimate of something else.
        return Verdict(inp.source, megatron=inp.release, problems=problems, family=family, notes=notices)
    if inp.notes:
        config = replace(config, notes=config.notes + inp.notes)
    result = estimate_memory(config, budget=budget, budget_source=budget_source,
                             overheads=overheads, environ=env)
    result = replace(result, assumptions=said + state_all(result.assumed))
    if request.fits_on:
        from megatron_estimator.results.catalog_fit import catalog_fit

        result = replace(result, catalog_fit=catalog_fit(result, resolve, overheads, env))
    if request.suggest and result.fits is False:
        return Verdict(inp.source, megatron=inp.release, estimate=result, family=family,
                       suggestions=suggest_changes(inp, result, overheads=overheads, environ=environ))
    return Verdict(inp.source, megatron=inp.release, estimate=result, family=family)


def suggest_changes(inp: Any, refused: Estimate, *, overheads=None, environ: Mapping[str, str] | None = None):
    """The nearest changes of the refused launch ``inp`` (estimated as ``refused``, a stage over
    its budget) that make every stage fit: a ``results.suggestion.Suggestions`` (planner/suggest.py),
    each suggestion re-estimated through ``verdict_of`` on the same world, budget and overheads."""
    from megatron_estimator.model.overhead import Overheads
    from megatron_estimator.planner.suggest import suggest

    overheads = overheads or Overheads()
    env = job_environ(environ, inp.environment)
    world = Sourced(refused.world_size, refused.world_size_source) if refused.world_size is not None else None
    budget = Sourced(refused.budget_bytes, refused.budget_source) if refused.budget_bytes is not None else None

    def verifier(raw: RawArgs) -> Verdict:
        return verdict_of(Request(replace(inp, raw=raw, notes=()), world_size=world, budget=budget,
                                  overheads=overheads, environ=environ, fits_on=False))

    return suggest(inp, refused, overheads=overheads, environ=env, verify=verifier)


def job_environ(base: Mapping[str, str] | None, extra: Mapping[str, str | None]) -> dict[str, str]:
    """The job's environment: ``base`` (None: this process's) with what the input adds (None: a
    variable the launch script unsets, which the job does not get)."""
    env = dict(os.environ if base is None else base)
    for name, value in extra.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def default_words(inp: Any, world_size_source: str | None) -> tuple[str, ...]:
    """The seed-style defaults ``inp`` took, the world size among them when it is the one used."""
    return inp.defaults + ((f"{SEED_WORLD_SIZE} GPUs",) if world_size_source == SEED_WORLD_SOURCE else ())
