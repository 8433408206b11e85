"""What each pipeline stage holds, and how many microbatches it keeps in flight.

Layer placement follows megatron/core/transformer/transformer_block.py
(``get_num_layers_to_build``), transformer_layer.py (``get_transformer_layer_offset``) and
pipeline_parallel_layer_layout.py; embedding / output placement follows
megatron/core/models/gpt/gpt_model.py (embedding on the first stage and on any stage that
runs MTP layers; output layer on the last, its weight not allocated when tied on a stage that
also holds the embedding).

The schedule follows megatron/core/pipeline_parallel/schedules.py: without virtual stages,
rank r runs ``p - r - 1`` warm-up forwards and then 1F1B, so it holds ``min(p - r, M)``
microbatches of activations; with virtual stages the interleaved schedule is simulated
step by step (``get_pp_rank_microbatches``, ``get_schedule_table``) to find the largest set
of model chunks whose activations are alive at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from megatron_estimator.config.typed import EstimatorConfig
from megatron_estimator.config.layout_syntax import parse_layout


@dataclass(frozen=True)
class ModelChunk:
    """One virtual stage (model chunk) on one pipeline rank."""
    pp_rank: int
    vp_stage: int
    layers: tuple[int, ...]          # global decoder layer indices
    embedding: bool                  # word (and position) embeddings live here
    pre_process: bool                # the embedding runs here (first chunk of the model)
    post_process: bool               # final norm, output layer and loss run here
    output_weight: bool              # the output layer allocates its own weight here
    mtp_layers: int


@dataclass(frozen=True)
class StageLayout:
    pp_rank: int
    chunks: tuple[ModelChunk, ...]

    @property
    def layers(self) -> tuple[int, ...]:
        if len(self.chunks) == 1:
            return self.chunks[0].layers
        return tuple(i for chunk in self.chunks for i in chunk.layers)

    @property
    def pre_process(self) -> bool:
        return any(c.pre_process for c in self.chunks)

    @property
    def post_process(self) -> bool:
        return any(c.post_process for c in self.chunks)

    @property
    def mtp_layers(self) -> int:
        return sum(c.mtp_layers for c in self.chunks)


def _layers_per_chunk(config: EstimatorConfig) -> list[list[int]]:
    """counts[pp_rank][vp_stage] of decoder layers, without a layout string."""
    p = config.parallel.pp
    v = config.parallel.virtual_stages
    split = config.split
    num_layers = config.model.num_layers
    counts = [[0] * v for _ in range(p)]
    if split.first_stage_layers is not None or split.last_stage_layers is not None:
        middle_layers = num_layers - (split.first_stage_layers or 0) - (split.last_stage_layers or 0)
        middle_stages = p - (split.first_stage_layers is not None) - (split.last_stage_layers is not None)
        per_middle = middle_layers // middle_stages if middle_stages > 0 else 0
        for r in range(p):
            per_rank = per_middle
            if r == 0 and split.first_stage_layers is not None:
                per_rank = split.first_stage_layers
            if r == p - 1 and split.last_stage_layers is not None:
                per_rank = split.last_stage_layers
            for s in range(v):
                counts[r][s] = per_rank // v
    else:
        counted = num_layers + split.account_for_embedding + split.account_for_loss
        per_rank = counted // p
        for r in range(p):
            for s in range(v):
                counts[r][s] = per_rank // v
        if split.account_for_embedding:
            counts[0][0] -= 1
        if split.account_for_loss:
            counts[p - 1][v - 1] -= 1
    return counts


def _layer_order(counts: list[list[int]]) -> list[list[tuple[int, ...]]]:
    """Global layer ids: chunks are numbered virtual stage major, pipeline rank minor."""
    p, v = len(counts), len(counts[0])
    ids = [[()] * v for _ in range(p)]
    offset = 0
    for s in range(v):
        for r in range(p):
            ids[r][s] = tuple(range(offset, offset + counts[r][s]))
            offset += counts[r][s]
    return ids


def _chunk(r: int, s: int, layers: tuple[int, ...], pre: bool, post: bool, mtp: int, tied: bool) -> ModelChunk:
    return ModelChunk(
        pp_rank=r, vp_stage=s, layers=layers, embedding=pre or mtp > 0, pre_process=pre,
        post_process=post, output_weight=post and not (pre and tied), mtp_layers=mtp,
    )


@lru_cache(maxsize=256)
def pipeline_stages(config: EstimatorConfig) -> tuple[StageLayout, ...]:
    """Every pipeline rank's model chunks (immutable records; memoised per configuration, so
    an equal configuration's stages are the same objects and the caches keyed on a stage
    find them by identity)."""
    p = config.parallel.pp
    v = config.parallel.virtual_stages
    tied = not config.model.untie_embeddings_and_output_weights
    if config.split.layout is not None:
        flat = parse_layout(config.split.layout)
        v = len(flat) // p
        grid = [[flat[s * p + r] for s in range(v)] for r in range(p)]
        ids = _layer_order([[chunk.count("t") for chunk in row] for row in grid])
        return tuple(
            StageLayout(r, tuple(
                _chunk(r, s, ids[r][s], "E" in grid[r][s], "L" in grid[r][s], grid[r][s].count("m"), tied)
                for s in range(v)))
            for r in range(p))
    hybrid = config.model.hybrid
    if hybrid is not None and hybrid.segments:
        # megatron/core/models/hybrid/hybrid_layer_allocation.py select_pipeline_segment:
        # segment vp * p + r runs on rank r, virtual stage vp.
        v = len(hybrid.segments) // p
        ids = _layer_order([[hybrid.segments[s * p + r] for s in range(v)] for r in range(p)])
    else:
        ids = _layer_order(_layers_per_chunk(config))
    stages = []
    for r in range(p):
        chunks = []
        for s in range(v):
            post = r == p - 1 and s == v - 1
            chunks.append(_chunk(r, s, ids[r][s], r == 0 and s == 0, post,
                                 config.model.mtp_num_layers if post else 0, tied))
        stages.append(StageLayout(r, tuple(chunks)))
    return tuple(stages)


@dataclass(frozen=True)
class InFlight:
    """The activations a pipeline rank holds at its fullest moment.

    ``chunk_microbatches[s]`` is how many microbatches of model chunk ``s`` are alive then;
    ``peak_chunk`` is the chunk whose forward (or backward) runs at that moment.
    """
    chunk_microbatches: tuple[int, ...]
    warmup: int
    description: str


def microbatches_in_flight(pp: int, rank: int, vpp: int | None, num_microbatches: int,
                           group_size: int, chunk_weights: tuple[int, ...] = (),
                           combined_1f1b: bool = False) -> InFlight:
    """Microbatches per model chunk alive at the rank's peak.

    ``chunk_weights`` (bytes per microbatch of each chunk) decides which moment is the
    fullest when chunks differ in size; with equal weights the first steady-state step is.
    ``combined_1f1b`` (--overlap-moe-expert-parallel-comm) runs one extra warm-up forward in
    the interleaved schedule (schedules.py ``get_pp_rank_microbatches``); the layer-by-layer
    overlap of one microbatch's forward with another's backward is a transient the memory
    model adds.
    """
    if pp == 1:
        return InFlight((1,) * (vpp or 1), 0, "no pipeline: one microbatch at a time")
    if not vpp or vpp == 1:
        live = min(pp - rank, num_microbatches)
        return InFlight((live,), pp - rank - 1,
                        f"1F1B: min(p - r, M) = min({pp} - {rank}, {num_microbatches}) = {live}")
    counts = _interleaved_peak(pp, rank, vpp, _equivalent_microbatches(pp, rank, vpp, num_microbatches, group_size,
                                                                       int(combined_1f1b)),
                               group_size, chunk_weights or (1,) * vpp, int(combined_1f1b))
    warmup = min((pp - rank - 1) * 2 + (vpp - 1) * group_size + int(combined_1f1b), num_microbatches * vpp)
    return InFlight(counts, warmup,
                    f"interleaved 1F1B ({vpp} virtual stages): {warmup} warm-up forwards, "
                    f"at most {sum(counts)} chunk-microbatches alive")


def _equivalent_microbatches(pp: int, rank: int, vpp: int, m: int, group: int, extra_warmup: int) -> int:
    """A microbatch count whose interleaved schedule peaks as ``m``'s does, small enough to
    simulate.  The schedule table repeats every ``group`` microbatches (each group runs every
    chunk), so past the warm-up the steady state repeats with that period; removing whole
    periods from the middle keeps the warm-up, the last partial group and the cool-down
    exactly as they are, and with them every live count the schedule reaches."""
    warmup = (pp - rank - 1) * 2 + (vpp - 1) * group + extra_warmup
    periods = warmup // (group * vpp) + 4        # warm-up, then steady periods on both sides
    if m <= group * (periods + 1):
        return m
    return group * periods + m % group


def live_states(pp: int, rank: int, vpp: int, num_microbatches: int, group_size: int,
                combined_1f1b: bool = False) -> tuple[tuple[int, ...], ...]:
    """Every distinct count of microbatches alive per model chunk that the interleaved
    schedule reaches on this rank after a forward, in the order they first occur: the
    fullest moment ``microbatches_in_flight`` picks for any chunk weights is the first of
    them with the largest weighted sum (none above zero: no microbatch)."""
    extra = int(combined_1f1b)
    return _live_states(pp, rank, vpp, _equivalent_microbatches(pp, rank, vpp, num_microbatches, group_size, extra),
                        group_size, extra)


def steady_live_states(pp: int, rank: int, vpp: int, num_microbatches: int, group_size: int,
                       combined_1f1b: bool = False) -> tuple[tuple[int, ...], ...]:
    """The ``live_states`` that can be the fullest moment when every chunk weight is above
    zero, in the same order: during the warm-up the live counts only grow, so each count the
    warm-up reaches is below, chunk by chunk, the count after the next forward and never the
    first with the largest weighted sum.  They are the counts after the steady state's
    forwards (all of warm-up + 1 microbatches), or the warm-up's last where it has none."""
    extra = int(combined_1f1b)
    m = _equivalent_microbatches(pp, rank, vpp, num_microbatches, group_size, extra)
    states = _live_states(pp, rank, vpp, m, group_size, extra)
    # The warm-up's counts are its first entries (each holds one microbatch more than the last).
    warmup = min((pp - rank - 1) * 2 + (vpp - 1) * group_size + extra, m * vpp)
    return states[warmup:] or states[-1:]


@lru_cache(maxsize=4096)
def _live_states(pp: int, rank: int, vpp: int, m: int, group: int, extra_warmup: int = 0) -> tuple[tuple[int, ...], ...]:
    # schedules.py get_schedule_table: microbatches in groups of `group`, each group runs
    # every chunk in order; backward visits chunks in reverse.
    table = []
    for start in range(0, m, group):
        end = m if start + group >= m else start + group
        table.extend(chunk for chunk in range(vpp) for mb in range(start, end))
    total = m * vpp
    warmup = min((pp - rank - 1) * 2 + (vpp - 1) * group + extra_warmup, total)
    live = [0] * vpp
    states: dict[tuple[int, ...], None] = {}
    for k in range(warmup):
        live[table[k]] += 1
        states.setdefault(tuple(live))
    for k in range(total - warmup):
        live[table[k + warmup]] += 1
        states.setdefault(tuple(live))
        live[vpp - 1 - table[k]] -= 1
    return tuple(states)


@lru_cache(maxsize=4096)
def _interleaved_peak(pp: int, rank: int, vpp: int, m: int, group: int,
                      weights: tuple[int, ...], extra_warmup: int = 0) -> tuple[int, ...]:
    best = (0, (0,) * vpp)
    for state in _live_states(pp, rank, vpp, m, group, extra_warmup):
        weight = sum(w * n for w, n in zip(weights, state))
        if weight > best[0]:
            best = (weight, state)
    return best[1]
