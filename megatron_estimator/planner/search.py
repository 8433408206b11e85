"""The layout planner: every parallel layout Megatron accepts for a model on N GPUs, the ones
that fit the budget, best first.

Input: a model (anything ``api.load_input`` reads, or a preset name), the world size, the
global batch size and a budget.  The planner chooses only the layout settings
(``PLANNED_DESTS``): tensor (tp), pipeline (pp), virtual pipeline (v) and context (cp)
parallel sizes, expert (ep) and expert tensor (etp) parallel sizes, the micro batch size,
sequence parallelism, activation recomputation and the distributed optimizer.  Every other
setting stays as the user gave it.

The search space (``SearchSpace``; each bound is a field):

- tp: divisors of the world size up to the GPUs of one node (TP across nodes is never
  competitive); cp: divisors of world / tp up to ``max_context_parallel``; pp: divisors of
  world / (tp cp) up to the number of layers; MoE models: ep any divisor of the number of
  experts, etp 1 or tp (Megatron's default is tp);
- v = 1..``max_virtual_stages`` virtual stages per rank; the layers are split evenly when
  they divide, else with ``--decoder-first/last-pipeline-num-layers`` (a balanced middle,
  the first and last stages no heavier), else with a balanced
  ``--pipeline-model-parallel-layout``; the user's own split is one more choice for the
  user's pp;
- micro batch sizes ``micro_batch_sizes``; sequence parallel on and off when tp > 1;
  recompute none, selective ``core_attn``, full uniform (one layer per group), full block
  with ``block_recompute_fractions`` of a model chunk's layers; distributed optimizer off/on.

"Megatron accepts" means the project's own checks pass: ``validation.rules.RULES`` on the
namespace ``derive.derive_namespace`` builds, as ``resolve.resolve_config`` runs them.  The
user's input is validated once (schema, model, vocabulary).  The rules run once per layout
family (tp, cp, pp, split) and again only for the inner choices they read: ``_Reads``
records which varied keys a rule looked at, and its verdict is reused for every choice that
agrees on them (the rules are pure functions of the namespace: the same keys with the same
values take the same path).

"Fits" means the device peak of the peak stage (``StageEstimate.device_peak_bytes``:
allocated memory plus CUDA context, NCCL buffers and fragmentation) is at most the budget.
The numbers are the estimator's: ``_LayoutMemory`` composes the memory/ functions the way
memory/model.py ``estimate_stage`` does.  What is cached, and by what it depends on:

- activations (``_Activations``): per (tp, cp, etp, micro batch, sequence parallel,
  selective recompute modules), each layer's bytes by layer kind (dense or MoE), chunks by
  their structure and their recompute grouping (memory/model.py ``_recompute_groups``), and a
  stage's transients, workspaces and batch; shared by every ep, optimizer and split;
- model states: bounded first, from memory/states.py ``model_states`` on padding-free probe
  tensors (per-element rates of the cheapest and the costliest tensor kind) plus the most
  padding the distributed optimizer can add.  A layout whose lower bound is over budget is
  rejected, one whose upper bound fits is accepted; only layouts in between (a few megabytes
  wide) and the reported ones get the exact states, which are checked against the bounds.

Two facts of the schedule (layout.py), exact and tested against it by brute force: within a
group of stages of the same structure the lowest rank has the most microbatches alive at
every step (its warm-up is longest), so it alone can be the group's peak; and the
interleaved schedule's live counts repeat with the microbatch group, so
``schedule_microbatches`` gives a smaller microbatch count with the same peak (and the peak's
moment does not change when the chunk weights are scaled).  With ``verify`` (the default)
every reported candidate is re-estimated through ``api.evaluate`` from its settings, and its
figures must agree.

Throughput proxy, the relative step time (lower is better; 1.0 is compute alone)::

    step = (1 + R + (T_tp + T_cp + T_ep) / C) x (1 + bubble) + T_dp / C

- C, the compute per GPU and step: F / (world x ``achieved_flops``), F = tokens x 3 x
  (sum over the layers of 2 x active parameters + the causal core attention s x a x (d_qk
  + d_v)) + the output layers' 6 x V x h (MTP included);
- bubble = (p - 1) / (v x M), M microbatches per step (megatron/core/pipeline_parallel/schedules.py);
- R, recompute: full recompute re-runs a layer's forward, a third of its forward and
  backward: R = forward flops of the recomputed layers / step flops (uniform: all layers;
  block n: the first n layers of each model chunk); selective ``core_attn`` re-runs only the
  core attention: R = its forward flops / step flops;
- T_g = V_g / bandwidth, V_g the bytes each GPU sends per step (ring collectives: all-reduce
  2(n-1)/n, all-gather and reduce-scatter (n-1)/n of the full tensor), X = s/cp x b x h
  activation bytes:
  TP: per layer and microbatch two collectives forward and two backward, 8(t-1)/t x X (the
  same with sequence parallelism, all-gather + reduce-scatter for all-reduce); the MoE block
  over etp with top-k times the tokens; a fully recomputed layer adds its forward ones again;
  CP: per layer and microbatch the ring passes the local K and V (cp-1) times forward and K,
  V and their gradients (cp-1) times backward: 3(cp-1) x local K+V bytes;
  EP: per MoE layer and microbatch dispatch and combine, forward and backward: 4 all-to-alls
  of (ep-1)/ep x tokens x top-k x h (tokens / t under sequence parallelism);
  DP: per step the gradients of the GPU's parameters, all-reduced over dp x cp (dense) and
  expert dp (experts), or with the distributed optimizer reduce-scattered, with the
  parameters all-gathered;
- the bandwidth is ``intra_node_bandwidth`` when the group's ranks lie in one node under
  Megatron's rank order (tp-cp-ep-dp-pp: a group of n ranks at stride k spans n x k
  consecutive ranks), else ``inter_node_bandwidth``.  Pipeline send/receive is not counted
  and communication is not assumed to overlap compute.

Ties go to the lower device peak.
"""

from __future__ import annotations

import itertools
import math
import os
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Mapping, Sequence

from megatron_estimator.api import TrainingInput, evaluate, load_input
from megatron_estimator.core.problems import InvalidInput, Problem
from megatron_estimator.model.layout import microbatches_in_flight
from megatron_estimator.model import activations as act
from megatron_estimator.model import stage as memory_model
from megatron_estimator.model.parameters import ParamTensor
from megatron_estimator.model.states import DTYPE_BYTES, model_states
from megatron_estimator.config.derive import shards_optimizer_states
from megatron_estimator.config.run_context import Resume, RunContext
from megatron_estimator.config.typed import with_distributed_optimizer
from megatron_estimator.config.parallel import ParallelDims
from megatron_estimator.inputs.rawargs import RawArgs, RawSetting
from megatron_estimator.results.estimate import Estimate

# -------------------------------------------------------------------------------------------
# What the planner chooses

PARALLEL_DESTS = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
                  "expert_model_parallel_size", "expert_tensor_parallel_size")
SPLIT_DESTS = ("num_layers_per_virtual_pipeline_stage", "num_virtual_stages_per_pipeline_rank",
               "pipeline_model_parallel_layout", "decoder_first_pipeline_num_layers",
               "decoder_last_pipeline_num_layers", "account_for_embedding_in_pipeline_split",
               "account_for_loss_in_pipeline_split", "microbatch_group_size_per_vp_stage")
BATCH_DESTS = ("micro_batch_size", "global_batch_size", "use_distributed_optimizer")
RECOMPUTE_DESTS = ("recompute_granularity", "recompute_method", "recompute_num_layers", "recompute_modules",
                   "recompute_activations", "distribute_saved_activations")
SEQUENCE_PARALLEL_DESTS = ("sequence_parallel",)
PLANNED_DESTS = PARALLEL_DESTS + SPLIT_DESTS + BATCH_DESTS + RECOMPUTE_DESTS + SEQUENCE_PARALLEL_DESTS

# The inner choices of a layout family, in loop order, and the namespace keys each changes.
# Derivation (derive.derive_namespace) runs per batch choice; the expert sizes, recompute and
# sequence parallel are laid over the derived namespace: derive does not read ep and only
# defaults etp, and passes recompute and sequence parallel through for the values the
# planner sets (sequence parallel only with tp > 1, --recompute-activations off).
_EXPERT, _BATCH, _RECOMPUTE, _SP = 0, 1, 2, 3
_KEY_DIM = {"expert_model_parallel_size": _EXPERT, "expert_tensor_parallel_size": _EXPERT}
_KEY_DIM.update({key: _BATCH for key in ("micro_batch_size", "global_batch_size", "num_microbatches",
                                          "use_distributed_optimizer", "use_layer_wise_distributed_optimizer")})
_KEY_DIM.update({key: _RECOMPUTE for key in RECOMPUTE_DESTS})
_KEY_DIM["sequence_parallel"] = _SP
_ALL_DIMS = frozenset((_EXPERT, _BATCH, _RECOMPUTE, _SP))


@dataclass(frozen=True)
class SearchSpace:
    """The bounds of the search (see the module docstring)."""
    gpus_per_node: int = 8
    max_tensor_parallel: int | None = None          # None: gpus_per_node
    max_context_parallel: int = 8
    max_virtual_stages: int = 8
    micro_batch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    block_recompute_fractions: tuple[float, ...] = (0.25, 0.5, 0.75)
    distributed_optimizer: tuple[bool, ...] = (False, True)

    @property
    def tensor_parallel_limit(self) -> int:
        return self.max_tensor_parallel or self.gpus_per_node

    def to_json(self) -> dict:
        return {
            "gpus_per_node": self.gpus_per_node, "max_tensor_parallel": self.tensor_parallel_limit,
            "max_context_parallel": self.max_context_parallel, "max_virtual_stages": self.max_virtual_stages,
            "micro_batch_sizes": list(self.micro_batch_sizes),
            "block_recompute_fractions": list(self.block_recompute_fractions),
            "distributed_optimizer": list(self.distributed_optimizer),
        }


@dataclass(frozen=True)
class ProxyAssumptions:
    """The constants of the throughput proxy (see the module docstring)."""
    achieved_flops: float = 400e12              # dense bf16 FLOP/s one GPU sustains (about 40% of an H100's peak)
    intra_node_bandwidth: float = 300e9         # bytes/s per GPU inside a node (NVLink)
    inter_node_bandwidth: float = 40e9          # bytes/s per GPU across nodes (a 400 Gb/s NIC per GPU)

    def to_json(self) -> dict:
        return {"achieved_flops": self.achieved_flops, "intra_node_bandwidth": self.intra_node_bandwidth,
                "inter_node_bandwidth": self.inter_node_bandwidth}


PROXY_FORMULA = "step = (1 + R + (T_tp + T_cp + T_ep) / C) x (1 + (p - 1) / (v M)) + T_dp / C"


@dataclass(frozen=True)
class PipelineChoice:
    """How the decoder layers are split over pp ranks and v virtual stages."""
    pp: int
    vpp: int | None
    settings: tuple[tuple[str, Any], ...]       # the split dests this choice sets
    label: str


@dataclass(frozen=True)
class Recompute:
    granularity: str | None                     # None | "selective" | "full"
    method: str | None = None                   # full: "uniform" | "block"
    num_layers: int | None = None
    modules: tuple[str, ...] | None = None      # selective: the modules recomputed

    @property
    def label(self) -> str:
        if self.granularity is None:
            return "none"
        if self.granularity == "selective":
            return "selective " + ",".join(self.modules or ())
        return f"full {self.method} {self.num_layers}"

    def settings(self) -> dict[str, Any]:
        return {"recompute_granularity": self.granularity, "recompute_method": self.method,
                "recompute_num_layers": self.num_layers,
                "recompute_modules": list(self.modules) if self.modules else None}

    def to_json(self) -> dict:
        return {"granularity": self.granularity, "method": self.method, "num_layers": self.num_layers,
                "modules": list(self.modules) if self.modules else None, "label": self.label}


NO_RECOMPUTE = Recompute(None)
SELECTIVE_CORE_ATTN = Recompute("selective", modules=("core_attn",))


@dataclass(frozen=True)
class ProxyBreakdown:
    """The throughput proxy of one layout; the terms are fractions of the step's compute."""
    step: float                  # the relative step time the ranking uses (lower is better)
    bubble: float
    recompute: float
    tp_comm: float
    cp_comm: float
    ep_comm: float
    dp_comm: float
    compute_seconds: float       # C: model compute per GPU and step at the assumed FLOP/s
    tp_bytes: int                # bytes each GPU sends per step
    cp_bytes: int
    ep_bytes: int
    dp_bytes: int

    @property
    def relative_throughput(self) -> float:
        return 1.0 / self.step

    def to_json(self) -> dict:
        return {
            "step": round(self.step, 6), "relative_throughput": round(self.relative_throughput, 6),
            "bubble": round(self.bubble, 6), "recompute": round(self.recompute, 6),
            "tp_comm": round(self.tp_comm, 6), "cp_comm": round(self.cp_comm, 6),
            "ep_comm": round(self.ep_comm, 6), "dp_comm": round(self.dp_comm, 6),
            "compute_seconds": round(self.compute_seconds, 6),
            "bytes_per_gpu_per_step": {"tp": self.tp_bytes, "cp": self.cp_bytes, "ep": self.ep_bytes,
                                       "dp": self.dp_bytes},
        }


@dataclass(frozen=True)
class Candidate:
    """One layout that fits, with the flags that select it."""
    parallel: ParallelDims
    pipeline: PipelineChoice
    micro_batch_size: int
    num_microbatches: int
    sequence_parallel: bool
    recompute: Recompute
    distributed_optimizer: bool
    peak_stage: int
    device_peak_bytes: int
    allocated_peak_bytes: int
    headroom_bytes: int
    proxy: ProxyBreakdown
    settings: tuple[tuple[str, Any], ...]   # every planned dest -> the value this layout uses
    flags: tuple[str, ...]                  # Megatron flags to add to (or change on) the input
    remove_flags: tuple[str, ...]           # flags of the input to delete (no flag turns them off)
    estimate: Estimate | None = field(default=None, compare=False, repr=False)

    def to_json(self) -> dict:
        return {
            "flags": list(self.flags),
            "remove_flags": list(self.remove_flags),
            "parallelism": self.parallel.as_dict(),
            "pipeline_split": self.pipeline.label,
            "micro_batch_size": self.micro_batch_size,
            "num_microbatches": self.num_microbatches,
            "sequence_parallel": self.sequence_parallel,
            "recompute": self.recompute.to_json(),
            "distributed_optimizer": self.distributed_optimizer,
            "peak_stage": self.peak_stage,
            "device_peak_bytes": self.device_peak_bytes,
            "allocated_peak_bytes": self.allocated_peak_bytes,
            "headroom_bytes": self.headroom_bytes,
            "throughput_proxy": self.proxy.to_json(),
        }


@dataclass(frozen=True)
class Plan:
    source: str
    world_size: int
    global_batch_size: int
    budget_bytes: int
    budget_source: str
    candidates: tuple[Candidate, ...]       # best first, at most ``top``
    searched: int                           # layouts enumerated
    valid: int                              # layouts Megatron accepts
    fitting: int                            # accepted layouts whose peak stage fits the budget
    seconds: float
    space: SearchSpace
    proxy: ProxyAssumptions
    # problem code -> layouts it rejected, most first (a layout failing several checks counts once,
    # under the first the search meets)
    rejections: tuple[tuple[str, int], ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def fits(self) -> bool:
        return self.fitting > 0


# -------------------------------------------------------------------------------------------
# Input


def plan_input(model: Any = None, *, extra_flags: Sequence[str] = (), preset: str | None = None,
               hf_config: str | None = None, environ: Mapping[str, str] | None = None
               ) -> tuple[TrainingInput, tuple[Problem, ...]]:
    """The model as a ``TrainingInput``: Megatron flags, a mapping, a file (seed or Megatron
    YAML, launch script, HF config.json), a ``TrainingInput``, or a preset (``preset=``, or
    ``model`` a string that is no existing path, path separator or file suffix: ``deepseek-v3``)
    or a HF config (``hf_config=``).  ``extra_flags`` (Megatron flags) add to it or override
    it: a preset or a HF config gives the architecture, the flags the training settings
    (``api.input_from_model``)."""
    from megatron_estimator.api import input_from_flags, input_from_model

    if (preset is None and hf_config is None and isinstance(model, str) and not model.startswith("-")
            and not os.path.exists(model) and os.sep not in model
            and not model.endswith((".json", ".yaml", ".yml", ".sh", ".toml"))):
        preset = model
    if preset is not None or hf_config is not None:
        return input_from_model(list(extra_flags), hf_config=hf_config, model=preset, environ=environ)
    if model is None:
        return input_from_flags(list(extra_flags), environ=environ)
    if isinstance(model, TrainingInput):
        inp, problems = model, ()
    else:
        inp, problems = load_input(model, environ=environ)
    if extra_flags:
        flag_input, flag_problems = input_from_flags(list(extra_flags), environ=environ)
        inp = replace(inp, raw=inp.raw.merged(flag_input.raw), source=f"{inp.source} + command line")
        problems = tuple(problems) + tuple(flag_problems)
    return inp, tuple(problems)


# -------------------------------------------------------------------------------------------
# The search space


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _layout_text(stages: list[str]) -> str:
    """A ``--pipeline-model-parallel-layout`` string for these stages, runs folded as (s|)*n."""
    def short(stage: str) -> str:
        out, i = [], 0
        while i < len(stage):
            j = i
            while j < len(stage) and stage[j] == stage[i]:
                j += 1
            out.append(stage[i] + (f"*{j - i}" if j - i > 2 else stage[i] * (j - i - 1)))
            i = j
        return "".join(out)

    parts, i, last = [], 0, len(stages) - 1
    while i < last:
        j = i
        while j + 1 < last and stages[j + 1] == stages[i]:
            j += 1
        run = j - i + 1
        parts.append(f"({short(stages[i])}|)*{run}" if run > 1 else short(stages[i]) + "|")
        i = j + 1
    parts.append(short(stages[last]))
    return "".join(parts)


def pipeline_choices(num_layers: int, mtp_layers: int, pp: int, max_virtual_stages: int) -> list[PipelineChoice]:
    """The splits the planner tries for ``pp`` ranks: one per number of virtual stages."""
    if pp == 1:
        return [PipelineChoice(1, None, (), "no pipeline")]
    choices = []
    for v in range(1, max_virtual_stages + 1):
        if pp * v > num_layers:
            break
        choice = _split(num_layers, mtp_layers, pp, v)
        if choice is not None:
            choices.append(choice)
    return choices


def _split(num_layers: int, mtp: int, pp: int, v: int) -> PipelineChoice | None:
    vpp = v if v > 1 else None
    virtual = (("num_virtual_stages_per_pipeline_rank", v),) if v > 1 else ()
    n = pp * v
    if num_layers % n == 0:
        per = num_layers // n
        return PipelineChoice(pp, vpp, virtual, f"even, {per} layer{'s' if per != 1 else ''} per chunk")
    # Uneven first/last stages (megatron/training/arguments.py; with v virtual stages every
    # count divisible by v): a balanced middle, ends no heavier than it.
    middle = pp - 2
    if middle == 0:
        first = (num_layers // 2) // v * v
        last = num_layers - first
        if first >= v and last % v == 0:
            return PipelineChoice(pp, vpp, (("decoder_first_pipeline_num_layers", first),
                                            ("decoder_last_pipeline_num_layers", last)) + virtual,
                                  f"first {first}, last {last}")
    else:
        k = -(-num_layers // pp)
        k = -(-k // v) * v
        while k * middle <= num_layers - 2 * v:
            rest = num_layers - k * middle
            first = (rest // 2) // v * v
            last = rest - first
            if rest % v == 0 and v <= first <= k and v <= last <= k:
                return PipelineChoice(pp, vpp, (("decoder_first_pipeline_num_layers", first),
                                                ("decoder_last_pipeline_num_layers", last)) + virtual,
                                      f"first {first}, middle {k}, last {last}")
            k += v
    # A layout string (megatron/core/transformer/pipeline_parallel_layer_layout.py): the layers
    # spread evenly, the extra ones on the middle stages first.
    if n > num_layers:
        return None
    base, extra = divmod(num_layers, n)
    counts = [base] * n
    for index in (list(range(1, n - 1)) + [n - 1, 0])[:extra]:
        counts[index] += 1
    stages = ["t" * c for c in counts]
    stages[0] = "E" + stages[0]
    stages[-1] = stages[-1] + "m" * mtp + "L"
    text = _layout_text(stages)
    return PipelineChoice(pp, vpp, (("pipeline_model_parallel_layout", text),), f"layout {text}")


def recompute_choices(max_chunk_layers: int, fractions: Sequence[float]) -> list[Recompute]:
    """None, selective core_attn, full uniform 1, full block n for each fraction of the layers
    of the largest model chunk (n below that count: block of all is uniform 1)."""
    choices = [NO_RECOMPUTE, SELECTIVE_CORE_ATTN]
    if max_chunk_layers >= 1:
        choices.append(Recompute("full", "uniform", 1))
    blocks = sorted({max(1, int(f * max_chunk_layers)) for f in fractions})
    choices += [Recompute("full", "block", n) for n in blocks if n < max_chunk_layers]
    return choices


def _user_pipeline_choice(raw: RawArgs) -> PipelineChoice | None:
    """The split the user gave (layout, uneven stages, accounting, virtual stages), if any."""
    given = tuple((d, raw.value(d)) for d in SPLIT_DESTS
                  if d != "microbatch_group_size_per_vp_stage" and raw.given(d) and raw.value(d) not in (None, False))
    if not given:
        return None
    pp = raw.value("pipeline_model_parallel_size", 1)
    label = "as given: " + " ".join("--" + d.replace("_", "-") + ("" if v is True else f" {v}") for d, v in given)
    return PipelineChoice(pp, None, given, label)


@dataclass(frozen=True)
class _Layout:
    """An outer choice: the parallel sizes and the pipeline split."""
    tp: int
    cp: int
    pp: int
    ep: int
    etp: int
    pipeline: PipelineChoice


def _family_settings(tp: int, cp: int, pp: int, pipeline: PipelineChoice) -> dict[str, Any]:
    out: dict[str, Any] = {d: None for d in SPLIT_DESTS}
    out.update({"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp, "context_parallel_size": cp,
                "expert_model_parallel_size": 1, "expert_tensor_parallel_size": None,
                "account_for_embedding_in_pipeline_split": False, "account_for_loss_in_pipeline_split": False,
                "recompute_activations": False, "distribute_saved_activations": False})
    out.update(dict(pipeline.settings))
    return out


_BATCH_KEYS = tuple(key for key, dim in _KEY_DIM.items() if dim == _BATCH)


def _derive_batches(ns: dict, batches: list[tuple[bool, int]], world: int, extra: Mapping[str, Any]
                    ) -> tuple[list[tuple[bool, int]], list[dict]]:
    """The batch choices and their derived namespaces, without the choices that derive to the
    same namespace as an earlier one (Megatron-FSDP turns the distributed optimizer on anyway)."""
    from megatron_estimator.config.derive import derive_namespace

    kept, namespaces, seen = [], [], set()
    for do, mbs in batches:
        ns["use_distributed_optimizer"] = do
        ns["micro_batch_size"] = mbs
        derived, _ = derive_namespace(ns, world)
        derived.update(extra)
        key = tuple(repr(derived.get(k)) for k in _BATCH_KEYS)
        if key in seen:
            continue
        seen.add(key)
        kept.append((do, mbs))
        namespaces.append(derived)
    return kept, namespaces


def _accepted_pairs(verdicts: "_Verdicts", choice: list[int], recomputes: list, sps: tuple
                    ) -> tuple[list[tuple[int, Recompute, bool]], dict[str, int]]:
    """The (recompute, sequence parallel) choices the rules accept with this expert and batch
    choice, and the problem codes of the rejected ones with their counts."""
    ok, rejected = [], {}
    choice = list(choice)
    for r, rec in enumerate(recomputes):
        choice[2] = r
        code = verdicts.check(_RECOMPUTE, choice)
        if code is not None:
            rejected[code] = rejected.get(code, 0) + len(sps)
            continue
        for s, sp in enumerate(sps):
            choice[3] = s
            code = verdicts.check(_SP, choice)
            if code is not None:
                rejected[code] = rejected.get(code, 0) + 1
                continue
            ok.append((r, rec, sp))
    return ok, rejected


def _expert_overlay(ep: int, etp: int) -> dict[str, Any]:
    return {"expert_model_parallel_size": ep, "expert_tensor_parallel_size": etp}


def _recompute_overlay(rec: Recompute, sp: bool, derived: Mapping) -> dict[str, Any]:
    """The namespace keys a recompute / sequence-parallel choice sets over the derived namespace."""
    over = rec.settings()
    if rec.modules is None:
        over["recompute_modules"] = derived.get("recompute_modules")
    over["recompute_activations"] = False
    over["distribute_saved_activations"] = False
    over["sequence_parallel"] = sp
    return over


def schedule_microbatches(pp: int, rank: int, vpp: int | None, m: int, group: int, extra_warmup: int = 0) -> int:
    """A microbatch count M' <= m for which ``layout.microbatches_in_flight`` gives the same
    chunk counts as for m, for any chunk weights.

    The interleaved schedule (layout.py ``_interleaved_peak``, after schedules.py
    ``get_schedule_table``) runs groups of ``group`` microbatches through the v chunks; with
    W warm-up forwards, the live counts after forward j are periodic in j with period
    P = group x v while forwards and backwards both fall in full groups, and near the end
    they depend only on the distance from the end.  With n full groups before the last one,
    n >= ceil((W + 2P) / P) keeps every distinct state and their first-occurrence order, so
    the surplus full groups can go."""
    if pp == 1 or not vpp or vpp == 1:
        return m
    period = group * vpp
    last = m - group * ((m - 1) // group)
    full = (m - last) // group
    warmup = (pp - rank - 1) * 2 + (vpp - 1) * group + extra_warmup
    needed = -(-(warmup + 2 * period) // period)
    return m if full <= needed else needed * group + last


# -------------------------------------------------------------------------------------------
# Validation: the project's rules, run once per choice they read


class _Reads(Mapping):
    """The namespace a rule sees, ``over`` laid on ``base``, recording which inner choice
    dimensions the rule read."""
    __slots__ = ("_base", "_over", "dims")

    def __init__(self, base: Mapping, over: Mapping):
        self._base = base
        self._over = over
        self.dims: set[int] = set()

    def get(self, key, default=None):
        dim = _KEY_DIM.get(key)
        if dim is not None:
            self.dims.add(dim)
        if key in self._over:
            return self._over[key]
        return self._base.get(key, default)

    def __getitem__(self, key):
        dim = _KEY_DIM.get(key)
        if dim is not None:
            self.dims.add(dim)
        if key in self._over:
            return self._over[key]
        return self._base[key]

    def __contains__(self, key) -> bool:
        dim = _KEY_DIM.get(key)
        if dim is not None:
            self.dims.add(dim)
        return key in self._over or key in self._base

    def __iter__(self):
        self.dims.update(_ALL_DIMS)
        return iter(self._base.keys() | self._over.keys())

    def __len__(self) -> int:
        self.dims.update(_ALL_DIMS)
        return len(self._base.keys() | self._over.keys())


class _Verdicts:
    """Which inner choices of one layout family pass the rules.

    Each rule is run on the first value of every dimension; when it read a dimension it is
    run again for each value of it (and of any dimension it then reads), giving a table over
    the dimensions it read.  A table is checked in the loop over the last dimension it needs.
    """

    def __init__(self, rules, raw: RawArgs, env: Mapping[str, str], run: RunContext, sizes: tuple[int, ...],
                 view: Callable[[tuple[int, ...]], _Reads], ignored: frozenset = frozenset()):
        self.sizes, self._view, self._raw, self._env, self._ignored = sizes, view, raw, env, ignored
        self._run_context = run
        self.failed: str | None = None           # a problem code every choice fails with
        self.levels: list[list[tuple[tuple[int, ...], dict]]] = [[] for _ in sizes]
        for rule in rules:
            dims, table = self._table(rule)
            if not dims:
                if table[()] is not None:
                    self.failed = table[()]
                    return
                continue
            if any(code is not None for code in table.values()):
                self.levels[max(dims)].append((dims, table))

    def _run(self, rule, choice: tuple[int, ...]) -> tuple[str | None, set[int]]:
        view = self._view(choice)
        for problem in rule(view, self._raw, self._env, self._run_context):
            if problem.code not in self._ignored:
                return problem.code, view.dims
        return None, view.dims

    def _table(self, rule) -> tuple[tuple[int, ...], dict]:
        code, read = self._run(rule, (0,) * len(self.sizes))
        dims = tuple(sorted(read))
        if not dims:
            return (), {(): code}
        while True:
            table: dict[tuple[int, ...], str | None] = {}
            for key in itertools.product(*(range(self.sizes[d]) for d in dims)):
                choice = [0] * len(self.sizes)
                for d, i in zip(dims, key):
                    choice[d] = i
                code, read = self._run(rule, tuple(choice))
                if not read <= set(dims):
                    dims = tuple(sorted(set(dims) | read))
                    break
                table[key] = code
            else:
                return dims, table

    def check(self, level: int, choice: list[int]) -> str | None:
        """The first problem code of the tables that complete at this loop level, or None."""
        for dims, table in self.levels[level]:
            code = table[(choice[dims[0]],) if len(dims) == 1 else tuple(choice[d] for d in dims)]
            if code is not None:
                return code
        return None


# -------------------------------------------------------------------------------------------
# Memory


class _Family:
    """What a pipeline split fixes: the stages, and the groups of stages of one structure.

    ``groups``: one per structure, (stage id, chunk ids, lowest rank, runs the loss, has layers,
    holds the batch, its layers);
    the ids are the search's interned structures (layer kinds, embedding, loss, output weight,
    MTP), so caches key on small ints."""

    def __init__(self, search: "_Search", stages: tuple, derived: Mapping):
        pattern = search.layer_pattern()
        self.stages = stages
        self.vpp = derived.get("virtual_pipeline_model_parallel_size")
        self.group_size = derived["microbatch_group_size_per_vp_stage"]
        self.combined_1f1b = bool(derived.get("overlap_moe_expert_parallel_comm"))
        self.max_chunk_layers = max((len(c.layers) for s in stages for c in s.chunks), default=0)
        seen: dict[int, int] = {}
        groups = []
        for stage in stages:
            chunk_ids = tuple(search.intern(("chunk", tuple(pattern[i] for i in c.layers), c.pre_process,
                                             c.post_process, c.mtp_layers)) for c in stage.chunks)
            stage_id = search.intern(("stage", chunk_ids, tuple((c.embedding, c.output_weight) for c in stage.chunks)))
            if stage_id in seen:
                continue                        # a higher rank of the same structure: never the peak
            seen[stage_id] = stage.pp_rank
            groups.append((stage_id, chunk_ids, stage.pp_rank, stage.post_process, bool(stage.layers),
                           stage.pre_process or stage.post_process, stage.layers))
        self.groups = tuple(groups)
        self.parts: dict[tuple, list[int]] = {}          # _LayoutMemory._parts, shared by the family


class _Activations:
    """The activation terms of one (tp, cp, etp, micro batch, sequence parallel, selective
    recompute modules) choice, from memory/activations.py and memory/model.py on a
    configuration with it.  A layer's bytes depend on the layer only through its kind (dense or
    MoE) and on recompute only through the selective modules; full recompute changes which
    layers are kept whole (``_Search.recompute_grouping``), so its variants share this record."""

    def __init__(self, search: "_Search", cfg):
        self.search, self.cfg = search, cfg
        self._layers: dict[bool, int] = {}
        self._chunks: dict[tuple, tuple[int, int]] = {}
        self._stages: dict[tuple, tuple[tuple[int, ...], int]] = {}
        self._deferred: dict[int, int] = {}
        self.layer_input = act.layer_input_bytes(cfg)
        self.embedding = act.embedding_activations(cfg)
        self.loss_kept = act.loss_activations(cfg)[0]
        self._mtp: int | None = None
        self.batch = memory_model._batch_bytes(cfg)
        self.buffers = memory_model._global_buffers(cfg)
        self._kinds: tuple[int, int] | None = None

    def layer(self, index: int) -> int:
        """memory/activations.py ``layer_activations`` total: it depends on the layer's kind only."""
        kind = self.search.pattern[index]
        value = self._layers.get(kind)
        if value is None:
            value = self._layers[kind] = act.layer_activations(self.cfg, index).total
        return value

    def chunk(self, chunk_id: int, chunk, rec: Recompute) -> tuple[int, int]:
        """memory/model.py ``chunk_activation_bytes``: (kept per microbatch, largest recompute),
        from the chunk's recompute groups counted by layer kind."""
        key = (chunk_id, rec)
        value = self._chunks.get(key)
        if value is None:
            whole, groups = self.search.recompute_grouping(self.cfg, rec, chunk_id, chunk)
            dense, moe = self.kind_bytes()
            kept = whole[0] * dense + whole[1] * moe + groups[0] * self.layer_input
            # --cpu-offloading-num-layers: the chunk's first layers live on the host (validation
            # excludes recompute with it, so they are all whole layers).
            kept -= sum(self.layer(i) for i in chunk.layers[:self.cfg.training.cpu_offloading_num_layers])
            recompute_peak = max((d * dense + m * moe for d, m in groups[1]), default=0)
            if chunk.pre_process:
                kept += self.embedding
            if chunk.post_process:
                kept += self.loss_kept
            if chunk.mtp_layers:
                if self._mtp is None:
                    self._mtp = act.mtp_layer_activations(self.cfg)
                kept += chunk.mtp_layers * self._mtp
            value = self._chunks[key] = (kept, recompute_peak)
        return value

    def kind_bytes(self) -> tuple[int, int]:
        """Bytes one dense and one MoE layer keep (0 for a kind the model does not have)."""
        if self._kinds is None:
            pattern = self.search.pattern
            dense = self.layer(pattern.index(False)) if False in pattern else 0
            moe = self.layer(pattern.index(True)) if True in pattern else 0
            self._kinds = (dense, moe)
        return self._kinds

    def stage(self, group: tuple, stage, rec: Recompute) -> tuple[tuple[int, ...], int]:
        """(kept bytes per microbatch of each chunk, the stage's other bytes but the FSDP
        transient), as memory/model.py ``estimate_stage`` adds them."""
        stage_id, chunk_ids = group[0], group[1]
        key = (stage_id, rec)
        value = self._stages.get(key)
        if value is None:
            cache = self._chunks
            per_chunk = [cache.get((cid, rec)) or self.chunk(cid, chunk, rec) for cid, chunk in zip(chunk_ids, stage.chunks)]
            transient = max(memory_model.stage_transients(
                self.cfg, stage, per_chunk, self.search.overheads.compute_capability).values())
            other = transient + self.search.workspaces + self.buffers
            if group[5]:
                other += self.batch
            value = self._stages[key] = (tuple(kept for kept, _ in per_chunk), other)
        return value

    def deferred(self, m: int) -> int:
        """memory/model.py ``_deferred_wgrad_bytes`` with M microbatches (on the loss stage)."""
        if not self.cfg.training.defer_embedding_wgrad_compute:
            return 0
        value = self._deferred.get(m)
        if value is None:
            value = self._deferred[m] = memory_model._deferred_wgrad_bytes(
                replace(self.cfg, training=replace(self.cfg.training, num_microbatches=m)))
        return value


@dataclass(frozen=True)
class _StateRates:
    """Model-state bytes per element, the cheapest and the costliest tensor kind."""
    dense_low: float
    dense_high: float
    expert_low: float
    expert_high: float


def _census(tensors) -> tuple[int, int, int, int]:
    """(dense elements, expert elements, dense tensors, expert tensors) of a tensor list."""
    dense = [t.numel for t in tensors if not t.expert]
    expert = [t.numel for t in tensors if t.expert]
    return sum(dense), sum(expert), len(dense), len(expert)


def _workspaces(config, overheads, environ) -> int:
    """The cuBLAS and Transformer Engine workspaces every stage holds (memory/overhead.py)."""
    from megatron_estimator.model.overhead import cublas_workspace_bytes, te_workspace_for

    cublas, _ = cublas_workspace_bytes(environ, overheads.compute_capability,
                                       config.training.deterministic_mode)
    return cublas + te_workspace_for(config, overheads.compute_capability)


class _LayoutMemory:
    """The per-stage memory of one layout, from the memory/ functions, cached by what each
    depends on (see the module docstring)."""

    def __init__(self, search: "_Search", layout: _Layout, family: _Family, derived: Mapping):
        from megatron_estimator.model.overhead import communicators

        self.search, self.layout, self.family = search, layout, family
        self._derived, self._config = derived, None
        self.dims = ParallelDims(search.world, layout.tp, layout.pp, layout.cp, layout.ep, layout.etp, family.vpp)
        o = search.overheads
        self.fixed = o.cuda_context_bytes + o.nccl_bytes_per_communicator * len(communicators(self.dims, search.moe))
        self.fragmentation = o.fragmentation
        self._exceed: dict[bool, bool] = {}
        self._bounds_cache: dict[tuple, list] = {}
        self._states: dict[bool, list[tuple[int, int]]] = {}
        self._proxy: dict[tuple, tuple] = {}

    @property
    def config(self):
        """This layout's EstimatorConfig (config.build_config on its derived namespace)."""
        if self._config is None:
            from megatron_estimator.config.typed import build_config

            ns = dict(self._derived)
            ns.update(_expert_overlay(self.layout.ep, self.layout.etp))
            self._config = build_config(ns, self.search.vocabulary(self.layout.tp), "plan", self.search.env,
                                        run=self.search.run_context)
        return self._config

    def states_exceed(self, do: bool) -> bool:
        """Whether the lower bound of the model states alone puts a stage over the budget."""
        exceed = self._exceed.get(do)
        if exceed is None:
            worst = max(self.lower_bounds(do))
            exceed = self._exceed[do] = worst + self.fixed + int(worst * self.fragmentation) > self.search.budget
        return exceed

    def lower_bounds(self, do: bool) -> list[int]:
        """A lower bound of each stage group's model states (weights, gradients, optimizer states)."""
        return self._bounds(do, 0)

    def upper_bounds(self, do: bool) -> list[int | None]:
        """An upper bound of each stage group's model states and FSDP transient (None: unbounded)."""
        return self._bounds(do, 1)

    def _bounds(self, do: bool, which: int) -> list:
        out = self._bounds_cache.get((do, which))
        if out is None:
            search, lay = self.search, self.layout
            out = []
            for group in self.family.groups:
                key = (lay.tp, lay.pp, lay.ep, lay.etp, do, group[0], which)
                value = search._bounds.get(key)
                if value is None:
                    value = search._bounds[key] = self._states_bound(do, group, upper=bool(which))
                out.append(value)
            self._bounds_cache[(do, which)] = out
        return out

    def _states_bound(self, do: bool, group: tuple, upper: bool) -> int | None:
        """A bound of the stage's model states (weights, gradients, optimizer states).

        memory/states.py ``model_states`` is linear in the elements of each tensor kind, up to
        buffer padding and integer truncation: a stage's states lie between its elements times
        the cheapest kind's rate and its elements times the costliest kind's rate plus the most
        padding the distributed optimizer adds (each tensor starts on a 64-element boundary,
        each bucket ends on a multiple of lcm(shard, 128)).  Megatron-FSDP's transient is not
        bounded above.  ``_Search.state_rates`` measures the rates on padding-free probes."""
        search = self.search
        lay, dims = self.layout, self.dims
        stage = self.family.stages[group[2]]
        ref = search.reference
        if upper and ref.optimizer.use_megatron_fsdp:
            return None
        rates = search.state_rates(dims, do)
        dense = expert = padding = 0
        dense_divisor, expert_divisor = math.lcm(dims.dp * dims.cp, 128), math.lcm(dims.edp, 128)
        for cid, chunk in zip(group[1], stage.chunks):
            d, e, nd, ne = search.chunk_census(lay.tp, lay.ep, lay.etp, cid, chunk)
            dense, expert = dense + d, expert + e
            if chunk.post_process:
                nd += 2                                            # the final norm: weight (and bias)
            padding += nd * 64 + (nd + 3) * dense_divisor if nd else 0
            padding += ne * 64 + (ne + 3) * expert_divisor if ne else 0
        truncation = 4 * 2 * len(stage.chunks)                    # int() per buffer group and term
        if not upper:
            return int(dense * rates.dense_low + expert * rates.expert_low) - truncation
        dense += 2 * ref.model.hidden_size                         # the largest final norm a stage holds
        bound = dense * rates.dense_high + expert * rates.expert_high + truncation
        if do or ref.optimizer.use_megatron_fsdp:
            bound += padding * (DTYPE_BYTES[ref.precision.params_dtype] + DTYPE_BYTES[ref.precision.main_grads_dtype])
        return int(bound) + 1

    def states(self, do: bool) -> list[tuple[int, int]]:
        """(weights + gradients + optimizer states, FSDP transient) of each stage group."""
        out = self._states.get(do)
        if out is None:
            search, lay = self.search, self.layout
            config = None
            out = []
            for group in self.family.groups:
                # dp x cp = world / (tp pp) and edp do not depend on cp: neither do the states.
                key = (lay.tp, lay.pp, lay.ep, lay.etp, do, group[0])
                value = search._states.get(key)
                if value is None:
                    if config is None:
                        config = self.config
                        config = with_distributed_optimizer(config, do)
                    stage = self.family.stages[group[2]]
                    st = model_states(config, [search.tensors(config, lay, cid, chunk)
                                               for cid, chunk in zip(group[1], stage.chunks)])
                    value = search._states[key] = (st.weights + st.gradients + st.optimizer_states, st.fsdp_transient)
                    lower, upper = self.lower_bounds(do)[len(out)], self.upper_bounds(do)[len(out)]
                    total = value[0] + value[1]
                    if total < lower or (upper is not None and total > upper):
                        raise RuntimeError(
                            f"planner: the model states of stage {group[2]} ({total} bytes) fall outside the "
                            f"planner's bounds [{lower}, {upper}]: memory/states.py changed; update "
                            "_LayoutMemory._states_bounds")
                out.append(value)
            self._states[do] = out
        return out

    def activations(self, mbs: int, rec: Recompute, sp: bool) -> _Activations:
        """The activation terms of this choice; they read tp, cp, etp, the training settings and
        the selective recompute modules, not pp, ep, the split or the optimizer."""
        lay = self.layout
        layered = rec if rec.granularity == "selective" else NO_RECOMPUTE
        key = (lay.tp, lay.cp, lay.etp, mbs, layered, sp)
        acts = self.search._activations.get(key)
        if acts is None:
            base = self.config
            modules = layered.modules if layered.modules is not None else tuple(self._derived.get("recompute_modules") or ())
            cfg = replace(base, parallel=ParallelDims(self.search.world, lay.tp, 1, lay.cp, 1, lay.etp),
                          training=replace(base.training, micro_batch_size=mbs, sequence_parallel=sp,
                                           recompute_granularity=layered.granularity, recompute_method=None,
                                           recompute_num_layers=None, recompute_modules=modules,
                                           distribute_saved_activations=False))
            acts = self.search._activations[key] = _Activations(self.search, cfg)
        return acts

    def _parts(self, mbs: int, m: int, r: int, rec: Recompute, sp: bool) -> list[int]:
        """Each stage group's bytes besides its model states: activations alive at the schedule's
        fullest moment, transients, workspaces, batch, buffers (memory/model.py ``estimate_stage``).
        They depend on tp, cp, etp and the inner choices, not on ep or the optimizer: shared by the
        layouts of a family."""
        family = self.family
        lay = self.layout
        key = (lay.tp, lay.cp, lay.etp, mbs, r, sp)          # r: the family's recompute choice index
        parts = family.parts.get(key)
        if parts is None:
            parts = family.parts[key] = self._compute_parts(mbs, m, rec, sp)
        return parts

    def _compute_parts(self, mbs: int, m: int, rec: Recompute, sp: bool) -> list[int]:
        acts = self.activations(mbs, rec, sp)
        family = self.family
        pp, vpp = self.layout.pp, family.vpp
        inflight_cache = self.search._inflight
        parts = []
        stage_cache = acts._stages
        for group in family.groups:
            rank = group[2]
            kept, other = stage_cache.get((group[0], rec)) or acts.stage(group, family.stages[rank], rec)
            if group[3]:
                other += acts.deferred(m)
            if pp == 1:
                live = sum(kept)                              # layout.microbatches_in_flight: one at a time
            elif vpp is None:
                live = min(pp - rank, m) * kept[0]            # 1F1B: min(p - r, M) microbatches
            else:
                # The fullest moment is the same for chunk weights scaled by a positive factor,
                # and for the smaller microbatch count schedule_microbatches gives.
                scale = math.gcd(*kept) or 1
                weights = tuple(k // scale for k in kept)
                scheduled = schedule_microbatches(pp, rank, vpp, m, family.group_size, int(family.combined_1f1b))
                key = (pp, rank, vpp, scheduled, family.group_size, weights, family.combined_1f1b)
                counts = inflight_cache.get(key)
                if counts is None:
                    counts = inflight_cache[key] = microbatches_in_flight(
                        pp, rank, vpp, scheduled, family.group_size, weights, family.combined_1f1b).chunk_microbatches
                live = sum(n * k for n, k in zip(counts, kept))
            parts.append(other + live)
        return parts

    def assess(self, do: bool, mbs: int, m: int, r: int, rec: Recompute, sp: bool) -> int | None:
        """None when a stage is over budget, else the peak device bytes (exact, or a lower bound
        within the few megabytes of padding when the upper bound of the states fits anyway)."""
        parts = self._parts(mbs, m, r, rec, sp)
        budget, fixed, fragmentation = self.search.budget, self.fixed, self.fragmentation
        worst = 0
        for lower, part in zip(self.lower_bounds(do), parts):
            low = lower + part
            device = low + fixed + int(low * fragmentation)
            if device > budget:
                return None
            if device > worst:
                worst = device
        for upper, part in zip(self.upper_bounds(do), parts):
            if upper is None:
                break
            high = upper + part
            if high + fixed + int(high * fragmentation) > budget:
                break
        else:
            return worst
        peak = self._exact(do, parts)
        return None if peak[0] > budget else peak[0]

    def exact_peak(self, do: bool, mbs: int, m: int, rec: Recompute, sp: bool) -> tuple[int, int, int]:
        """(device peak, allocated peak, rank) of the peak stage, with exact model states."""
        return self._exact(do, self._compute_parts(mbs, m, rec, sp))

    def _exact(self, do: bool, parts: list[int]) -> tuple[int, int, int]:
        fixed, fragmentation = self.fixed, self.fragmentation
        best = None
        for group, (states_bytes, fsdp_transient), part in zip(self.family.groups, self.states(do), parts):
            allocated = states_bytes + fsdp_transient + part
            device = allocated + fixed + int(allocated * fragmentation)
            rank = group[2]
            if best is None or device > best[0] or (device == best[0] and rank < best[2]):
                best = (device, allocated, rank)
        return best

    # throughput proxy

    def recomputed_fraction(self, rec: Recompute) -> float:
        """Forward flops of the layers full recompute re-runs / forward flops of all decoder layers."""
        key = (self.layout.pp, self.layout.pipeline, rec)
        cached = self.search._recomputed.get(key)
        if cached is None:
            model = self.search.proxy_model
            pattern = self.search.layer_pattern()
            dense_f, moe_f = model.layer_forward
            total = sum(moe_f if k else dense_f for k in pattern) or 1.0
            again = 0.0
            for stage in self.family.stages:
                for chunk in stage.chunks:
                    layers = chunk.layers if rec.method == "uniform" else chunk.layers[:rec.num_layers or 0]
                    again += sum(moe_f if pattern[i] else dense_f for i in layers)
            cached = self.search._recomputed[key] = again / total
        return cached

    def proxy(self, mbs: int, m: int, rec: Recompute, sp: bool, do: bool) -> ProxyBreakdown:
        """The throughput proxy of the module docstring."""
        terms = self._proxy_terms(rec, sp, do)
        r, tp_c, cp_c, ep_c, dp_c, c, volumes = terms
        bubble = (self.layout.pp - 1) / ((self.family.vpp or 1) * m)
        step = (1 + r + tp_c + cp_c + ep_c) * (1 + bubble) + dp_c
        return ProxyBreakdown(step, bubble, r, tp_c, cp_c, ep_c, dp_c, c, *volumes)

    def step(self, m: int, rec: Recompute, sp: bool, do: bool) -> float:
        """The proxy's relative step time alone (for ranking every layout that fits)."""
        r, tp_c, cp_c, ep_c, dp_c, _, _ = self._proxy_terms(rec, sp, do)
        return (1 + r + tp_c + cp_c + ep_c) * (1 + (self.layout.pp - 1) / ((self.family.vpp or 1) * m)) + dp_c

    def _proxy_terms(self, rec: Recompute, sp: bool, do: bool) -> tuple:
        """(R, T_tp/C, T_cp/C, T_ep/C, T_dp/C, C, bytes sent per step by tp, cp, ep, dp).

        The volumes per microbatch grow with the micro batch b and there are M = gbs / (b dp)
        microbatches: the step's volumes do not depend on b, only the bubble does."""
        key = (rec, sp, do)
        terms = self._proxy.get(key)
        if terms is not None:
            return terms
        search = self.search
        model = search.proxy_model
        a, node = search.proxy_assumptions, search.space.gpus_per_node
        d = self.dims
        tp, cp, pp, ep, etp, dp, edp = d.tp, d.cp, d.pp, d.ep, d.etp, d.dp, d.edp
        s_local = model.seq_length // cp
        tokens_per_step = s_local * search.gbs / dp                   # M x b tokens through each GPU
        x = tokens_per_step * model.hidden * model.act_bytes          # M x one [s/cp, b, h] activation
        dense_layers, moe_layers = model.dense_layers / pp, model.moe_layers / pp
        again = self.recomputed_fraction(rec) if rec.granularity == "full" else 0.0

        def bandwidth(size: int, stride: int) -> float:
            return a.intra_node_bandwidth if size * stride <= node else a.inter_node_bandwidth

        tp_bytes = 0.0
        if tp > 1:                                     # attention blocks and dense MLP blocks
            tp_bytes += (dense_layers + moe_layers + dense_layers) * 4 * (tp - 1) / tp * x
        if etp > 1 and moe_layers:
            tp_bytes += moe_layers * 4 * (etp - 1) / etp * x * model.topk
        tp_bytes *= 1 + 0.5 * again
        cp_bytes = 0.0
        if cp > 1:
            kv = tokens_per_step * model.kv_width * model.act_bytes / tp
            cp_bytes = (dense_layers + moe_layers) * (cp - 1) * kv * (3 + again)
        ep_bytes = 0.0
        if ep > 1 and moe_layers:
            tokens = tokens_per_step / (tp if sp else 1)
            ep_bytes = (moe_layers * 4 * (ep - 1) / ep * tokens * model.topk * model.hidden * model.act_bytes
                        * (1 + 0.5 * again))
        per = (model.grad_bytes + model.param_bytes) if do else 2 * model.grad_bytes
        n_dense = dp * cp
        dp_dense = (n_dense - 1) / n_dense * model.dense_params / (tp * pp) * per
        dp_expert = (edp - 1) / edp * model.expert_params / (ep * etp * pp) * per

        c = model.flops_per_gpu / a.achieved_flops
        dp_s = dp_dense / bandwidth(n_dense, tp) + dp_expert / bandwidth(edp, etp * ep)
        if rec.granularity == "full":
            r = model.layer_forward_share * again
        elif rec.granularity == "selective":
            r = model.core_attention_share
        else:
            r = 0.0
        terms = self._proxy[key] = (
            r, tp_bytes / bandwidth(tp, 1) / c, cp_bytes / bandwidth(cp, tp) / c, ep_bytes / bandwidth(ep, etp) / c,
            dp_s / c, c, (int(tp_bytes), int(cp_bytes), int(ep_bytes), int(dp_dense + dp_expert)))
        return terms


@dataclass(frozen=True)
class _ProxyModel:
    """What the proxy needs of the model, computed once per plan."""
    seq_length: int
    hidden: int
    act_bytes: int
    param_bytes: int
    grad_bytes: int
    kv_width: int                  # K + V elements per token, all heads
    topk: int
    dense_layers: int
    moe_layers: int
    dense_params: int              # one copy of the non-expert parameters
    expert_params: int             # one copy of the expert parameters
    flops_per_gpu: float           # model flops per GPU and step
    layer_forward_share: float     # the decoder layers' forward flops / step flops
    core_attention_share: float    # the core attention's forward flops / step flops
    layer_forward: tuple[float, float]   # forward flops per token of a (dense, MoE) layer


def _proxy_model(search: "_Search") -> _ProxyModel:
    from megatron_estimator.model.parameters import count, embedding_tensors, mtp_tensors

    config = search.reference
    m = config.model
    pattern = search.layer_pattern()
    s = config.training.seq_length
    a = m.num_attention_heads
    if m.mla is not None:
        d_qk, d_v = m.mla.qk_head_dim + m.mla.qk_pos_emb_head_dim, m.mla.v_head_dim
        kv_width = a * (d_qk + d_v)
    else:
        d_qk = d_v = m.kv_channels
        kv_width = 2 * m.num_query_groups * m.kv_channels
    # Core attention per token, forward: QK^T and PV, 2 flops per multiply-add, s/2 keys on
    # average under the causal mask: 2 x 2 x s/2 x a x d.
    core = s * a * (d_qk + d_v)
    one = replace(config, parallel=ParallelDims(search.world, 1, 1, 1, 1, 1))
    forward: dict[bool, float] = {}
    dense_params = expert_params = 0
    for kind in sorted(set(pattern)):
        dense, expert, _, _ = search.layer_counts(1, 1, 1, kind)
        active = dense + (expert * m.moe.router_topk / m.moe.num_experts if kind else 0)
        forward[kind] = 2 * active + core
        dense_params += pattern.count(kind) * dense
        expert_params += pattern.count(kind) * expert
    output = m.padded_vocab_size * m.hidden_size
    dense_params += count(embedding_tensors(one)).total + (output if m.untie_embeddings_and_output_weights else 0)
    mtp_forward = 0.0
    for j in range(m.mtp_num_layers):
        c = count(mtp_tensors(one, j))
        dense_params += c.dense
        expert_params += c.expert
        mtp_forward += forward[pattern[-1]] + 2 * 2 * m.hidden_size * m.hidden_size + 2 * output
    layers_forward = sum(forward[k] * pattern.count(k) for k in forward)
    step_per_token = 3 * (layers_forward + 2 * output + mtp_forward)
    prec = config.precision
    return _ProxyModel(
        seq_length=s, hidden=m.hidden_size, act_bytes=2 if prec.params_dtype != "fp32" else 4,
        param_bytes=DTYPE_BYTES[prec.params_dtype], grad_bytes=DTYPE_BYTES[prec.main_grads_dtype],
        kv_width=kv_width, topk=m.moe.router_topk if m.moe else 0,
        dense_layers=pattern.count(False), moe_layers=pattern.count(True),
        dense_params=dense_params, expert_params=expert_params,
        flops_per_gpu=step_per_token * search.gbs * s / search.world,
        layer_forward_share=layers_forward / step_per_token,
        core_attention_share=core * m.num_layers / step_per_token,
        layer_forward=(forward.get(False, 0.0), forward.get(True, 0.0)),
    )


# -------------------------------------------------------------------------------------------
# The search


@dataclass
class _Fit:
    """A layout that fits, before it becomes a Candidate."""
    step: float
    device: int                 # the peak device bytes, or a lower bound within the padding (see assess)
    memory: _LayoutMemory
    micro_batch_size: int
    num_microbatches: int
    distributed_optimizer: bool
    recompute: Recompute
    sequence_parallel: bool
    chosen_optimizer: bool      # --use-distributed-optimizer as chosen (derivation may change it)
    exact: tuple[int, int, int] | None = None    # (device, allocated, rank) once computed

    def sort_key(self) -> tuple:
        lay = self.memory.layout
        device = self.exact[0] if self.exact is not None else self.device
        return (self.step, device, lay.tp, lay.pp, lay.cp, lay.ep, lay.etp, lay.pipeline.label,
                self.micro_batch_size, self.recompute.label, self.sequence_parallel, self.chosen_optimizer)

    def resolve(self) -> tuple[int, int, int]:
        if self.exact is None:
            self.exact = self.memory.exact_peak(self.distributed_optimizer, self.micro_batch_size,
                                                self.num_microbatches, self.recompute, self.sequence_parallel)
        return self.exact


class _Search:
    """One planning run: the model resolved once, then every layout, with shared caches."""

    def __init__(self, inp: TrainingInput, world: int, gbs: int, budget: int, budget_source: str, overheads,
                 environ, space: SearchSpace, proxy: ProxyAssumptions):
        from megatron_estimator.megatron.flags import flag_table
        from megatron_estimator.config.resolve import ENVIRONMENT_RULES, resolve_config
        from megatron_estimator.config.rules import RULES
        from megatron_estimator.config.schema import check_config_schema

        self.inp, self.world, self.gbs, self.budget, self.budget_source = inp, world, gbs, budget, budget_source
        # Layouts are planned for a fresh start: a resumed run's checkpoint exchange buffers
        # (memory/checkpoint.py) depend on the checkpoint on disk, not on the layout searched.
        overheads = replace(overheads, resume="no")
        self.overheads, self.env, self.space, self.proxy_assumptions = overheads, environ, space, proxy
        self.rules = tuple(RULES)
        job_environment = bool(getattr(inp, "job_environment", False))
        # resolve.resolve_config turns environment rules into notes unless the environment is the job's.
        self.ignored_codes = frozenset() if job_environment else frozenset(ENVIRONMENT_RULES)
        self.compute_capability = overheads.compute_capability if getattr(overheads, "gpu_known", False) else None
        # What the rules and the kernel choice know of the run (resolve.resolve_config's ``run``).
        self.run_context = RunContext(gpu_compute_capability=self.compute_capability, flash_attn=overheads.flash_attn,
                                      resume=Resume("no"), job_environment=job_environment)

        # The model without a layout: the user's settings minus what the planner chooses (the
        # recompute modules stay: selective layouts set their own, the others do not read them).
        settings = {d: s for d, s in inp.raw.settings.items() if d not in PLANNED_DESTS or d == "recompute_modules"}
        settings["global_batch_size"] = RawSetting("global_batch_size", gbs, "--global-batch-size")
        settings["micro_batch_size"] = RawSetting("micro_batch_size", min(space.micro_batch_sizes), "--micro-batch-size")
        self.raw = RawArgs(settings, inp.raw.source)
        self.namespace = dict(flag_table().defaults())
        self.namespace.update({d: s.value for d, s in self.raw.settings.items()})
        self.moe = bool(self.namespace.get("num_experts"))

        # Validate the input once: the types and ranges of everything the user gave, then the
        # model alone (one GPU, Megatron's default layout).
        given = dict(self.namespace)
        given.update({d: s.value for d, s in inp.raw.settings.items()})
        problems = check_config_schema(given, inp.raw)
        if problems:
            raise InvalidInput(problems)
        try:
            self.reference = resolve_config(self.raw, world_size=1, world_size_source="plan", environ=environ,
                                            compute_capability=self.compute_capability,
                                            flash_attn=overheads.flash_attn, resume="no",
                                            job_environment=job_environment)
            self.base_problems: tuple[Problem, ...] = ()
        except InvalidInput as err:
            # Problems of the default layout may vanish with another one; those of the model do not.
            if any(p.code in ("unknown-vocab-size", "missing-required") for p in err.problems):
                raise InvalidInput(err.problems) from None
            self.reference = None
            self.base_problems = tuple(err.problems)
        self.user_pipeline = _user_pipeline_choice(inp.raw)
        self._proxy_model: _ProxyModel | None = None
        self.pattern: tuple[bool, ...] | None = None   # per decoder layer: MoE or not
        self.workspaces = 0                             # cuBLAS + Transformer Engine workspaces

        # caches shared by all layouts
        self._vocab: dict[int, Any] = {}
        self._families: dict[tuple, _Family] = {}
        self._layer_counts: dict[tuple, tuple[int, int]] = {}
        self._bounds: dict[tuple, int] = {}
        self._states: dict[tuple, tuple[int, int]] = {}
        self._activations: dict[tuple, _Activations] = {}
        self._tensors: dict[tuple, list] = {}
        self._inflight: dict[tuple, tuple[int, ...]] = {}
        self._groupings: dict[tuple, tuple] = {}
        self._rates: dict[tuple, _StateRates] = {}
        self._interned: dict[tuple, int] = {}
        self._recomputed: dict[tuple, float] = {}

        self.searched = self.valid = 0
        self.rejections: dict[str, int] = {}
        self.fits: list[_Fit] = []

    # -- the space -----------------------------------------------------------------------------

    def families(self) -> Iterator[tuple[int, int, int, PipelineChoice]]:
        """(tp, cp, pp, split) of every layout family."""
        ns, world, space = self.namespace, self.world, self.space
        num_layers = ns.get("num_layers") or 1
        mtp = ns.get("mtp_num_layers") or 0
        for tp in _divisors(world):
            if tp > space.tensor_parallel_limit:
                break
            for cp in _divisors(world // tp):
                if cp > space.max_context_parallel:
                    break
                for pp in _divisors(world // (tp * cp)):
                    if pp > num_layers:
                        break
                    choices = pipeline_choices(num_layers, mtp, pp, space.max_virtual_stages)
                    user = self.user_pipeline
                    if user is not None and user.pp == pp and user.settings not in [c.settings for c in choices]:
                        choices.insert(0, user)
                    for choice in choices:
                        yield tp, cp, pp, choice

    def expert_choices(self, tp: int) -> list[tuple[int, int]]:
        """(ep, etp) pairs: every divisor of the number of experts, etp 1 or tp (dense: (1, tp))."""
        experts = self.namespace.get("num_experts") or 0
        if not experts:
            return [(1, tp)]
        return [(ep, etp) for ep in _divisors(experts) if ep <= self.world for etp in sorted({1, tp})]

    def batch_choices(self) -> list[tuple[bool, int]]:
        return [(do, mbs) for do in self.space.distributed_optimizer for mbs in self.space.micro_batch_sizes]

    # -- the loop ------------------------------------------------------------------------------

    def _reject(self, code: str, count: int) -> None:
        self.searched += count
        self.rejections[code] = self.rejections.get(code, 0) + count

    def run(self) -> None:
        all_batches = self.batch_choices()
        for tp, cp, pp, pipeline in self.families():
            ns = dict(self.namespace)
            ns.update(_family_settings(tp, cp, pp, pipeline))
            batches, namespaces = _derive_batches(ns, all_batches, self.world, {"world_size_source": "plan"})
            first = namespaces[0]
            family = self.family(pp, pipeline, tp, first)
            experts = self.expert_choices(tp)
            recomputes = recompute_choices(family.max_chunk_layers, self.space.block_recompute_fractions)
            sps = (False, True) if tp > 1 else (False,)
            expert_over = [_expert_overlay(ep, etp) for ep, etp in experts]
            rec_over = [[_recompute_overlay(rec, sp, first) for sp in sps] for rec in recomputes]

            def view(choice, namespaces=namespaces, expert_over=expert_over, rec_over=rec_over) -> _Reads:
                e, b, r, s = choice
                return _Reads(namespaces[b], {**expert_over[e], **rec_over[r][s]})

            sizes = (len(experts), len(batches), len(recomputes), len(sps))
            verdicts = _Verdicts(self.rules, self.raw, self.env, self.run_context, sizes, view, self.ignored_codes)
            if verdicts.failed is not None:
                self._reject(verdicts.failed, math.prod(sizes))
                continue
            per_batch = len(recomputes) * len(sps)
            inner = verdicts.levels[_RECOMPUTE] + verdicts.levels[_SP]
            # The (recompute, sp) pairs the rules accept depend on the expert / batch choice only
            # through the dimensions the inner tables read.
            outer_dims = sorted({d for dims, _ in inner for d in dims if d in (_EXPERT, _BATCH)})
            accepted: dict[tuple, tuple[list, dict]] = {}
            choice = [0, 0, 0, 0]
            fits, searched, valid = self.fits, 0, 0
            for e, (ep, etp) in enumerate(experts):
                choice[0] = e
                code = verdicts.check(_EXPERT, choice)
                if code is not None:
                    self._reject(code, len(batches) * per_batch)
                    continue
                memory = _LayoutMemory(self, _Layout(tp, cp, pp, ep, etp, pipeline), family, first)
                assess, step = memory.assess, memory.step
                for b, (chosen, mbs) in enumerate(batches):
                    choice[1] = b
                    code = verdicts.check(_BATCH, choice)
                    if code is not None:
                        self._reject(code, per_batch)
                        continue
                    key = tuple(choice[d] for d in outer_dims)
                    pairs = accepted.get(key)
                    if pairs is None:
                        pairs = accepted[key] = _accepted_pairs(verdicts, choice, recomputes, sps)
                    ok, rejected = pairs
                    for code, count in rejected.items():
                        self._reject(code, count)
                    searched += len(ok)
                    valid += len(ok)
                    derived = namespaces[b]
                    do = shards_optimizer_states(derived)
                    if memory.states_exceed(do):
                        continue
                    m = derived["num_microbatches"]
                    for r, rec, sp in ok:
                        device = assess(do, mbs, m, r, rec, sp)
                        if device is not None:
                            fits.append(_Fit(step(m, rec, sp, do), device, memory, mbs, m, do, rec, sp, chosen))
            self.searched += searched
            self.valid += valid

    # -- shared pieces -------------------------------------------------------------------------

    def family(self, pp: int, pipeline: PipelineChoice, tp: int, derived: dict) -> _Family:
        """The stages of this split (``layout.pipeline_stages``): they depend on pp, the split
        and the model only."""
        key = (pp, pipeline)
        family = self._families.get(key)
        if family is None:
            from megatron_estimator.config.typed import build_config
            from megatron_estimator.model.layout import pipeline_stages

            config = build_config(derived, self.vocabulary(tp), "plan", self.env, run=self.run_context)
            if self.reference is None:
                self.reference = config
            if self.pattern is None:
                self.pattern = self.layer_pattern()
                self.workspaces = _workspaces(config, self.overheads, self.env)
            family = self._families[key] = _Family(self, pipeline_stages(config), derived)
        return family

    def recompute_grouping(self, cfg, rec: Recompute, chunk_id: int, chunk) -> tuple[tuple[int, int], tuple[int, tuple]]:
        """memory/model.py ``_recompute_groups`` of a chunk under this recompute choice, counted
        by layer kind: ((dense, MoE) layers kept whole, (number of groups, distinct (dense, MoE)
        group counts))."""
        key = (rec, chunk_id)
        value = self._groupings.get(key)
        if value is None:
            cfg = replace(cfg, training=replace(cfg.training, recompute_granularity=rec.granularity,
                                                recompute_method=rec.method, recompute_num_layers=rec.num_layers))
            groups, whole = memory_model._recompute_groups(cfg, chunk.layers)
            pattern = self.pattern

            def kinds(layers) -> tuple[int, int]:
                moe = sum(1 for i in layers if pattern[i])
                return len(layers) - moe, moe

            value = self._groupings[key] = (kinds(whole), (len(groups), tuple(sorted({kinds(g) for g in groups}))))
        return value

    def intern(self, structure: tuple) -> int:
        """A small int for a stage or chunk structure, the same for equal structures."""
        return self._interned.setdefault(structure, len(self._interned))

    def vocabulary(self, tp: int):
        from megatron_estimator.config.vocab import vocabulary_of

        vocab = self._vocab.get(tp)
        if vocab is None:
            # The call resolve.resolve_config makes; the input's vocabulary was checked there.
            vocab = vocabulary_of(self.namespace, tp)
            if vocab is None:
                raise InvalidInput([Problem("unknown-vocab-size", self.raw.location("vocab_size"),
                                            "cannot tell the vocabulary size; pass --vocab-size")])
            self._vocab[tp] = vocab
        return vocab

    def layer_pattern(self) -> tuple[bool, ...]:
        """Per decoder layer: True where it is a MoE layer."""
        ns = self.namespace
        if self.reference is not None:
            model = self.reference.model
            return model.moe.layer_pattern if model.moe is not None else (False,) * model.num_layers
        from megatron_estimator.config.typed import expand_moe_layer_freq

        if not ns.get("num_experts"):
            return (False,) * ns["num_layers"]
        return expand_moe_layer_freq(ns.get("moe_layer_freq", 1), ns["num_layers"])

    def layer_counts(self, tp: int, ep: int, etp: int, moe_layer: bool) -> tuple[int, int, int, int]:
        """(dense elements, expert elements, dense tensors, expert tensors) one GPU holds of a
        decoder layer of this kind (memory/parameters.py ``layer_tensors``)."""
        key = (tp, ep, etp, moe_layer)
        counts = self._layer_counts.get(key)
        if counts is None:
            from megatron_estimator.model.parameters import layer_tensors

            index = self.layer_pattern().index(moe_layer)
            config = replace(self.reference, parallel=ParallelDims(self.world, tp, 1, 1, ep, etp))
            counts = self._layer_counts[key] = _census(layer_tensors(config, index, ""))
        return counts

    def state_rates(self, dims: ParallelDims, do: bool) -> "_StateRates":
        """Model-state bytes per dense and per expert element, lowest and highest over the
        tensor kinds, for these shard sizes: memory/states.py ``model_states`` of one probe
        tensor whose size leaves no padding (a multiple of 64 and of lcm(shard, 128))."""
        key = (dims.dp * dims.cp, dims.edp, dims.pp > 1, do)
        rates = self._rates.get(key)
        if rates is None:
            ref = self.reference
            config = with_distributed_optimizer(replace(ref, parallel=dims), do)
            found = []
            for expert, shard in ((False, dims.dp * dims.cp), (True, dims.edp)):
                size = 64 * math.lcm(shard, 128) * 4096
                per_kind = []
                for kind in ("linear", "norm", "bias", "embedding", "router"):
                    st = model_states(config, [[ParamTensor("probe", size, expert, kind)]])
                    total = st.weights + st.gradients + st.optimizer_states
                    per_kind.append((total / size, (total + 8) / size))   # the probe's own truncation
                found.append((min(low for low, _ in per_kind), max(high for _, high in per_kind)))
            rates = self._rates[key] = _StateRates(found[0][0], found[0][1], found[1][0], found[1][1])
        return rates

    def tensors(self, config, layout: _Layout, chunk_id: int, chunk) -> list:
        """memory/parameters.py ``chunk_tensors``: it depends on tp, ep, etp and the chunk's structure."""
        key = (layout.tp, layout.ep, layout.etp, chunk_id, chunk.embedding, chunk.output_weight)
        tensors = self._tensors.get(key)
        if tensors is None:
            from megatron_estimator.model.parameters import chunk_tensors

            tensors = self._tensors[key] = chunk_tensors(config, chunk)
        return tensors

    def chunk_census(self, tp: int, ep: int, etp: int, chunk_id: int, chunk) -> tuple[int, int, int, int]:
        """(dense elements, expert elements, dense tensors, expert tensors) of a model chunk on
        one GPU: its decoder layers, embedding, output layer and MTP layers (the final norm is
        left out: the callers bound it)."""
        key = ("chunk", tp, ep, etp, chunk_id, chunk.embedding, chunk.output_weight)
        cached = self._layer_counts.get(key)
        if cached is not None:
            return cached
        dense = expert = n_dense = n_expert = 0
        for i in chunk.layers:
            d, e, nd, ne = self.layer_counts(tp, ep, etp, self.pattern[i])
            dense, expert, n_dense, n_expert = dense + d, expert + e, n_dense + nd, n_expert + ne
        if chunk.embedding or chunk.output_weight or chunk.mtp_layers:
            edges_key = ("edges", tp, ep, etp)
            edges = self._layer_counts.get(edges_key)
            if edges is None:
                from megatron_estimator.model.parameters import embedding_tensors, mtp_tensors

                model = replace(self.reference.model, padded_vocab_size=self.vocabulary(tp).padded_size)
                config = replace(self.reference, parallel=ParallelDims(self.world, tp, 1, 1, ep, etp), model=model)
                mtp = _census(mtp_tensors(config, 0)) if model.mtp_num_layers else (0, 0, 0, 0)
                output = (model.padded_vocab_size // tp * model.hidden_size, 0, 1, 0)
                edges = self._layer_counts[edges_key] = (_census(embedding_tensors(config)), output, mtp)
            for part, times in zip(edges, (chunk.embedding, chunk.output_weight, chunk.mtp_layers)):
                if times:
                    dense += part[0] * times
                    expert += part[1] * times
                    n_dense += part[2] * times
                    n_expert += part[3] * times
        result = self._layer_counts[key] = (dense, expert, n_dense, n_expert)
        return result

    @property
    def proxy_model(self) -> _ProxyModel:
        if self._proxy_model is None:
            self._proxy_model = _proxy_model(self)
        return self._proxy_model


# -------------------------------------------------------------------------------------------
# Flags


def _flag_tokens(dest: str, value: Any) -> list[str]:
    from megatron_estimator.megatron.flags import flag_table

    spec = flag_table().by_dest(dest)
    if spec.action == "store_true":
        return [spec.flag]
    if isinstance(value, (list, tuple)):
        return [spec.flag, *[str(v) for v in value]]
    return [spec.flag, str(value)]


def _input_value(raw: RawArgs, dest: str) -> Any:
    from megatron_estimator.megatron.flags import flag_table

    return raw.value(dest) if raw.given(dest) else flag_table().default(dest)


def _unset(value: Any) -> bool:
    return value is None or value is False


def candidate_flags(raw: RawArgs, settings: Mapping[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(flags to add, flags to remove) that turn the input ``raw`` into this layout: only the
    planned settings whose value differs from what the input gives (a flag or Megatron's
    default).  A setting the layout leaves unset is removed where the input sets it: no flag
    unsets it.  ``--expert-tensor-parallel-size`` unset means tp, so it is compared as given."""
    from megatron_estimator.megatron.flags import flag_table

    table = flag_table()
    add: list[str] = []
    remove: list[str] = []
    for dest in PLANNED_DESTS:
        value = settings.get(dest)
        if dest == "recompute_modules" and settings.get("recompute_granularity") != "selective":
            continue              # only selective recompute reads the module list
        before = _input_value(raw, dest)
        if _unset(value):
            if raw.given(dest) and not _unset(raw.value(dest)):
                remove.append(table.by_dest(dest).flag)
            continue
        if isinstance(before, list):
            before = tuple(before)
        if (tuple(value) if isinstance(value, list) else value) == before:
            continue
        add += _flag_tokens(dest, value)
    return tuple(add), tuple(remove)


def candidate_raw(raw: RawArgs, candidate: Candidate) -> RawArgs:
    """The input's settings with this candidate's layout: what ``api.evaluate`` re-estimates."""
    return layout_raw(raw, dict(candidate.settings))


def candidate_argv(argv: Sequence[str], candidate: Candidate) -> list[str]:
    """Megatron flags ``argv`` edited to select this candidate: the flags it removes or sets are
    taken out with their values, then ``candidate.flags`` are appended."""
    from megatron_estimator.megatron.flags import flag_table

    table = flag_table()
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


# -------------------------------------------------------------------------------------------
# The entry point


def plan(model: Any = None, *, world_size: int, global_batch_size: int, budget: int | str | None = None,
         budget_source: str | None = None, gpu: str | None = None, extra_flags: Sequence[str] = (),
         preset: str | None = None, hf_config: str | None = None, top: int | None = 10,
         space: SearchSpace | None = None, proxy: ProxyAssumptions | None = None, overheads=None,
         environ: Mapping[str, str] | None = None, verify: bool = True) -> Plan:
    """Every layout of the model (``plan_input``) on ``world_size`` GPUs that Megatron accepts
    and that fits the budget (bytes, a size such as ``"80GiB"``, or the capacity of ``gpu``),
    ranked by the throughput proxy.  The best ``top`` (all with None) become candidates; with
    ``verify`` each is re-estimated through ``api.evaluate`` (its ``estimate``), and its figures
    must agree.  Raises InvalidInput with every problem of the input; a plan where nothing
    fits has ``fitting == 0``."""
    from megatron_estimator.core.units import parse_bytes
    from megatron_estimator.megatron.gpus import lookup_gpu
    from megatron_estimator.model.overhead import Overheads

    started = time.perf_counter()
    problems: list[Problem] = []
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        problems.append(Problem("out-of-range", "--world-size", f"world size {world_size!r} must be a positive integer"))
    if not isinstance(global_batch_size, int) or isinstance(global_batch_size, bool) or global_batch_size < 1:
        problems.append(Problem("out-of-range", "--global-batch-size",
                                f"global batch size {global_batch_size!r} must be a positive integer"))
    gpu_spec = None
    if gpu is not None:
        try:
            gpu_spec = lookup_gpu(gpu)
        except InvalidInput as err:
            problems += err.problems
    budget_bytes = None
    if budget is not None:
        if isinstance(budget, int) and not isinstance(budget, bool):
            budget_bytes, budget_source = budget, budget_source or f"{budget} bytes"
        else:
            try:
                budget_bytes = parse_bytes(str(budget), location="budget")
                budget_source = budget_source or f"budget {budget}"
            except InvalidInput as err:
                problems += err.problems
    elif gpu_spec is not None:
        budget_bytes, budget_source = gpu_spec.total_memory_bytes, budget_source or f"{gpu_spec.name} capacity"
    elif gpu is None:
        problems.append(Problem("missing-budget", "--budget", "the planner needs a budget: --budget SIZE or --gpu NAME"))
    if budget_bytes is not None and budget_bytes <= 0:
        problems.append(Problem("out-of-range", "--budget", f"budget {budget_bytes} bytes must be positive"))
    inp, input_problems = plan_input(model, extra_flags=extra_flags, preset=preset, hf_config=hf_config,
                                     environ=environ)
    problems += input_problems
    if problems:
        raise InvalidInput(problems)
    if overheads is None:
        overheads = Overheads(compute_capability=gpu_spec.compute_capability_value if gpu_spec else 9.0,
                              gpu_known=gpu_spec is not None)
    env = dict(os.environ if environ is None else environ)
    env.update(inp.environment)
    space = space or SearchSpace()
    proxy = proxy or ProxyAssumptions()

    search = _Search(inp, world_size, global_batch_size, budget_bytes, budget_source, overheads, env, space, proxy)
    search.run()
    if search.valid == 0:
        raise NoValidLayout(_no_valid_layout(search), search.searched)
    chosen = _best(search.fits, top)
    candidates = tuple(_candidate(search, fit, verify) for fit in chosen)
    notes = list(inp.notes)
    if search.base_problems:
        notes.append("with Megatron's default layout the input fails validation: "
                     + "; ".join(f"{p.location}: {p.message}" for p in search.base_problems))
    return Plan(
        source=inp.source, world_size=world_size, global_batch_size=global_batch_size,
        budget_bytes=budget_bytes, budget_source=budget_source, candidates=candidates,
        searched=search.searched, valid=search.valid, fitting=len(search.fits),
        seconds=time.perf_counter() - started, space=space, proxy=proxy,
        rejections=tuple(sorted(search.rejections.items(), key=lambda kv: (-kv[1], kv[0]))),
        notes=tuple(notes),
    )


def _best(fits: list[_Fit], top: int | None) -> list[_Fit]:
    """The ``top`` best layouts by (proxy step, device peak).  The device peaks of the layouts
    tied with the last of them on the proxy are made exact first, so the order is the one
    exact peaks give."""
    fits.sort(key=_Fit.sort_key)
    if top is None or top >= len(fits):
        window = fits
    else:
        boundary = fits[top - 1].step
        window = [fit for fit in fits if fit.step <= boundary]
    for fit in window:
        fit.resolve()
    window.sort(key=_Fit.sort_key)
    return window if top is None else window[:top]


def search_space(model: Any, *, world_size: int, global_batch_size: int, extra_flags: Sequence[str] = (),
                 space: SearchSpace | None = None, environ: Mapping[str, str] | None = None
                 ) -> Iterator[dict[str, Any]]:
    """Every layout ``plan`` searches, as the planned settings (dest -> value) of each: what a
    brute-force check runs through ``api.evaluate`` (``layout_raw`` applies one to the input)."""
    from megatron_estimator.model.overhead import Overheads

    inp, problems = plan_input(model, extra_flags=extra_flags, environ=environ)
    if problems:
        raise InvalidInput(problems)
    env = dict(os.environ if environ is None else environ)
    env.update(inp.environment)
    space = space or SearchSpace()
    search = _Search(inp, world_size, global_batch_size, 1, "", Overheads(), env, space, ProxyAssumptions())
    for tp, cp, pp, pipeline in search.families():
        ns = dict(search.namespace)
        ns.update(_family_settings(tp, cp, pp, pipeline))
        batches, namespaces = _derive_batches(ns, search.batch_choices(), world_size, {})
        family = search.family(pp, pipeline, tp, namespaces[0])
        for ep, etp in search.expert_choices(tp):
            for do, mbs in batches:
                for rec in recompute_choices(family.max_chunk_layers, space.block_recompute_fractions):
                    for sp in ((False, True) if tp > 1 else (False,)):
                        settings = _family_settings(tp, cp, pp, pipeline)
                        settings.update({"expert_model_parallel_size": ep,
                                         "expert_tensor_parallel_size": etp if search.moe and etp != tp else None,
                                         "micro_batch_size": mbs, "global_batch_size": global_batch_size,
                                         "use_distributed_optimizer": do, "sequence_parallel": sp})
                        settings.update(rec.settings())
                        yield {d: settings.get(d) for d in PLANNED_DESTS}


def layout_raw(raw: RawArgs, settings: Mapping[str, Any]) -> RawArgs:
    """The input's settings with these planned settings instead of its own."""
    out = {d: s for d, s in raw.settings.items() if d not in PLANNED_DESTS}
    for dest, value in settings.items():
        if value is None or value is False:
            continue
        if dest == "recompute_modules" and settings.get("recompute_granularity") != "selective" and raw.given(dest):
            out[dest] = raw.settings[dest]
            continue
        out[dest] = RawSetting(dest, value, _flag_tokens(dest, value)[0])
    return RawArgs(out, raw.source)


class NoValidLayout(InvalidInput):
    """No layout passes Megatron's checks; ``searched`` says how many were tried."""

    def __init__(self, problems, searched: int):
        super().__init__(problems)
        self.searched = searched


def _no_valid_layout(search: _Search) -> list[Problem]:
    if search.base_problems:
        return list(search.base_problems)
    reasons = ", ".join(f"{code} ({n})" for code, n in sorted(search.rejections.items(), key=lambda kv: -kv[1])[:5])
    return [Problem("no-valid-layout", "--world-size",
                    f"none of the {search.searched} layouts searched on {search.world} GPUs passes Megatron's "
                    "checks" + (f"; rejected by: {reasons}" if reasons else ""))]


def _candidate(search: _Search, fit: _Fit, verify: bool = True) -> Candidate:
    """The Candidate of a fitting layout; with ``verify`` its figures must match ``api.evaluate``
    on its settings."""
    layout = fit.memory.layout
    device, allocated, rank = fit.resolve()
    settings: dict[str, Any] = _family_settings(layout.tp, layout.cp, layout.pp, layout.pipeline)
    settings.update({"expert_model_parallel_size": layout.ep,
                     "expert_tensor_parallel_size": layout.etp if search.moe and layout.etp != layout.tp else None,
                     "micro_batch_size": fit.micro_batch_size, "global_batch_size": search.gbs,
                     "use_distributed_optimizer": fit.chosen_optimizer,
                     "sequence_parallel": fit.sequence_parallel})
    settings.update(fit.recompute.settings())
    proxy = fit.memory.proxy(fit.micro_batch_size, fit.num_microbatches, fit.recompute, fit.sequence_parallel,
                             fit.distributed_optimizer)
    flags, remove = candidate_flags(search.inp.raw, settings)
    candidate = Candidate(
        parallel=fit.memory.dims, pipeline=layout.pipeline, micro_batch_size=fit.micro_batch_size,
        num_microbatches=fit.num_microbatches, sequence_parallel=fit.sequence_parallel, recompute=fit.recompute,
        distributed_optimizer=fit.chosen_optimizer, peak_stage=rank, device_peak_bytes=device,
        allocated_peak_bytes=allocated, headroom_bytes=search.budget - device, proxy=proxy,
        settings=tuple((d, settings.get(d)) for d in PLANNED_DESTS), flags=flags, remove_flags=remove)
    if not verify:
        return candidate
    raw = candidate_raw(search.inp.raw, candidate)
    verdict = evaluate(replace(search.inp, raw=raw), world_size=search.world, world_size_source="--world-size",
                       budget=search.budget, budget_source=search.budget_source,
                       overheads=search.overheads, environ=search.env)
    if verdict.estimate is None:
        raise RuntimeError(f"planner: layout {' '.join(flags)} passed the rules but the estimator rejects it: "
                           + "; ".join(f"{p.location}: {p.message}" for p in verdict.problems))
    peak = verdict.estimate.peak_stage
    if (peak.device_peak_bytes, peak.allocated_peak_bytes, peak.pipeline_rank) != (device, allocated, rank):
        raise RuntimeError(f"planner: the fast estimate of {' '.join(flags) or 'the input layout'} ({device} "
                           f"bytes on stage {rank}) differs from the estimator's "
                           f"({peak.device_peak_bytes} bytes on stage {peak.pipeline_rank})")
    return replace(candidate, estimate=verdict.estimate)
