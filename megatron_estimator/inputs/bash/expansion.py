"""Word expansion, as bash does it: parameters (``$VAR``, ``${VAR:-x}``, ``${VAR#p}``, arrays,
``"$@"``), arithmetic, command substitution (only the few side-effect-free commands are
evaluated: ``dirname``, ``basename``, ``echo``, ``printf``, ``pwd``, ``cd``, ``realpath``), tilde,
brace-expansion check, and word splitting on IFS (quoted text is not split).  Pathname
expansion is not done: a word with ``*`` stays as written, as bash leaves it when no file matches.

``Expansion`` is a part of ``Interpreter`` (it reads ``self.state`` and runs ``$(...)`` bodies with
``self.run_list``).
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Sequence

from megatron_estimator.inputs.bash.arith import ArithError, Arithmetic, ArithUnknown
from megatron_estimator.inputs.bash.parser import parse
from megatron_estimator.inputs.bash.pattern import glob_to_regex
from megatron_estimator.inputs.bash.state import ImpureCommand, ScriptExit
from megatron_estimator.inputs.bash.syntax import Arith, CmdSub, Lit, Param, ShellSyntaxError, Word
from megatron_estimator.inputs.bash.values import (
    UNRESOLVED, UNSUPPORTED, ArrayValue, Cause, Field, Origin, Seg, Var, at_use, causes_of, is_known,
    lit_seg, text_of, unknown_seg,
)


class Expansion:
    """Words to fields: the expansion half of the interpreter."""

    # ---- values --------------------------------------------------------------------

    def lookup(self, name: str) -> Var | None:
        return self.state.vars.get(name)

    def set_var(self, name: str, value, origin: Origin | None, *, export: bool | None = None,
                integer: bool | None = None) -> None:
        old = self.state.vars.get(name)
        exported = old.exported if old else False
        if export is not None:
            exported = export or exported
        if self.state.allexport:
            exported = True
        if isinstance(value, (tuple, ArrayValue)):
            over = self.state.budget.size(value if isinstance(value, tuple) else value.values(), f"the value of {name}")
            if over is not None:
                raise ShellSyntaxError(origin or self.current_line or Origin(self.reader.display, 0), over, UNSUPPORTED)
        if name in self.state.unset_names:
            self.state.unset_names -= {name}
        self.state.vars[name] = Var(value, exported, old.integer if (old and integer is None) else bool(integer),
                                    origin)

    def unset_cause(self, name: str, at: Origin) -> Cause:
        """An unset variable: bash expands it to nothing (fallback ''), unless ``set -u`` is in
        effect, where bash would stop the script instead (no fallback: the value is unknown)."""
        nounset = self.state.nounset
        if nounset is not None:
            what = f"the script's argument {name}, which was not given" if name.isdigit() else \
                f"not set in the script or the environment"
            message = (f"{'$' if name.isdigit() else ''}{name} is {what}; the script runs `set -u` ({nounset}), "
                       "so bash would stop here unless it is set when the job runs")
            if self.reader.missing_sources and not name.isdigit():
                message += "; it may come from " + ", ".join(self.reader.missing_sources) + ", which could not be read"
            return Cause(UNRESOLVED, at, f"${name}" if name.isdigit() else name, message)
        if name.isdigit():
            return Cause(UNRESOLVED, at, f"${name}",
                         f"${name} is the script's argument {name}, which was not given "
                         "(bash would expand it to nothing)", "")
        message = f"{name} is not set in the script or the environment (bash would expand it to nothing)"
        if self.reader.missing_sources:
            message += "; it may come from " + ", ".join(self.reader.missing_sources) + ", which could not be read"
        return Cause(UNRESOLVED, at, name, message, "")

    def param_value(self, param: Param):
        """The raw value of a parameter: a Var-like value, or None when unset."""
        name = param.name
        if name.isdigit():
            n = int(name)
            if n == 0:
                return (lit_seg(self.reader.display, param.origin),)
            pos = self.state.positional
            if isinstance(pos, Cause):
                return pos
            return at_use(pos[n - 1].segs, param.origin) if n <= len(pos) else None
        if name in ("@", "*"):
            pos = self.state.positional
            if isinstance(pos, Cause):
                return pos
            if pos is self.unknown_script_args:
                return Cause(UNRESOLVED, param.origin, f"${name}",
                             f"${name} passes on the arguments the script is run with, which are not known "
                             "here (bash would pass none when it runs without arguments)"
                             + self.unknown_args_advice, "")
            return ArrayValue(tuple(enumerate(pos)))
        if name == "#":
            pos = self.state.positional
            if isinstance(pos, Cause):
                return pos
            return (lit_seg(str(len(pos)), param.origin),)
        if name == "?":
            if self.state.status is None:
                return Cause(UNSUPPORTED, param.origin, "$?", "$? is the exit status of a command that was not run")
            return (lit_seg(str(self.state.status), param.origin),)
        if name in ("$", "!"):
            return Cause(UNSUPPORTED, param.origin, f"${name}", f"${name} is a process id, known only when the script runs")
        if name == "-":
            return (lit_seg("hB", param.origin),)
        if name == "RANDOM" or name == "SRANDOM":
            return Cause(UNSUPPORTED, param.origin, name, f"{name} is a random number")
        if name == "LINENO":
            return (lit_seg(str(param.origin.line), param.origin),)
        if name == "BASH_SOURCE" and name not in self.state.vars:
            return ArrayValue(((0, Field((lit_seg(self.reader.display, param.origin),))),))
        if name == "PWD" and name not in self.state.vars and self.state.cwd:
            return (lit_seg(self.state.cwd, param.origin),)
        var = self.state.vars.get(name)
        if var is None:
            return None
        if var.origin is None and isinstance(var.value, tuple):
            return at_use(var.value, param.origin, name)      # inherited: it was written where it is used
        return var.value

    # ---- expansion -----------------------------------------------------------------

    def expand_fields(self, words: Sequence[Word], brace_check: bool = True) -> list[Field]:
        fields: list[Field] = []
        for word in words:
            fields.extend(self.word_fields(word, brace_check))
        return fields

    def word_fields(self, word: Word, brace_check: bool = True) -> list[Field]:
        chunks = self.word_chunks(word, tilde=True)
        fields = self.split(chunks, word.origin)
        if brace_check:
            literal = "".join(p.text for p in word.parts if isinstance(p, Lit) and not p.quoted)
            if re.search(r"\{[^{}\s]*(,|\.\.)[^{}\s]*\}", literal):
                cause = Cause(UNSUPPORTED, word.origin, word.raw,
                              f"`{word.raw}` uses brace expansion, which this tool does not do")
                return [Field((unknown_seg(cause, word.raw, word.origin),), True, word.origin)]
        return fields

    def expand_scalar(self, word: Word, tilde: bool = False) -> tuple:
        """A word expanded without splitting ("$@" joined with spaces), as in assignments."""
        segs: list[Seg] = []
        for chunk in self.word_chunks(word, tilde=tilde, join_arrays=True):
            if chunk[0] == "seg":
                segs.append(chunk[1])
            else:
                segs.append(lit_seg(" ", word.origin))
        return tuple(s for s in segs if s.text or s.cause)

    def pattern_chunks(self, word: Word) -> tuple[list[tuple[str, bool]], list[Cause]]:
        out: list[tuple[str, bool]] = []
        causes: list[Cause] = []
        for chunk in self.word_chunks(word, tilde=False, join_arrays=True):
            if chunk[0] != "seg":
                out.append((" ", True))
                continue
            seg = chunk[1]
            if seg.cause is not None:
                if seg.cause.fallback is not None:
                    out.append((seg.cause.fallback, True))
                else:
                    causes.append(seg.cause)
                continue
            out.append((seg.text, chunk[3]))
        return out, causes

    def word_chunks(self, word: Word, tilde: bool = False, join_arrays: bool = False) -> list:
        """Chunks: ('seg', Seg, splittable, quoted, literal) and ('break',)."""
        chunks: list = []
        for n, part in enumerate(word.parts):
            if isinstance(part, Lit):
                text = part.text
                if tilde and n == 0 and not part.quoted and text.startswith("~") and (len(text) == 1 or text[1] == "/"):
                    home = self.param_value(Param("HOME", part.origins[0] if part.origins else word.origin, "$HOME", False))
                    if isinstance(home, tuple) and is_known(home):
                        chunks.append(("seg", Seg(text_of(home), (part.origins[0],) * len(text_of(home))), False, True, False))
                        text = text[1:]
                        origins = part.origins[1:]
                        if text:
                            chunks.append(("seg", Seg(text, tuple(origins)), False, part.quoted, True))
                        continue
                origins = part.origins if len(part.origins) == len(text) else (word.origin,) * len(text)
                chunks.append(("seg", Seg(text, tuple(origins)), False, part.quoted, True))
            elif isinstance(part, Param):
                chunks.extend(self.param_chunks(part, join_arrays))
            elif isinstance(part, Arith):
                seg = self.arith_seg(part)
                chunks.append(("seg", seg, not part.quoted, part.quoted, False))
            elif isinstance(part, CmdSub):
                for seg in self.cmdsub_segs(part):
                    chunks.append(("seg", seg, not part.quoted, part.quoted, False))
        return chunks

    def split(self, chunks: list, origin: Origin) -> list[Field]:
        ifs = self.ifs()
        fields: list[Field] = []
        current: list[Seg] = []
        started = False
        uncertain = False

        def emit() -> None:
            nonlocal current, started, uncertain
            if started or current:
                fields.append(Field(tuple(current), uncertain, origin))
            current, started, uncertain = [], False, False

        for chunk in chunks:
            if chunk[0] == "break":
                emit()
                continue
            _, seg, splittable, quoted, _literal = chunk
            if not splittable:
                current.append(seg)
                if quoted or seg.text or seg.cause:
                    started = True
                continue
            if seg.cause is not None:
                current.append(seg)
                started = True
                uncertain = True
                continue
            # split on IFS
            text = seg.text
            start = 0
            i = 0
            while i < len(text):
                if text[i] in ifs:
                    if i > start:
                        current.append(Seg(text[start:i], seg.origins[start:i], None, seg.via))
                        started = True
                    if text[i] not in " \t\n":
                        started = True
                    if started or current:
                        emit()
                    j = i + 1
                    while j < len(text) and text[j] in ifs and text[j] in " \t\n":
                        j += 1
                    i = j
                    start = j
                    continue
                i += 1
            if start < len(text):
                current.append(Seg(text[start:], seg.origins[start:], None, seg.via))
                started = True
        emit()
        return fields

    def ifs(self) -> str:
        var = self.state.vars.get("IFS")
        if var is None or not isinstance(var.value, tuple) or not is_known(var.value):
            return " \t\n"
        return text_of(var.value)

    def param_chunks(self, param: Param, join_arrays: bool) -> list:
        quoted = param.quoted
        value = self.param_value(param)
        index = param.index
        at = param.origin
        is_array_all = index in ("@", "*") or (param.name in ("@", "*") and index is None)
        star = index == "*" or (param.name == "*" and index is None)

        def unknown_chunk(cause: Cause, spelling: str | None = None) -> list:
            seg = unknown_seg(cause, spelling or param.spelling, at)
            return [("seg", seg, not quoted, quoted, False)]

        if isinstance(value, Cause):
            return unknown_chunk(value, param.spelling)

        # ${#...}
        if param.op == "len":
            if is_array_all:
                if value is None:
                    return [("seg", lit_seg("0", at), False, quoted, False)]
                elems = value.values() if isinstance(value, ArrayValue) else [Field(value)]
                if any(e.uncertain or e.causes for e in elems):
                    cause = next((c for e in elems for c in e.causes), None) or Cause(
                        UNSUPPORTED, at, param.name, f"the number of elements of {param.name} cannot be known statically")
                    return unknown_chunk(cause)
                return [("seg", lit_seg(str(len(elems)), at), False, quoted, False)]
            segs = self.select_scalar(value, param, at)
            if isinstance(segs, Cause):
                return unknown_chunk(segs)
            if segs is None:
                segs = ()
            if not is_known(segs):
                return unknown_chunk(causes_of(segs)[0])
            return [("seg", lit_seg(str(len(text_of(segs))), at), False, quoted, False)]

        if param.op == "indirect":
            segs = self.select_scalar(value, param, at)
            if segs is None or isinstance(segs, Cause) or not is_known(segs):
                cause = segs if isinstance(segs, Cause) else (
                    causes_of(segs)[0] if segs else self.unset_cause(param.name, at))
                return unknown_chunk(cause)
            target = text_of(segs)
            return self.param_chunks(Param(target, at, param.spelling, quoted), join_arrays)
        if param.op in ("names",) or (param.op or "").startswith("@"):
            return unknown_chunk(Cause(UNSUPPORTED, at, param.spelling,
                                       f"`{param.spelling}` is a substitution this tool does not evaluate"))

        if is_array_all:
            if value is None:
                elems = None
            elif isinstance(value, ArrayValue):
                elems = value.values()
            else:
                elems = [Field(value)]
            return self.array_chunks(param, elems, quoted, star, join_arrays)

        segs = self.select_scalar(value, param, at)
        if isinstance(segs, Cause):
            return unknown_chunk(segs)
        return self.scalar_op_chunks(param, segs, quoted)

    def select_scalar(self, value, param: Param, at: Origin):
        """The scalar a parameter names: ${A}, ${A[2]}; None when unset."""
        if value is None:
            return None
        if isinstance(value, Cause):
            return value
        index = param.index
        if isinstance(value, ArrayValue):
            if index is None:
                key = 0
            else:
                key = self.arith_index(index, at)
                if isinstance(key, Cause):
                    return key
                if key < 0 and value.elems:
                    key = value.elems[-1][0] + 1 + key
            field_ = value.as_dict().get(key)
            return None if field_ is None else field_.segs
        if index is not None:
            key = self.arith_index(index, at)
            if isinstance(key, Cause):
                return key
            return value if key in (0, -1) else None
        return value

    def arith_index(self, index, at: Origin):
        segs = self.expand_scalar(index) if isinstance(index, Word) else (lit_seg(index, at),)
        if not is_known(segs):
            return causes_of(segs)[0]
        try:
            return Arithmetic(self, text_of(segs), at).run()
        except ArithUnknown as exc:
            return exc.cause
        except ArithError as exc:
            return Cause(UNSUPPORTED, at, text_of(segs), f"bad array index: {exc}")

    def is_null(self, segs, colon: bool) -> bool | None:
        """Is a parameter unset (or, with ':', empty)?  None: cannot be known."""
        if segs is None:
            return True
        if not colon:
            return False
        if any(s.cause is None and s.text for s in segs):
            return False
        # what is left is empty text and unknown pieces; unset variables (fallback '') are empty
        if all(s.cause is None or s.cause.fallback == "" for s in segs):
            return True
        return None

    def scalar_op_chunks(self, param: Param, segs, quoted: bool) -> list:
        at = param.origin
        op = param.op

        def out(result_segs) -> list:
            return [("seg", s, not quoted, quoted, False) for s in result_segs] or (
                [("seg", Seg("", ()), False, quoted, False)] if quoted else [])

        def unknown(cause: Cause) -> list:
            return [("seg", unknown_seg(cause, param.spelling, at), not quoted, quoted, False)]

        if op is None:
            if segs is None:
                return unknown(self.unset_cause(param.name, at))
            return out(segs)
        if op in (":-", "-", ":=", "=", ":+", "+", ":?", "?"):
            null = self.is_null(segs, op.startswith(":"))
            if null is None:
                causes = causes_of(segs or ())
                return unknown(causes[0] if causes else self.unset_cause(param.name, at))
            if op in (":-", "-"):
                if null:
                    chunks = self.default_chunks(param.arg, quoted)
                    if segs is None and not param.name.isdigit() and param.name not in self.state.unset_names and all(
                            c[0] == "seg" and not c[1].text and c[1].cause is None for c in chunks):
                        # ``${X:-}`` of an unset X is bash's '' exactly as ``$X`` (and safe under
                        # ``set -u``): the job may set X, so it stays an unset variable read as ''
                        return unknown(Cause(UNRESOLVED, at, param.name,
                                             f"{param.name} is not set in the script or the environment "
                                             f"(`{param.spelling}` expands to nothing)", ""))
                    return chunks
                return out(segs)
            if op in (":=", "="):
                if null:
                    value = self.expand_scalar(param.arg, tilde=True) if param.arg else ()
                    if param.name.isdigit() or param.name in "@*#?$!-":
                        return unknown(Cause(UNSUPPORTED, at, param.spelling, f"`{param.spelling}` assigns to a special parameter"))
                    self.set_var(param.name, value, at)
                    return out(value)
                return out(segs)
            if op in (":+", "+"):
                if null:
                    return [("seg", Seg("", ()), False, quoted, False)] if quoted else []
                return self.default_chunks(param.arg, quoted)
            # :? / ?
            if null:
                message = text_of(self.expand_scalar(param.arg)) if param.arg else "parameter null or not set"
                cause = Cause(UNRESOLVED, at, param.name,
                              f"the script requires {param.name} (`{param.spelling}`: {message}) and it is not set; "
                              "bash would stop the script here")
                self.reader.require_failure(cause)
                return unknown(cause)
            return out(segs)
        if segs is None:
            return unknown(self.unset_cause(param.name, at))
        if not is_known(segs):
            return unknown(causes_of(segs)[0])
        text = text_of(segs)
        origins = [o for s in segs for o in s.origins]
        origin0 = origins[0] if origins else at
        if op in ("#", "##", "%", "%%"):
            pattern, causes = self.pattern_chunks(param.arg) if param.arg else ([], [])
            if causes:
                return unknown(causes[0])
            regex = re.compile(glob_to_regex(pattern), re.S)
            if op.startswith("#"):
                cuts = range(len(text) + 1) if op == "#" else range(len(text), -1, -1)
                for k in cuts:
                    if regex.fullmatch(text[:k]):
                        return out((Seg(text[k:], tuple(origins[k:])),))
            else:
                cuts = range(len(text), -1, -1) if op == "%" else range(len(text) + 1)
                for k in cuts:
                    if regex.fullmatch(text[k:]):
                        return out((Seg(text[:k], tuple(origins[:k])),))
            return out(segs)
        if op in ("/", "//", "/#", "/%"):
            pattern, causes = self.pattern_chunks(param.arg) if param.arg else ([], [])
            rep = self.expand_scalar(param.arg2) if param.arg2 is not None else ()
            if causes or not is_known(rep):
                return unknown((causes or causes_of(rep))[0])
            regex = glob_to_regex(pattern)
            if not regex:
                return out(segs)
            replacement = text_of(rep)
            if op == "/#":
                new = re.sub("^(?:" + regex + ")", lambda m: replacement, text, count=1, flags=re.S)
            elif op == "/%":
                m = None
                for k in range(len(text) + 1):
                    if re.fullmatch(regex, text[k:], re.S):
                        m = k
                        break
                new = text if m is None else text[:m] + replacement
            else:
                new = re.sub(regex, lambda m: replacement, text, count=0 if op == "//" else 1, flags=re.S)
            return out((lit_seg(new, origin0),))
        if op in ("^", "^^", ",", ",,"):
            if op == "^^":
                new = text.upper()
            elif op == ",,":
                new = text.lower()
            elif op == "^":
                new = text[:1].upper() + text[1:]
            else:
                new = text[:1].lower() + text[1:]
            return out((Seg(new, tuple(origins)),))
        if op == "substr":
            offset = self.arith_word(param.arg, at)
            length = self.arith_word(param.arg2, at) if param.arg2 is not None else None
            for value in (offset, length):
                if isinstance(value, Cause):
                    return unknown(value)
            if offset < 0:
                offset = max(0, len(text) + offset)
            end = len(text) if length is None else (offset + length if length >= 0 else len(text) + length)
            return out((Seg(text[offset:end], tuple(origins[offset:end])),))
        return unknown(Cause(UNSUPPORTED, at, param.spelling, f"`{param.spelling}` is a substitution this tool does not evaluate"))

    def arith_word(self, word: Word | None, at: Origin):
        if word is None:
            return 0
        segs = self.expand_scalar(word)
        if not is_known(segs):
            return causes_of(segs)[0]
        try:
            return Arithmetic(self, text_of(segs), at).run()
        except ArithUnknown as exc:
            return exc.cause
        except ArithError as exc:
            return Cause(UNSUPPORTED, at, text_of(segs), f"bad arithmetic: {exc}")

    def default_chunks(self, word: Word | None, quoted: bool) -> list:
        if word is None:
            return [("seg", Seg("", ()), False, quoted, False)] if quoted else []
        chunks = []
        for chunk in self.word_chunks(word, tilde=not quoted):
            if chunk[0] == "seg":
                _, seg, _splittable, q, literal = chunk
                if quoted:
                    chunks.append(("seg", seg, False, True, literal))
                else:
                    # in an unquoted ${x:-word}, the word's own quoting decides what is split
                    chunks.append(("seg", seg, not q, q, literal))
            else:
                chunks.append(chunk)
        if not chunks and quoted:
            chunks.append(("seg", Seg("", ()), False, True, False))
        return chunks

    def array_chunks(self, param: Param, elems, quoted: bool, star: bool, join_arrays: bool) -> list:
        at = param.origin
        if elems is None:
            if param.op in (":-", "-"):
                return self.default_chunks(param.arg, quoted)
            if param.op in (":+", "+"):
                return []
            if param.name in ("@", "*"):
                return []
            return [("seg", unknown_seg(self.unset_cause(param.name, at), param.spelling, at), not quoted, quoted, False)]
        if param.op in (":-", "-") and not elems:
            return self.default_chunks(param.arg, quoted)
        if param.op in (":+", "+"):
            return self.default_chunks(param.arg, quoted) if elems else []
        if param.op == "substr":
            offset = self.arith_word(param.arg, at)
            length = self.arith_word(param.arg2, at) if param.arg2 is not None else None
            if isinstance(offset, Cause) or isinstance(length, Cause):
                cause = offset if isinstance(offset, Cause) else length
                return [("seg", unknown_seg(cause, param.spelling, at), not quoted, quoted, False)]
            if param.name in ("@", "*"):
                program = Field((lit_seg(self.reader.display, at),))
                elems = [program] + list(elems)
            if offset < 0:
                offset = max(0, len(elems) + offset)
            end = len(elems) if length is None else offset + length
            elems = elems[offset:end]
        elif param.op in ("#", "##", "%", "%%", "/", "//", "/#", "/%", "^", "^^", ",", ",,"):
            mapped = []
            for elem in elems:
                sub = self.scalar_op_chunks(Param(param.name, at, param.spelling, True, None, param.op, param.arg, param.arg2),
                                            elem.segs, True)
                mapped.append(Field(tuple(c[1] for c in sub if c[0] == "seg"), elem.uncertain))
            elems = mapped
        elif param.op is not None and param.op not in (":=", "=", ":?", "?"):
            return [("seg", unknown_seg(Cause(UNSUPPORTED, at, param.spelling, f"`{param.spelling}` is not supported"),
                                     param.spelling, at), not quoted, quoted, False)]
        chunks: list = []
        if quoted and (star or join_arrays):
            sep = self.ifs()[:1]
            for k, elem in enumerate(elems):
                if k:
                    chunks.append(("seg", lit_seg(sep, at), False, True, False))
                chunks.extend(self.elem_chunks(elem, True))
            if not chunks:
                chunks.append(("seg", Seg("", ()), False, True, False))
            return chunks
        for k, elem in enumerate(elems):
            if k:
                chunks.append(("break",) if not join_arrays else ("seg", lit_seg(" ", at), False, quoted, False))
            chunks.extend(self.elem_chunks(elem, quoted))
        return chunks

    def elem_chunks(self, elem: Field, quoted: bool) -> list:
        if not elem.segs:
            return [("seg", Seg("", ()), False, True, False)] if quoted else []
        out = []
        for seg in elem.segs:
            splittable = not quoted
            out.append(("seg", seg, splittable, quoted, False))
        if elem.uncertain and quoted:
            # an element that was itself an unknown number of words: it stays unknown
            out = [("seg", s, True if s.cause else False, quoted, False) for s in elem.segs]
        return out

    def arith_seg(self, part: Arith) -> Seg:
        segs = self.expand_scalar(part.expr)
        if not is_known(segs):
            return unknown_seg(causes_of(segs)[0], part.spelling, part.origin)
        try:
            value = Arithmetic(self, text_of(segs), part.origin).run()
        except ArithUnknown as exc:
            return unknown_seg(exc.cause, part.spelling, part.origin)
        except ArithError as exc:
            cause = Cause(UNSUPPORTED, part.origin, part.spelling, f"`{part.spelling}` cannot be evaluated: {exc}")
            return unknown_seg(cause, part.spelling, part.origin)
        return lit_seg(str(value), part.origin)

    def arith_variable(self, name: str, origin: Origin, depth: int) -> int:
        var = self.state.vars.get(name)
        if var is None:
            value = self.param_value(Param(name, origin, name, False))
            if value is None:
                cause = self.unset_cause(name, origin)
                cause = replace(cause, message=f"{name} is not set in the script or the environment "
                                               "(bash would read it as 0 in arithmetic)", fallback="0")
                raise ArithUnknown(cause)
        else:
            value = var.value
        if isinstance(value, Cause):
            raise ArithUnknown(value)
        if isinstance(value, ArrayValue):
            elem = value.as_dict().get(0)
            value = elem.segs if elem else ()
        if not is_known(value):
            raise ArithUnknown(causes_of(value)[0])
        text = text_of(value).strip()
        if not text:
            return 0
        if depth > 16:
            raise ArithError(f"{name} refers to itself in arithmetic")
        if re.fullmatch(r"-?\d+", text):
            return int(text)
        return Arithmetic(self, text, origin, depth + 1).run()

    def arith_element(self, name: str, index: int, origin: Origin) -> int:
        var = self.state.vars.get(name)
        if var is None:
            raise ArithUnknown(replace(self.unset_cause(name, origin), fallback="0"))
        if isinstance(var.value, Cause):
            raise ArithUnknown(var.value)
        if isinstance(var.value, ArrayValue):
            elem = var.value.as_dict().get(index)
            segs = elem.segs if elem else ()
        else:
            segs = var.value if index == 0 else ()
        if not is_known(segs):
            raise ArithUnknown(causes_of(segs)[0])
        text = text_of(segs).strip() or "0"
        return Arithmetic(self, text, origin, 1).run()

    def arith_assign(self, name: str, value: int, origin: Origin) -> None:
        self.set_var(name, (lit_seg(str(value), origin),), origin)

    def cmdsub_segs(self, part: CmdSub) -> tuple[Seg, ...]:
        """What ``$(...)`` expands to: its output with bash's trailing newlines removed, each
        character where it is written (a here-document's text, ``cat`` of it, keeps its lines and
        its unknown values; other output is located at the ``$(``)."""
        text, origins = part.source
        spelling = part.spelling if len(part.spelling) <= 60 else part.spelling[:57] + "..."
        if part.spelling[:1] in "<>":
            cause = Cause(UNSUPPORTED, part.origin, spelling,
                          f"`{spelling}` is a process substitution, a file that exists only while the script runs")
            return (unknown_seg(cause, part.spelling, part.origin),)
        answer = self.reader.machine_output(text, f"{part.origin} `{spelling}`") \
            if self.reader.machine_output is not None else None
        if answer is not None:
            output, why = answer
            if output is not None:
                return (lit_seg(output, part.origin),)
            return (unknown_seg(Cause(UNSUPPORTED, part.origin, spelling, f"`{spelling}`: {why}"), part.spelling, part.origin),)
        try:
            output = self.pure_output(text, origins)
        except ImpureCommand as exc:
            cause = Cause(UNSUPPORTED, part.origin, spelling,
                          f"`{spelling}` runs {exc.command}; its output cannot be known without running it")
            return (unknown_seg(cause, part.spelling, part.origin),)
        except ShellSyntaxError as exc:
            cause = Cause(UNSUPPORTED, exc.origin, spelling, f"`{spelling}` cannot be read: {exc.message}")
            return (unknown_seg(cause, part.spelling, part.origin),)
        segs = [item if isinstance(item, Seg) else lit_seg(item, part.origin) for item in output]
        while segs and segs[-1].cause is None and segs[-1].text.endswith("\n"):
            last = segs.pop()
            kept = last.text.rstrip("\n")
            if kept:
                segs.append(Seg(kept, last.origins[:len(kept)], None, last.via))
                break
        segs = [seg for seg in segs if seg.text or seg.cause is not None]
        return tuple(segs) if segs else (lit_seg("", part.origin),)

    def pure_output(self, text: str, origins: Sequence[Origin]) -> list:
        """The output of commands run inside ``$(...)``: text (str) and located segments (Seg)."""
        if not text.strip():
            return []
        if text.strip().startswith("<"):
            raise ImpureCommand("a read of a file")       # $(< file)
        tree = parse(text, origins)
        saved_state, saved_capture = self.state, self.capture
        self.state = self.state.fork()
        self.capture = []
        self.sandbox += 1
        try:
            try:
                self.run_list(tree)
            except ScriptExit:
                pass
            return list(self.capture)
        finally:
            self.sandbox -= 1
            self.state = saved_state
            self.capture = saved_capture

