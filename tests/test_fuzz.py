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


# -- bounds on what the campaigns found slow (counts, not timings) ----------------------------

def test_a_script_sourcing_itself_is_parsed_once(tmp_path, monkeypatch):
    # Campaign case shell-2202 (19 s): a 300 KB script sourcing itself was parsed again on each
    # of the 16 levels the reader follows.  Now each sourced file is parsed once: the script
    # itself (as train.sh) and the sourced copy (as ./train.sh, its own spelling in messages).
    from megatron_estimator.inputs.bash import reader
    from megatron_estimator.inputs.launch.script import load_launch_script

    parsed = []
    real = reader.parse
    monkeypatch.setattr(reader, "parse", lambda text, origins: parsed.append(len(text)) or real(text, origins))
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/bash\n. ./train.sh\n" + "torchrun --nproc-per-node 8 pretrain_gpt.py\n" * 2000)
    monkeypatch.chdir(tmp_path)
    _, problems = load_launch_script("train.sh", environ={})
    assert [p.message for p in problems if p.location == "./train.sh:2"] == ["sourced files nest too deeply to follow"]
    assert parsed == [script.stat().st_size] * 2


def test_the_sourced_text_is_bounded_in_all(tmp_path, monkeypatch):
    from megatron_estimator.inputs.bash.state import ShellBudget
    from megatron_estimator.inputs.launch.script import load_launch_script

    monkeypatch.setattr(ShellBudget, "MAX_SOURCED", 100)
    (tmp_path / "a.sh").write_text("X=1\n" * 15)        # 60 characters: 60 <= 100
    (tmp_path / "b.sh").write_text("Y=2\n" * 15)        # 60 more: 120 > 100, refused at line 3
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/bash\n. ./a.sh\n. ./b.sh\ntorchrun --nproc-per-node 8 pretrain_gpt.py\n")
    monkeypatch.chdir(tmp_path)
    _, problems = load_launch_script("train.sh", environ={})
    assert [(p.location, p.message) for p in problems if "sources more" in p.message] == [
        ("train.sh:3", "the script sources more than 100 characters of shell text in all, the limit of what this tool follows")]


def test_defaults_fanned_out_read_a_bounded_number_of_files(tmp_path, monkeypatch):
    # Campaign case tree-nemorl-7763 (28 s): eight defaults of eight defaults ... (8 + 64 + 512
    # reads for three levels; NeMo-RL reads a file once per path).  At most 64 reads complete;
    # the five files open on the inheritance path c -> b0 -> b1 -> b2 -> b3 may add theirs.
    pytest.importorskip("omegaconf")
    from megatron_estimator.inputs.trees import nemo_rl

    for i in range(4):
        (tmp_path / f"b{i}.yaml").write_text(f"defaults: [{', '.join([f'b{i + 1}.yaml'] * 8)}]\npolicy:\n  x: 1\n")
    (tmp_path / "b4.yaml").write_text("policy:\n  model_name: m\n")
    (tmp_path / "c.yaml").write_text("defaults: b0.yaml\npolicy:\n  x: 1\n")
    reads = []
    real = nemo_rl.read_input_text
    monkeypatch.setattr(nemo_rl, "read_input_text", lambda path, kind: reads.append(path) or real(path, kind))
    reading = nemo_rl.read_nemo_rl(str(tmp_path / "c.yaml"))
    [problem] = reading.problems
    assert "reads more than 64 files in all" in problem.message and problem.location.endswith("defaults")
    assert 64 <= len(reads) <= 64 + 5


def test_collecting_problems_is_linear(monkeypatch):
    # Campaign case log-906 (11 s): 10,000 bad lines, each a problem, each compared with every
    # earlier one (50 million comparisons).  Distinct problems compare by hash now.
    from megatron_estimator.core.problems import Problem, ProblemCollector

    compared = [0]
    real = Problem.__eq__
    monkeypatch.setattr(Problem, "__eq__", lambda a, b: compared.__setitem__(0, compared[0] + 1) or real(a, b))
    collector = ProblemCollector()
    for i in range(10_000):
        collector.add("bad", f"train.log:{i + 1}", "not an arguments line")
    collector.add("bad", "train.log:1", "not an arguments line")        # a duplicate: dropped
    assert len(collector) == 10_000 and collector.problems[0].location == "train.log:1"
    assert compared[0] < 100


_EST = ["estimate", "--model", "llama3-8b", "--gpu", "h100", "--"]


@pytest.mark.parametrize("path", ["a\x00b.yaml", "\ud800.yaml", "", "x" * 300],
                         ids=["nul", "surrogate", "empty", "long"])
@pytest.mark.parametrize("argv", [_EST + ["--seq-length", "128", "--yaml-cfg"], ["check"], ["compare"],
                                  ["estimate", "--gpu", "h100", "--hf-config"]],
                         ids=["yaml-cfg", "check", "compare", "hf-config"])
def test_a_path_no_file_can_have_is_one_located_problem(argv, path, tmp_path, monkeypatch, capsys):
    # A NUL byte or a lone surrogate cannot come through a real command line (the campaign
    # calls main() in-process, as the API and a settings file can): one error line, exit 2.
    from megatron_estimator.cli import main

    monkeypatch.chdir(tmp_path)
    code = main(argv + [path])
    out = capsys.readouterr()
    # "  error: LOCATION: message", or a usage error "megatron-estimator CMD: error: ..." (an
    # empty --hf-config or log is no argument at all)
    errors = [line for line in (out.out + out.err).splitlines() if "error: " in line]
    assert code == 2 and len(errors) == 1, out
    location = errors[0].split("error: ", 1)[1].split(": ", 1)[0] if errors[0].lstrip().startswith("error: ") \
        else errors[0].split(": error: ", 1)[0]
    assert location.strip() and "\x00" not in errors[0], errors
