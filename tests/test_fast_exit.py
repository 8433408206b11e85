"""``cli.entry_point`` ends the process with ``os._exit`` once stdout and stderr are flushed
(no interpreter teardown), but only where nothing else is owed at exit.  The output a pipe
receives, and the exit status, are those of the in-process ``cli.main``."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys

import pytest

from conftest import REPO

from megatron_estimator import cli

CLI = [sys.executable, "-m", "megatron_estimator"]
SMALL = ("--num-layers 2 --hidden-size 256 --num-attention-heads 4 --seq-length 512 "
         "--max-position-embeddings 512 --micro-batch-size 1 --global-batch-size 8 --vocab-size 1024 --bf16").split()


def _environ():
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MEGATRON_ESTIMATOR_") and k != "WORLD_SIZE"}
    environ["PYTHONPATH"] = str(REPO)
    return environ


def _in_process(args):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = cli.main(list(args))
    return status, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("args", [
    ["--version"],
    ["estimate", "--world-size", "8", "--budget", "80GiB", "--format", "json", "--", *SMALL],
    ["estimate", "--world-size", "8", "--budget", "1GiB", "--", *SMALL],
    ["estimate", "--world-size", "8", "--", "--num-layers", "2"],
    ["check", "examples/llama3-8b.yaml", "examples/llama3_8b_pretrain.sh"],
], ids=["version", "json-fits", "over-budget", "invalid", "check"])
def test_a_pipe_gets_everything_and_the_exit_status(args, monkeypatch):
    monkeypatch.chdir(REPO)
    for key in [k for k in os.environ if k.startswith("MEGATRON_ESTIMATOR_") or k == "WORLD_SIZE"]:
        monkeypatch.delenv(key)
    status, out, err = _in_process(args)
    done = subprocess.run(CLI + args, capture_output=True, text=True, env=_environ(), cwd=REPO, timeout=120)
    assert (done.returncode, done.stdout, done.stderr) == (status, out, err)


def test_a_profiler_still_writes_its_report(tmp_path):
    stats = tmp_path / "version.prof"
    done = subprocess.run([sys.executable, "-m", "cProfile", "-o", str(stats), "-m", "megatron_estimator", "--version"],
                          capture_output=True, text=True, env=_environ(), cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    assert stats.stat().st_size > 0


def test_atexit_callbacks_still_run(tmp_path):
    marker = tmp_path / "ran"
    code = ("import atexit, sys; from megatron_estimator import cli; "
            f"atexit.register(lambda: open({str(marker)!r}, 'w').close()); "
            "sys.argv = ['megatron-estimator', '--version']; cli.entry_point()")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_environ(), cwd=REPO,
                          timeout=120)
    assert (done.returncode, done.stdout) == (0, "megatron-estimator " + cli.__version__ + "\n")
    assert marker.exists()


class _Recorded(Exception):
    pass


def _quiet_process(monkeypatch):
    """Nothing owed at exit, whatever pytest's own process has registered."""
    import atexit
    import threading

    monkeypatch.setattr(atexit, "_ncallbacks", lambda: 0)
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    monkeypatch.setattr(sys, "gettrace", lambda: None)
    monkeypatch.setattr(sys, "getprofile", lambda: None)
    calls = []

    def fake_exit(status):
        calls.append(status)
        raise _Recorded

    monkeypatch.setattr(os, "_exit", fake_exit)
    return calls


def test_exits_at_once_with_the_status_when_nothing_is_owed(monkeypatch):
    calls = _quiet_process(monkeypatch)
    with pytest.raises(_Recorded):
        cli._exit_now(1)
    assert calls == [1]


@pytest.mark.parametrize("owed", ["atexit", "thread", "trace", "profile", "broken-stdout", "no-stderr"])
def test_returns_when_something_is_owed_at_exit(monkeypatch, owed):
    import atexit
    import threading

    calls = _quiet_process(monkeypatch)
    if owed == "atexit":
        monkeypatch.setattr(atexit, "_ncallbacks", lambda: 1)
    elif owed == "thread":
        monkeypatch.setattr(threading, "active_count", lambda: 2)
    elif owed == "trace":
        monkeypatch.setattr(sys, "gettrace", lambda: print)
    elif owed == "profile":
        monkeypatch.setattr(sys, "getprofile", lambda: print)
    elif owed == "broken-stdout":
        class Broken(io.StringIO):
            def flush(self):
                raise BrokenPipeError(32, "Broken pipe")
        monkeypatch.setattr(sys, "stdout", Broken())
    else:
        monkeypatch.setattr(sys, "stderr", None)
    cli._exit_now(0)
    assert calls == []
