"""Running a launch command unchanged: ``exec_launch(command)`` replaces this process with it."""

from __future__ import annotations

import os

from megatron_estimator.inputs.launch.command import LaunchCommand


def exec_launch(command: LaunchCommand) -> None:
    """Replace this process with the launch command: the same argv, the same environment.

    The environment is the one this process started with: the interpreter may have added to
    ``os.environ`` on its own (PEP 538 locale coercion sets LC_CTYPE=C.UTF-8 when the locale
    is C), which the job must not inherit.  Raises OSError when the command cannot be run.
    """
    environment = started_environment()
    if environment is None:
        os.execvp(command.argv[0], list(command.argv))
    os.execvpe(command.argv[0], list(command.argv), environment)


def started_environment() -> dict[str, str] | None:
    """This process's environment as it was at exec time (Linux ``/proc/self/environ``, which
    later ``setenv`` calls do not change), or None where that cannot be read."""
    try:
        with open("/proc/self/environ", "rb") as handle:
            block = handle.read()
    except OSError:
        return None
    environment = {}
    for entry in block.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep and name:
            environment[os.fsdecode(name)] = os.fsdecode(value)
    return environment

