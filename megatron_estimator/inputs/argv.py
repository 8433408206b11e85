"""Read a Megatron command line the way Megatron's parser does: argv -> ``RawArgs`` + problems.

``parse_megatron_argv`` mirrors ``argparse`` as Megatron configures it
(``argparse.ArgumentParser(allow_abbrev=False)``, arguments.py ``parse_args``), using the flag
table of ``megatron_estimator.megatron.flags``: option strings match exactly (no
abbreviations); ``--flag value`` and ``--flag=value``; ``store_true``, ``store_false`` and
``BooleanOptionalAction`` (``--x`` / ``--no-x``); nargs ``?``, ``*``, ``+`` and counts; a token
is a value unless it looks like an option, and ``-1`` or ``-.5`` are values because no Megatron
option looks like a negative number (argparse's rule up to Python 3.13: ``-1e-5`` is *not* such
a number, so write ``--flag=-1e-5``; 3.14 widened the rule); the last repetition of a flag wins.
Values are converted with the flag's converter and checked against its choices.  Instead of
stopping at the first error, as argparse does, every problem is returned, in command-line order;
nothing is printed or raised for bad input.

Flags that exist only with an optional extension are accepted: whether the training
environment has the extension cannot be known from here.  ``conditional_flag_notes`` names the
ones a ``RawArgs`` uses, as notes to show, not as problems.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Collection, Mapping, Sequence

import re
from megatron_estimator.core.problems import Problem, ProblemCollector
from megatron_estimator.inputs.rawargs import RawArgs, RawSetting
from megatron_estimator.megatron.flags import (
    BOOLEAN_OPTIONAL,
    CONDITIONS,
    FlagChoiceError,
    FlagSpec,
    FlagTable,
    FlagValueError,
    closest_flags,
    convert_value,
    flag_table,
)
from megatron_estimator.megatron.releases import NEWEST

# The ``conditional`` of the flags an entry script registers (inputs/script_flags.py).
SCRIPT_CONDITION = "entry-script"

# argparse's test for a negative number (ArgumentParser._negative_number_matcher, Python 3.10-3.11;
# 3.12/3.13 also accept underscores, 3.14 also exponents).
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")
_NUMBER_LIKE = re.compile(r"-\.?\d")
_HELP = ("-h", "--help")


def _looks_like_option(token: str, table: FlagTable, extra: Collection[str] = ()) -> bool:
    """argparse's _parse_optional for Megatron's parser: is ``token`` an option (O) or a value (A)?
    ``extra``: option strings the entry script adds (and flags accepted as its own)."""
    if not token or token[0] != "-":
        return False
    if token in table or token in _HELP or token in extra:
        return True
    if len(token) == 1:
        return False
    if "=" in token and (token.split("=", 1)[0] in table or token.split("=", 1)[0] in extra):
        return True
    if _NEGATIVE_NUMBER.match(token):
        return False        # no Megatron option looks like a negative number
    return " " not in token


def _count(n: int) -> str:
    return "one value" if n == 1 else f"{n} values"


@dataclass(frozen=True)
class UnknownFlag:
    """An option that neither Megatron nor the entry script registers, and its problem."""

    spelled: str                       # as typed, without a glued value
    suggestions: tuple[str, ...]       # the closest known flags
    problem: Problem                   # the ``unknown-flag`` problem reported for it


@dataclass(frozen=True)
class ArgvReading:
    """What ``read_megatron_argv`` found: the settings, every problem, the unknown flags."""

    raw: RawArgs
    problems: tuple[Problem, ...]
    unknown: tuple[UnknownFlag, ...] = ()


def parse_megatron_argv(argv: Sequence[str], *, locations: Sequence[str] | None = None,
                        source: str = "command line", release: str = NEWEST) -> tuple[RawArgs, tuple[Problem, ...]]:
    """Megatron's flags in ``argv`` -> the settings given, and every problem found, by the
    flags of release ``release`` (a label of ``data/megatron_releases.tsv``).

    ``argv`` is what follows the training script (``pretrain_gpt.py``).  ``locations``, one per
    token, names where each token came from (``run.sh:12``); a setting's location is then
    ``run.sh:12 --num-layers``, else the option as spelled.  Problem codes: ``unknown-flag``,
    ``help-flag``, ``missing-value``, ``invalid-value``, ``invalid-choice``,
    ``unexpected-argument``, ``ignored-explicit-value``.
    """
    reading = read_megatron_argv(argv, locations=locations, source=source, release=release)
    return reading.raw, reading.problems


def read_megatron_argv(argv: Sequence[str], *, locations: Sequence[str] | None = None,
                       source: str = "command line", script_flags: Sequence[FlagSpec] = (),
                       accepted: Collection[str] = (), opaque: Collection[int] = (), release: str = NEWEST) -> ArgvReading:
    """``parse_megatron_argv`` with the flags an entry script adds to Megatron's parser
    (``script_flags``, read by ``inputs.script_flags``: parsed with their own arity and
    choices, their values checked but not kept, since Megatron's model does not read them) and
    option strings ``accepted`` as the script's own without knowing their arity (each takes
    the values up to the next option, as argparse sets unrecognized arguments aside).
    ``opaque``: the indexes of tokens whose text is not known statically (a launch script's
    ``$CKPT``, already reported or noticed): a flag's value among them is taken as argparse
    would, and kept only when it converts; a flag left without a value is in ``RawArgs.opaque``."""
    tokens = list(argv)
    if locations is not None and len(locations) != len(tokens):
        raise ValueError(f"locations has {len(locations)} entries for {len(tokens)} tokens")
    table = flag_table(release)
    return _read_argv(tokens, table, locations, source, script_flags, accepted, opaque, release)


def _read_argv(tokens: list[str], table: FlagTable, locations: Sequence[str] | None, source: str,
               script_flags: Sequence[FlagSpec], accepted: Collection[str], opaque: Collection[int],
               release: str) -> ArgvReading:
    """``read_megatron_argv`` on any command line, with every problem."""
    problems = ProblemCollector()
    settings: dict[str, RawSetting] = {}
    script_specs: Mapping[str, FlagSpec] = {o: spec for spec in script_flags for o in spec.option_strings
                                            if o not in table}
    accepted = frozenset(accepted)       # membership only: a set, whatever collection was given
    extra = frozenset(script_specs) | accepted
    unknown: list[UnknownFlag] = []
    unknown_dests: set[str] = set()

    def where(index: int, spelled: str | None) -> str:
        if locations is not None:
            return f"{locations[index]} {spelled}" if spelled else locations[index]
        return spelled or "<command>"

    # argparse's pattern of the command line: O (option), A (value), '-' ('--', after which
    # everything is a value).
    kinds: list[str] = []
    for index, token in enumerate(tokens):
        if token == "--":
            kinds.append("-")
            kinds.extend("A" * (len(tokens) - index - 1))
            break
        kinds.append("O" if _looks_like_option(token, table, extra) else "A")

    def run_of_values(start: int) -> int:
        stop = start
        while stop < len(tokens) and kinds[stop] == "A":
            stop += 1
        return stop

    previous: tuple[int, str, FlagSpec, int] | None = None   # option's token index, spelling, spec, values taken
    i = 0
    while i < len(tokens):
        token, kind = tokens[i], kinds[i]
        if kind == "-":
            rest = len(tokens) - i - 1
            after = f" and the {_plural(rest, 'argument')} after it" if rest else ""
            problems.add("unexpected-argument", where(i, None),
                         f"'--' ends the options; Megatron rejects it{after}")
            break
        if kind == "A":
            stop = run_of_values(i)
            stray = " ".join(repr(t) for t in tokens[i:stop])
            noun = "argument" if stop - i == 1 else "arguments"
            if previous is None:
                problems.add("unexpected-argument", where(i, None),
                             f"unexpected {noun} {stray}: Megatron takes only --flags "
                             "(is a flag missing before it?)")
            else:
                p_index, p_spelled, p_spec, taken = previous
                why = ("this flag takes no value" if not p_spec.takes_value
                       else f"this flag takes {_count(taken)}")
                problems.add("unexpected-argument", where(p_index, p_spelled),
                             f"unexpected {noun} {stray} ({why})")
            previous = None
            i = stop
            continue

        # An option: exact, or exact before '=' (allow_abbrev=False: no prefixes).
        option_index = i
        spelled, explicit = token, None
        if token not in table and token not in extra and "=" in token:
            spelled, explicit = token.split("=", 1)
        spec = table.by_option(spelled) or script_specs.get(spelled)
        location = where(option_index, spelled)
        if spec is None:
            if spelled in accepted:
                pass                   # the entry script's own, as the settings say
            elif spelled in _HELP:
                problems.add("help-flag", location, "Megatron prints its help and exits instead of training")
            else:
                # did-you-mean costs ~10 ms a flag: the first hundred unknown flags get one
                suggestions = _best_suggestions(spelled, release, tuple(script_specs)) if len(unknown) < 100 else []
                hint = f"; did you mean {_either(suggestions)}?" if suggestions else ""
                from megatron_estimator.megatron.flags import history_message
                history = history_message(spelled, release)
                text = f"unknown flag ({history})" if history else "unknown flag" + hint
                problem = Problem("unknown-flag", location, text)
                problems.extend((problem,))
                unknown.append(UnknownFlag(spelled, tuple(suggestions), problem))
            # argparse lists the values after an unknown option among the unrecognized
            # arguments too; they belong to this problem, not to new ones.
            i = run_of_values(i + 1)
            previous = None
            continue

        nargs = spec.nargs
        if not spec.takes_value:
            i += 1
            previous = (option_index, spelled, spec, 0)
            if explicit is not None:
                problems.add("ignored-explicit-value", location,
                             f"this flag takes no value; Megatron rejects '={explicit}' (write {spelled} alone)")
                continue
            if spec.action == BOOLEAN_OPTIONAL:
                value = not spelled.startswith("--no-")      # argparse.BooleanOptionalAction.__call__
            else:
                value = spec.action == "store_true"
            if spec.conditional != SCRIPT_CONDITION:
                settings[spec.dest] = RawSetting(spec.dest, value, location)
            continue

        if explicit is not None:
            # argparse matches an explicit '=value' as exactly one value.
            i += 1
            values = [explicit]
            previous = (option_index, spelled, spec, 1)
            if isinstance(nargs, int) and nargs != 1:
                problems.add("missing-value", location,
                             f"expects {_count(nargs)}; '={explicit}' gives one "
                             f"(write {spelled} followed by {nargs} values)")
                continue
        else:
            start = i + 1
            available = run_of_values(start) - start
            if nargs is None:
                needed, taken = 1, min(available, 1)
            elif nargs == "?":
                needed, taken = 0, min(available, 1)
            elif nargs == "*":
                needed, taken = 0, available
            elif nargs == "+":
                needed, taken = 1, available
            else:
                needed, taken = nargs, min(available, nargs)
            i = start + taken
            previous = (option_index, spelled, spec, taken)
            if taken < needed:
                expects = ("a value" if nargs is None else "at least one value" if nargs == "+"
                           else _count(nargs))
                problems.add("missing-value", location,
                             f"expects {expects}{_what_follows(tokens, i, taken, spelled)}")
                if (i < len(tokens) and _NUMBER_LIKE.match(tokens[i])
                        and tokens[i] not in table):
                    i += 1      # the number that argparse took for an option: explained above
                continue
            values = tokens[start:i]

        if opaque and any(k in opaque for k in ([option_index] if explicit is not None
                                                 else range(i - len(values), i))):
            try:
                converted_values = [convert_value(spec, text) for text in values]
            except (FlagChoiceError, FlagValueError):
                unknown_dests.add(spec.dest)       # given, but its value is not known here
                continue
            if spec.conditional != SCRIPT_CONDITION:
                settings[spec.dest] = RawSetting(spec.dest, (converted_values[0] if converted_values else spec.const)
                                                 if nargs in (None, "?") else converted_values, location)
            continue
        converted = convert_values(spec, values, location, problems)
        if converted is None:
            continue
        if nargs is None:
            value = converted[0]
        elif nargs == "?":
            value = converted[0] if converted else spec.const
        else:
            value = converted
        if spec.conditional != SCRIPT_CONDITION:
            settings[spec.dest] = RawSetting(spec.dest, value, location)

    return ArgvReading(RawArgs(settings, source, opaque=frozenset(unknown_dests - set(settings))),
                       problems.problems, tuple(unknown))


def _best_suggestions(option: str, release: str, extra: Sequence[str] = ()) -> list[str]:
    """The closest flags worth naming: the best match and any nearly as close."""
    import difflib

    found = closest_flags(option, extra=extra, release=release)
    if len(found) < 2:
        return found
    normalized = "--" + option.lstrip("-").replace("_", "-")
    scores = [difflib.SequenceMatcher(None, normalized, f).ratio() for f in found]
    return [f for f, score in zip(found, scores) if score >= scores[0] - 0.05]


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _either(options: Sequence[str]) -> str:
    return options[0] if len(options) == 1 else ", ".join(options[:-1]) + " or " + options[-1]


def _what_follows(tokens: Sequence[str], index: int, taken: int, spelled: str) -> str:
    """Why a flag got too few values: the token that stopped them, or the end of the line."""
    got = f", got {taken}" if taken else ""
    if index >= len(tokens):
        return got if taken else " but the command line ends"
    following = tokens[index]
    text = f"{got} before {following}" if taken else f" but {following} follows"
    if following == "--":
        text += " ('--' ends the options)"
    elif _NUMBER_LIKE.match(following):
        # e.g. -1e-5: not a negative number by argparse's rule, so it reads as an option.
        text += f" (argparse reads {following} as an option; write {spelled}={following})"
    return text


def convert_values(spec, texts, location: str, problems) -> list[Any] | None:
    """Each of ``texts`` converted as Megatron's argparse converts the flag ``spec``'s values,
    or None after adding an ``invalid-choice`` / ``invalid-value`` problem for each bad one."""
    converted: list[Any] = []
    for text in texts:
        try:
            converted.append(convert_value(spec, text))
        except FlagChoiceError as exc:
            problems.add("invalid-choice", location, _choice_message(exc))
        except FlagValueError as exc:
            problems.add("invalid-value", location, f"invalid value {text!r}: {exc}")
    return converted if len(converted) == len(texts) else None


def _choice_message(exc: FlagChoiceError) -> str:
    choices = ", ".join(str(c) for c in exc.choices)
    message = f"invalid choice {exc.value!r}; choose from {choices}"
    if isinstance(exc.value, str):
        from megatron_estimator.core.hints import closest
        close = closest(exc.value, [str(c) for c in exc.choices], fold_case=False)
        if close is not None:
            message += f" (did you mean {close}?)"
    return message


def conditional_flag_notes(raw: RawArgs, release: str = NEWEST) -> tuple[Problem, ...]:
    """Notes (not problems) for the settings in ``raw`` whose flags exist only with an optional
    extension: code ``conditional-flag``, located where the setting was given."""
    table = flag_table(release)
    notes = []
    for dest, setting in raw.settings.items():
        spec = table.by_dest(dest)
        if spec is not None and spec.conditional:
            notes.append(Problem("conditional-flag", setting.location, CONDITIONS.get(
                spec.conditional, f"registered only with the optional extension {spec.conditional}")))
    return tuple(notes)
