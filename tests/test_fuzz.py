"""The fuzz seeds of tests/fuzz/generate.py (issue 30): every command on hostile input ends with
exit 0, 1 or 2, never an internal error, every error line located and on one line, within a
1 GiB address space and a generous time limit (a non-hang proof, not a timing assertion)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("fuzz_generate", REPO / "tests" / "fuzz" / "generate.py")
generate = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(generate)

LIMIT_BYTES = 1 << 30
# Python, torch-free: the estimator's own import plus the input stays far below 1 GiB of address
# space; the limit is set in the child before it starts.
_RUNNER = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit})); "
           "sys.path.insert(0, {repo!r}); from megatron_estimator.cli import main; sys.exit(main(sys.argv[1:]))")

SEEDS = generate.seeds()


def _run(case: dict, folder: Path) -> subprocess.CompletedProcess:
    for name, text in case["files"].items():
        (folder / name).write_bytes(text.encode("utf-8", "surrogateescape"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEGATRON_ESTIMATOR_")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run([sys.executable, "-c", _RUNNER.format(limit=LIMIT_BYTES, repo=str(REPO)), *case["argv"]],
                          cwd=folder, env=env, capture_output=True, timeout=60)


def test_the_seeds_cover_every_surface():
    surfaces = {case["name"].split("-")[0] for case in SEEDS}
    assert {"yaml", "hf", "shell", "log", "plan", "estimate", "settings"} <= surfaces


@pytest.mark.parametrize("case", SEEDS, ids=[case["name"] for case in SEEDS])
def test_hostile_input_is_one_located_problem(case, tmp_path):
    done = _run(case, tmp_path)
    out = (done.stdout + done.stderr).decode("utf-8", "replace")
    assert done.returncode in (0, 1, 2), out[-2000:]
    assert "internal error" not in out and "Traceback" not in out, out[-2000:]
    assert "MemoryError" not in out
    # nothing the input said reaches the terminal raw: no escape or other control characters
    assert not any(ch < " " and ch not in "\n" for ch in out), repr(out[-500:])
    for line in out.splitlines():
        if line.lstrip().startswith("error: "):
            location = line.split("error: ", 1)[1].split(": ", 1)
            assert len(location) == 2 and location[0].strip(), line      # "error: LOCATION: message"


def test_a_log_line_of_repeated_rank_prefixes_is_read_in_linear_time():
    # Found by the campaign (generate.py --campaign, case log-675): 5,000 copies of a cut report
    # joined by U+2028 on one line made the memory pattern rescan the line from every "[Rank":
    # 39 s.  The report name is bounded now; a whole report on the same line still reads.
    import time

    from megatron_estimator.inputs.megatron_log import parse_megatron_log

    cut = "[Rank 17] (after 10 iterations) memory (MB) | allocated: ~ | max allocated: \u2028"
    whole = ("[Rank 3] (after 10 iterations) memory (MB) | allocated: 1 | max allocated: 2 | "
             "reserved: 3 | max reserved: 4\n")
    start = time.perf_counter()
    log = parse_megatron_log(cut * 5000 + "\n" + whole, "train.log")
    assert time.perf_counter() - start < 2.0
    [report] = log.memory
    # 1 MB and 4 MB as Megatron prints them (MiB): 1 * 2**20 and 4 * 2**20 bytes
    assert (report.rank, report.allocated, report.max_reserved) == (3, 1 << 20, 4 << 20)
