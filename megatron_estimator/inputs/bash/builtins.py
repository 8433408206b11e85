"""The shell builtins the reader follows, as ``name -> handler(interp, fields, node, env)``.

A handler returns the exit status (None: not known statically).  ``echo``/``printf``/``pwd``
write only inside ``$(...)``; ``source``, ``eval``, ``exec`` and ``command`` run what they are
given; builtins with no effect on what the script runs (``trap``, ``ulimit``...) do nothing.
"""

from __future__ import annotations

import os
import re
from dataclasses import replace

from megatron_estimator.inputs.bash.parser import parse
from megatron_estimator.inputs.bash.state import FunctionReturn, ImpureCommand, LoopJump, ScriptExit
from megatron_estimator.inputs.bash.values import (
    NAME, UNSUPPORTED, ArrayValue, Cause, Field, Origin, Var, is_known, lit_seg, text_of,
)


def _texts(interp, fields: list[Field]) -> list[str | None]:
    return [None if f.causes else f.text for f in fields]


def _b_true(interp, fields, node, env):
    return 0


def _b_false(interp, fields, node, env):
    return 1


def _b_echo(interp, fields, node, env):
    if interp.sandbox:
        args = _texts(interp, fields[1:])
        if any(a is None for a in args):
            raise ImpureCommand("`echo` of a value that cannot be known statically")
        newline = True
        while args and re.fullmatch(r"-[neE]+", args[0]):
            if "n" in args[0]:
                newline = False
            args = args[1:]
        interp.capture.append(" ".join(args) + ("\n" if newline else ""))
    return 0


def _printf_format(fmt: str, args: list[str]) -> str | None:
    out = []
    i = 0
    k = 0
    escapes = {"n": "\n", "t": "\t", "\\": "\\", '"': '"', "'": "'", "r": "\r"}
    while True:
        i = 0
        while i < len(fmt):
            c = fmt[i]
            if c == "\\" and i + 1 < len(fmt) and fmt[i + 1] in escapes:
                out.append(escapes[fmt[i + 1]])
                i += 2
                continue
            if c == "%":
                if fmt[i + 1:i + 2] == "%":
                    out.append("%")
                    i += 2
                    continue
                m = re.compile(r"%(-?\d*)([sdi])").match(fmt, i)
                if not m:
                    return None
                arg = args[k] if k < len(args) else ""
                k += 1
                if m.group(2) in "di":
                    try:
                        arg = str(int(arg or "0"))
                    except ValueError:
                        return None
                width = m.group(1)
                out.append(f"{arg:{'<' if width.startswith('-') else '>'}{width.lstrip('-')}}" if width else arg)
                i = m.end()
                continue
            out.append(c)
            i += 1
        if k == 0 or k >= len(args):
            break
    return "".join(out)


def _b_printf(interp, fields, node, env):
    args = _texts(interp, fields[1:])
    target = None
    if len(args) >= 2 and args[0] == "-v":
        target = args[1]
        args = args[2:]
    result = None
    if args and all(a is not None for a in args):
        result = _printf_format(args[0], args[1:])
    if target is not None:
        if result is None:
            interp.set_var(target, Cause(UNSUPPORTED, node.origin, target,
                                         f"{target} is set by a `printf -v` this tool cannot evaluate"), node.origin)
        else:
            interp.set_var(target, (lit_seg(result, node.origin),), node.origin)
        return 0
    if interp.sandbox:
        if result is None:
            raise ImpureCommand("`printf` with a format this tool does not evaluate")
        interp.capture.append(result)
    return 0


def _b_pwd(interp, fields, node, env):
    if interp.sandbox:
        if interp.state.cwd is None:
            raise ImpureCommand("`pwd` after a `cd` to a directory that cannot be known statically")
        interp.capture.append(interp.state.cwd + "\n")
    return 0


def _b_cd(interp, fields, node, env):
    args = list(fields[1:])
    while args and not args[0].causes and args[0].text.startswith("-") and args[0].text != "-":
        if args.pop(0).text == "--":      # cd [-L|-P [-e]] [-@] [--] DIR: options end at --
            break
    if not args:
        home = interp.state.vars.get("HOME")
        target = text_of(home.value) if home and isinstance(home.value, tuple) and is_known(home.value) else None
    else:
        target = None if args[0].causes else args[0].text
        if target == "-":
            target = None
    cwd = interp.state.cwd
    if target is None or (cwd is None and not target.startswith("/")):
        interp.state.cwd = None
    else:
        interp.state.cwd = os.path.normpath(os.path.join(cwd or "/", target))
    if interp.state.cwd is not None:
        old = interp.state.vars.get("PWD")
        # the shell keeps PWD itself: not a setting the script makes for the commands it runs (origin None)
        interp.state.vars["PWD"] = Var((lit_seg(interp.state.cwd, node.origin),), old.exported if old else True, False,
                                       None)
    else:
        interp.state.vars["PWD"] = Var(Cause(UNSUPPORTED, node.origin, "PWD",
                                             f"the directory the script changes to at {node.origin} cannot be known statically"),
                                       True, False, None)
    return 0


def _b_popd(interp, fields, node, env):
    interp.state.cwd = None
    return 0


def _b_unset(interp, fields, node, env):
    functions = False
    for f in fields[1:]:
        text = f.text
        if text == "-f":
            functions = True
            continue
        if text in ("-v", "-n"):
            continue
        if f.causes:
            continue
        if functions:
            interp.state.functions.pop(text, None)
        else:
            name = text.split("[", 1)[0]
            if "[" in text and name in interp.state.vars and isinstance(interp.state.vars[name].value, ArrayValue):
                key = interp.arith_index(text[len(name) + 1:-1], node.origin)
                if isinstance(key, int):
                    elems = interp.state.vars[name].value.as_dict()
                    elems.pop(key, None)
                    interp.state.vars[name] = replace(interp.state.vars[name], value=ArrayValue.of(elems))
                continue
            interp.state.vars.pop(name, None)
            interp.state.unset_names |= {name}
    return 0


def _set_option(interp, name: str, on: bool, node) -> None:
    """``set -o NAME`` / ``set +o NAME``: the options that change what the reader does."""
    if name == "allexport":
        interp.state.allexport = on
    elif name == "nounset":
        interp.state.nounset = node.origin if on else None


def _b_set(interp, fields, node, env):
    args = fields[1:]
    k = 0
    while k < len(args):
        text = args[k].text
        if text == "--":
            interp.state.positional = list(args[k + 1:])
            return 0
        if text in ("-o", "+o"):
            if k + 1 < len(args):
                _set_option(interp, args[k + 1].text, text == "-o", node)
            k += 2
            continue
        if len(text) > 1 and text[0] in "-+":
            if "a" in text[1:]:
                interp.state.allexport = text[0] == "-"
            if "u" in text[1:]:
                interp.state.nounset = node.origin if text[0] == "-" else None
            if "o" in text[1:]:
                if k + 1 < len(args):
                    _set_option(interp, args[k + 1].text, text[0] == "-", node)
                k += 2
                continue
            k += 1
            continue
        interp.state.positional = list(args[k:])
        return 0
    return 0


def _b_shift(interp, fields, node, env):
    n = 1
    if len(fields) > 1:
        try:
            n = int(fields[1].text)
        except ValueError:
            return None
    pos = interp.state.positional
    if isinstance(pos, Cause):
        return None
    if n > len(pos):
        return 1
    interp.state.positional = pos[n:]
    return 0


def _b_exit(interp, fields, node, env):
    status = interp.state.status
    if len(fields) > 1:
        try:
            status = int(fields[1].text) & 255
        except ValueError:
            status = None
    if not interp.sandbox and not interp.conditions and not interp.nested and interp.reader.exit_note is None:
        note = f"the script exits at {node.origin}"
        if interp.decided:
            note += f" (because {interp.decided[-1]} in this environment)"
        interp.reader.exit_note = note
    raise ScriptExit(status)


def _b_return(interp, fields, node, env):
    if not interp.func_depth and not interp.reader.source_depth:
        return 1        # bash: "can only `return' from a function or sourced script", and goes on
    status = interp.state.status
    if len(fields) > 1:
        try:
            status = int(fields[1].text)
        except ValueError:
            status = None
    raise FunctionReturn(status)


def _b_break(interp, fields, node, env, kind="break"):
    if not interp.loop_depth:
        return 0        # bash: "only meaningful in a `for', `while', or `until' loop", and goes on
    levels = 1
    if len(fields) > 1:
        try:
            levels = int(fields[1].text)
        except ValueError:
            levels = 1
    raise LoopJump(kind, levels)


def _b_continue(interp, fields, node, env):
    return _b_break(interp, fields, node, env, "continue")


def _b_read(interp, fields, node, env):
    args = [f.text for f in fields[1:]]
    names = []
    array = None
    k = 0
    while k < len(args):
        a = args[k]
        if a.startswith("-") and len(a) > 1:
            letters = a[1:]
            for j, ch in enumerate(letters):
                if ch in "pdntuNi":
                    if j == len(letters) - 1:
                        k += 1
                    break
                if ch == "a":
                    array = letters[j + 1:] or (args[k + 1] if k + 1 < len(args) else None)
                    if not letters[j + 1:]:
                        k += 1
                    break
            k += 1
            continue
        names.append(a)
        k += 1
    if not names and array is None:
        names = ["REPLY"]
    for name in names + ([array] if array else []):
        if name and NAME.fullmatch(name):
            interp.set_var(name, Cause(UNSUPPORTED, node.origin, name,
                                       f"{name} is read from input at {node.origin}, which cannot be known statically"),
                           node.origin)
    return None


def _b_mapfile(interp, fields, node, env):
    plain = [f.text for f in fields[1:] if not f.text.startswith("-")]
    name = plain[-1] if plain else "MAPFILE"
    if NAME.fullmatch(name):
        interp.set_var(name, Cause(UNSUPPORTED, node.origin, name,
                                   f"{name} is read from input at {node.origin}, which cannot be known statically"),
                       node.origin)
    return None


def _b_let(interp, fields, node, env):
    status = 1
    for f in fields[1:]:
        value = interp.arith_value(f.segs, node.origin)
        if isinstance(value, Cause):
            return None
        status = 0 if text_of(value) != "0" else 1
    return status


def _b_test(interp, fields, node, env):
    return interp.test_builtin(fields, closing=fields[0].text == "[")


def _b_source(interp, fields, node, env):
    if len(fields) < 2:
        return 2
    return interp.reader.source(interp, fields[1], fields[2:], node)


_EVAL_HOLE = "__megatron_estimator_eval_"


def _b_eval(interp, fields, node, env):
    """``eval ARGS``: the arguments joined by spaces, read and run as shell text.  A part not known
    statically (``$(date)``, an unset variable) is not text the reader can parse: it stands in the
    string as a reference to a variable holding that unknown part, so it expands where it is
    written, as one word part, and is judged where it is used, as it is outside ``eval``."""
    if len(fields) < 2:
        return 0
    segs = [seg for f in fields[1:] for seg in f.segs]
    if all(seg.cause is not None or not seg.text.strip() for seg in segs):
        cause = next(seg for seg in segs if seg.cause is not None).cause if any(s.cause for s in segs) else None
        if cause is None:
            return 0
        # nothing of the command is known: not even which program it runs
        interp.visitor.note(node.origin, f"`eval` at {node.origin} gets `{fields[1].text}`: {cause.message}")
        return None
    texts: list[str] = []
    origins: list[Origin] = []
    holes: list[str] = []
    for k, f in enumerate(fields[1:]):
        if k:
            texts.append(" ")
            origins.append(node.origin)
        for seg in f.segs:
            if seg.cause is not None:
                name = f"{_EVAL_HOLE}{len(holes)}"
                holes.append(name)
                at = seg.origins[0] if seg.origins else node.origin
                interp.state.vars[name] = Var((seg,), False, False, at)
                ref = "${" + name + "}"
                texts.append(ref)
                origins.extend((at,) * len(ref))
                continue
            texts.append(seg.text)
            origins.extend(seg.origins if len(seg.origins) == len(seg.text) else (node.origin,) * len(seg.text))
    try:
        tree = parse("".join(texts), origins)
        return interp.run_list(tree)
    finally:
        for name in holes:
            interp.state.vars.pop(name, None)


def _b_exec(interp, fields, node, env):
    if len(fields) < 2:
        return 0
    interp.external(fields, env, node)
    raise ScriptExit(None)


def _b_command(interp, fields, node, env):
    rest = fields[1:]
    while rest and rest[0].text in ("-p", "-v", "-V", "--"):
        if rest[0].text in ("-v", "-V"):
            # whether a program is on the job's machine: only what the caller knows of it
            probe = interp.reader.machine_output
            name = rest[1].text if len(rest) > 1 else ""
            answer = probe(f"command -v {name}", f"{node.origin} `command -v {name}`") if probe and name else None
            return 0 if answer is not None and answer[0] is not None else None
        rest = rest[1:]
    if not rest:
        return 0
    handler = BUILTINS.get(rest[0].text)
    if handler is not None:
        return handler(interp, rest, node, env)
    return interp.external(rest, env, node)


def _b_getopts(interp, fields, node, env):
    if len(fields) >= 3 and NAME.fullmatch(fields[2].text):
        interp.set_var(fields[2].text, Cause(UNSUPPORTED, node.origin, fields[2].text,
                                             f"{fields[2].text} is set by getopts, which reads the script's arguments at run time"),
                       node.origin)
    return None


BUILTINS = {
    ":": _b_true, "true": _b_true, "false": _b_false, "echo": _b_echo, "printf": _b_printf, "pwd": _b_pwd,
    "cd": _b_cd, "pushd": _b_cd, "popd": _b_popd, "unset": _b_unset, "set": _b_set, "shift": _b_shift,
    "exit": _b_exit, "return": _b_return, "break": _b_break, "continue": _b_continue, "read": _b_read,
    "mapfile": _b_mapfile, "readarray": _b_mapfile, "let": _b_let, "test": _b_test, "[": _b_test,
    "source": _b_source, ".": _b_source, "eval": _b_eval, "exec": _b_exec, "command": _b_command,
    "builtin": _b_command, "getopts": _b_getopts,
    "shopt": _b_true, "trap": _b_true, "wait": _b_true, "umask": _b_true, "ulimit": _b_true, "alias": _b_true,
    "unalias": _b_true, "hash": _b_true, "type": _b_true, "enable": _b_true, "complete": _b_true,
    "history": _b_true, "jobs": _b_true, "disown": _b_true, "times": _b_true, "caller": _b_true, "help": _b_true,
}

