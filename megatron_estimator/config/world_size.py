"""The world size a job is estimated on: the one check every front makes (``--world-size``,
the API's ``world_size``, ``WORLD_SIZE``, the launch's own), bounded by ``core.limits``."""
from __future__ import annotations

from typing import Any, Mapping

from megatron_estimator.core.limits import bounded_world_size
from megatron_estimator.core.problems import Problem
from megatron_estimator.core.sourced import Sourced


def world_size_for(inp: Any, given: int | None = None, given_source: str | None = None, *,
                   environ: Mapping[str, str] | None = None, say_launch: bool = False, location: str | None = None
                   ) -> tuple[Sourced | None, tuple[Problem, ...]]:
    """The world size to estimate on with where it came from (a ``Sourced``; None: no source
    gives one), and any problem with it.

    The first source that gives one wins: ``given`` (``--world-size``, the ``world_size``
    argument); ``WORLD_SIZE`` in ``environ``, passed only by the fronts whose environment
    is the job's own (``estimate`` and ``plan`` on the command line); the input's own (the
    launcher's ``--nproc-per-node x --nnodes``, a seed YAML's ``world_size``, a launch
    script's).  None of them: ``config.resolve`` takes the smallest world the layout needs
    (data parallel 1), or reports ``inp.world_size_unknown`` for a launch (``inp`` None: the
    input is not read yet, its own size is not asked).  ``say_launch``
    (``run``): a given size's source also names what the launch command itself says.  Every
    front checks a given size here, the same way: one that is not a positive integer is an
    ``invalid-world-size`` problem at ``location`` (default ``given_source``)."""
    if given is not None and (isinstance(given, bool) or not isinstance(given, int) or given < 1):
        where = location or given_source or "--world-size"
        return None, (Problem("invalid-world-size", where, f"{where} must be a positive integer, not {given!r}"),)
    value, source, problems = bounded_world_size(*_world_size_from(inp, given, given_source, environ, say_launch))
    return (Sourced(value, source) if value is not None else None), problems


def _world_size_from(inp, given, given_source, environ, say_launch):
    if given is not None:
        source = given_source or "--world-size"
        if say_launch and inp is not None and inp.world_size is not None and inp.world_size != given:
            source += f" (the launch command itself says {inp.world_size}: {inp.world_size_source})"
        return given, source, ()
    if environ is not None and environ.get("WORLD_SIZE") is not None:
        raw = environ["WORLD_SIZE"]
        try:
            value = int(raw)
        except ValueError:
            value = 0
        if value < 1:
            return None, None, (Problem("invalid-world-size", "WORLD_SIZE",
                                        f"WORLD_SIZE={raw!r} is not a positive integer"),)
        return value, f"WORLD_SIZE={value} in the environment", ()
    return (inp.world_size, inp.world_size_source, ()) if inp is not None else (None, None, ())
