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
