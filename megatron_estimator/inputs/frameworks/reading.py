"""A launch of a framework's entry program read into Megatron settings (``read_framework_argv``,
called by ``inputs.entry_script.read_entry_argv`` before it reads a custom entry script)."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    from typing import Collection, Sequence

    from typing import Any as EntryScript      # inputs.entry_script.EntryScript (which imports this module)

    from megatron_estimator.inputs.argv import ArgvReading

from megatron_estimator.core.problems import Problem
from megatron_estimator.inputs.frameworks import _frameworks, adapt, framework_flags, recognise
from megatron_estimator.inputs.frameworks.adapter import Framework, load_flag_table, patched_megatron_flags
from megatron_estimator.inputs.rawargs import RawArgs, RawSetting


def _by_flags(unknown: Sequence[str]) -> tuple[Framework, tuple[str, ...]] | None:
    """A stack the estimator does not model, told by two or more flags only it registers (no source to read)."""
    for framework in _frameworks():
        if framework.unsupported is None or framework.flag_table is None:
            continue
        own = {o for spec in load_flag_table(framework.flag_table) for o in spec.option_strings}
        marks = tuple(flag for flag in unknown if flag in own)
        if len(marks) >= 2:         # one could be a slip; two of its own flags are its launch
            return framework, marks
    return None


def read_framework_argv(argv: Sequence[str], first: ArgvReading, entry: EntryScript, path: str | None,
                        base_dirs: Sequence[str], *, locations: Sequence[str] | None, source: str,
                        accepted: Collection[str], opaque: Collection[int], megatron_script: bool, accept_setting: str,
                        release: str = "main", python_path: str = ""
                        ) -> tuple[RawArgs, tuple[Problem, ...], EntryScript] | None:
    """The settings, problems and entry of a launch of a framework's entry program, or None when
    ``entry`` is no framework's (Megatron-LM's own, or a custom script).  ``megatron_script``: the
    entry is one of Megatron-LM's entry scripts; ``accept_setting``: how to accept flags, in words."""
    from megatron_estimator.inputs.argv import read_megatron_argv

    framework = recognise(entry.script, entry.is_module, path, argv, megatron_script, base_dirs)
    how = f"its entry program {entry.script}" + (" and its imports" if path is not None else " and its flags")
    if framework is None and first.unknown and (path is None or not os.path.isfile(path)):
        found = _by_flags(tuple(dict.fromkeys(u.spelled for u in first.unknown)))
        if found is not None:
            framework, marks = found
            how = "flags only it registers: " + ", ".join(marks)
    if framework is None:
        return None
    entry = replace(entry, path=path, framework=framework.name)
    if framework.unsupported is not None:
        message = (f"{framework.name} (recognised by {how}): {framework.unsupported}; check the job with "
                   "that stack's own tools, or launch it with Megatron-LM's entry scripts")
        return first.raw, (Problem("unsupported-stack", entry.location, message),), entry
    specs, origin = framework_flags(framework, path, base_dirs, release, python_path)
    if framework.read_argv is not None:     # it parses its whole argv itself (Megatron-Bridge)
        # a word whose text is not known here ($@) is left out, as the launch's notice says
        kept = [i for i in range(len(argv)) if i not in set(opaque)]
        read = framework.read_argv([argv[i] for i in kept], None if locations is None else
                                   [locations[i] for i in kept if i < len(locations)], entry, path, base_dirs,
                                   specs, release)
        said = (f"framework: {framework.name}, its flags read from {origin}",) if origin else ()
        entry = replace(entry, framework_flags=origin or None, assumptions=said + read.assumptions,
                        world_size=read.world_size, world_size_source=read.world_size_source,
                        environment=read.environment)
        return read.raw, tuple(read.problems), entry
    # Flags another parser takes apart (slime's --sglang-*, sglang_parse_args) are accepted as they are.
    apart = tuple(t.split("=", 1)[0] for t in argv if t.startswith(framework.prefixes)) if framework.prefixes else ()
    reading = read_megatron_argv(argv, locations=locations, source=source, script_flags=specs,
                                 accepted=tuple(accepted) + apart, opaque=opaque, release=release) if first.unknown else first
    adaptation = adapt(framework, argv, specs, opaque)
    where = f"{framework.name} ({entry.location})"
    forced = RawArgs({dest: RawSetting(dest, value, where) for dest, value in adaptation.settings.items()}, source)
    raw = reading.raw.merged(forced) if forced.settings else reading.raw
    if adaptation.co_resident:
        raw = replace(raw, co_resident=raw.co_resident + tuple(adaptation.co_resident))
    entry = replace(entry, framework_flags=origin, world_size=adaptation.world_size,
                    world_size_source=adaptation.world_size_source,
                    assumptions=(f"framework: {framework.name}, its flags read from {origin}",) + adaptation.assumptions)
    problems = reading.problems
    for flag, decides in adaptation.unknown:
        index = next((i for i, t in enumerate(argv) if t == flag or t.startswith(flag + "=")), None)
        at = locations[index] if locations is not None and index is not None and index < len(locations) else flag
        problems += (Problem("unknown-value", str(at), f"{flag}: its value is not known before the job runs, and "
                             f"{framework.name} takes {decides} from it; set it in the script or the environment"),)
    unknown = reading.unknown
    if unknown and framework.patched_megatron is not None:
        problems, unknown = _patched_megatron(framework, problems, unknown)
    if unknown:
        names = tuple(dict.fromkeys(u.spelled for u in unknown))
        dropped = {id(u.problem) for u in unknown}
        count = len(names)
        grouped = Problem("unknown-flag", unknown[0].problem.location,
                          f"{count} flag{'s' if count != 1 else ''} unknown to Megatron and to {framework.name} "
                          f"({origin}): {', '.join(names)}; if {'they belong' if count != 1 else 'it belongs'} to "
                          f"an extra_args_provider of your own and change{'' if count != 1 else 's'} neither "
                          f"the model nor memory, {accept_setting}")
        problems = tuple(p for p in problems if id(p) not in dropped) + (grouped,)
    return raw, tuple(problems), entry


def _patched_megatron(framework: Framework, problems: tuple, unknown: Sequence) -> tuple[tuple, tuple]:
    """The flags only the framework's patched Megatron-LM has (``Framework.patched_megatron``):
    one ``unsupported-stack`` problem naming them (their per-flag problems dropped), and the
    unknown flags left."""
    source, patched = patched_megatron_flags(framework.patched_megatron)
    theirs = tuple(u for u in unknown if u.spelled in patched)
    if not theirs:
        return problems, tuple(unknown)
    names = tuple(dict.fromkeys(u.spelled for u in theirs))
    dropped = {id(u.problem) for u in theirs}
    one = len(names) == 1
    releases = ",".join(dict.fromkeys(r for n in names for r in patched[n].split()))
    message = (f"{', '.join(names)}: {'a flag' if one else 'flags'} only {framework.name}'s patched Megatron-LM has "
               f"(docker/patch/{{{releases}}}/megatron.patch, {source}); the estimator models stock Megatron-LM, not "
               f"the model changes of that patch, so it cannot estimate this job as launched; remove "
               f"{'it' if one else 'them'} to estimate the stock-Megatron model instead (without what "
               f"{'it adds' if one else 'they add'})")
    problems = tuple(p for p in problems if id(p) not in dropped) + (
        Problem("unsupported-stack", theirs[0].problem.location, message),)
    return problems, tuple(u for u in unknown if u.spelled not in patched)
