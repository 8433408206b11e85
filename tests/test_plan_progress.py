"""The planner's progress report: ``planner.search`` calls the progress callback once its clock
has passed a second and about once a second after, never sooner; ``megatron-estimator plan``
writes it on stderr only (one line each, or one rewritten line on a terminal), so its JSON on
stdout stays clean.  The clock is injected: nothing here depends on how fast the machine is."""

from __future__ import annotations

import io
import json
import os

from conftest import LLAMA3_8B, TINY_GPT, flags
from megatron_estimator import api
from megatron_estimator.cli import PlanProgress, main
from megatron_estimator.planner import search as planner_search
from megatron_estimator.results.plan import SearchProgress

GiB = 1 << 30


class SteppingClock:
    """A fake clock: each reading is ``step`` seconds after the one before, from 0."""

    def __init__(self, step: float):
        self.step, self.readings = step, 0

    def __call__(self) -> float:
        value = self.readings * self.step
        self.readings += 1
        return value


def _plan(clock, seen):
    return api.plan(flags(LLAMA3_8B), world_size=8, global_batch_size=32, budget="80GiB", environ={},
                    top=1, verify=False, clock=clock, progress=seen.append)


def test_no_progress_before_a_second():
    # A clock that reads 0.999 s after the start, however long the search runs.
    readings = iter([0.0])
    seen: list[SearchProgress] = []
    plan = _plan(lambda: next(readings, 0.999), seen)
    assert seen == []
    assert plan.searched == 5224          # the space test_planner.py's CLI test counts


def test_progress_once_the_clock_passes_a_second():
    # Readings 0, 0.25, 0.5, ...: api.plan reads the start (0), then the search reads the clock
    # at each family and expert choice; the first reading at 1.0 s (the 5th) fires the
    # callback, and then each reading a whole second later (every 4th).
    clock = SteppingClock(0.25)
    seen: list[SearchProgress] = []
    fired_at: list[int] = []
    plan = api.plan(flags(LLAMA3_8B), world_size=8, global_batch_size=32, budget="80GiB", environ={},
                    top=1, verify=False, clock=clock,
                    progress=lambda state: (seen.append(state), fired_at.append(clock.readings)))
    assert fired_at[0] == 5
    assert [state.seconds for state in seen] == [float(i) for i in range(1, len(seen) + 1)]
    assert all(b - a == 4 for a, b in zip(fired_at, fired_at[1:]))
    searched = [state.searched for state in seen]
    assert searched == sorted(searched) and searched[-1] <= plan.searched
    assert all(state.fitting <= state.searched for state in seen)
    families = {state.families for state in seen}
    assert len(families) == 1 and all(1 <= state.families_started <= state.families for state in seen)


def test_a_fast_search_reports_nothing_with_the_real_clock_default():
    seen: list[SearchProgress] = []
    # The callback may fire on a slow machine; when it does, it is only after a second.
    api.plan(flags(TINY_GPT), world_size=4, global_batch_size=16, budget=4 * GiB, environ={}, top=1,
             verify=False, progress=seen.append)
    assert all(state.seconds >= 1.0 for state in seen)


class _Stream(io.StringIO):
    def __init__(self, terminal: bool):
        super().__init__()
        self.terminal = terminal

    def isatty(self) -> bool:
        return self.terminal


STATE = SearchProgress(searched=212000, fitting=14, families_started=12, families=447, seconds=2.4)


def test_progress_lines_on_a_pipe():
    stream = _Stream(terminal=False)
    report = PlanProgress(stream)
    report(STATE)
    report(SearchProgress(315168, 19503, 289, 447, 3.0))
    report.finish()
    assert stream.getvalue() == (
        "plan: 212,000 layouts searched, 14 fit so far (layout family 12 of 447, 2 s)\n"
        "plan: 315,168 layouts searched, 19,503 fit so far (layout family 289 of 447, 3 s)\n")


def test_progress_line_rewritten_on_a_terminal():
    stream = _Stream(terminal=True)
    report = PlanProgress(stream)
    report(SearchProgress(315168, 19503, 289, 447, 3.0))
    report(STATE)
    report.finish()
    long = "plan: 315,168 layouts searched, 19,503 fit so far (layout family 289 of 447, 3 s)"
    short = "plan: 212,000 layouts searched, 14 fit so far (layout family 12 of 447, 2 s)"
    assert stream.getvalue() == "\r" + long + "\r" + short.ljust(len(long)) + "\n"


def test_terminal_with_nothing_reported_writes_nothing():
    stream = _Stream(terminal=True)
    PlanProgress(stream).finish()
    assert stream.getvalue() == ""


def test_cli_plan_json_stays_clean_with_progress(monkeypatch, capsys):
    # Progress due at once and at every reading: the search reports all the way through.
    monkeypatch.setattr(planner_search, "PROGRESS_AFTER_SECONDS", 0.0)
    monkeypatch.setattr(planner_search, "PROGRESS_EVERY_SECONDS", 0.0)
    for name in [k for k in os.environ if k.startswith("MEGATRON_ESTIMATOR_") or k == "WORLD_SIZE"]:
        monkeypatch.delenv(name)
    status = main(["plan", "--world-size", "8", "--budget", "80GiB", "--global-batch-size", "32", "--top", "1",
                   "--format", "json", "--"] + flags(LLAMA3_8B))
    out, err = capsys.readouterr()
    assert status == 0
    doc = json.loads(out)
    assert doc["searched"] == 5224
    lines = err.splitlines()
    assert lines and all(line.startswith("plan: ") and "layouts searched" in line for line in lines)
