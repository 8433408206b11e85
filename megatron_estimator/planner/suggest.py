"""Suggestions on refusal: the nearest changes that make every stage of a refused launch fit.

A refused launch keeps its world size, its model and its global batch; what may change is its
layout, the planner's choices (``planner.space``): activation recompute (selective; full
uniform; full block with every ``--recompute-num-layers`` below a chunk's layers, so the
fewest layers that suffice are among them), the micro batch size (the input's and the
smaller ones of the search space), sequence parallelism, the distributed optimizer, the
pipeline split (virtual stages, uneven first/last stages, a layout string, the input's own),
and the tp / cp / pp / ep / etp sizes of the same world.  ``SuggestionSearch`` is the
planner's own search (``planner.search._Search``: validity by ``config/rules``, memory by
``model/stage.py``'s stage parts, the throughput proxy of ``planner.cost``) over the
neighbourhood of the input's layout: at most ``MAX_PARALLEL_CHANGES`` of the parallel sizes
differ from the input's.  Fine-grained activation offloading of every module the estimator
models (``DENSE_OFFLOAD_MODULES``, ``MOE_OFFLOAD_MODULES``) is one more change where the input
does not offload: a second search of the input with it, on the input's own parallel sizes.
Its host transfers are not in the proxy (planner/cost.py counts no PCIe traffic).

Order ("nearest first"): fewer changed setting groups (``GROUPS``: each parallel size, the
pipeline split, the micro batch size, sequence parallelism, the distributed optimizer,
recompute), then fewer flags to add, change or remove (``--global-batch-size``, which only
keeps the input's global batch where data parallelism changes, is not counted), then the lower
proxy step time, then the lower device peak.  Each group combination is shown once, with its best layout, and a
combination that contains one already shown is left out (it changes more for nothing).
Every suggestion is re-estimated through the normal path (``verify``: ``api.evaluate`` on the
changed settings) and shown only when every stage fits there, with the normal path's figures.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

from megatron_estimator.core.problems import InvalidInput
from megatron_estimator.inputs.rawargs import RawArgs
from megatron_estimator.planner.search import _Fit, _Search
from megatron_estimator.planner.space import user_pipeline_choice
from megatron_estimator.results.estimate import Estimate, Verdict
from megatron_estimator.results.plan import NO_RECOMPUTE, SELECTIVE_CORE_ATTN, ProxyAssumptions, Recompute, SearchSpace
from megatron_estimator.results.suggestion import Suggestion, Suggestions

MAX_SUGGESTIONS = 3
MAX_PARALLEL_CHANGES = 2     # of tp, cp, pp, ep, etp

# The setting groups a suggestion changes, in the order they are named.
GROUPS = ("recompute", "micro batch size", "sequence parallel", "distributed optimizer", "pipeline split",
          "tensor parallel", "pipeline parallel", "context parallel", "expert parallel", "expert tensor parallel")
OFFLOADING = "activation offloading"


@dataclass(frozen=True)
class _Current:
    """The refused launch's own choices, as the planner's dimensions name them."""
    tp: int
    cp: int
    pp: int
    ep: int
    etp: int
    etp_follows_tp: bool          # --expert-tensor-parallel-size not given: it is tp
    split: tuple                  # the input's pipeline split settings (() for none)
    micro_batch_size: int
    global_batch_size: int
    sequence_parallel: bool
    distributed_optimizer: bool
    recompute: Recompute


def _current(raw: RawArgs, estimate: Estimate, release: str) -> _Current:
    from megatron_estimator.megatron.flags import flag_table

    defaults = flag_table(release).defaults()

    def value(dest: str) -> Any:
        return raw.value(dest) if raw.given(dest) else defaults.get(dest)

    par = estimate.parallelism
    mbs = int(value("micro_batch_size") or 1)
    gbs = value("global_batch_size") or mbs * int(par["dp"])     # Megatron: mbs x dp when not given
    granularity = value("recompute_granularity") or ("selective" if value("recompute_activations") else None)
    if granularity == "selective":
        recompute = Recompute("selective", modules=tuple(value("recompute_modules") or ("core_attn",)))
    elif granularity == "full":
        recompute = Recompute("full", value("recompute_method"), value("recompute_num_layers"))
    else:
        recompute = NO_RECOMPUTE
    pipeline = user_pipeline_choice(raw)
    tp = int(par["tp"])
    return _Current(tp=tp, cp=int(par["cp"]), pp=int(par["pp"]), ep=int(par.get("ep") or 1),
                    etp=int(par.get("etp") or tp), etp_follows_tp=not raw.given("expert_tensor_parallel_size"),
                    split=pipeline.settings if pipeline is not None else (),
                    micro_batch_size=mbs, global_batch_size=int(gbs),
                    sequence_parallel=bool(value("sequence_parallel")),
                    distributed_optimizer=bool(value("use_distributed_optimizer")), recompute=recompute)


def _same_recompute(a: Recompute, b: Recompute) -> bool:
    if a.granularity != b.granularity:
        return False
    if a.granularity == "selective":
        return tuple(a.modules or ()) == tuple(b.modules or ())
    if a.granularity == "full":
        return (a.method, a.num_layers) == (b.method, b.num_layers)
    return True


class SuggestionSearch(_Search):
    """The planner's search over the neighbourhood of one refused launch."""

    def __init__(self, inp, current: _Current, world: int, budget: int, budget_source: str, overheads, environ,
                 space: SearchSpace, proxy: ProxyAssumptions, max_parallel_changes: int = MAX_PARALLEL_CHANGES):
        super().__init__(inp, world, current.global_batch_size, budget, budget_source, overheads, environ,
                         space, proxy)
        self.current = current
        self.max_parallel_changes = max_parallel_changes
        self._family_changes = 0

    def families(self) -> Iterator[tuple]:
        cur = self.current
        for tp, cp, pp, pipeline in super().families():
            changes = (tp != cur.tp) + (cp != cur.cp) + (pp != cur.pp)
            if changes > self.max_parallel_changes:
                continue
            self._family_changes = changes     # read by expert_choices, called next for this family
            if self.expert_choices(tp):        # a family with no expert choice left is not searched
                yield tp, cp, pp, pipeline

    def expert_choices(self, tp: int) -> list[tuple[int, int]]:
        return [(ep, etp) for ep, etp in super().expert_choices(tp)
                if self._family_changes + self._expert_changes(tp, ep, etp) <= self.max_parallel_changes]

    def _expert_changes(self, tp: int, ep: int, etp: int) -> int:
        cur = self.current
        etp_changed = etp != tp if cur.etp_follows_tp else etp != cur.etp
        return (ep != cur.ep) + etp_changed if self.moe else 0

    def batch_choices(self) -> list[tuple[bool, int]]:
        cur = self.current
        sizes = sorted({cur.micro_batch_size} | {m for m in self.space.micro_batch_sizes if m < cur.micro_batch_size})
        return [(do, mbs) for do in self.space.distributed_optimizer for mbs in sizes]

    def recompute_choices(self, family) -> list[Recompute]:
        layers = family.max_chunk_layers
        choices = [NO_RECOMPUTE, SELECTIVE_CORE_ATTN]
        if layers >= 1:
            choices.append(Recompute("full", "uniform", 1))
        choices += [Recompute("full", "block", n) for n in range(1, layers)]
        if not any(_same_recompute(self.current.recompute, c) for c in choices):
            choices.append(self.current.recompute)
        return choices

    def changes(self, fit: _Fit) -> tuple[str, ...]:
        """The setting groups this fitting layout changes, in ``GROUPS`` order."""
        cur, lay = self.current, fit.memory.layout
        changed = {
            "recompute": not _same_recompute(fit.recompute, cur.recompute),
            "micro batch size": fit.micro_batch_size != cur.micro_batch_size,
            "sequence parallel": fit.sequence_parallel != cur.sequence_parallel and lay.tp > 1,
            "distributed optimizer": fit.chosen_optimizer != cur.distributed_optimizer,
            "pipeline split": tuple(lay.pipeline.settings) != tuple(cur.split),
            "tensor parallel": lay.tp != cur.tp,
            "pipeline parallel": lay.pp != cur.pp,
            "context parallel": lay.cp != cur.cp,
            "expert parallel": self.moe and lay.ep != cur.ep,
            "expert tensor parallel": self.moe and bool(self._expert_changes(lay.tp, cur.ep, lay.etp)),
        }
        return tuple(g for g in GROUPS if changed[g])


Verifier = Callable[[RawArgs], Verdict]


def suggest(inp, estimate: Estimate, *, overheads, environ: Mapping[str, str], verify: Verifier,
            space: SearchSpace | None = None, proxy: ProxyAssumptions | None = None,
            limit: int = MAX_SUGGESTIONS) -> Suggestions:
    """Up to ``limit`` changes of the refused launch ``inp`` (a ``TrainingInput``, estimated as
    ``estimate``) that make every stage fit ``estimate.budget_bytes``, nearest first (module
    docstring), each checked with ``verify`` (the normal path)."""
    from dataclasses import replace

    space, proxy = space or SearchSpace(), proxy or ProxyAssumptions()
    current = _current(inp.raw, estimate, inp.release.version)
    # (the search, the flags it adds to every layout, the group those flags change)
    searches: list[tuple[SuggestionSearch, tuple[str, ...], tuple[str, ...]]] = []
    offload = _offloading(inp.raw)
    try:
        searches.append((_run(inp, current, estimate, overheads, environ, space, proxy, MAX_PARALLEL_CHANGES), (), ()))
        if offload is not None:
            raw, offload_flags = offload
            searches.append((_run(replace(inp, raw=raw), current, estimate, overheads, environ, space, proxy, 0),
                             offload_flags, (OFFLOADING,)))
    except InvalidInput as err:
        if not searches:
            return Suggestions((), note="no change to suggest: " + "; ".join(p.message for p in err.problems[:3]))
    except RuntimeError as err:
        # The planner's own consistency checks (planner/memory.py): a refusal is still reported.
        if not searches:
            return Suggestions((), note=f"no change to suggest: the planner cannot search this input ({err})")

    best: dict[tuple[str, ...], tuple] = {}
    for run, extra_flags, extra_kind in searches:
        for fit in run.fits:
            kind = extra_kind + run.changes(fit)
            if not kind:
                continue
            held = best.get(kind)
            if held is None or (fit.step, fit.device) < (held[1].step, held[1].device):
                best[kind] = (run, fit, extra_flags)
    ranked = []
    if best:           # planner.candidates writes the flags of a fitting layout: none, no import
        from megatron_estimator.planner.candidates import candidate, candidate_flags, candidate_raw, candidate_settings
    for kind, (run, fit, extra_flags) in best.items():
        flags, remove = candidate_flags(run.inp.raw, candidate_settings(run, fit), run.megatron.version)
        count = len(_changed_flags(flags)) + len(remove) + len(_changed_flags(extra_flags))
        ranked.append((len(kind), count, fit.step, fit.device, kind, run, fit, extra_flags))
    ranked.sort(key=lambda r: r[:5])

    shown: list[Suggestion] = []
    for _, _, _, _, kind, run, fit, extra_flags in ranked:
        if len(shown) == limit:
            break
        if any(set(s.changes) < set(kind) for s in shown):
            continue
        found = candidate(run, fit)
        verdict = verify(candidate_raw(run.inp.raw, found, run.megatron.version))
        if verdict.estimate is None or verdict.estimate.fits is not True:
            continue
        peak = verdict.estimate.peak_stage
        shown.append(Suggestion(changes=kind, flags=_without_implied_global_batch(inp.raw, found) + extra_flags,
                                remove_flags=found.remove_flags,
                                peak_stage=peak.pipeline_rank, device_peak_bytes=peak.device_peak_bytes,
                                allocated_peak_bytes=peak.allocated_peak_bytes, headroom_bytes=peak.headroom_bytes,
                                cost=found.proxy, estimate=verdict.estimate))
    searched = sum(run.valid for run, _, _ in searches)
    note = None
    if not shown:
        note = (f"no change within reach fits: none of the {searched} layouts of these {estimate.world_size} GPUs "
                f"searched (recompute, micro batch size, sequence parallel, distributed optimizer, pipeline split, "
                f"activation offloading, up to {MAX_PARALLEL_CHANGES} parallel sizes changed) fits the budget")
    return Suggestions(tuple(shown), searched=searched, fitting=sum(len(run.fits) for run, _, _ in searches),
                       note=note)


def _run(inp, current: _Current, estimate: Estimate, overheads, environ, space, proxy,
         max_parallel_changes: int) -> SuggestionSearch:
    run = SuggestionSearch(inp, current, estimate.world_size, estimate.budget_bytes, estimate.budget_source or "",
                           overheads, environ, space, proxy, max_parallel_changes)
    run.run()
    return run


# The modules whose saved tensors the estimator models offloading (model/activations.py
# ``offloaded_bytes``), in a valid --offload-modules list (attn_proj needs core_attn).
DENSE_OFFLOAD_MODULES = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm")
MOE_OFFLOAD_MODULES = ("expert_fc1", "moe_act")


def _offloading(raw: RawArgs) -> tuple[RawArgs, tuple[str, ...]] | None:
    """The input with fine-grained activation offloading of every module the estimator models
    (megatron/core/pipeline_parallel/fine_grained_activation_offload.py), and the flags that
    select it; None where the input offloads already (or uses --cpu-offloading-num-layers,
    which Megatron does not combine with it)."""
    from megatron_estimator.inputs.rawargs import RawSetting

    if raw.value("fine_grained_activation_offloading", False) or raw.value("cpu_offloading_num_layers", 0):
        return None
    modules = DENSE_OFFLOAD_MODULES + (MOE_OFFLOAD_MODULES if raw.value("num_experts") else ())
    settings = dict(raw.settings)
    settings["fine_grained_activation_offloading"] = RawSetting(
        "fine_grained_activation_offloading", True, "--fine-grained-activation-offloading")
    settings["offload_modules"] = RawSetting("offload_modules", list(modules), "--offload-modules")
    return RawArgs(settings, raw.source), ("--fine-grained-activation-offloading", "--offload-modules", *modules)


def _changed_flags(tokens: tuple[str, ...]) -> list[str]:
    """The flag names among flag tokens (their values left out), but ``--global-batch-size``:
    it only keeps the input's global batch where the data parallel size changes."""
    return [t for t in tokens if t.startswith("--") and t != "--global-batch-size"]


def _without_implied_global_batch(raw: RawArgs, found) -> tuple[str, ...]:
    """The candidate's flags without ``--global-batch-size`` where the input does not give it and
    Megatron's default (micro batch x data parallel, megatron/training/arguments.py) is the
    same global batch with the change."""
    flags = list(found.flags)
    if raw.given("global_batch_size") or "--global-batch-size" not in flags:
        return tuple(flags)
    at = flags.index("--global-batch-size")
    if found.micro_batch_size * found.parallel.dp == int(flags[at + 1]):
        del flags[at:at + 2]
    return tuple(flags)
