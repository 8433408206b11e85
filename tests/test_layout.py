"""Pipeline schedule: microbatches in flight per stage, 1F1B and interleaved."""

from megatron_estimator.model.layout import microbatches_in_flight
from megatron_estimator.config.layout_syntax import LayoutSyntaxError, parse_layout

import pytest


def test_one_f_one_b_holds_p_minus_r():
    assert [microbatches_in_flight(4, r, None, 8, 4).chunk_microbatches for r in range(4)] == [(4,), (3,), (2,), (1,)]


def test_one_f_one_b_limited_by_microbatches():
    assert [microbatches_in_flight(4, r, None, 2, 4).chunk_microbatches for r in range(4)] == [(2,), (2,), (2,), (1,)]


def test_no_pipeline_holds_one():
    assert microbatches_in_flight(1, 0, None, 16, 1).chunk_microbatches == (1,)


def test_interleaved_rank0_peaks_at_warmup_plus_one():
    # pp 2, vpp 2, 4 microbatches, groups of 2: rank 0 warms up with
    # (2 - 0 - 1) * 2 + (2 - 1) * 2 = 4 forwards, then holds 5 chunk-microbatches.
    # schedules.py get_schedule_table: (mb, chunk) = (0,0) (1,0) (0,1) (1,1) | (2,0) (3,0) (2,1) (3,1).
    # Warm-up runs the first four: chunk 0 holds 2, chunk 1 holds 2; the first steady step's
    # forward (2,0) makes it 3 + 2 before its backward (of (0,0), i.e. chunk 1) frees one.
    inflight = microbatches_in_flight(2, 0, 2, 4, 2)
    assert inflight.warmup == 4
    assert inflight.chunk_microbatches == (3, 2)


def test_interleaved_last_rank():
    # Rank 1 warms up with (2 - 1 - 1) * 2 + (2 - 1) * 2 = 2 forwards, (0,0) and (1,0); the first
    # steady forward (0,1) gives 2 + 1 before the backward of chunk 1 frees one.
    inflight = microbatches_in_flight(2, 1, 2, 4, 2)
    assert inflight.warmup == 2
    assert inflight.chunk_microbatches == (2, 1)


def test_interleaved_all_warmup_when_few_microbatches():
    # 8 virtual stages and 4 microbatches: every chunk-microbatch runs forward first.
    inflight = microbatches_in_flight(4, 0, 8, 4, 4)
    assert inflight.chunk_microbatches == (4,) * 8


def test_heavier_chunk_decides_the_peak_moment():
    # When chunk 1 weighs more (the loss lives there), the fullest moment has more of it alive.
    equal = microbatches_in_flight(2, 1, 2, 8, 2)
    heavy = microbatches_in_flight(2, 1, 2, 8, 2, chunk_weights=(1, 100))
    assert sum(equal.chunk_microbatches) == 3
    assert heavy.chunk_microbatches[1] >= equal.chunk_microbatches[1]


def test_layout_syntax_expands_groups_and_repeats():
    assert parse_layout("Et*2|(tt|)*2t|tmL") == (("E", "t", "t"), ("t", "t"), ("t", "t"), ("t",), ("t", "m", "L"))
    assert parse_layout("E,t|t,L") == (("E", "t"), ("t", "L"))


@pytest.mark.parametrize("text, message", [
    ("Et|x|L", "invalid layer character 'x'"),
    ("E(tt|L", "'(' is never closed"),
    ("E(tt)|L", "must be followed by '*n'"),
    ("E((t)*2)*2|L", "groups cannot nest"),
    ("E*|L", "'*' must be followed by a repeat count"),
])
def test_layout_syntax_errors(text, message):
    with pytest.raises(LayoutSyntaxError, match=message.replace("(", r"\(").replace("*", r"\*")):
        parse_layout(text)


def test_interleaved_peak_of_many_microbatches_is_simulated_on_an_equivalent_count():
    # The schedule repeats every group of microbatches: removing whole periods from the middle
    # keeps every live count, so a global batch of 10^12 samples costs what a small one does.
    from megatron_estimator.model.layout import _equivalent_microbatches, _interleaved_peak

    for pp, vpp, group in ((2, 2, 1), (4, 2, 4), (3, 3, 2), (4, 4, 5)):
        for rank in range(pp):
            for extra in (0, 1):
                for m in range(1, 70):
                    weights = (1,) * (vpp - 1) + (3,)
                    small = _equivalent_microbatches(pp, rank, vpp, m, group, extra)
                    assert small <= m
                    assert _interleaved_peak(pp, rank, vpp, m, group, weights, extra) == \
                        _interleaved_peak(pp, rank, vpp, small, group, weights, extra)
    assert _equivalent_microbatches(4, 0, 2, 10**12, 4, 0) == 4 * 5
    assert microbatches_in_flight(4, 0, 2, 10**12, 4).chunk_microbatches == \
        microbatches_in_flight(4, 0, 2, 4 * 5, 4).chunk_microbatches


def _schedule_states(pp, rank, vpp, m, group, extra):
    """Live microbatches per chunk after each forward of the interleaved schedule, simulated
    here on its own (schedules.py get_schedule_table: groups of ``group`` microbatches run every
    chunk in turn; backward visits the chunks in reverse), with the warm-up's length."""
    order = []
    for start in range(0, m, group):
        order += [chunk for chunk in range(vpp) for _ in range(min(group, m - start))]
    warmup = min((pp - rank - 1) * 2 + (vpp - 1) * group + extra, m * vpp)
    live, states = [0] * vpp, []
    for k in range(m * vpp):
        live[order[k]] += 1
        states.append(tuple(live))
        if k >= warmup:
            live[vpp - 1 - order[k - warmup]] -= 1
    return states, warmup


def test_only_the_steady_states_can_be_the_fullest_with_positive_weights():
    # steady_live_states (the planner's shortcut for chunk weights above zero) keeps, in order,
    # the counts that can be the first heaviest: every count it drops is below a kept one chunk
    # by chunk, and the first heaviest over all counts is among those kept, for any positive weights.
    import random
    from megatron_estimator.model.layout import live_states, steady_live_states

    rng = random.Random(11)
    for pp in (2, 3, 4, 6):
        for vpp in (2, 3, 4):
            for group in (pp, 2 * pp):
                for m in list(range(1, 4 * group + 2)) + [61, 200]:
                    for rank in range(pp):
                        for extra in (0, 1):
                            states, warmup = _schedule_states(pp, rank, vpp, m, group, extra)
                            every = live_states(pp, rank, vpp, m, group, bool(extra))
                            kept = steady_live_states(pp, rank, vpp, m, group, bool(extra))
                            assert list(every) == list(dict.fromkeys(states))
                            assert list(kept) == [s for s in every if s in kept]
                            for s in set(states) - set(kept):
                                assert any(t != s and all(a >= b for a, b in zip(t, s)) for t in kept)
                            for _ in range(4):
                                weights = tuple(rng.choice((1, rng.randint(1, 9), 10**9)) for _ in range(vpp))

                                def first_heaviest(candidates):
                                    return max(candidates, key=lambda s: (sum(map(int.__mul__, s, weights)),
                                                                          -candidates.index(s)))
                                assert first_heaviest(list(kept)) == first_heaviest(states) == \
                                    microbatches_in_flight(pp, rank, vpp, m, group, weights,
                                                           bool(extra)).chunk_microbatches
