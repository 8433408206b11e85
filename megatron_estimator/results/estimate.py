"""The estimate as data: frozen results, in bytes, with the assumptions behind them.

These objects are what the library returns and what every renderer (text, JSON, markdown)
reads; their field names are the JSON contract's (``schemas/report.schema.json``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from megatron_estimator.core.problems import Problem
# The memory model's records of bytes (model/records.py), part of the results' contract.
from megatron_estimator.model.records import (Assumed, DeviceOverhead, MemoryBytes, ModelShape, ModuleBytes,
                                              StageEstimate)

__all__ = ["Assumed", "Assumption", "DeviceOverhead", "MemoryBytes", "ModelShape", "ModuleBytes", "StageEstimate",
           "Estimate", "Verdict", "build_estimate"]


@dataclass(frozen=True)
class Assumption:
    """An assumption as the report states it (report/assumptions.py ``state``); ``value`` is
    shown when it is a number.  The JSON contract's ``assumptions`` entries."""
    key: str
    text: str
    value: int | float | str | None = None

    def to_json(self) -> dict:
        return {"key": self.key, "text": self.text, "value": self.value}


@dataclass(frozen=True)
class Estimate:
    world_size: int
    world_size_source: str
    parallelism: Mapping[str, int | None]      # read-only: tp, pp, vpp, cp, dp, ep, etp, edp
    stages: tuple[StageEstimate, ...]
    assumed: tuple[Assumed, ...]               # the facts; report/assumptions.py states them
    budget_bytes: int | None = None
    budget_source: str | None = None
    model: ModelShape | None = None            # the model and batch, for the summary lines
    total_parameters: int = 0
    # ``assumed`` as the report states them: filled in by api.evaluate (report/assumptions.py).
    assumptions: tuple[Assumption, ...] = ()
    # Gives the catalog GPUs on which every stage fits (api.evaluate sets it: results/catalog_fit.py
    # ``lazy_fits_on``; asked only when ``fits_on`` is read); None: not asked.
    catalog_fit: Any = field(default=None, compare=False, repr=False)

    @property
    def fits_on(self) -> tuple[str, ...] | None:
        """The GPU catalog's names (megatron/gpus.py, catalog order) on which every stage fits,
        each GPU judged with its own compute capability, whatever the budget; None: not asked."""
        return self.catalog_fit() if self.catalog_fit is not None else None

    @property
    def peak_stage(self) -> StageEstimate:
        return max(self.stages, key=lambda s: (s.device_peak_bytes, -s.pipeline_rank))

    @property
    def fits(self) -> bool | None:
        if self.budget_bytes is None:
            return None
        return all(stage.fits for stage in self.stages)

    @property
    def status(self) -> str:
        return "over_budget" if self.fits is False else "fits"


@dataclass(frozen=True)
class Verdict:
    """What a command says about one input: an estimate, or the problems that stopped it."""
    source: str
    estimate: Estimate | None = None
    problems: tuple[Problem, ...] = ()
    notes: tuple[str, ...] = field(default=())
    # results.suggestion.Suggestions on a refusal, when the caller asked for them (api.evaluate)
    suggestions: Any = field(default=None, compare=False)
    # inputs.entry_script.ModelFamily: the model family the entry script and flags say (None: not read)
    family: Any = None
    # inputs.job_stack.StackPackage records: the job's packages as ``run`` found them (empty: not looked at)
    stack: tuple = ()
    # megatron.releases.ChosenRelease this input was checked against (api.evaluate sets it from
    # TrainingInput.release); None: a verdict made without evaluating (the default release)
    megatron: Any = None

    @property
    def status(self) -> str:
        if self.estimate is None:
            return "invalid"
        return self.estimate.status

    @property
    def exit_code(self) -> int:
        return {"fits": 0, "over_budget": 1, "invalid": 2}[self.status]


def build_estimate(config, *, budget: int | None = None, budget_source: str | None = None,
                   overheads=None, environ: Mapping[str, str] | None = None) -> Estimate:
    """The whole estimate of a validated configuration (``config.typed.EstimatorConfig``):
    every pipeline stage through the one stage function (``model.stage.estimate_stage``), the
    facts assumed, the model summary and the parameter count, against ``budget``; each stage
    with its modules (``model.breakdown.stage_modules``)."""
    import os
    from types import MappingProxyType

    from dataclasses import replace
    from megatron_estimator.model.breakdown import stage_modules
    from megatron_estimator.model.layout import pipeline_stages
    from megatron_estimator.model.overhead import Overheads
    from megatron_estimator.model.stage import (assumptions, estimate_stage, model_shape, shared_terms, states_config,
                                                total_parameters)

    overheads = Overheads() if overheads is None else overheads
    environ = os.environ if environ is None else environ
    stages = pipeline_stages(states_config(config))    # the placement reads no training setting either
    shared = shared_terms(config, overheads, environ)        # alike on every stage
    results = tuple(estimate_stage(config, stage, overheads, environ, budget, shared=shared) for stage in stages)
    results = tuple(replace(result, modules=stage_modules(config, stage, result)) for stage, result in zip(stages, results))
    return Estimate(
        world_size=config.parallel.world_size,
        world_size_source=config.world_size_source,
        parallelism=MappingProxyType(config.parallel.as_dict()),
        stages=results,
        assumed=assumptions(config, overheads, environ, results),
        budget_bytes=budget,
        budget_source=budget_source,
        model=model_shape(config),
        total_parameters=total_parameters(config, stages),
    )
