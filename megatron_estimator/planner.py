"""The layout planner: every parallel layout Megatron accepts for a model on N GPUs, the ones
that fit the budget, best first.

Input: a model (anything ``api.load_input`` reads, or a preset name), the world size, the
global batch size and a budget.  The planner varies only the layout settings the input does
not fix for the model (``PLANNED_DESTS``): tensor (tp), pipeline (pp), virtual pipeline (vpp)
and context (cp) parallel sizes, expert (ep) and expert tensor (etp) parallel sizes, the
micro batch size, sequence parallelism, activation recomputation and the distributed
optimizer.  Every other setting stays as the user gave it.

The search space (``SearchSpace``; each bound is a field that can be changed):

- tp: the divisors of the world size up to the GPUs of one node (TP across nodes is never
  competitive); cp: divisors of world / tp up to ``max_context_parallel``; pp: divisors of
  world / (tp cp) up to the number of layers; ep: divisors of the number of experts (MoE
  models); etp: 1 or tp (MoE models; Megatron's default is tp);
- virtual stages per rank v = 1..``max_virtual_stages``; the layers are split evenly when
  they divide, else with ``--decoder-first/last-pipeline-num-layers`` (a balanced middle, the
  first and last stages no heavier), else with a balanced ``--pipeline-model-parallel-layout``;
  the user's own split is kept as one more choice for the user's pp;
- micro batch sizes ``micro_batch_sizes``; sequence parallel on/off when tp > 1;
- recompute: none, selective ``core_attn``, full uniform (1 layer per group), full block
  with ``block_recompute_fractions`` of the layers of a model chunk; distributed optimizer
  off/on.

"Megatron accepts" means the project's own checks pass (``validation.rules.RULES`` on the
namespace ``derive.derive_namespace`` builds): the planner calls them, it does not restate
them.  The user's input is validated once (schema, model rules, vocabulary); each layout
runs the rules.  To keep that fast, a rule is run once per layout family and again only for
the choices it reads: ``_Reads`` records which planner-varied keys a rule looked at, and its
verdict is reused for every choice that differs only in keys it did not read (the rules are
pure functions of the namespace, so that is exact).

"Fits" means the device peak of the peak stage (``results.StageEstimate.device_peak_bytes``,
allocated memory plus CUDA context, NCCL buffers and fragmentation) is at most the budget.
The numbers are the estimator's own: the planner composes ``memory`` functions
(``chunk_tensors``, ``model_states``, ``chunk_activation_bytes``, the stage transients,
``layout.microbatches_in_flight``) with caches keyed by what each depends on: model states
by (tp, pp, ep, etp, distributed optimizer, stage structure), activations by (tp, cp, micro
batch, sequence parallel, recompute, chunk structure: layer kinds, embedding, loss, MTP).
Each reported candidate is then re-estimated through ``api.evaluate`` from its settings, and
its figures come from that estimate.  Layouts whose model states alone (weights and
gradients, a lower bound) exceed the budget are rejected before any activation work.

Throughput proxy (lower is better; 1.0 is ideal compute with nothing exposed)::

    step = (1 + R + (V_tp/B_tp + V_cp/B_cp + V_ep/B_ep) / C) x (1 + bubble) + (V_dp/B_dp) / C

- C: seconds of model compute per GPU per step, F / (world x ``achieved_flops``), with
  F = tokens x 3 x (sum over layers of 2 x active parameters + causal core attention
  s x a x (d_qk + d_v)) + the output layers' 6 x V x h per token (MTP included);
- bubble = (p - 1) / (v x M), M microbatches per step (megatron/core/pipeline_parallel/schedules.py);
- R, recompute: full recompute re-runs a layer's forward, 1/3 of its forward + backward, so
  R = recomputed forward flops / step flops (uniform: every layer; block n: the first n
  layers of each model chunk); selective ``core_attn`` re-runs only the core attention:
  R = core attention forward flops / step flops;
- V: bytes each GPU sends per step (ring collectives: all-reduce 2(n-1)/n, all-gather and
  reduce-scatter (n-1)/n of the full tensor), for X = s/cp x b x h activation bytes:
  TP: per layer and microbatch 2 collectives forward and 2 backward, 8(t-1)/t x X (the
  same with sequence parallelism: all-gather + reduce-scatter instead of all-reduce), the
  MoE block over etp with top-k times the tokens; a fully recomputed layer adds its forward
  collectives again;
  CP: per layer and microbatch the ring passes the local K and V (cp-1) times forward and
  K, V and their gradients (cp-1) times backward: 3(cp-1) x local K+V bytes;
  EP: per MoE layer and microbatch dispatch + combine forward and backward, 4 all-to-alls of
  (ep-1)/ep x tokens x top-k x h (tokens / t under sequence parallelism);
  DP: per step the gradients of the GPU's parameters: all-reduce over dp x cp (dense) and
  expert-dp (experts), or with the distributed optimizer reduce-scatter of gradients +
  all-gather of parameters;
- B: ``intra_node_bandwidth`` when the group's ranks lie in one node under Megatron's rank
  order (tp-cp-ep-dp-pp: a group of size n and stride k spans n x k consecutive ranks),
  else ``inter_node_bandwidth``.  Pipeline send/receive is not counted; communication is
  not assumed to overlap compute.

Ties are broken by the lower device peak.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field, replace
from typing import Any, Iterator, Mapping, Sequence

from .api import TrainingInput, evaluate, load_input
from .errors import InvalidInput, Problem
from .parallel import ParallelDims
from .rawargs import RawArgs, RawSetting
from .results import Estimate

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

# The namespace keys each inner choice changes, after derive.derive_namespace: the batch
# choice (distributed optimizer, micro batch) is derived per choice; recompute and sequence
# parallel are laid over the derived namespace (derive passes them through unchanged for the
# values the planner sets: sequence parallel only with tp > 1, --recompute-activations off).
_BATCH, _RECOMPUTE, _SP = 0, 1, 2
_KEY_DIM = {key: _BATCH for key in ("micro_batch_size", "global_batch_size", "num_microbatches",
                                     "use_distributed_optimizer", "use_layer_wise_distributed_optimizer")}
_KEY_DIM.update({key: _RECOMPUTE for key in RECOMPUTE_DESTS})
_KEY_DIM["sequence_parallel"] = _SP
_ALL_DIMS = frozenset((_BATCH, _RECOMPUTE, _SP))


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
    inter_node_bandwidth: float = 40e9          # bytes/s per GPU across nodes (one 400 Gb/s NIC per GPU)

    def to_json(self) -> dict:
        return {"achieved_flops": self.achieved_flops, "intra_node_bandwidth": self.intra_node_bandwidth,
                "inter_node_bandwidth": self.inter_node_bandwidth}


@dataclass(frozen=True)
class PipelineChoice:
    """How the decoder layers are split over pp ranks and v virtual stages."""
    pp: int
    vpp: int | None
    settings: tuple[tuple[str, Any], ...]       # split dests the choice sets
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
    """The throughput proxy of one layout: each term as a fraction of the step's compute."""
    step: float                  # the relative step time the ranking uses (lower is better)
    bubble: float
    recompute: float
    tp_comm: float
    cp_comm: float
    ep_comm: float
    dp_comm: float
    compute_seconds: float       # C: model compute per GPU per step at the assumed FLOP/s
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
    flags: tuple[str, ...]                  # Megatron flags to add (or change) on the input
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
    candidates: tuple[Candidate, ...]       # best first; at most ``top``
    searched: int                           # layouts enumerated
    valid: int                              # layouts Megatron accepts
    fitting: int                            # accepted layouts whose peak stage fits the budget
    seconds: float
    space: SearchSpace
    proxy: ProxyAssumptions
    rejections: tuple[tuple[str, int], ...] = ()   # problem code -> layouts it rejected, most first
    notes: tuple[str, ...] = ()

    @property
    def fits(self) -> bool:
        return self.fitting > 0


# -------------------------------------------------------------------------------------------
# Input


def plan_input(model: Any, *, extra_flags: Sequence[str] = (), environ: Mapping[str, str] | None = None
               ) -> tuple[TrainingInput, tuple[Problem, ...]]:
    """The model as a ``TrainingInput``: Megatron flags, a mapping, a file (seed / Megatron
    YAML, launch script, HF config.json) or a preset name (``deepseek-v3``; a string that is
    not an existing path but names a preset).  ``extra_flags`` (Megatron flags) are laid over
    it: a preset or a HF config gives the architecture, the flags the training settings."""
    from .flags import parse_megatron_argv
    from .presets import load_preset, preset_names

    if isinstance(model, TrainingInput):
        inp, problems = model, ()
    elif isinstance(model, str) and not model.startswith("-") and not os.path.exists(model) and (
            model in preset_names() or os.sep not in model and not model.endswith((".json", ".yaml", ".yml", ".sh"))):
        loaded = load_preset(model)
        inp = TrainingInput(loaded.raw, source=f"preset {model}")
        problems = tuple(loaded.problems)
    else:
        inp, problems = load_input(model, environ=environ)
    if extra_flags:
        raw, flag_problems = parse_megatron_argv(list(extra_flags), source="command line")
        inp = replace(inp, raw=inp.raw.merged(raw), source=f"{inp.source} + command-line flags")
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
    # Uneven first/last stages (megatron/training/arguments.py: counts divisible by v): a
    # balanced middle and ends no heavier than it.
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
    # A layout string (megatron/core/transformer/pipeline_parallel_layer_layout.py): layers spread
    # evenly, the extra ones on the middle stages first.
    if n > num_layers:
        return None
    base, extra = divmod(num_layers, n)
    counts = [base] * n
    order = list(range(1, n - 1)) + [n - 1, 0]
    for index in order[:extra]:
        counts[index] += 1
    stages = ["t" * c for c in counts]
    stages[0] = "E" + stages[0]
    stages[-1] = stages[-1] + "m" * mtp + "L"
    text = _layout_text(stages)
    return PipelineChoice(pp, vpp, (("pipeline_model_parallel_layout", text),), f"layout {text}")


def recompute_choices(max_chunk_layers: int, fractions: Sequence[float]) -> list[Recompute]:
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
    from .layout_syntax import count_layout_stages

    pp = raw.value("pipeline_model_parallel_size", 1)
    values = dict(given)
    vpp = values.get("num_virtual_stages_per_pipeline_rank")
    if "pipeline_model_parallel_layout" in values:
        stages = count_layout_stages(values["pipeline_model_parallel_layout"]) or pp
        vpp = stages // pp if pp and stages % pp == 0 else None
    label = "as given: " + " ".join(f"--{d.replace('_', '-')}" + ("" if v is True else f" {v}") for d, v in given)
    return PipelineChoice(pp, vpp if vpp and vpp > 1 else None, given, label)


@dataclass(frozen=True)
class _Layout:
    """An outer choice: the parallel sizes and the pipeline split."""
    tp: int
    cp: int
    pp: int
    ep: int
    etp: int
    pipeline: PipelineChoice

    def settings(self, moe: bool) -> dict[str, Any]:
        out = {d: None for d in SPLIT_DESTS}
        out.update({"tensor_model_parallel_size": self.tp, "pipeline_model_parallel_size": self.pp,
                    "context_parallel_size": self.cp, "expert_model_parallel_size": self.ep,
                    "expert_tensor_parallel_size": self.etp if moe and self.etp != self.tp else None})
        out.update({"account_for_embedding_in_pipeline_split": False, "account_for_loss_in_pipeline_split": False})
        out.update(dict(self.pipeline.settings))
        return out


# -------------------------------------------------------------------------------------------
# Validation: the project's rules, run once per choice they read


class _Reads(Mapping):
    """The namespace a rule sees: ``over`` laid on ``base``; records which choice dimensions
    (batch, recompute, sequence parallel) the rule read."""
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
    """Which inner choices (batch b, recompute r, sequence parallel s) of one layout pass the rules.

    Each rule is run on the first choice of every dimension; when it read a dimension, it is
    run again for each value of that dimension (and of any other it then reads).  Its verdict
    for a choice is the verdict of the run that agrees with the choice on every dimension the
    run read: the same keys read with the same values take the same path.
    """

    def __init__(self, rules, raw: RawArgs, env: Mapping[str, str], namespaces: list[dict],
                 overlays: list[list[dict]]):
        self.failed: str | None = None          # a problem code every choice fails with
        self.tables: list[tuple[tuple[int, ...], dict[tuple[int, ...], str | None]]] = []
        self._raw, self._env = raw, env
        self._namespaces, self._overlays = namespaces, overlays
        self._sizes = (len(namespaces), len(overlays), len(overlays[0]))
        for rule in rules:
            dims, table = self._table(rule)
            if not dims:
                code = table[()]
                if code is not None:
                    self.failed = code
                    return
                continue
            if all(code is None for code in table.values()):
                continue
            self.tables.append((dims, table))

    def _run(self, rule, choice: tuple[int, int, int]) -> tuple[str | None, set[int]]:
        b, r, s = choice
        view = _Reads(self._namespaces[b], self._overlays[r][s])
        for problem in rule(view, self._raw, self._env):
            return problem.code, view.dims
        return None, view.dims

    def _table(self, rule) -> tuple[tuple[int, ...], dict]:
        code, read = self._run(rule, (0, 0, 0))
        dims = tuple(sorted(read))
        while True:
            table: dict[tuple[int, ...], str | None] = {}
            grown = False
            for key in _product([range(self._sizes[d]) for d in dims]):
                choice = [0, 0, 0]
                for d, i in zip(dims, key):
                    choice[d] = i
                code, read = self._run(rule, tuple(choice))
                if not read <= set(dims):
                    dims = tuple(sorted(set(dims) | read))
                    grown = True
                    break
                table[key] = code
            if not grown:
                return dims, table

    def code(self, b: int, r: int, s: int) -> str | None:
        """The first problem code this choice fails with, or None when every rule passes."""
        if self.failed is not None:
            return self.failed
        choice = (b, r, s)
        for dims, table in self.tables:
            code = table[tuple(choice[d] for d in dims)]
            if code is not None:
                return code
        return None


def _product(ranges: list) -> Iterator[tuple[int, ...]]:
    if not ranges:
        yield ()
        return
    import itertools

    yield from itertools.product(*ranges)


# -------------------------------------------------------------------------------------------
# The search


@dataclass
class _Fit:
    """A layout that fits, before it becomes a Candidate."""
    step: float
    device: int
    allocated: int
    peak_rank: int
    layout: _Layout
    vpp: int | None
    micro_batch_size: int
    num_microbatches: int
    distributed_optimizer: bool
    recompute: Recompute
    sequence_parallel: bool

    def sort_key(self) -> tuple:
        lay = self.layout
        return (self.step, self.device, lay.tp, lay.pp, lay.cp, lay.ep, lay.etp, lay.pipeline.label,
                self.micro_batch_size, self.recompute.label, self.sequence_parallel, self.distributed_optimizer)


class _Search:
    """One planning run: the model resolved once, then every layout, with shared caches."""

    def __init__(self, inp: TrainingInput, world: int, gbs: int, budget: int, overheads, environ,
                 space: SearchSpace, proxy: ProxyAssumptions):
        from .flags import flag_table
        from .resolve import resolve_config
        from .validation.rules import RULES
        from .validation.schema import check_config_schema

        self.inp, self.world, self.gbs, self.budget = inp, world, gbs, budget
        self.overheads, self.env, self.space, self.proxy_assumptions = overheads, environ, space, proxy
        self.rules = tuple(RULES)

        # The model without the layout: the user's settings minus what the planner chooses.
        settings = {d: s for d, s in inp.raw.settings.items() if d not in PLANNED_DESTS}
        settings["global_batch_size"] = RawSetting("global_batch_size", gbs, "--global-batch-size")
        settings["micro_batch_size"] = RawSetting("micro_batch_size", min(space.micro_batch_sizes), "--micro-batch-size")
        self.raw = RawArgs(settings, inp.raw.source)
        defaults = flag_table().defaults()
        self.namespace = dict(defaults)
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
            self.reference = resolve_config(self.raw, world_size=1, world_size_source="plan", environ=environ)
            self.base_problems: tuple[Problem, ...] = ()
        except InvalidInput as err:
            # Problems of the default layout may vanish with another one; those of the model do not.
            if any(p.code in ("unknown-vocab-size", "missing-required") for p in err.problems):
                raise InvalidInput(err.problems) from None
            self.reference = None
            self.base_problems = tuple(err.problems)

        self.user_pipeline = _user_pipeline_choice(inp.raw)
        self.proxy_model: _ProxyModel | None = None

        # caches shared by all layouts
        self._vocab: dict[int, Any] = {}
        self._stages: dict[tuple, tuple] = {}
        self._layer_counts: dict[tuple, tuple[int, int]] = {}
        self._states: dict[tuple, int] = {}
        self._act_configs: dict[tuple, Any] = {}
        self._chunk_acts: dict[tuple, tuple[int, int]] = {}
        self._stage_acts: dict[tuple, tuple[tuple[int, ...], int]] = {}
        self._deferred: dict[tuple, int] = {}
        self._recomputed: dict[tuple, float] = {}

        self.searched = self.valid = 0
        self.rejections: dict[str, int] = {}
        self.fits: list[_Fit] = []

    # -- the space ----------------------------------------------------------------------------

    def layouts(self) -> Iterator[_Layout]:
        ns, world, space = self.namespace, self.world, self.space
        num_layers = ns.get("num_layers") or ns.get("encoder_num_layers") or 1
        mtp = ns.get("mtp_num_layers") or 0
        experts = ns.get("num_experts") or 0
        splits: dict[int, list[PipelineChoice]] = {}
        for tp in _divisors(world):
            if tp > space.tensor_parallel_limit:
                break
            for cp in _divisors(world // tp):
                if cp > space.max_context_parallel:
                    break
                for pp in _divisors(world // (tp * cp)):
                    if pp > num_layers:
                        break
                    if pp not in splits:
                        splits[pp] = pipeline_choices(num_layers, mtp, pp, space.max_virtual_stages)
                        user = self.user_pipeline
                        if user is not None and user.pp == pp and user.settings not in [c.settings for c in splits[pp]]:
                            splits[pp].insert(0, user)
                    for choice in splits[pp]:
                        if not experts:
                            yield _Layout(tp, cp, pp, 1, tp, choice)
                            continue
                        for ep in _divisors(experts):
                            if ep > world:
                                break
                            for etp in sorted({1, tp}):
                                yield _Layout(tp, cp, pp, ep, etp, choice)

    def batch_choices(self) -> list[tuple[bool, int]]:
        return [(do, mbs) for do in self.space.distributed_optimizer for mbs in self.space.micro_batch_sizes]

    # -- the loop -----------------------------------------------------------------------------

    def run(self) -> None:
        from .derive import derive_namespace

        batches = self.batch_choices()
        for layout in self.layouts():
            ns = dict(self.namespace)
            ns.update(layout.settings(self.moe))
            ns["recompute_activations"] = False
            ns["distribute_saved_activations"] = False
            namespaces = []
            for do, mbs in batches:
                ns["use_distributed_optimizer"] = do
                ns["micro_batch_size"] = mbs
                derived, _ = derive_namespace(ns, self.world)
                derived["world_size_source"] = "plan"
                namespaces.append(derived)
            first = namespaces[0]
            stages = self.stage_layout(layout, first)
            max_chunk = max((len(c.layers) for s in stages for c in s.chunks), default=0)
            recomputes = recompute_choices(max_chunk, self.space.block_recompute_fractions)
            sps = (False, True) if layout.tp > 1 else (False,)
            overlays = [[_recompute_overlay(rec, sp, first) for sp in sps] for rec in recomputes]
            verdicts = _Verdicts(self.rules, self.raw, self.env, namespaces, overlays)
            if verdicts.failed is not None:
                count = len(batches) * len(recomputes) * len(sps)
                self.searched += count
                self.rejections[verdicts.failed] = self.rejections.get(verdicts.failed, 0) + count
                continue
            memory = _LayoutMemory(self, layout, first, stages)
            for b, (_, mbs) in enumerate(batches):
                derived = namespaces[b]
                m = derived["num_microbatches"]
                do = bool(derived.get("use_distributed_optimizer"))
                over_budget = memory.states_exceed(do)
                for r, rec in enumerate(recomputes):
                    for s, sp in enumerate(sps):
                        self.searched += 1
                        code = verdicts.code(b, r, s)
                        if code is not None:
                            self.rejections[code] = self.rejections.get(code, 0) + 1
                            continue
                        self.valid += 1
                        if over_budget:
                            continue
                        peak = memory.peak(do, mbs, m, rec, sp)
                        if peak is None:
                            continue
                        device, allocated, rank = peak
                        step = memory.proxy(mbs, m, rec, sp, do).step
                        self.fits.append(_Fit(step, device, allocated, rank, layout, memory.vpp, mbs, m, do, rec, sp))

    # -- shared pieces ------------------------------------------------------------------------

    def stage_layout(self, layout: _Layout, derived: dict) -> tuple:
        """``layout.pipeline_stages`` of this split: it depends on pp, the split and the model only."""
        from .config import build_config
        from .layout import pipeline_stages

        key = (layout.pp, layout.pipeline)
        stages = self._stages.get(key)
        if stages is None:
            config = build_config(derived, self.vocabulary(layout.tp), "plan", self.env)
            if self.reference is None:
                self.reference = config
            stages = self._stages[key] = pipeline_stages(config)
        return stages

    def vocabulary(self, tp: int):
        from .vocab import resolve_vocabulary

        vocab = self._vocab.get(tp)
        if vocab is None:
            # The call resolve.resolve_config makes; the input's vocabulary was checked there.
            ns = self.namespace
            vocab = resolve_vocabulary(
                vocab_size=ns.get("vocab_size"), padded_vocab_size=ns.get("padded_vocab_size"),
                tokenizer_type=ns.get("tokenizer_type") or "GPT2BPETokenizer", vocab_file=ns.get("vocab_file"),
                tokenizer_model=ns.get("tokenizer_model"),
                make_vocab_size_divisible_by=ns.get("make_vocab_size_divisible_by") or 128,
                tp=tp, pad=bool(ns.get("pad_vocab_size", True)))
            if vocab is None:
                raise InvalidInput([Problem("unknown-vocab-size", self.raw.location("vocab_size"),
                                            "cannot tell the vocabulary size; pass --vocab-size")])
            self._vocab[tp] = vocab
        return vocab

    def layer_pattern(self) -> tuple[bool, ...]:
        model = self.reference.model
        return model.moe.layer_pattern if model.moe is not None else (False,) * model.num_layers

    def layer_counts(self, tp: int, ep: int, etp: int, moe_layer: bool) -> tuple[int, int]:
        """(dense, expert) parameters one GPU holds of a decoder layer of this kind."""
        from .memory.parameters import count, layer_tensors

        key = (tp, ep, etp, moe_layer)
        counts = self._layer_counts.get(key)
        if counts is None:
            index = self.layer_pattern().index(moe_layer)
            config = replace(self.reference, parallel=ParallelDims(self.world, tp, 1, 1, ep, etp))
            c = count(layer_tensors(config, index, ""))
            counts = self._layer_counts[key] = (c.dense, c.expert)
        return counts

    def get_proxy_model(self, config) -> "_ProxyModel":
        if self.proxy_model is None:
            self.proxy_model = _proxy_model(self, config)
        return self.proxy_model


def _recompute_overlay(rec: Recompute, sp: bool, derived: Mapping) -> dict:
    """The namespace keys a recompute / sequence-parallel choice sets on the derived namespace."""
    over = rec.settings()
    if rec.modules is None:
        over["recompute_modules"] = derived.get("recompute_modules")
    over["recompute_activations"] = False
    over["distribute_saved_activations"] = False
    over["sequence_parallel"] = sp
    return over


def _stage_other(cfg, stage, per_chunk, overheads, environ) -> int:
    """A stage's bytes besides model states and kept activations: the largest transient, the
    workspaces, the batch and the global buffers, term by term as memory/model.py
    ``estimate_stage`` adds them (without the FSDP transient, which comes with the states)."""
    from .memory import activations as act
    from .memory import model as mm
    from .memory.overhead import cublas_workspace_bytes, te_workspace_bytes

    ns = cfg.namespace
    backward = mm._layer_backward_working_set(cfg, stage.layers)
    transients = [backward]
    if ns.get("fine_grained_activation_offloading") and stage.layers:
        transients.append(backward + max(act.offloaded_bytes(cfg, i) for i in stage.layers))
    if ns.get("overlap_moe_expert_parallel_comm") and stage.layers:
        transients.append(backward + max(act.layer_activations(cfg, i).total for i in stage.layers))
    transients.append(max((r for _, r in per_chunk), default=0))
    if stage.post_process:
        transients.append(mm._loss_transient(cfg, overheads.compute_capability))
    cublas, _ = cublas_workspace_bytes(environ, overheads.compute_capability, bool(ns.get("deterministic_mode")))
    te = te_workspace_bytes(overheads.compute_capability, cfg.kernels.transformer_impl)
    batch = mm._batch_bytes(cfg) if (stage.pre_process or stage.post_process) else 0
    return max(transients) + cublas + te + batch + mm._global_buffers(cfg)


class _LayoutMemory:
    """The per-stage memory of one layout, composed the way memory/model.py ``estimate_stage``
    composes it, from the same functions, with their results cached by what each depends on.

    Stages with the same structure (layer kinds, embedding, loss, output weight, MTP) share
    model states and per-microbatch activations.  Without virtual stages a lower rank of such
    a group holds at least as many microbatches (1F1B: min(p - r, M)) and nothing else differs,
    so only its first rank can be the group's peak; with virtual stages every rank is checked.
    """

    def __init__(self, search: _Search, layout: _Layout, derived: dict, stages: tuple):
        from .memory.overhead import communicators

        self.search, self.layout, self.derived, self.stages = search, layout, derived, stages
        self.vpp = derived.get("virtual_pipeline_model_parallel_size")
        self.group_size = derived["microbatch_group_size_per_vp_stage"]
        self.combined_1f1b = bool(derived.get("overlap_moe_expert_parallel_comm"))
        self._config = None
        self.dims = ParallelDims(search.world, layout.tp, layout.pp, layout.cp, layout.ep, layout.etp, self.vpp)
        o = search.overheads
        self.fixed = o.cuda_context_bytes + o.nccl_bytes_per_communicator * len(communicators(self.dims, search.moe))
        self.fragmentation = o.fragmentation
        pattern = search.layer_pattern()
        classes: dict[tuple, list[int]] = {}
        for stage in stages:
            sig = tuple((tuple(pattern[i] for i in c.layers), c.embedding, c.pre_process, c.post_process,
                         c.output_weight, c.mtp_layers) for c in stage.chunks)
            classes.setdefault(sig, []).append(stage.pp_rank)
        self.classes = [(sig, ranks if self.vpp else ranks[:1]) for sig, ranks in classes.items()]
        self._bound: dict[bool, bool] = {}
        self._states: dict[bool, list[tuple[int, int]]] = {}

    @property
    def config(self):
        """This layout's EstimatorConfig (config.build_config on the derived namespace)."""
        if self._config is None:
            from .config import build_config

            self._config = build_config(self.derived, self.search.vocabulary(self.layout.tp), "plan", self.search.env)
        return self._config

    # model states

    def states_exceed(self, do: bool) -> bool:
        """Whether a lower bound of the model states alone puts some stage over the budget.

        The bound is memory/states.py ``model_states`` of the stage's decoder-layer parameters
        as one dense and one expert tensor, of the kind that costs least: the states grow with
        the elements (padding only adds), and the embedding, output layer and MTP layers are
        left out."""
        bound = self._bound.get(do)
        if bound is None:
            from .memory.parameters import ParamTensor
            from .memory.states import model_states

            search, lay = self.search, self.layout
            ref = search.reference
            config = replace(ref, parallel=self.dims, precision=replace(ref.precision, use_distributed_optimizer=do))
            worst = 0
            for sig, _ in self.classes:
                dense = expert = 0
                for chunk in sig:
                    for kind in chunk[0]:
                        d, e = search.layer_counts(lay.tp, lay.ep, lay.etp, kind)
                        dense += d
                        expert += e
                lowest = None
                for kind in ("linear", "norm"):
                    probe = [ParamTensor("probe", dense, False, kind)] if dense else []
                    if expert:
                        probe.append(ParamTensor("probe.expert", expert, True, kind))
                    st = model_states(config, [probe])
                    total = st.weights + st.gradients + st.optimizer_states
                    lowest = total if lowest is None else min(lowest, total)
                # model_states truncates per buffer group; the real stage has more groups.
                worst = max(worst, lowest - 8 * len(sig))
            device = worst + self.fixed + int(worst * self.fragmentation)
            bound = self._bound[do] = device > search.budget
        return bound

    def states(self, do: bool) -> list[tuple[int, int]]:
        """(weights + gradients + optimizer states, FSDP transient) of each stage group (memory/states.py)."""
        out = self._states.get(do)
        if out is None:
            from .memory.parameters import chunk_tensors
            from .memory.states import model_states

            lay = self.layout
            config = self.config
            if config.precision.use_distributed_optimizer != do:
                config = replace(config, precision=replace(config.precision, use_distributed_optimizer=do))
            cache = self.search._states
            out = []
            for sig, ranks in self.classes:
                # dp x cp = world / (tp pp) and edp do not depend on cp: neither do the states.
                key = (lay.tp, lay.pp, lay.ep, lay.etp, do, sig)
                value = cache.get(key)
                if value is None:
                    stage = self.stages[ranks[0]]
                    st = model_states(config, [chunk_tensors(config, chunk) for chunk in stage.chunks])
                    value = cache[key] = (st.weights + st.gradients + st.optimizer_states, st.fsdp_transient)
                out.append(value)
            self._states[do] = out
        return out

    # activations

    def _act_config(self, mbs: int, rec: Recompute, sp: bool):
        """A configuration with this batch and recompute choice for the activation terms, which
        read tp, cp, ep, etp and the training settings (not pp, the split or the optimizer)."""
        lay = self.layout
        key = (lay.tp, lay.cp, lay.ep, lay.etp, mbs, rec, sp)
        cfg = self.search._act_configs.get(key)
        if cfg is None:
            base = self.config
            modules = rec.modules if rec.modules is not None else tuple(self.derived.get("recompute_modules") or ())
            cfg = self.search._act_configs[key] = replace(
                base, parallel=ParallelDims(self.search.world, lay.tp, 1, lay.cp, lay.ep, lay.etp),
                training=replace(base.training, micro_batch_size=mbs, sequence_parallel=sp,
                                 recompute_granularity=rec.granularity, recompute_method=rec.method,
                                 recompute_num_layers=rec.num_layers, recompute_modules=modules,
                                 distribute_saved_activations=False))
        return key, cfg

    def _group_activations(self, akey, cfg, index: int) -> tuple[tuple[int, ...], int]:
        """(bytes one microbatch keeps in each chunk, the stage's other bytes but the FSDP transient)."""
        from .memory import model as mm

        sig, ranks = self.classes[index]
        key = (akey, sig)
        cached = self.search._stage_acts.get(key)
        if cached is None:
            chunk_acts = self.search._chunk_acts
            stage = self.stages[ranks[0]]
            per_chunk = []
            for chunk, (kinds, _, pre, post, _, mtp) in zip(stage.chunks, sig):
                ckey = (akey, kinds, pre, post, mtp)
                value = chunk_acts.get(ckey)
                if value is None:
                    value = chunk_acts[ckey] = mm.chunk_activation_bytes(cfg, chunk)
                per_chunk.append(value)
            other = _stage_other(cfg, stage, per_chunk, self.search.overheads, self.search.env)
            cached = self.search._stage_acts[key] = (tuple(kept for kept, _ in per_chunk), other)
        return cached

    def _deferred(self, akey, cfg, m: int) -> int:
        """memory/model.py ``_deferred_wgrad_bytes`` for M microbatches (last stage only)."""
        if not cfg.training.defer_embedding_wgrad_compute:
            return 0
        from .memory import model as mm

        key = (akey, m)
        value = self.search._deferred.get(key)
        if value is None:
            value = self.search._deferred[key] = mm._deferred_wgrad_bytes(
                replace(cfg, training=replace(cfg.training, num_microbatches=m)))
        return value

    def peak(self, do: bool, mbs: int, m: int, rec: Recompute, sp: bool) -> tuple[int, int, int] | None:
        """(device peak, allocated peak, rank) of the peak stage; None as soon as a stage is over budget."""
        from .layout import microbatches_in_flight

        states = self.states(do)
        akey, cfg = self._act_config(mbs, rec, sp)
        budget, fixed, fragmentation = self.search.budget, self.fixed, self.fragmentation
        pp, vpp, group, combined = self.layout.pp, self.vpp, self.group_size, self.combined_1f1b
        best = None
        for index, (sig, ranks) in enumerate(self.classes):
            kept, other = self._group_activations(akey, cfg, index)
            model_states, fsdp_transient = states[index]
            base = model_states + other + fsdp_transient
            if sig[-1][3]:                                   # the loss runs here
                base += self._deferred(akey, cfg, m)
            for rank in ranks:
                inflight = microbatches_in_flight(pp, rank, vpp, m, group, kept, combined).chunk_microbatches
                allocated = base + sum(n * k for n, k in zip(inflight, kept))
                device = allocated + fixed + int(allocated * fragmentation)
                if device > budget:
                    return None
                if best is None or (device, -rank) > (best[0], -best[2]):
                    best = (device, allocated, rank)
        return best

    # throughput proxy

    def recomputed_fraction(self, rec: Recompute) -> float:
        """Forward flops of the layers full recompute re-runs / forward flops of all decoder layers."""
        key = (self.layout.pp, self.layout.pipeline, rec)
        cached = self.search._recomputed.get(key)
        if cached is None:
            model = self.search.get_proxy_model(self.config)
            pattern = self.search.layer_pattern()
            dense_f, moe_f = model.layer_forward
            total = sum(moe_f if k else dense_f for k in pattern) or 1.0
            again = 0.0
            for stage in self.stages:
                for chunk in stage.chunks:
                    layers = chunk.layers if rec.method == "uniform" else chunk.layers[:rec.num_layers or 0]
                    again += sum(moe_f if pattern[i] else dense_f for i in layers)
            cached = self.search._recomputed[key] = again / total
        return cached

    def proxy(self, mbs: int, m: int, rec: Recompute, sp: bool, do: bool) -> ProxyBreakdown:
        """The throughput proxy of the module docstring."""
        search = self.search
        model = search.get_proxy_model(self.config)
        a, node = search.proxy_assumptions, search.space.gpus_per_node
        d = self.dims
        tp, cp, pp, ep, etp, dp, edp = d.tp, d.cp, d.pp, d.ep, d.etp, d.dp, d.edp
        v = self.vpp or 1
        s_local = model.seq_length // cp
        x = s_local * mbs * model.hidden * model.act_bytes            # one [s/cp, b, h] activation
        dense_layers, moe_layers = model.dense_layers / pp, model.moe_layers / pp
        again = self.recomputed_fraction(rec) if rec.granularity == "full" else 0.0

        def bandwidth(size: int, stride: int) -> float:
            return a.intra_node_bandwidth if size * stride <= node else a.inter_node_bandwidth

        tp_bytes = 0.0
        if tp > 1:
            block = 4 * (tp - 1) / tp * x                              # one block, forward + backward
            tp_bytes += (dense_layers + moe_layers + dense_layers) * block * (1 + 0.5 * again)
        if etp > 1 and moe_layers:
            tp_bytes += moe_layers * 4 * (etp - 1) / etp * x * model.topk * (1 + 0.5 * again)
        tp_bytes *= m
        cp_bytes = 0.0
        if cp > 1:
            kv_local = s_local * mbs * model.kv_width * model.act_bytes / tp
            cp_bytes = (dense_layers + moe_layers) * m * (cp - 1) * kv_local * (3 + again)
        ep_bytes = 0.0
        if ep > 1 and moe_layers:
            tokens = s_local * mbs / (tp if sp else 1)
            ep_bytes = (moe_layers * m * 4 * (ep - 1) / ep * tokens * model.topk * model.hidden * model.act_bytes
                        * (1 + 0.5 * again))
        dense_local = model.dense_params / (tp * pp)
        expert_local = model.expert_params / (ep * etp * pp)
        per = (model.grad_bytes + model.param_bytes) if do else 2 * model.grad_bytes
        n_dense, n_expert = dp * cp, edp
        dp_dense = (n_dense - 1) / n_dense * dense_local * per
        dp_expert = (n_expert - 1) / n_expert * expert_local * per

        c = model.flops_per_gpu / a.achieved_flops
        tp_s = tp_bytes / bandwidth(tp, 1)
        cp_s = cp_bytes / bandwidth(cp, tp)
        ep_s = ep_bytes / bandwidth(ep, etp)
        dp_s = dp_dense / bandwidth(n_dense, tp) + dp_expert / bandwidth(n_expert, etp * ep)
        bubble = (pp - 1) / (v * m)
        if rec.granularity == "full":
            r = model.layer_forward_share * again
        elif rec.granularity == "selective":
            r = model.core_attention_share
        else:
            r = 0.0
        step = (1 + r + (tp_s + cp_s + ep_s) / c) * (1 + bubble) + dp_s / c
        return ProxyBreakdown(step, bubble, r, tp_s / c, cp_s / c, ep_s / c, dp_s / c, c,
                              int(tp_bytes), int(cp_bytes), int(ep_bytes), int(dp_dense + dp_expert))


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
    dense_params: int              # one copy of the model's non-expert parameters
    expert_params: int             # one copy of the expert parameters
    flops_per_gpu: float           # model flops per GPU per step
    layer_forward_share: float     # decoder layers' forward flops / step flops
    core_attention_share: float    # core attention's forward flops / step flops
    layer_forward: tuple[float, float]   # forward flops per token of a (dense, MoE) layer


def _proxy_model(search: _Search, config) -> _ProxyModel:
    from .memory.parameters import count, embedding_tensors, mtp_tensors
    from .memory.states import DTYPE_BYTES

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
        dense, expert = search.layer_counts(1, 1, 1, kind)
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
# Flags


def _flag_tokens(dest: str, value: Any) -> list[str]:
    from .flags import flag_table

    spec = flag_table().by_dest(dest)
    if spec.action == "store_true":
        return [spec.flag]
    if isinstance(value, (list, tuple)):
        return [spec.flag, *[str(v) for v in value]]
    return [spec.flag, str(value)]


def _input_value(raw: RawArgs, dest: str) -> Any:
    from .flags import flag_table

    return raw.value(dest) if raw.given(dest) else flag_table().default(dest)


def _normalized(dest: str, value: Any, settings: Mapping[str, Any]) -> Any:
    if dest == "expert_tensor_parallel_size" and value is None:
        return settings.get("tensor_model_parallel_size") or 1
    if dest == "recompute_modules" and isinstance(value, (list, tuple)):
        return tuple(value)
    if value is False:
        return None
    return value


def candidate_flags(raw: RawArgs, settings: Mapping[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(flags to add, flags to remove) that turn the input ``raw`` into this layout."""
    from .flags import flag_table

    table = flag_table()
    given = {d: _input_value(raw, d) for d in PLANNED_DESTS}
    given_tp = {"tensor_model_parallel_size": given["tensor_model_parallel_size"]}
    add: list[str] = []
    remove: list[str] = []
    for dest in PLANNED_DESTS:
        value = settings.get(dest)
        if dest == "recompute_modules" and settings.get("recompute_granularity") != "selective":
            continue           # only selective recompute reads the module list
        before = _normalized(dest, given[dest], given_tp)
        after = _normalized(dest, value, settings)
        if before == after:
            continue
        if after is None:
            if raw.given(dest):
                remove.append(table.by_dest(dest).flag)
            continue
        add += _flag_tokens(dest, value)
    return tuple(add), tuple(remove)


def candidate_raw(raw: RawArgs, candidate: Candidate) -> RawArgs:
    """The input's settings with this candidate's layout: what ``api.evaluate`` re-estimates."""
    settings = {d: s for d, s in raw.settings.items() if d not in PLANNED_DESTS}
    for dest, value in candidate.settings:
        if value is None or value is False:
            continue
        settings[dest] = RawSetting(dest, value, f"plan {_flag_tokens(dest, value)[0]}")
    return RawArgs(settings, raw.source)


def candidate_argv(argv: Sequence[str], candidate: Candidate) -> list[str]:
    """Megatron flags ``argv`` edited to select this candidate: the flags it removes or sets are
    taken out (with their values), then ``candidate.flags`` are appended."""
    from .flags import flag_table

    table = flag_table()
    touched = {table.by_option(f).dest for f in candidate.remove_flags}
    i = 0
    while i < len(candidate.flags):
        spec = table.by_option(candidate.flags[i])
        if spec is not None:
            touched.add(spec.dest)
        i += 1
    out: list[str] = []
    tokens = list(argv)
    i = 0
    while i < len(tokens):
        token = tokens[i]
        option = token.split("=", 1)[0] if token.startswith("--") else None
        spec = table.by_option(option) if option else None
        if spec is None or spec.dest not in touched:
            out.append(token)
            i += 1
            continue
        i += 1
        if "=" in token or not spec.takes_value:
            continue
        if spec.nargs in ("+", "*"):
            while i < len(tokens) and not tokens[i].startswith("--"):
                i += 1
        elif spec.nargs == "?":
            if i < len(tokens) and not tokens[i].startswith("--"):
                i += 1
        else:
            i += int(spec.nargs) if isinstance(spec.nargs, int) else 1
    return out + list(candidate.flags)


# -------------------------------------------------------------------------------------------
# The entry point


def plan(model: Any, *, world_size: int, global_batch_size: int, budget: int | str | None = None,
         gpu: str | None = None, extra_flags: Sequence[str] = (), top: int | None = 10,
         space: SearchSpace | None = None, proxy: ProxyAssumptions | None = None, overheads=None,
         environ: Mapping[str, str] | None = None) -> Plan:
    """Every layout of ``model`` on ``world_size`` GPUs that Megatron accepts and that fits the
    budget (bytes, a size such as ``"80GiB"``, or the capacity of ``gpu``), ranked by the
    throughput proxy; the best ``top`` (all with None) are returned as candidates, each
    re-estimated through ``api.evaluate``.  Raises InvalidInput with every problem of the input."""
    from .gpus import lookup_gpu, parse_bytes
    from .memory.overhead import Overheads

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
    budget_bytes, budget_source = None, None
    if budget is not None:
        if isinstance(budget, int) and not isinstance(budget, bool):
            budget_bytes, budget_source = budget, f"{budget} bytes"
        else:
            try:
                budget_bytes, budget_source = parse_bytes(str(budget), location="budget"), f"budget {budget}"
            except InvalidInput as err:
                problems += err.problems
    elif gpu_spec is not None:
        budget_bytes, budget_source = gpu_spec.total_memory_bytes, f"{gpu_spec.name} capacity"
    elif gpu is None:
        problems.append(Problem("missing-budget", "--budget", "the planner needs a budget: --budget SIZE or --gpu NAME"))
    if budget_bytes is not None and budget_bytes <= 0:
        problems.append(Problem("out-of-range", "--budget", f"budget {budget_bytes} bytes must be positive"))
    inp, input_problems = plan_input(model, extra_flags=extra_flags, environ=environ)
    problems += input_problems
    if problems:
        raise InvalidInput(problems)
    if overheads is None:
        overheads = Overheads(compute_capability=gpu_spec.compute_capability_value if gpu_spec else 9.0)
    env = dict(os.environ if environ is None else environ)
    env.update(inp.environment)
    space = space or SearchSpace()
    proxy = proxy or ProxyAssumptions()

    search = _Search(inp, world_size, global_batch_size, budget_bytes, overheads, env, space, proxy)
    search.run()
    if search.valid == 0:
        raise InvalidInput(_no_valid_layout(search))
    search.fits.sort(key=_Fit.sort_key)
    chosen = search.fits if top is None else search.fits[:top]
    candidates = tuple(_candidate(search, fit, environ) for fit in chosen)
    notes = []
    if search.base_problems:
        notes.append("the input fails validation with Megatron's default layout: "
                     + "; ".join(f"{p.location}: {p.message}" for p in search.base_problems))
    return Plan(
        source=inp.source, world_size=world_size, global_batch_size=global_batch_size,
        budget_bytes=budget_bytes, budget_source=budget_source, candidates=candidates,
        searched=search.searched, valid=search.valid, fitting=len(search.fits),
        seconds=time.perf_counter() - started, space=space, proxy=proxy,
        rejections=tuple(sorted(search.rejections.items(), key=lambda kv: (-kv[1], kv[0]))),
        notes=tuple(notes),
    )


def _no_valid_layout(search: _Search) -> list[Problem]:
    if search.base_problems:
        return list(search.base_problems)
    reasons = ", ".join(f"{code} ({n})" for code, n in sorted(search.rejections.items(), key=lambda kv: -kv[1])[:5])
    return [Problem("no-valid-layout", "--world-size",
                    f"none of the {search.searched} layouts searched on {search.world} GPUs passes Megatron's "
                    f"checks" + (f"; rejected by: {reasons}" if reasons else ""))]


def _candidate(search: _Search, fit: _Fit, environ) -> Candidate:
    """The Candidate of a fitting layout, its figures from ``api.evaluate`` on its settings."""
    from .derive import derive_namespace

    layout = fit.layout
    settings = layout.settings(search.moe)
    settings.update({"micro_batch_size": fit.micro_batch_size, "global_batch_size": search.gbs,
                     "use_distributed_optimizer": fit.distributed_optimizer,
                     "sequence_parallel": fit.sequence_parallel,
                     "recompute_activations": False, "distribute_saved_activations": False})
    settings.update(fit.recompute.settings())
    if fit.recompute.granularity != "selective":
        settings["recompute_modules"] = None
    ns = dict(search.namespace)
    ns.update(settings)
    derived, _ = derive_namespace(ns, search.world)
    memory = _LayoutMemory(search, layout, derived, search.stage_layout(layout, derived))
    proxy = memory.proxy(fit.micro_batch_size, fit.num_microbatches, fit.recompute, fit.sequence_parallel,
                         fit.distributed_optimizer)
    flags, remove = candidate_flags(search.inp.raw, settings)
    candidate = Candidate(
        parallel=memory.dims, pipeline=layout.pipeline, micro_batch_size=fit.micro_batch_size,
        num_microbatches=fit.num_microbatches, sequence_parallel=fit.sequence_parallel, recompute=fit.recompute,
        distributed_optimizer=fit.distributed_optimizer, peak_stage=fit.peak_rank, device_peak_bytes=fit.device,
        allocated_peak_bytes=fit.allocated, headroom_bytes=search.budget - fit.device, proxy=proxy,
        settings=tuple((d, settings.get(d)) for d in PLANNED_DESTS), flags=flags, remove_flags=remove)
    # The reported figures are the estimator's, through its normal path.
    raw = candidate_raw(search.inp.raw, candidate)
    verdict = evaluate(TrainingInput(raw, source=search.inp.source, environment=search.inp.environment),
                       world_size=search.world, world_size_source="--world-size", budget=search.budget,
                       budget_source="plan", overheads=search.overheads, environ=search.env)
    if verdict.estimate is None:
        raise RuntimeError(f"planner: layout {' '.join(flags)} passed the rules but the estimator rejects it: "
                           + "; ".join(f"{p.location}: {p.message}" for p in verdict.problems))
    peak = verdict.estimate.peak_stage
    if (peak.device_peak_bytes, peak.allocated_peak_bytes, peak.pipeline_rank) != (fit.device, fit.allocated, fit.peak_rank):
        raise RuntimeError(f"planner: the fast estimate of {' '.join(flags)} ({fit.device} bytes on stage "
                           f"{fit.peak_rank}) differs from the estimator's ({peak.device_peak_bytes} bytes on "
                           f"stage {peak.pipeline_rank})")
    return replace(candidate, estimate=verdict.estimate)
