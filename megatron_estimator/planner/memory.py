"""The memory of a layout: ``model/stage.py``'s stage function, cached by what each part reads.

"Fits" means the device peak of the peak stage (``StageEstimate.device_peak_bytes``:
allocated memory plus CUDA context, NCCL buffers and fragmentation) is at most the budget.
The numbers are ``estimate``'s own: ``LayoutMemory`` adds the public parts of
``model/stage.py`` ``estimate_stage`` (``stage_states``, ``stage_terms`` with ``shared_terms``,
``held_activations``, ``deferred_wgrad_bytes``, ``fixed_device_bytes``, ``device_bytes``),
each memoised on what it reads:

- activations (``LayoutActivations``): per (tp, cp, etp, micro batch, sequence parallel,
  selective recompute modules), a chunk's ``chunk_activation_bytes`` as a cached form: each
  layer's bytes by layer kind (dense or MoE, ``activations.layer_activations`` reads the
  layer only through its kind) and the chunk's ``recompute_groups`` counted by kind; then
  ``stage_terms`` of each stage structure on those chunks; shared by every ep, optimizer and
  split;
- model states: bounded first, from model/states.py ``model_states`` on padding-free probe
  tensors (per-element rates of the cheapest and the costliest tensor kind) plus the most
  padding the distributed optimizer can add.  A layout whose lower bound is over budget is
  rejected, one whose upper bound fits is accepted; only layouts in between (a few megabytes
  wide) and the reported ones get the exact ``stage_states``, which are checked against the
  bounds.

Facts of the stage function and the schedule the caches rest on, exact and tested against
``model/stage.py`` and ``model/layout.py`` by brute force:

- ``stage_terms`` reads the chunks' activations only through their kept bytes (the schedule's
  weights) and the largest recompute peak (a transient), and the stage only through its
  first / last flags and the kinds of its layers: the rest of its terms (``unscheduled``) is
  cached on those (``LayoutActivations.stage``);
- within a group of stages of the same structure the lowest rank has the most microbatches
  alive at every step (its warm-up is longest), so it alone can be the group's peak
  (``StageGroup``);
- the interleaved schedule's fullest moment is the first of its live counts
  (``layout.live_states``, which do not depend on the chunk weights) with the largest
  weighted sum, above zero: the same moment for weights scaled by a positive factor, so it
  is cached per schedule and weights divided by their greatest common divisor; with every
  weight above zero only the steady state's counts can be it (``layout.steady_live_states``:
  each warm-up count is below a later one, chunk by chunk).

A layout fits when every stage group's model states plus its other bytes stay within the
allocated bytes whose device peak is the budget (``LayoutMemory.limits``: the device peak
grows with the allocated bytes); the groups are checked one at a time and a group's bytes
are computed only when the groups before it fit (``StageParts``), so a layout that does not
fit costs only the groups up to the first that is over.
"""

from __future__ import annotations

import math
import operator

from dataclasses import dataclass, replace
from typing import Mapping

from megatron_estimator.config.parallel import ParallelDims
from megatron_estimator.model import activations as act
from megatron_estimator.model import stage as stage_model
from megatron_estimator.model.distillation import teacher_weight_bytes
from megatron_estimator.model.layout import ModelChunk, StageLayout, live_states
from megatron_estimator.config.typed import with_distributed_optimizer
from megatron_estimator.model.states import DTYPE_BYTES
from megatron_estimator.planner.space import LayoutChoice
from megatron_estimator.planner.validity import expert_overlay
from megatron_estimator.results.plan import NO_RECOMPUTE, Recompute


@dataclass(frozen=True, eq=False)
class StageGroup:
    """The stages of one structure in a pipeline split, represented by the lowest rank of
    them (the one with the most microbatches alive: the group's peak).  The ids are the
    search's interned structures (layer kinds, embedding, loss, output weight, MTP), so
    caches key on small ints."""
    stage_id: int
    chunk_ids: tuple[int, ...]      # one per model chunk of the stage
    stage: StageLayout              # the group's lowest rank
    rank: int                       # its pipeline rank
    runs_loss: bool                 # the stage computes the loss (its post_process)
    reads: int                      # what stage_terms reads of the stage (first, last, its layers' kinds), interned


class LayoutFamily:
    """What a pipeline split fixes: the stages (``layout.pipeline_stages``), the groups of
    stages of one structure (``groups``) and the schedule's settings."""

    def __init__(self, search: "_Search", stages: tuple[StageLayout, ...], derived: Mapping):
        pattern = search.pattern
        self.stages = stages
        self.vpp = derived.get("virtual_pipeline_model_parallel_size")
        self.group_size = derived["microbatch_group_size_per_vp_stage"]
        self.combined_1f1b = bool(derived.get("overlap_moe_expert_parallel_comm"))
        self.max_chunk_layers = max((len(c.layers) for s in stages for c in s.chunks), default=0)
        seen: set[int] = set()
        groups = []
        # A chunk's structure by what decides its layers' tensors (a 'D' layer without an
        # indexer differs from one with: _Search.parameter_kinds), a stage's reads by kind.
        tensor_kinds = search.parameter_kinds()
        for stage in stages:
            chunk_ids = tuple(search.intern(("chunk", tuple(tensor_kinds[i] for i in c.layers), c.pre_process,
                                             c.post_process, c.mtp_layers)) for c in stage.chunks)
            stage_id = search.intern(("stage", chunk_ids, tuple((c.embedding, c.output_weight) for c in stage.chunks)))
            if stage_id in seen:
                continue                        # a higher rank of the same structure: never the peak
            seen.add(stage_id)
            kinds = tuple(sorted({pattern[i] for i in stage.layers}))
            groups.append(StageGroup(stage_id, chunk_ids, stage, stage.pp_rank, stage.post_process,
                                     search.intern(("reads", stage.pre_process, stage.post_process, kinds))))
        self.groups: tuple[StageGroup, ...] = tuple(groups)
        self.parts: dict[tuple, StageParts] = {}         # LayoutMemory.parts, shared by the family
        self.bounds: dict[tuple, list] = {}              # LayoutMemory._bounds, shared by the family
        self.recomputed: dict[int, float] = {}           # LayoutCost.recomputed_fraction by recompute id
        self.fullest: dict[tuple[int, int], dict] = {}   # (group, M) -> _Search.fullest_table


class LayoutActivations:
    """``stage_terms`` of every stage structure under one (tp, cp, etp, micro batch, sequence
    parallel, selective recompute modules) choice, on a configuration with it.  A layer's bytes
    depend on the layer only through its kind (dense or MoE; a hybrid layer's symbol: Mamba,
    attention, MLP, MoE; ``_Search.kinds``) and on recompute only through the
    selective modules; full recompute changes which layers are kept whole
    (``_Search.recompute_grouping``), so its variants share this record."""

    def __init__(self, search: "_Search", cfg):
        self.search, self.cfg = search, cfg
        self._layers: dict = {}
        self._chunks: dict[tuple, stage_model.ChunkActivations] = {}
        # recompute id -> (chunk id -> kept bytes, chunk id -> recompute peak), for ``stage``
        self._by_recompute: dict[int, tuple[dict[int, int], dict[int, int]]] = {}
        self._stages: dict[tuple, tuple[tuple[int, ...], int]] = {}
        self._unscheduled: dict[tuple, int] = {}
        self._deferred: dict[int, int] = {}
        self.layer_input = act.layer_input_bytes(cfg)
        self.embedding = act.embedding_activations(cfg)
        self.loss_kept = act.loss_activations(cfg)[0]
        self._mtp: int | None = None
        self._kinds: tuple[int, ...] | None = None
        self.shared = stage_model.shared_terms(cfg, search.overheads, search.env)

    def layer(self, index: int) -> int:
        """model/activations.py ``layer_activations`` total: it depends on the layer's kind only."""
        kind = self.search.pattern[index]
        value = self._layers.get(kind)
        if value is None:
            # the busiest expert rank's routed tokens, as estimate_stage counts them
            imbalance = self.search.overheads.routing_imbalance
            value = self._layers[kind] = act.layer_activations(self.cfg, index, imbalance).total
        return value

    def chunk(self, chunk_id: int, chunk: ModelChunk, rec: Recompute, rid: int | None = None
              ) -> stage_model.ChunkActivations:
        """model/stage.py ``chunk_activation_bytes``, from the chunk's recompute groups counted
        by layer kind (its cached form: the brute-force tests hold it equal)."""
        if rid is None:
            rid = self.search.recompute_id(rec)
        key = (chunk_id, rid)
        value = self._chunks.get(key)
        if value is None:
            whole, groups = self.search.recompute_grouping(self.cfg, rec, chunk_id, chunk, rid)
            per_kind = self._kinds or self.kind_bytes()
            kept = sum(map(operator.mul, whole, per_kind)) + groups[0] * self.layer_input
            offloaded = self.cfg.training.cpu_offloading_num_layers
            if offloaded:
                # --cpu-offloading-num-layers: the chunk's first layers live on the host
                # (validation excludes recompute with it, so they are all whole layers).
                kept -= sum(self.layer(i) for i in chunk.layers[:offloaded])
            recompute_peak = max((sum(map(operator.mul, counts, per_kind)) for counts in groups[1]), default=0)
            if chunk.pre_process:
                kept += self.embedding
            if chunk.post_process:
                kept += self.loss_kept
            if chunk.mtp_layers:
                if self._mtp is None:
                    self._mtp = act.mtp_layer_activations(self.cfg)
                kept += chunk.mtp_layers * self._mtp
            value = self._chunks[key] = stage_model.ChunkActivations(kept, recompute_peak)
        return value

    def kind_bytes(self) -> tuple[int, ...]:
        """Bytes one layer of each kind keeps (``_Search.kinds`` order)."""
        if self._kinds is None:
            pattern = self.search.pattern
            self._kinds = tuple(self.layer(pattern.index(kind)) for kind in self.search.kinds)
        return self._kinds

    def stage(self, group: StageGroup, rec: Recompute, rid: int | None = None) -> tuple[tuple[int, ...], int]:
        """model/stage.py ``stage_terms`` of the group's stage under this recompute choice, as
        the schedule uses it: (``chunk_weights``, ``unscheduled``).  ``unscheduled`` is
        ``stage_terms`` of the stage with one chunk of no kept bytes and the chunks' largest
        recompute peak: it reads the chunks through nothing else (the module docstring).
        ``rid``: ``_Search.recompute_id`` of ``rec`` (the caches' key)."""
        if rid is None:
            rid = self.search.recompute_id(rec)
        key = (group.stage_id, rid)
        parts = self._stages.get(key)
        if parts is None:
            kept_of, peak_of = self._by_recompute.get(rid) or self._by_recompute.setdefault(rid, ({}, {}))
            try:
                kept = tuple(map(kept_of.__getitem__, group.chunk_ids))
            except KeyError:
                for cid, chunk in zip(group.chunk_ids, group.stage.chunks):
                    if cid not in kept_of:
                        kept_of[cid], peak_of[cid] = self.chunk(cid, chunk, rec, rid)
                kept = tuple(map(kept_of.__getitem__, group.chunk_ids))
            peak = max(map(peak_of.__getitem__, group.chunk_ids), default=0)
            reads = (group.reads, peak)
            unscheduled = self._unscheduled.get(reads)
            if unscheduled is None:
                search = self.search
                unscheduled = self._unscheduled[reads] = stage_model.stage_terms(
                    self.cfg, group.stage, search.overheads, search.env, (stage_model.ChunkActivations(0, peak),),
                    self.shared).unscheduled
            parts = self._stages[key] = (kept, unscheduled)
        return parts

    def deferred(self, m: int) -> int:
        """model/stage.py ``deferred_wgrad_bytes`` with M microbatches (on the loss stage)."""
        if not self.cfg.training.defer_embedding_wgrad_compute:
            return 0
        value = self._deferred.get(m)
        if value is None:
            value = self._deferred[m] = stage_model.deferred_wgrad_bytes(
                replace(self.cfg, training=replace(self.cfg.training, num_microbatches=m)))
        return value


@dataclass(frozen=True)
class StateRates:
    """Model-state bytes per element, the cheapest and the costliest tensor kind."""
    dense_low: float
    dense_high: float
    expert_low: float
    expert_high: float


def census(tensors) -> tuple[int, int, int, int]:
    """(dense elements, expert elements, dense tensors, expert tensors) of a tensor list."""
    dense = [t for t in tensors if not t.expert]
    expert = [t for t in tensors if t.expert]
    return (sum(t.numel * t.count for t in dense), sum(t.numel * t.count for t in expert),
            sum(t.count for t in dense), sum(t.count for t in expert))


class LayoutMemory:
    """The per-stage memory of one layout: ``estimate_stage``'s parts, cached by what each
    depends on (see the module docstring)."""
    __slots__ = ("search", "layout", "family", "_derived", "_config", "dims", "fixed", "fragmentation", "_exceed",
                 "_lower", "_upper", "_states", "_limits")                                       # one per layout searched

    def __init__(self, search: "_Search", layout: LayoutChoice, family: LayoutFamily, derived: Mapping):
        self.search, self.layout, self.family = search, layout, family
        self._derived, self._config = derived, None
        self.dims, self.fixed = search.dims_and_fixed(layout.tp, layout.pp, layout.cp, layout.ep, layout.etp, family.vpp)
        self.fragmentation = search.overheads.fragmentation
        self._exceed: dict[bool, bool] = {}
        self._lower: dict[bool, list[int]] = {}             # lower_bounds by optimizer choice
        self._upper: dict[bool, list[int | None]] = {}      # upper_bounds by optimizer choice
        self._states: dict[bool, list[stage_model.StageStates]] = {}
        self._limits: dict[bool, tuple] = {}

    @property
    def config(self):
        """This layout's EstimatorConfig (config.build_config on its derived namespace)."""
        if self._config is None:
            from megatron_estimator.config.typed import build_config

            ns = dict(self._derived)
            ns.update(expert_overlay(self.layout.ep, self.layout.etp))
            self._config = build_config(ns, self.search.vocabulary(self.layout.tp), "plan", self.search.env,
                                        run=self.search.run_context, family=self.search.family_name)
            files = self.search.kd_files()
            if files is not None:      # distillation: the teacher for this layout (config/distillation.py)
                from megatron_estimator.config.distillation import attach_distillation

                self._config = attach_distillation(self._config, ns, self.search.vocabulary(self.layout.tp),
                                                   self.search.env, self.search.family_name, files)
        return self._config

    def states_exceed(self, do: bool) -> bool:
        """Whether the lower bound of the model states alone puts a stage over the budget."""
        exceed = self._exceed.get(do)
        if exceed is None:
            most = self.search.allocated_limit(self.fixed, self.fragmentation)
            # The bounds are never negative: a budget the fixed device bytes (CUDA context,
            # NCCL buffers) already exceed needs none of them.
            exceed = self._exceed[do] = most < 0 or max(self._lower.get(do) or self.lower_bounds(do)) > most
        return exceed

    def lower_bounds(self, do: bool) -> list[int]:
        """A lower bound of each stage group's model states (weights, gradients, optimizer states)."""
        return self._lower.get(do) or self._bounds(do, 0)

    def upper_bounds(self, do: bool) -> list[int | None]:
        """An upper bound of each stage group's model states and FSDP transient (None: unbounded)."""
        return self._upper.get(do) or self._bounds(do, 1)

    def _bounds(self, do: bool, which: int) -> list:
        mine = self._upper if which else self._lower
        out = mine.get(do)
        if out is None:
            # The states read tp, pp, ep, etp and the stage, not cp: the family's layouts of
            # every cp share the lists.
            search, lay = self.search, self.layout
            family_key = (lay.tp, lay.ep, lay.etp, do)
            both = self.family.bounds.get(family_key)
            if both is None:
                lower, upper = [], []
                cache, rates = search.bounds_cache, None
                for group in self.family.groups:
                    key = (lay.tp, lay.pp, lay.ep, lay.etp, do, group.stage_id)
                    value = cache.get(key)
                    if value is None:
                        rates = rates or search.state_rates(self.dims, do)
                        value = cache[key] = self._states_bounds(do, group, rates)
                    lower.append(value[0])
                    upper.append(value[1])
                both = self.family.bounds[family_key] = (lower, upper)
            self._lower[do], self._upper[do] = both
            out = both[which]
        return out

    def _states_bounds(self, do: bool, group: StageGroup, rates: StateRates | None = None
                       ) -> tuple[int, int | None]:
        """A lower and an upper bound of the stage's model states (weights, gradients,
        optimizer states; None: not bounded above).

        model/states.py ``model_states`` is linear in the elements of each tensor kind, up to
        buffer padding and integer truncation: a stage's states lie between its elements times
        the cheapest kind's rate and its elements times the costliest kind's rate plus the most
        padding the distributed optimizer adds (each tensor starts on a 64-element boundary,
        each bucket ends on a multiple of lcm(shard, 128)).  Megatron-FSDP's transient is not
        bounded above.  ``_Search.state_rates`` measures the rates on padding-free probes."""
        search = self.search
        lay, dims = self.layout, self.dims
        stage = group.stage
        ref = search.reference
        rates = rates or search.state_rates(dims, do)
        dense, expert, dense_tensors, dense_chunks, expert_tensors, expert_chunks = search.stage_census(
            lay.tp, lay.ep, lay.etp, group)
        truncation = 4 * 2 * len(stage.chunks)                    # int() per buffer group and term
        lower = int(dense * rates.dense_low + expert * rates.expert_low) - truncation
        if ref.optimizer.use_megatron_fsdp:
            return lower, None
        # Per chunk with n tensors of a kind: n x 64 + (n + 3) x lcm(shard, 128), summed.
        dense_divisor, expert_divisor = math.lcm(dims.dp * dims.cp, 128), math.lcm(dims.edp, 128)
        padding = (dense_tensors * 64 + (dense_tensors + 3 * dense_chunks) * dense_divisor
                   + expert_tensors * 64 + (expert_tensors + 3 * expert_chunks) * expert_divisor)
        dense += 2 * ref.model.hidden_size                         # the largest final norm a stage holds
        bound = dense * rates.dense_high + expert * rates.expert_high + truncation
        if do:
            bound += padding * (DTYPE_BYTES[ref.precision.params_dtype] + DTYPE_BYTES[ref.precision.main_grads_dtype])
        return lower, int(bound) + 1

    def states(self, do: bool) -> list[stage_model.StageStates]:
        """model/stage.py ``stage_states`` of each stage group."""
        out = self._states.get(do)
        if out is None:
            search, lay = self.search, self.layout
            config = None
            out = []
            for group in self.family.groups:
                # dp x cp = world / (tp pp) and edp do not depend on cp: neither do the states.
                key = (lay.tp, lay.pp, lay.ep, lay.etp, do, group.stage_id)
                value = search.states_cache.get(key)
                if value is None:
                    if config is None:
                        config = self.config
                        config = with_distributed_optimizer(config, do)
                    value = search.states_cache[key] = stage_model.stage_states(
                        config, [search.tensors(config, lay, cid, chunk)
                                 for cid, chunk in zip(group.chunk_ids, group.stage.chunks)])
                    lower, upper = self.lower_bounds(do)[len(out)], self.upper_bounds(do)[len(out)]
                    total = value.allocated
                    if total < lower or (upper is not None and total > upper):
                        raise RuntimeError(
                            f"planner: the model states of stage {group.rank} ({total} bytes) fall outside the "
                            f"planner's bounds [{lower}, {upper}]: model/states.py changed; update "
                            "LayoutMemory._states_bounds")
                out.append(value)
            self._states[do] = out
        return out

    def activations(self, mbs: int, rec: Recompute, sp: bool) -> LayoutActivations:
        """The activation terms of this choice; they read tp, cp, etp, the training settings and
        the selective recompute modules, not pp, ep, the split or the optimizer."""
        lay = self.layout
        layered = rec if rec.granularity == "selective" else NO_RECOMPUTE
        key = (lay.tp, lay.cp, lay.etp, mbs, self.search.recompute_id(layered), sp)
        acts = self.search.activations_cache.get(key)
        if acts is None:
            base = self.config
            modules = layered.modules if layered.modules is not None else tuple(self._derived.get("recompute_modules") or ())
            cfg = replace(base, parallel=ParallelDims(self.search.world, lay.tp, 1, lay.cp, 1, lay.etp),
                          training=replace(base.training, micro_batch_size=mbs, sequence_parallel=sp,
                                           recompute_granularity=layered.granularity, recompute_method=None,
                                           recompute_num_layers=None, recompute_modules=modules,
                                           distribute_saved_activations=False))
            acts = self.search.activations_cache[key] = LayoutActivations(self.search, cfg)
        return acts

    def parts(self, mbs: int, m: int, r: int, rec: Recompute, sp: bool) -> "StageParts":
        """Each stage group's bytes besides its model states (``StageParts``).  They depend on
        tp, cp, etp and the inner choices, not on ep or the optimizer: shared by the layouts of
        a family."""
        lay = self.layout
        key = (lay.tp, lay.cp, lay.etp, mbs, r, sp)          # r: the family's recompute choice index
        row = self.family.parts.get(key)
        if row is None:
            row = self.family.parts[key] = StageParts(self, mbs, m, rec, sp)
        return row

    def limits(self, do: bool) -> tuple[list[int], list[int], list[int | None]]:
        """(the lower bound of each group's states, the most bytes besides them that keep the
        group within the budget with that bound, the same with the upper bound (None:
        unbounded)).  ``stage.device_bytes`` grows with the allocated bytes, so a stage fits
        exactly when its allocated bytes are at most ``_Search.allocated_limit``."""
        found = self._limits.get(do)
        if found is None:
            most = self.search.allocated_limit(self.fixed, self.fragmentation)
            lower = self._lower.get(do) or self.lower_bounds(do)
            upper = self._upper.get(do) or self.upper_bounds(do)
            found = self._limits[do] = (lower, [most - low for low in lower],
                                        [None if high is None else most - high for high in upper])
        return found

    def assess(self, do: bool, mbs: int, m: int, r: int, rec: Recompute, sp: bool) -> int | None:
        """None when a stage is over budget, else the peak device bytes (exact, or a lower bound
        within the few megabytes of padding when the upper bound of the states fits anyway).
        The groups are checked in order, each group's bytes computed only once those before it
        fit."""
        found = self.assess_all(do, mbs, m, ((r, rec, sp),))
        return found[0][3] if found else None

    def assess_all(self, do: bool, mbs: int, m: int, choices) -> list[tuple[int, Recompute, bool, int]]:
        """``assess`` of each (r, recompute, sequence parallel) of ``choices`` with this
        optimizer and micro batch: (r, recompute, sequence parallel, device bytes) of those
        that fit, in order."""
        lay = self.layout
        tp, cp, etp = lay.tp, lay.cp, lay.etp
        rows = self.family.parts
        lower, low_room, high_room = self._limits.get(do) or self.limits(do)
        fixed, fragmentation = self.fixed, self.fragmentation
        fits = []
        bounded = None not in high_room
        for r, rec, sp in choices:
            row = rows.get((tp, cp, etp, mbs, r, sp)) or self.parts(mbs, m, r, rec, sp)
            values = row.values
            if row.complete:
                # Every group's bytes known: the same checks, each over all groups at once.
                if any(map(operator.gt, values, low_room)):
                    continue
                if bounded and not any(map(operator.gt, values, high_room)):
                    worst = max(map(operator.add, lower, values))
                    device = worst + fixed + int(worst * fragmentation)     # stage.device_bytes, inline
                    fits.append((r, rec, sp, device if device > 0 else 0))
                    continue
                peak = self._exact(do, values)[0]
                if peak <= self.search.budget:
                    fits.append((r, rec, sp, peak))
                continue
            worst = None
            for g, room in enumerate(low_room):
                part = values[g]
                if part is None:
                    part = row.compute(g)
                if part > room:
                    break
                low = lower[g] + part
                if worst is None or low > worst:
                    worst = low
            else:
                for g, room in enumerate(high_room):
                    if room is None or values[g] > room:
                        peak = self._exact(do, values)[0]
                        if peak <= self.search.budget:
                            fits.append((r, rec, sp, peak))
                        break
                else:
                    device = worst + fixed + int(worst * fragmentation)     # stage.device_bytes, inline
                    fits.append((r, rec, sp, device if device > 0 else 0))
        return fits

    def exact_peak(self, do: bool, mbs: int, m: int, rec: Recompute, sp: bool) -> tuple[int, int, int]:
        """(device peak, allocated peak, rank) of the peak stage, with exact model states."""
        return self._exact(do, StageParts(self, mbs, m, rec, sp).all())

    def _exact(self, do: bool, parts: list[int]) -> tuple[int, int, int]:
        fixed, fragmentation = self.fixed, self.fragmentation
        best = None
        for group, states, part in zip(self.family.groups, self.states(do), parts):
            allocated = states.allocated + part
            device = stage_model.device_bytes(allocated, fixed, fragmentation)
            rank = group.rank
            if best is None or device > best[0] or (device == best[0] and rank < best[2]):
                best = (device, allocated, rank)
        return best


class StageParts:
    """Each stage group's bytes besides its model states under one inner choice: the
    activations alive at the schedule's fullest moment, transients, workspaces, batch and
    buffers (model/stage.py ``estimate_stage``), computed one group at a time on demand
    (``values``: None until computed)."""
    __slots__ = ("memory", "acts", "m", "rec", "rid", "values", "complete", "_missing")

    def __init__(self, memory: LayoutMemory, mbs: int, m: int, rec: Recompute, sp: bool):
        self.memory, self.m, self.rec = memory, m, rec
        self.rid = memory.search.recompute_id(rec)
        self.acts = memory.activations(mbs, rec, sp)
        self.values: list[int | None] = [None] * len(memory.family.groups)
        self.complete = False                       # every value computed
        self._missing = len(self.values)

    def all(self) -> list[int]:
        for g, value in enumerate(self.values):
            if value is None:
                self.compute(g)
        return self.values

    def compute(self, g: int) -> int:
        memory, acts, rid = self.memory, self.acts, self.rid
        family = memory.family
        group = family.groups[g]
        kept, other = acts._stages.get((group.stage_id, rid)) or acts.stage(group, self.rec, rid)
        if group.runs_loss:
            other += acts.deferred(self.m)
        if memory.config.distillation is not None:
            other += teacher_weight_bytes(memory.config, group.stage)    # model/stage.py estimate_stage
        pp = memory.layout.pp
        if pp == 1:
            live = sum(kept)                              # layout.microbatches_in_flight: one at a time
        elif family.vpp is None:
            m = self.m
            live = (pp - group.rank if pp - group.rank < m else m) * kept[0]   # 1F1B: min(p - r, M) microbatches
        else:
            # The fullest moment: the first live count with the largest weighted sum, so the
            # activations held then are the largest sum (none: nothing held).
            m, vpp, rank = self.m, family.vpp, group.rank
            table = family.fullest.get((g, m))
            if table is None:
                table = family.fullest[(g, m)] = memory.search.fullest_table(
                    pp, rank, vpp, m, family.group_size, family.combined_1f1b)
            live = memory.search.fullest_held(pp, rank, vpp, m, family.group_size, family.combined_1f1b, kept, table)
        value = self.values[g] = other + live
        self._missing -= 1
        self.complete = not self._missing
        return value
