"""What the unknown parts of a launch's Megatron flags change, so that only those that matter stop the check.

The shell reader marks what it cannot know statically (an unset variable, a script argument
not given, ``$(date +%s)``, a variable of the cluster's environment) with a ``Cause``.  Once the
launch is found, each Megatron token that carries one is judged by where it lands:

- in the place of a flag (``${EXTRA_ARGS}`` between flags): an unset variable, or ``"$@"`` of
  arguments not given, expands to no word at all, as bash does; the word is dropped and a
  notice says so.  Anything else there (``$(get_flags)``, an unset variable under ``set -u``)
  could be any flags: a problem.
- as the value of a flag: a problem when the flag changes validation or memory
  (``megatron.flag_effects``: modelled or not modelled), unless the value is a location (a
  file, a directory: ``--load``, ``--vocab-file``, what reads it is on the cluster); otherwise
  (a path, a name, a log or save location, a run-control number) a notice, and the check goes
  on without the value.

Notices are sentences with the ``file:line`` of the unknown value; the caller adds them to the
report's notes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from megatron_estimator.megatron.flag_effects import NO_MEMORY_EFFECT, NO_MEMORY_EFFECT_KIND, classify
from megatron_estimator.megatron.flags import FlagSpec, flag_table

# A string value whose dest ends so names a file or directory (the flag table's dests).
_LOCATION_SUFFIXES = ("_file", "_path", "_dir", "_cfg", "_config", "_load", "_save")
_LOCATION_DESTS = frozenset({"load", "save", "tokenizer_model"})


@dataclass(frozen=True)
class TokenRole:
    """Where a Megatron token lands: the flag whose value it is (None: the place of a flag, or
    with ``option`` a value after a flag Megatron does not know, the entry script's own)."""

    spec: FlagSpec | None
    option: str | None = None      # the flag as spelled


def framework_specs(script: str, is_module: bool, texts: Sequence[str], release: str = "main") -> tuple[FlagSpec, ...]:
    """The own flags of the framework whose entry program ``script`` is (inputs/frameworks), so
    that an unset variable after one of them is judged by that flag's arity; () for none."""
    from megatron_estimator.inputs.entry_script import known_script
    from megatron_estimator.inputs.frameworks import framework_flags, recognise

    framework = recognise(script, is_module, None, texts, known_script(script, is_module) is not None)
    if framework is None or framework.unsupported is not None:
        return ()
    return framework_flags(framework, None, (), release)[0]


def token_roles(texts: Sequence[str], extra: Sequence[FlagSpec] = (), release: str = "main") -> list[TokenRole]:
    """The flag each token is a value of, read as Megatron's argparse takes values: a known
    option (Megatron's, or one of ``extra``: a framework's own, whose values are never read
    by validation or memory; Megatron's of release ``release``) takes its nargs of the tokens after it that do not start with '-'."""
    table = flag_table(release)
    own = {option: spec for spec in extra for option in spec.option_strings}
    roles: list[TokenRole] = []
    current: FlagSpec | None = None
    spelled: str | None = None
    left = 0                             # values the current flag may still take
    own_left = 0                         # values the current framework flag may still take
    for text in texts:
        option = text.split("=", 1)[0] if text.startswith("--") else text
        spec = table.by_option(option) if text.startswith("-") else None
        if spec is None and option in own:
            # A framework's flag: its arity is known; its values reach neither validation nor memory.
            framework = own[option]
            roles.append(TokenRole(None))
            current, spelled, left = None, None, 0
            if framework.takes_value and "=" not in text:
                nargs = framework.nargs
                own_left = 1 if nargs in (None, "?") else 10 ** 9 if nargs in ("*", "+") else int(nargs)
                spelled = option if own_left else None
            continue
        if own_left and not text.startswith("-"):
            roles.append(TokenRole(None, spelled))      # a value of the framework's flag
            own_left -= 1
            spelled = spelled if own_left else None      # then the place of a flag again
            continue
        own_left = 0
        if spec is not None:
            if "=" in text and text.startswith("--") and spec.takes_value:
                roles.append(TokenRole(spec, option))
                current, left = None, 0
                continue
            roles.append(TokenRole(None))
            current, spelled = spec, option
            nargs = spec.nargs
            left = 0 if not spec.takes_value else 1 if nargs in (None, "?") else \
                10 ** 9 if nargs in ("*", "+") else int(nargs)
            continue
        if text.startswith("--"):
            roles.append(TokenRole(None))
            current, spelled, left = None, option, 0     # a flag Megatron does not know: its values follow
            continue
        if current is not None and left > 0:
            roles.append(TokenRole(current, spelled))
            left -= 1
            continue
        roles.append(TokenRole(None, spelled if current is None else None))
    return roles


def is_location(spec: FlagSpec) -> bool:
    """A flag whose value names a file or directory."""
    if spec.type not in (None, "str"):
        return False
    return spec.dest in _LOCATION_DESTS or spec.dest.endswith(_LOCATION_SUFFIXES)


def why_irrelevant(spec: FlagSpec) -> str | None:
    """Why an unknown value of this flag need not stop the check, or None when it must."""
    try:
        kind = classify(spec.dest)
    except KeyError:
        return None
    if kind == NO_MEMORY_EFFECT_KIND:
        return f"{NO_MEMORY_EFFECT.get(spec.dest, 'no memory effect')}: it changes neither validation nor memory"
    if is_location(spec):
        return "a location the job reads on its own machines, not this check"
    return None
