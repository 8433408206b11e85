"""Which GPUs of the catalog (megatron/gpus.py) an input fits on.

A GPU fits when every pipeline stage's device peak is within its budget, the capacity CUDA
reports (``GpuSpec.total_memory_bytes``), the comparison ``StageEstimate.fits`` makes.  The
peak itself depends on the GPU through its compute capability only (the run context's
``gpu_compute_capability`` and ``Overheads.compute_capability``: validation rules, the
attention kernel, workspaces), so the caller's estimate is asked once per distinct compute
capability and every GPU that shares one is judged on the same stages.  That is a resolve
and an estimate per distinct capability (nine in the catalog: about ten times one estimate),
so ``lazy_fits_on`` defers it until a report reads ``Estimate.fits_on``: ``run`` launching a
fitting job and the API's callers that never ask pay nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    from megatron_estimator.results.estimate import Estimate

from megatron_estimator.megatron.gpus import GPUS


def fits_on(estimate_on: Callable[[float], Estimate | None]) -> tuple[str, ...]:
    """The catalog names, in catalog order, of the GPUs on which every stage fits.
    ``estimate_on(compute_capability)``: the input's estimate on a GPU of that compute
    capability, or None when the input is invalid there (it fits on none of them)."""
    by_capability: dict[float, Estimate | None] = {}
    names = []
    for gpu in GPUS:
        capability = gpu.compute_capability_value
        if capability not in by_capability:
            by_capability[capability] = estimate_on(capability)
        estimate = by_capability[capability]
        if estimate is not None and all(s.device_peak_bytes <= gpu.total_memory_bytes for s in estimate.stages):
            names.append(gpu.name)
    return tuple(names)


def lazy_fits_on(estimate_on: Callable[[float], Estimate | None]) -> Callable[[], tuple[str, ...]]:
    """``fits_on(estimate_on)``, worked out on the first call and remembered."""
    found: list[tuple[str, ...]] = []

    def answer() -> tuple[str, ...]:
        if not found:
            found.append(fits_on(estimate_on))
        return found[0]

    return answer


def catalog_fit(result: Estimate, resolve, overheads, env):
    """The catalog GPUs (megatron/gpus.py, in catalog order) on which every stage of the input
    fits its capacity as CUDA reports it.  The GPU changes the run context (its compute
    capability: validation rules such as CUDA_DEVICE_MAX_CONNECTIONS before Blackwell, the
    attention kernel in deterministic mode, workspaces, the fused cross entropy's buffers), so
    the input is resolved and estimated once per distinct compute capability, as if that GPU had
    been named; one the rules refuse there fits on none of its GPUs.  Returns the function
    that works them out (``catalog_fit.lazy_fits_on``)."""
    from dataclasses import replace

    from megatron_estimator.core.problems import InvalidInput
    from megatron_estimator.results.estimate import build_estimate

    def on(capability: float):
        if overheads.gpu_known and capability == overheads.compute_capability:
            return result
        try:
            config = resolve(capability)        # the run's release travels in its run context
        except InvalidInput:
            return None
        return build_estimate(config, environ=env,
                              overheads=replace(overheads, compute_capability=capability, gpu_known=True))

    return lazy_fits_on(on)
