"""A training log's measured memory beside the estimate of the configuration it ran with.

Records only, and the arithmetic that builds them from a ``MegatronLog`` and an ``Estimate``:
which pipeline stage a rank holds, the relative errors, whether the estimate had refused a
launch that ran out of memory, and the ``[tool.megatron-estimator]`` settings the logged gaps
imply.  Bytes are ints; errors and fractions are the only floats.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from megatron_estimator.core.units import MiB
from megatron_estimator.results.estimate import Estimate, Verdict


def pipeline_rank_of(rank: int, world_size: int, tp: int, cp: int, pp: int, tp_pp_dp: bool = False) -> int:
    """The pipeline stage of a global rank in Megatron's rank order.

    megatron/core/parallel_state.py initialize_model_parallel builds its groups with
    ``order="tp-cp-ep-dp-pp"`` (tensor parallel varies fastest, pipeline slowest), so a
    stage holds ``world_size / pp`` consecutive ranks; ``--use-tp-pp-dp-mapping``
    (megatron/training/initialize.py) uses ``tp-cp-ep-pp-dp``, where pp follows tp and cp.
    """
    if tp_pp_dp:
        return (rank // (tp * cp)) % pp
    return rank // (world_size // pp)


def relative_error(estimated: int, measured: int) -> float | None:
    """(estimated - measured) / measured: positive when the estimate is above the measurement."""
    return None if measured <= 0 else (estimated - measured) / measured


@dataclass(frozen=True)
class MomentsTiming:
    """When the optimizer's moments come to exist in the logged run.

    Megatron's optimizers create them lazily, in the first ``step()``: torch.optim.Adam(W)
    ``_init_group`` (``state['exp_avg'] = torch.zeros_like(p)``), TE's FusedAdam (the one
    megatron/core/optimizer/__init__.py imports first; transformer_engine/pytorch/optimizers/
    fused_adam.py ``step``: ``if len(state) == 0: self.initialize_state(p, ...)``) and Apex's
    FusedAdam alike; the distributed optimizer wraps them and creates no state at
    construction (megatron/core/optimizer/distrib_optimizer.py).  Only loading a checkpoint's
    optimizer state creates them before the first step: ``init_state_fn``
    (optimizer/__init__.py, zeros for exp_avg / exp_avg_sq) runs from
    ``sharded_state_dict(is_loading=True)`` (optimizer.py), which load_checkpoint
    (megatron/training/checkpointing.py) calls unless --finetune or --no-load-optim.  So until
    the first step of the run ends, the forward and backward passes run without the moments;
    Megatron reports again after the second iteration for that reason (training.py
    ``training_log``, core_v0.16.1 lines 2093-2101)."""
    first_step: int | None     # the iteration whose step creates them; None: they exist from the start
    why: str


def moments_timing(log) -> MomentsTiming:
    """From the log's checkpoint load line and --finetune / --no-load-optim."""
    loaded = log.loaded_iteration
    skip = [flag for flag, dest in (("--finetune", "finetune"), ("--no-load-optim", "no_load_optim"))
            if log.raw.value(dest, False)]
    if loaded is None:
        return MomentsTiming(1, "no checkpoint loaded: the first optimizer step creates the Adam moments")
    if skip:
        return MomentsTiming(loaded + 1, f"{log.loaded_location}: checkpoint loaded at iteration {loaded} "
                             f"without its optimizer state ({', '.join(skip)}): the next step creates the moments")
    return MomentsTiming(None, f"{log.loaded_location}: checkpoint loaded at iteration {loaded} with its "
                         "optimizer state: the moments exist from the start")


def estimate_at(stage, iteration: int | None, timing: MomentsTiming) -> tuple[int, str]:
    """The stage's allocated peak up to the end of ``iteration`` (the logged max allocated is
    the peak since start-up: Megatron never resets it), and which state that is.

    Through the step that creates the moments the peak is the larger of the forward/backward
    peak without them (the estimate's peak less ``optimizer_moments``) and the step itself,
    where the moments exist and the held activations are freed (the peak less
    ``activations``): the steady peak less the smaller of the two.  After it, the estimate's
    steady-state peak."""
    if timing.first_step is None or iteration is None or iteration > timing.first_step:
        return stage.allocated_peak_bytes, "steady"
    moments = dict(stage.details).get("optimizer_moments", 0)
    return stage.allocated_peak_bytes - min(moments, stage.bytes.activations), "before the moments"


@dataclass(frozen=True)
class RankComparison:
    """One rank's logged peaks (the largest over its ``report_memory`` lines) and its stage's
    estimate at the time of the line that logged the largest max allocated (``estimate_at``)."""
    rank: int
    pipeline_rank: int
    reports: int
    location: str                       # the report_memory line compared (largest max allocated)
    measured_max_allocated_bytes: int
    measured_max_reserved_bytes: int
    allocated_peak_bytes: int           # the stage's estimate (torch.cuda.max_memory_allocated)
    reserved_estimate_bytes: int        # allocated peak + the fragmentation term
    device_peak_bytes: int              # + CUDA context and NCCL buffers, which reserved does not hold
    iteration: int | None = None        # when that line was printed (None: its name says none)
    state: str = "steady"               # "steady" or "before the moments" (estimate_at)
    steady_allocated_peak_bytes: int | None = None   # the stage's steady-state estimate

    @property
    def allocated_error(self) -> float | None:
        return relative_error(self.allocated_peak_bytes, self.measured_max_allocated_bytes)

    @property
    def reserved_error(self) -> float | None:
        return relative_error(self.reserved_estimate_bytes, self.measured_max_reserved_bytes)

    @property
    def device_error(self) -> float | None:
        return relative_error(self.device_peak_bytes, self.measured_max_reserved_bytes)

    def to_json(self) -> dict:
        return {
            "rank": self.rank, "pipeline_rank": self.pipeline_rank, "reports": self.reports,
            "location": self.location,
            "measured_max_allocated_bytes": self.measured_max_allocated_bytes,
            "measured_max_reserved_bytes": self.measured_max_reserved_bytes,
            "allocated_peak_bytes": self.allocated_peak_bytes,
            "reserved_estimate_bytes": self.reserved_estimate_bytes,
            "device_peak_bytes": self.device_peak_bytes,
            "allocated_error": self.allocated_error, "reserved_error": self.reserved_error,
            "device_error": self.device_error, "iteration": self.iteration, "state": self.state,
            "steady_allocated_peak_bytes": self.steady_allocated_peak_bytes,
        }


@dataclass(frozen=True)
class OomComparison:
    """A CUDA out-of-memory message beside the estimate: had the estimate refused the launch?"""
    rank: int | None
    rank_source: str
    pipeline_rank: int | None           # None: the rank is not known (compared with the peak stage)
    location: str
    requested_bytes: int
    allocated_bytes: int
    reserved_bytes: int
    total_capacity_bytes: int
    process_in_use_bytes: int | None
    device_peak_bytes: int              # the stage's (or the peak stage's) estimate
    budget_bytes: int | None
    budget_source: str | None
    stage_refused: bool | None          # the stage's device peak exceeds the budget
    launch_refused: bool | None         # some stage does: the estimate refused the launch

    def to_json(self) -> dict:
        return {
            "rank": self.rank, "rank_source": self.rank_source, "pipeline_rank": self.pipeline_rank,
            "location": self.location, "requested_bytes": self.requested_bytes,
            "allocated_bytes": self.allocated_bytes, "reserved_bytes": self.reserved_bytes,
            "total_capacity_bytes": self.total_capacity_bytes,
            "process_in_use_bytes": self.process_in_use_bytes,
            "device_peak_bytes": self.device_peak_bytes, "budget_bytes": self.budget_bytes,
            "budget_source": self.budget_source, "stage_refused": self.stage_refused,
            "launch_refused": self.launch_refused,
        }


@dataclass(frozen=True)
class SuggestedSetting:
    key: str                  # a settings.py key: fragmentation, cuda-context, nccl-buffers
    value: float | int | None  # a fraction, or bytes; None: the log does not measure it
    current: float | int       # the value the estimate used
    derivation: str

    @property
    def toml_value(self) -> str:
        value = self.current if self.value is None else self.value
        if isinstance(value, float):
            return f"{value:g}"
        return f'"{value // MiB}MiB"' if value % MiB == 0 else f'"{value}B"'

    def to_json(self) -> dict:
        return {"key": self.key, "value": self.value, "current": self.current, "derivation": self.derivation}


@dataclass(frozen=True)
class LogComparison:
    source: str
    verdict: Verdict
    ranks: tuple[RankComparison, ...] = ()
    out_of_memory: tuple[OomComparison, ...] = ()
    suggested_settings: tuple[SuggestedSetting, ...] | None = None
    notes: tuple[str, ...] = ()

    @property
    def exit_code(self) -> int:
        return self.verdict.exit_code if self.verdict.estimate is None else 0


def compare_ranks(log, estimate: Estimate, tp_pp_dp: bool, fragmentation: float) -> tuple[RankComparison, ...]:
    """Per rank that logged memory: its largest logged peaks against its stage's estimate at
    the time they were logged (``estimate_at``; ``fragmentation``: the fraction the estimate used)."""
    p = estimate.parallelism
    timing = moments_timing(log)
    by_rank: dict[int, list] = {}
    for report in log.memory:
        by_rank.setdefault(report.rank, []).append(report)
    stages = {s.pipeline_rank: s for s in estimate.stages}
    out = []
    for rank in sorted(by_rank):
        reports = by_rank[rank]
        if rank >= estimate.world_size:
            continue
        stage = stages[pipeline_rank_of(rank, estimate.world_size, p["tp"], p["cp"], p["pp"], tp_pp_dp)]
        # the peak since start-up: the largest, and of equal ones the latest line
        top = max(enumerate(reports), key=lambda ir: (ir[1].max_allocated, ir[0]))[1]
        allocated, state = estimate_at(stage, top.iteration, timing)
        frag = int(allocated * fragmentation)
        o = stage.device_overhead
        out.append(RankComparison(
            rank=rank, pipeline_rank=stage.pipeline_rank, reports=len(reports), location=top.location,
            measured_max_allocated_bytes=top.max_allocated,
            measured_max_reserved_bytes=max(r.max_reserved for r in reports),
            allocated_peak_bytes=allocated,
            reserved_estimate_bytes=allocated + frag,
            device_peak_bytes=allocated + o.cuda_context + o.communication_buffers + frag,
            iteration=top.iteration, state=state, steady_allocated_peak_bytes=stage.allocated_peak_bytes))
    return tuple(out)


def timing_notes(log, ranks: tuple[RankComparison, ...]) -> list[str]:
    """The note that says why some ranks are compared with the state before the moments."""
    early = [r.rank for r in ranks if r.state != "steady"]
    if not early:
        return []
    return [f"ranks {early} logged their peak by the end of the step that creates the optimizer's moments: "
            f"compared with the estimate without them ({moments_timing(log).why})"]


def compare_ooms(log, estimate: Estimate, tp_pp_dp: bool) -> tuple[OomComparison, ...]:
    p = estimate.parallelism
    stages = {s.pipeline_rank: s for s in estimate.stages}
    out = []
    for oom in log.out_of_memory:
        pipeline_rank = None
        if oom.rank is not None and oom.rank < estimate.world_size:
            pipeline_rank = pipeline_rank_of(oom.rank, estimate.world_size, p["tp"], p["cp"], p["pp"], tp_pp_dp)
        stage = stages[pipeline_rank] if pipeline_rank is not None else estimate.peak_stage
        out.append(OomComparison(
            rank=oom.rank, rank_source=oom.rank_source, pipeline_rank=pipeline_rank, location=oom.location,
            requested_bytes=oom.requested, allocated_bytes=oom.allocated, reserved_bytes=oom.reserved,
            total_capacity_bytes=oom.total_capacity, process_in_use_bytes=oom.process_in_use,
            device_peak_bytes=stage.device_peak_bytes, budget_bytes=estimate.budget_bytes,
            budget_source=estimate.budget_source, stage_refused=None if stage.fits is None else not stage.fits,
            launch_refused=None if estimate.fits is None else not estimate.fits))
    return tuple(out)


def suggest_settings(log, ranks: tuple[RankComparison, ...], communicators: int, cuda_context: int,
                     nccl_buffers: int, fragmentation: float) -> tuple[SuggestedSetting, ...]:
    """The fragmentation, CUDA context and NCCL buffer settings the logged figures imply.

    - fragmentation: the estimate's fragmentation term is ``allocated peak x fragmentation``
      (model/stage.py), standing for what the caching allocator reserves beyond what it hands
      out; measured, that is ``max reserved / max allocated - 1`` of a rank's report_memory
      lines.  The largest over the ranks, rounded up to 0.001, covers every rank.
    - cuda-context and nccl-buffers: memory outside the allocator, which ``reserved`` does not
      hold.  A report_memory line with ``total device memory used`` (--log-device-memory-used:
      torch.cuda.device_memory_used, the whole device) gives it as used minus reserved at the
      same moment; an out-of-memory message as "this process has M memory in use" minus what
      PyTorch reserved.  The largest such gap O is split as the estimate adds it (model/stage.py:
      one CUDA context plus NCCL buffers per communicator): the CUDA context keeps its setting
      and ``(O - context) / communicators``, rounded up to 1 MiB, is each communicator's
      buffers; when O is below the context setting, O is the context and the buffers are 0.
    """
    gaps = [(r.measured_max_reserved_bytes / r.measured_max_allocated_bytes - 1, r) for r in ranks
            if r.measured_max_allocated_bytes > 0]
    if gaps:
        worst, rank = max(gaps, key=lambda g: (g[0], -g[1].rank))
        value = max(0.0, math.ceil(round(worst * 1000, 6)) / 1000)
        frag = SuggestedSetting("fragmentation", value, fragmentation, (
            f"largest (max reserved - max allocated) / max allocated over {len(gaps)} logged rank(s): "
            f"rank {rank.rank} ({rank.location}) {rank.measured_max_reserved_bytes} / "
            f"{rank.measured_max_allocated_bytes} bytes - 1 = {worst:.4f}, rounded up to 0.001"))
    else:
        frag = SuggestedSetting("fragmentation", None, fragmentation,
                                "no report_memory line in the log: not measured, the current value kept")
    samples = []
    for report in log.memory:
        if report.device_used is not None:
            samples.append((report.device_used - report.reserved,
                            f"{report.location}: total device memory used - reserved"))
    for oom in log.out_of_memory:
        if oom.process_in_use is not None:
            samples.append((oom.process_in_use - oom.reserved,
                            f"{oom.location}: this process's memory in use - reserved by PyTorch"))
    if not samples:
        why = ("not measured (no 'total device memory used' in the report_memory lines, which "
               "--log-device-memory-used adds, and no out-of-memory message): the current value kept")
        return (frag, SuggestedSetting("cuda-context", None, cuda_context, why),
                SuggestedSetting("nccl-buffers", None, nccl_buffers, why))
    outside, where = max(samples, key=lambda s: s[0])
    outside = max(0, outside)
    head = f"memory outside the allocator O = {outside} bytes ({where}; the largest of {len(samples)})"
    if outside <= cuda_context or communicators == 0:
        context = SuggestedSetting("cuda-context", outside, cuda_context,
                                   f"{head}; " + ("no communicator moves data in this layout: O is the context"
                                                  if communicators == 0 else "O is below the context setting: "
                                                  "O is the context"))
        nccl = SuggestedSetting("nccl-buffers", 0 if communicators else None, nccl_buffers,
                                f"{head}; nothing of O is left for NCCL" if communicators else
                                "no communicator in this layout: not measured, the current value kept")
        return frag, context, nccl
    per = math.ceil((outside - cuda_context) / communicators / MiB) * MiB
    return (frag,
            SuggestedSetting("cuda-context", cuda_context, cuda_context,
                             f"{head}; the context keeps its setting (one number cannot split the two)"),
            SuggestedSetting("nccl-buffers", per, nccl_buffers,
                             f"{head}; (O - cuda-context {cuda_context}) / {communicators} communicator(s), "
                             "rounded up to 1 MiB"))
