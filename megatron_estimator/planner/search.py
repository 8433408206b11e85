"""The search: every parallel layout Megatron accepts for a model on N GPUs, the ones that
fit the budget, best first.

Input: a model read into a ``TrainingInput`` (``api.plan_input``), the world size, the global
batch size and a budget.  ``search`` enumerates the space (``planner.space``), keeps the
layouts the rules accept (``planner.validity``), evaluates each with ``model/stage.py``'s
stage function cached (``planner.memory``), ranks those that fit by the throughput proxy
(``planner.cost``) and turns the best into candidates (``planner.candidates``), each checked
against the normal path when a verifier is given (``api.plan`` gives ``api.evaluate``).
The result is a ``results.plan.Plan``.
"""

from __future__ import annotations

import math
import operator
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator, Mapping, TYPE_CHECKING
if TYPE_CHECKING:
    from megatron_estimator.planner.candidates import Verifier

from megatron_estimator.config.parallel import ParallelDims
from megatron_estimator.core.problems import InvalidInput, Problem
from megatron_estimator.inputs.rawargs import RawArgs, RawSetting
from megatron_estimator.model import stage as stage_model
from megatron_estimator.model.parameters import ParamTensor
from megatron_estimator.config.derive import shards_optimizer_states
from megatron_estimator.config.run_context import Resume, RunContext
from megatron_estimator.config.typed import with_distributed_optimizer
from megatron_estimator.model.states import model_states
from megatron_estimator.planner.cost import LayoutCost, ProxyModel, proxy_model
from megatron_estimator.planner.memory import LayoutActivations, LayoutFamily, LayoutMemory, StateRates, census
from megatron_estimator.planner.space import (
    PLANNED_DESTS, LayoutChoice, batch_choices, expert_choices, extra_dests, family_settings, layout_families,
    recompute_choices, sequence_parallel_choices, user_pipeline_choice)
from megatron_estimator.planner.validity import (
    BATCH, EXPERT, RECOMPUTE, SP, accepted_pairs, derive_batches, family_verdicts, layout_rules, validate_model)
from megatron_estimator.results.plan import (
    Plan, PipelineChoice, ProxyAssumptions, Recompute, SearchProgress, SearchSpace)

if TYPE_CHECKING:
    ProgressCallback = Callable[[SearchProgress], None]

# A search that runs longer than this reports where it stands, and again after each interval.
PROGRESS_AFTER_SECONDS = 1.0
PROGRESS_EVERY_SECONDS = 1.0


class _Progress:
    """Calls ``callback`` once the clock has passed ``PROGRESS_AFTER_SECONDS`` since the start,
    then at most once per ``PROGRESS_EVERY_SECONDS``; never for a search that ends sooner."""

    def __init__(self, callback: ProgressCallback, clock: Callable[[], float], started: float):
        self.callback, self.clock, self.started = callback, clock, started
        self.due = started + PROGRESS_AFTER_SECONDS

    def __call__(self, searched: int, fitting: int, started_families: int, families: int) -> None:
        now = self.clock()
        if now < self.due:
            return
        self.due = now + PROGRESS_EVERY_SECONDS
        self.callback(SearchProgress(searched, fitting, started_families, families, now - self.started))


@dataclass
class _Fit:
    """A layout that fits, before it becomes a Candidate."""
    step: float
    device: int                 # the peak device bytes, or a lower bound within the padding (see assess)
    memory: LayoutMemory
    cost: LayoutCost
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

    def __init__(self, inp, world: int, gbs: int, budget: int, budget_source: str, overheads,
                 environ, space: SearchSpace, proxy: ProxyAssumptions):
        from megatron_estimator.megatron.flags import flag_table
        # The release the input was read against (TrainingInput.release, a ChosenRelease): its
        # flags and rules.
        self.megatron = inp.release
        self.inp, self.world, self.gbs, self.budget, self.budget_source = inp, world, gbs, budget, budget_source
        # Layouts are planned for a fresh start: a resumed run's checkpoint exchange buffers
        # (model/checkpoint.py) depend on the checkpoint on disk, not on the layout searched.
        overheads = replace(overheads, resume="no")
        self.overheads, self.env, self.space, self.proxy_assumptions = overheads, environ, space, proxy
        job_environment = bool(getattr(inp, "job_environment", False))
        self.rules, self.ignored_codes = layout_rules(job_environment)
        self.compute_capability = overheads.compute_capability if getattr(overheads, "gpu_known", False) else None
        # What the rules and the kernel choice know of the run (resolve.resolve_config's ``run``).
        self.run_context = RunContext(gpu_compute_capability=self.compute_capability, flash_attn=overheads.flash_attn,
                                      resume=Resume("no"), job_environment=job_environment,
                                      release=self.megatron)

        # The model without a layout: the user's settings minus what the planner chooses (the
        # recompute modules stay: selective layouts set their own, the others do not read them).
        settings = {d: s for d, s in inp.raw.settings.items() if d not in PLANNED_DESTS or d == "recompute_modules"}
        settings["global_batch_size"] = RawSetting("global_batch_size", gbs, "--global-batch-size")
        settings["micro_batch_size"] = RawSetting("micro_batch_size", min(space.micro_batch_sizes), "--micro-batch-size")
        self.raw = RawArgs(settings, inp.raw.source)
        self.namespace = dict(flag_table(self.megatron.version).defaults())
        self.namespace.update({d: s.value for d, s in self.raw.settings.items()})
        # The model family (a hybrid Mamba model is laid out by its pattern: planner/hybrid.py)
        # and what validate_args derives from a hybrid layer pattern, as resolve_config does.
        from megatron_estimator.config.hybrid import normalize_namespace
        from megatron_estimator.inputs.entry_script import model_family

        model = model_family(inp.raw, getattr(inp, "entry", None))
        self.family_name = model.name
        normalize_namespace(self.namespace)
        self.moe = bool(self.namespace.get("num_experts"))
        self.reference, self.base_problems = validate_model(
            inp.raw, self.raw, self.namespace, environ, compute_capability=self.compute_capability,
            flash_attn=overheads.flash_attn, job_environment=job_environment, family=model, release=self.megatron)
        self.user_pipeline = user_pipeline_choice(inp.raw)
        self._proxy_model: ProxyModel | None = None
        # Per decoder layer its kind (layer_kinds), and the distinct kinds in order.
        self.pattern: tuple | None = None
        self.kinds: tuple = ()

        # caches shared by all layouts
        self._vocab: dict[int, Any] = {}
        self._families: dict[tuple, LayoutFamily] = {}
        self._layer_counts: dict[tuple, tuple[int, int]] = {}
        self._parameter_kinds: tuple | None = None
        self.bounds_cache: dict[tuple, int] = {}
        self.states_cache: dict[tuple, stage_model.StageStates] = {}
        self.activations_cache: dict[tuple, LayoutActivations] = {}
        self._tensors: dict[tuple, list] = {}
        self._fullest: dict[tuple, dict[tuple[int, ...], tuple[int, ...] | None]] = {}
        self._allocated_limits: dict[tuple, int] = {}
        self._groupings: dict[tuple, tuple] = {}
        self._rates: dict[tuple, StateRates] = {}
        self._interned: dict[tuple, int] = {}
        self._recompute_ids: dict[Recompute, int] = {}
        self._dims: dict[tuple, tuple[ParallelDims, int]] = {}

        self.searched = self.valid = 0
        self.rejections: dict[str, int] = {}
        # Each fitting layout as the fields of a _Fit, in their order (a _Fit is built only for
        # those the ranking or a caller looks at: ``fits``).
        self.found: list[tuple] = []
        self._fits: list[_Fit] | None = None
        self.progress: _Progress | None = None

    @property
    def fits(self) -> list["_Fit"]:
        """Every layout that fits, as found."""
        if self._fits is None or len(self._fits) != len(self.found):
            self._fits = [_Fit(*found) for found in self.found]
        return self._fits

    def release(self) -> None:
        """Drop every cache and fit of the run.  The caches hold reference cycles (a layout's
        memory and its family's stage parts, the activations and the search): emptied here,
        reference counting frees them at once, without the cyclic collector."""
        for family in self._families.values():
            family.__dict__.clear()
        self.__dict__.clear()

    # -- the space -----------------------------------------------------------------------------

    def families(self) -> Iterator[tuple[int, int, int, PipelineChoice]]:
        """(tp, cp, pp, split) of every layout family."""
        if self.family_name == "hybrid":
            from megatron_estimator.planner.hybrid import hybrid_pipeline_choices

            return layout_families(self.namespace, self.world, self.space, self.user_pipeline,
                                   hybrid_pipeline_choices(self.namespace, self.megatron.version))
        return layout_families(self.namespace, self.world, self.space, self.user_pipeline)

    def expert_choices(self, tp: int) -> list[tuple[int, int]]:
        return expert_choices(self.namespace, self.world, tp)

    def batch_choices(self) -> list[tuple[bool, int]]:
        """(distributed optimizer, micro batch size) pairs, in loop order."""
        return batch_choices(self.space)

    def recompute_choices(self, family: LayoutFamily) -> list[Recompute]:
        return recompute_choices(family.max_chunk_layers, self.space.block_recompute_fractions)

    def sequence_parallel_choices(self, tp: int) -> tuple[bool, ...]:
        return sequence_parallel_choices(tp)

    # -- the loop ------------------------------------------------------------------------------

    def _reject(self, code: str, count: int) -> None:
        self.searched += count
        self.rejections[code] = self.rejections.get(code, 0) + count

    def run(self) -> None:
        all_batches = self.batch_choices()
        progress = self.progress
        families = list(self.families()) if progress is not None else self.families()
        total = len(families) if progress is not None else 0
        for index, (tp, cp, pp, pipeline) in enumerate(families):
            if progress is not None:
                progress(self.searched, len(self.found), index + 1, total)
            ns = dict(self.namespace)
            ns.update(family_settings(tp, cp, pp, pipeline))
            chosen_batches, namespaces = derive_batches(ns, all_batches, self.world, {"world_size_source": "plan"},
                                                        self.megatron)
            # (the optimizer chosen, micro batch size, the optimizer derived, microbatches)
            batches = [(chosen, mbs, shards_optimizer_states(derived), derived["num_microbatches"])
                       for (chosen, mbs), derived in zip(chosen_batches, namespaces)]
            first = namespaces[0]
            family = self.family(pp, pipeline, tp, first)
            experts = self.expert_choices(tp)
            recomputes = self.recompute_choices(family)
            sps = self.sequence_parallel_choices(tp)
            verdicts = family_verdicts(self.rules, self.raw, self.env, self.run_context, namespaces, experts, recomputes, sps,
                                       self.ignored_codes)
            if verdicts.failed is not None:
                self._reject(verdicts.failed, math.prod(verdicts.sizes))
                continue
            per_batch = len(recomputes) * len(sps)
            inner = verdicts.levels[RECOMPUTE] + verdicts.levels[SP]
            # The (recompute, sp) pairs the rules accept depend on the expert / batch choice only
            # through the dimensions the inner tables read.
            outer_dims = {d for dims, _ in inner for d in dims if d in (EXPERT, BATCH)}
            by_expert, by_batch = EXPERT in outer_dims, BATCH in outer_dims
            batch_rules = bool(verdicts.levels[BATCH])
            expert_rules = bool(verdicts.levels[EXPERT])
            accepted: dict[tuple, tuple[list, dict]] = {}
            choice = [0, 0, 0, 0]
            found, searched, valid = self.found, 0, 0
            append, rejections = found.append, self.rejections
            for e, (ep, etp) in enumerate(experts):
                if progress is not None:
                    progress(self.searched + searched, len(found), index + 1, total)
                choice[0] = e
                if expert_rules:
                    code = verdicts.check(EXPERT, choice)
                    if code is not None:
                        self._reject(code, len(batches) * per_batch)
                        continue
                layout = LayoutChoice(tp, cp, pp, ep, etp, pipeline)
                memory = LayoutMemory(self, layout, family, first)
                cost = LayoutCost(self, layout, family, memory.dims)
                for b, (chosen, mbs, do, m) in enumerate(batches):
                    choice[1] = b
                    if batch_rules:
                        code = verdicts.check(BATCH, choice)
                        if code is not None:
                            self._reject(code, per_batch)
                            continue
                    key = (by_expert and e, by_batch and b)
                    pairs = accepted.get(key)
                    if pairs is None:
                        pairs = accepted[key] = accepted_pairs(verdicts, choice, recomputes, sps)
                    ok, rejected = pairs
                    if rejected:
                        for code, count in rejected.items():        # _reject, inline
                            self.searched += count
                            rejections[code] = rejections.get(code, 0) + count
                    searched += len(ok)
                    valid += len(ok)
                    exceed = memory._exceed.get(do)
                    if exceed or (exceed is None and memory.states_exceed(do)):
                        continue
                    fits = memory.assess_all(do, mbs, m, ok)
                    if fits:
                        for (r, rec, sp, device), step in zip(fits, cost.steps(m, do, fits)):
                            append((step, device, memory, cost, mbs, m, do, rec, sp, chosen))
            self.searched += searched
            self.valid += valid

    # -- shared pieces -------------------------------------------------------------------------

    def family(self, pp: int, pipeline: PipelineChoice, tp: int, derived: dict) -> LayoutFamily:
        """The stages of this split (``layout.pipeline_stages``): they depend on pp, the split
        and the model only."""
        key = (pp, pipeline)
        family = self._families.get(key)
        if family is None:
            from megatron_estimator.config.typed import build_config
            from megatron_estimator.model.layout import pipeline_stages

            config = build_config(derived, self.vocabulary(tp), "plan", self.env, run=self.run_context,
                                  family=self.family_name)
            if self.reference is None:
                self.reference = config
            if self.pattern is None:
                self.pattern = self.layer_kinds()
                self.kinds = tuple(sorted(set(self.pattern), key=repr))
            family = self._families[key] = LayoutFamily(self, pipeline_stages(config), derived)
        return family

    def recompute_grouping(self, cfg, rec: Recompute, chunk_id: int, chunk, rid: int | None = None
                           ) -> tuple[tuple[int, int], tuple[int, tuple]]:
        """model/stage.py ``recompute_groups`` of a chunk under this recompute choice, counted
        by layer kind (``kinds``: dense and MoE, or a hybrid's symbols): (layers of each kind
        kept whole, (number of groups, distinct per-kind group counts))).  ``rid``:
        ``recompute_id`` of ``rec``."""
        key = (self.recompute_id(rec) if rid is None else rid, chunk_id)
        value = self._groupings.get(key)
        if value is None:
            cfg = replace(cfg, training=replace(cfg.training, recompute_granularity=rec.granularity,
                                                recompute_method=rec.method, recompute_num_layers=rec.num_layers))
            groups, whole = stage_model.recompute_groups(cfg, chunk.layers)
            pattern, all_kinds = self.pattern, self.kinds

            def kinds(layers) -> tuple[int, ...]:
                found = [pattern[i] for i in layers]
                return tuple(found.count(k) for k in all_kinds)

            value = self._groupings[key] = (kinds(whole), (len(groups), tuple(sorted({kinds(g) for g in groups}))))
        return value

    def fullest_table(self, pp: int, rank: int, vpp: int, m: int, group: int, combined_1f1b: bool) -> dict:
        """``fullest_state``'s cache for this schedule: weights -> the state, (weights,) -> its
        weighted sum (``fullest_held``), None -> the live states by count, 0 -> the steady
        state's."""
        schedule = (pp, rank, vpp, m, group, combined_1f1b)
        table = self._fullest.get(schedule)
        if table is None:
            table = self._fullest[schedule] = {}
        return table

    def fullest_held(self, pp: int, rank: int, vpp: int, m: int, group: int, combined_1f1b: bool,
                     kept: tuple[int, ...], table: dict) -> int:
        """The bytes alive at ``fullest_state``'s moment for chunk weights ``kept`` (0: none),
        cached in ``table`` (the schedule's ``fullest_table``) for the weights over their
        greatest common divisor, whose sum is that factor times smaller."""
        scale = math.gcd(*kept)
        weights = tuple(map(scale.__rfloordiv__, kept)) if scale > 1 else kept
        key = (weights,)
        held = table.get(key)
        if held is None:
            state = self.fullest_state(pp, rank, vpp, m, group, combined_1f1b, weights, table)
            held = table[key] = 0 if state is None else sum(map(operator.mul, state, weights))
        return held * scale if scale > 1 else held

    def fullest_state(self, pp: int, rank: int, vpp: int, m: int, group: int, combined_1f1b: bool,
                      kept: tuple[int, ...], table: dict | None = None) -> tuple[int, ...] | None:
        """Microbatches alive per chunk at the interleaved schedule's fullest moment for chunk
        weights ``kept``, as ``microbatches_in_flight`` finds it: the first of model/layout.py
        ``live_states`` with the largest weighted sum (None when no sum is above zero: nothing
        is held; with every weight above zero, the first of ``steady_live_states``, the only
        ones that can be).  The moment is the same for weights scaled by a positive factor, so this is
        cached on the weights divided by their greatest common divisor (``table``: the
        schedule's ``fullest_table``, when at hand)."""
        scale = math.gcd(*kept)
        weights = tuple(map(scale.__rfloordiv__, kept)) if scale > 1 else kept
        by_weights = self.fullest_table(pp, rank, vpp, m, group, combined_1f1b) if table is None else table
        state = by_weights.get(weights, by_weights)           # the dict itself: not known yet
        if state is not by_weights:
            return state
        if min(weights, default=0) > 0:
            # Every weight above zero: only the steady state's counts can be the fullest (the
            # warm-up's are each below a later one), all holding as many microbatches.
            steady = by_weights.get(0)
            if steady is None:
                from megatron_estimator.model.layout import steady_live_states

                steady = by_weights[0] = steady_live_states(pp, rank, vpp, m, group, combined_1f1b)
            best, state = 0, None
            for live in steady:
                weight = sum(map(operator.mul, live, weights))
                if weight > best:
                    best, state = weight, live
            by_weights[weights] = state
            return state
        ranked = by_weights.get(None)
        if ranked is None:
            from megatron_estimator.model.layout import live_states

            # (count, position, state), most microbatches first: a state's weighted sum is at
            # most its count times the largest weight (the counts are not negative).
            ranked = by_weights[None] = sorted(
                ((sum(live), i, live) for i, live in enumerate(live_states(pp, rank, vpp, m, group, combined_1f1b))),
                key=lambda entry: (-entry[0], entry[1]))
        top = max(weights, default=0)
        best, first, state = 0, -1, None
        for count, i, live in ranked:
            if count * top < best:
                break                                   # no later state reaches the best
            weight = sum(map(operator.mul, live, weights))
            if weight > best or (weight == best and weight > 0 and i < first):
                best, first, state = weight, i, live
        by_weights[weights] = state
        return state

    def allocated_limit(self, fixed: int, fragmentation: float) -> int:
        """The most allocated bytes whose ``stage.device_bytes`` is within the budget: it grows
        with the allocated bytes (an integer plus a truncated non-negative multiple of it), so
        a stage fits exactly when its allocated bytes are at most this."""
        key = (fixed, fragmentation)
        most = self._allocated_limits.get(key)
        if most is None:
            most = self._allocated_limits[key] = allocated_limit(self.budget, fixed, fragmentation)
        return most

    def dims_and_fixed(self, tp: int, pp: int, cp: int, ep: int, etp: int, vpp: int | None
                       ) -> tuple[ParallelDims, int]:
        """The ParallelDims of these sizes and their ``stage.fixed_device_bytes``."""
        key = (tp, pp, cp, ep, etp, vpp)
        found = self._dims.get(key)
        if found is None:
            dims = ParallelDims(self.world, tp, pp, cp, ep, etp, vpp)
            found = self._dims[key] = (dims, stage_model.fixed_device_bytes(dims, self.moe, self.overheads))
        return found

    def recompute_id(self, rec: Recompute) -> int:
        """A small int for a recompute choice, the same for equal choices (the caches' keys)."""
        return self._recompute_ids.setdefault(rec, len(self._recompute_ids))

    def intern(self, structure: tuple) -> int:
        """A small int for a stage or chunk structure, the same for equal structures."""
        return self._interned.setdefault(structure, len(self._interned))

    def kd_files(self):
        """Distillation's files (config/distillation.py ``read_kd_files``), read once; None
        without --export-kd-teacher-load.  Their problems were reported by the input's resolve."""
        if not hasattr(self, "_kd_files"):
            files = None
            if self.namespace.get("export_kd_teacher_load"):
                from megatron_estimator.config.distillation import read_kd_files

                files = read_kd_files(self.namespace, self.megatron.version, [])
            self._kd_files = files
        return self._kd_files

    def vocabulary(self, tp: int):
        from megatron_estimator.config.vocab import vocabulary_of

        vocab = self._vocab.get(tp)
        if vocab is None:
            # The call resolve.resolve_config makes; the input's vocabulary was checked there.
            vocab = vocabulary_of(self.namespace, tp, self.megatron)
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

        if self.family_name == "hybrid":
            return tuple(kind == "E" for kind in self.layer_kinds())
        if not ns.get("num_experts"):
            return (False,) * ns["num_layers"]
        return expand_moe_layer_freq(ns.get("moe_layer_freq", 1), ns["num_layers"])

    def layer_kinds(self) -> tuple:
        """Per decoder layer its kind: a hybrid model's pattern symbols (config/hybrid.py),
        else whether it is a MoE layer (``layer_pattern``)."""
        if self.family_name != "hybrid":
            return self.layer_pattern()
        if self.reference is not None:
            return self.reference.model.hybrid.layer_kinds
        from megatron_estimator.config.hybrid import parse_pattern

        return tuple(parse_pattern(self.namespace["hybrid_pattern_unified"])[0].layers)

    def parameter_kinds(self) -> tuple:
        """Per decoder layer what decides its tensors (model/parameters.py ``layer_kind``): the
        ``layer_kinds`` but for a 'D' layer that reuses another's top-k (no indexer)."""
        if self._parameter_kinds is None:
            from megatron_estimator.model.parameters import layer_kind

            self._parameter_kinds = tuple(layer_kind(self.reference, i) for i in range(len(self.pattern)))
        return self._parameter_kinds

    def layer_counts(self, tp: int, ep: int, etp: int, moe_layer) -> tuple[int, int, int, int]:
        """(dense elements, expert elements, dense tensors, expert tensors) one GPU holds of a
        decoder layer of this kind (``layer_kinds``; model/parameters.py ``layer_tensors``)."""
        key = (tp, ep, etp, moe_layer)
        counts = self._layer_counts.get(key)
        if counts is None:
            from megatron_estimator.model.parameters import layer_tensors

            index = self.parameter_kinds().index(moe_layer)
            config = replace(self.reference, parallel=ParallelDims(self.world, tp, 1, 1, ep, etp))
            counts = self._layer_counts[key] = census(layer_tensors(config, index, ""))
        return counts

    def state_rates(self, dims: ParallelDims, do: bool) -> StateRates:
        """Model-state bytes per dense and per expert element, lowest and highest over the
        tensor kinds, for these shard sizes: model/states.py ``model_states`` of one probe
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
                for kind in ("linear", "norm", "bias", "embedding", "router") + (("conv",) if "M" in self.kinds else ()):
                    st = model_states(config, [[ParamTensor("probe", size, expert, kind)]])
                    total = st.weights + st.gradients + st.optimizer_states
                    per_kind.append((total / size, (total + 8) / size))   # the probe's own truncation
                found.append((min(low for low, _ in per_kind), max(high for _, high in per_kind)))
            rates = self._rates[key] = StateRates(found[0][0], found[0][1], found[1][0], found[1][1])
        return rates

    def tensors(self, config, layout: LayoutChoice, chunk_id: int, chunk) -> list:
        """model/parameters.py ``chunk_tensors``: it depends on tp, ep, etp and the chunk's structure."""
        key = (layout.tp, layout.ep, layout.etp, chunk_id, chunk.embedding, chunk.output_weight)
        tensors = self._tensors.get(key)
        if tensors is None:
            from megatron_estimator.model.parameters import chunk_tensors

            tensors = self._tensors[key] = chunk_tensors(config, chunk)
        return tensors

    def stage_census(self, tp: int, ep: int, etp: int, group) -> tuple[int, int, int, int, int, int]:
        """(dense elements, expert elements, dense tensors, chunks with dense tensors, expert
        tensors, chunks with expert tensors) of a stage group's stage on one GPU
        (``chunk_census`` of each chunk; the final norm's two tensors counted, its elements
        not)."""
        key = ("stage", tp, ep, etp, group.stage_id)
        cached = self._layer_counts.get(key)
        if cached is None:
            dense = expert = n_dense = k_dense = n_expert = k_expert = 0
            for cid, chunk in zip(group.chunk_ids, group.stage.chunks):
                d, e, nd, ne = self.chunk_census(tp, ep, etp, cid, chunk)
                if chunk.post_process:
                    nd += 2                                    # the final norm: weight (and bias)
                dense, expert = dense + d, expert + e
                n_dense, k_dense = n_dense + nd, k_dense + (nd > 0)
                n_expert, k_expert = n_expert + ne, k_expert + (ne > 0)
            cached = self._layer_counts[key] = (dense, expert, n_dense, k_dense, n_expert, k_expert)
        return cached

    def chunk_census(self, tp: int, ep: int, etp: int, chunk_id: int, chunk) -> tuple[int, int, int, int]:
        """(dense elements, expert elements, dense tensors, expert tensors) of a model chunk on
        one GPU: its decoder layers, embedding, output layer and MTP layers (the final norm is
        left out: the callers bound it)."""
        key = ("chunk", tp, ep, etp, chunk_id, chunk.embedding, chunk.output_weight)
        cached = self._layer_counts.get(key)
        if cached is not None:
            return cached
        dense = expert = n_dense = n_expert = 0
        kinds = self.parameter_kinds()
        for i in chunk.layers:
            d, e, nd, ne = self.layer_counts(tp, ep, etp, kinds[i])
            dense, expert, n_dense, n_expert = dense + d, expert + e, n_dense + nd, n_expert + ne
        if chunk.embedding or chunk.output_weight or chunk.mtp_layers:
            edges_key = ("edges", tp, ep, etp)
            edges = self._layer_counts.get(edges_key)
            if edges is None:
                from megatron_estimator.model.parameters import embedding_tensors, mtp_tensors

                model = replace(self.reference.model, padded_vocab_size=self.vocabulary(tp).padded_size)
                config = replace(self.reference, parallel=ParallelDims(self.world, tp, 1, 1, ep, etp), model=model)
                mtp = census(mtp_tensors(config, 0)) if model.mtp_num_layers else (0, 0, 0, 0)
                output = (model.padded_vocab_size // tp * model.hidden_size, 0, 1, 0)
                edges = self._layer_counts[edges_key] = (census(embedding_tensors(config)), output, mtp)
            for part, times in zip(edges, (chunk.embedding, chunk.output_weight, chunk.mtp_layers)):
                if times:
                    dense += part[0] * times
                    expert += part[1] * times
                    n_dense += part[2] * times
                    n_expert += part[3] * times
        result = self._layer_counts[key] = (dense, expert, n_dense, n_expert)
        return result

    @property
    def proxy_model(self) -> ProxyModel:
        if self._proxy_model is None:
            self._proxy_model = proxy_model(self)
        return self._proxy_model


# -------------------------------------------------------------------------------------------
# The entry points


def search(inp, *, world_size: int, global_batch_size: int, budget: int, budget_source: str, overheads,
           environ: Mapping[str, str], space: SearchSpace, proxy: ProxyAssumptions, top: int | None = 10,
           verify: Verifier | None = None, started: float | None = None,
           progress: ProgressCallback | None = None, clock: Callable[[], float] = time.perf_counter) -> Plan:
    """Every layout of ``inp`` (a ``TrainingInput``) on ``world_size`` GPUs that Megatron
    accepts and that fits ``budget`` bytes, ranked by the throughput proxy.  The best ``top``
    (all with None) become candidates, each checked with ``verify`` when given.  Raises
    NoValidLayout when no layout passes the rules; a plan where nothing fits has
    ``fitting == 0``.  ``progress``, when given, is called with a ``SearchProgress`` once the
    search has run past a second by ``clock`` (``started`` is on that clock), then about once
    a second: never for a search that ends sooner."""
    started = clock() if started is None else started
    run = _Search(inp, world_size, global_batch_size, budget, budget_source, overheads, environ, space, proxy)
    if progress is not None:
        run.progress = _Progress(progress, clock, started)
    # The host's garbage collector is never switched off here: the run's caches hold reference
    # cycles, which ``_Search.release`` breaks once the plan is built, so reference counting
    # frees them at once.
    try:
        run.run()
        if run.valid == 0:
            raise NoValidLayout(_no_valid_layout(run), run.searched)
        chosen = _best(run.found, top)
        from megatron_estimator.planner.candidates import candidate   # not on run's suggestion path

        candidates = tuple(candidate(run, fit, verify) for fit in chosen)
        plan = _plan(run, chosen, candidates, space, proxy)
        del chosen
    finally:
        run.release()
    return replace(plan, seconds=clock() - started)


def _plan(run: _Search, chosen: list[_Fit], candidates: tuple, space: SearchSpace, proxy: ProxyAssumptions) -> Plan:
    """The Plan of a finished run (its ``seconds`` filled in by ``search``)."""
    inp = run.inp
    notes = list(inp.notes)
    base_problems = run.base_problems
    if run.family_name == "hybrid":
        from megatron_estimator.planner.hybrid import default_layout_problems, pipe_free_note

        best = chosen[0].memory if chosen else None
        note = (pipe_free_note(run.namespace, best.family.stages)
                if best is not None and not extra_dests(best.layout.pipeline) else None)
        if note is not None:
            notes.append(note)
        base_problems = default_layout_problems(run.namespace, base_problems)
    if base_problems:
        notes.append("with Megatron's default layout the input fails validation: "
                     + "; ".join(f"{p.location}: {p.message}" for p in base_problems))
    return Plan(
        source=inp.source, world_size=run.world, global_batch_size=run.gbs,
        budget_bytes=run.budget, budget_source=run.budget_source, candidates=candidates,
        searched=run.searched, valid=run.valid, fitting=len(run.found),
        seconds=0.0, space=space, proxy=proxy,
        rejections=tuple(sorted(run.rejections.items(), key=lambda kv: (-kv[1], kv[0]))),
        notes=tuple(notes),
    )


def allocated_limit(budget: int, fixed: int, fragmentation: float) -> int:
    """The largest integer x with ``stage.device_bytes(x, fixed, fragmentation) <= budget``
    (the device bytes never decrease as x grows: fragmentation is not negative)."""
    if fragmentation < 0:
        raise ValueError("the planner needs a non-negative fragmentation")

    def fits(x: int) -> bool:
        return stage_model.device_bytes(x, fixed, fragmentation) <= budget

    low = high = budget - fixed
    step = 1
    while fits(high):
        low, high, step = high, high + step, step * 2
    step = 1
    while not fits(low):
        high, low, step = low, low - step, step * 2
    while high - low > 1:                         # fits(low), not fits(high)
        mid = (low + high) // 2
        if fits(mid):
            low = mid
        else:
            high = mid
    return low


def _best(found: list[tuple], top: int | None) -> list[_Fit]:
    """The ``top`` best layouts by (proxy step, device peak), of the fitting layouts ``found``
    (``_Search.found``).  The device peaks of the layouts tied with the last of them on the
    proxy are made exact first, so the order is the one exact peaks give: the order of
    sorting every layout by ``_Fit.sort_key``, taking those whose step is at most the
    ``top``-th smallest, making their peaks exact and sorting again (the sorts are stable), for
    which only the layouts taken need sorting."""
    if top is None or top >= len(found):
        window = [_Fit(*f) for f in found]
    else:
        import heapq    # only where the fits are more than the top asked for

        boundary = heapq.nsmallest(top, [f[0] for f in found])[-1] if top > 0 else None
        window = [_Fit(*f) for f in found if boundary is not None and f[0] <= boundary]
    window.sort(key=_Fit.sort_key)
    for fit in window:
        fit.resolve()
    window.sort(key=_Fit.sort_key)
    return window if top is None else window[:top]


def layouts(inp, *, world_size: int, global_batch_size: int, environ: Mapping[str, str],
            space: SearchSpace | None = None) -> Iterator[dict[str, Any]]:
    """Every layout ``search`` enumerates for ``inp`` (a ``TrainingInput``), as the planned
    settings (dest -> value) of each: what a brute-force check runs through ``api.evaluate``
    (``candidates.layout_raw`` applies one to the input)."""
    from megatron_estimator.model.overhead import Overheads

    space = space or SearchSpace()
    run = _Search(inp, world_size, global_batch_size, 1, "", Overheads(), environ, space, ProxyAssumptions())
    for tp, cp, pp, pipeline in run.families():
        ns = dict(run.namespace)
        ns.update(family_settings(tp, cp, pp, pipeline))
        batches, namespaces = derive_batches(ns, batch_choices(space), world_size, {}, run.megatron)
        family = run.family(pp, pipeline, tp, namespaces[0])
        for ep, etp in run.expert_choices(tp):
            for do, mbs in batches:
                for rec in recompute_choices(family.max_chunk_layers, space.block_recompute_fractions):
                    for sp in sequence_parallel_choices(tp):
                        settings = family_settings(tp, cp, pp, pipeline)
                        settings.update({"expert_model_parallel_size": ep,
                                         "expert_tensor_parallel_size": etp if run.moe and etp != tp else None,
                                         "micro_batch_size": mbs, "global_batch_size": global_batch_size,
                                         "use_distributed_optimizer": do, "sequence_parallel": sp})
                        settings.update(rec.settings())
                        yield {d: settings.get(d) for d in PLANNED_DESTS + extra_dests(pipeline)}


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


