"""The interpreter: runs a parsed script as bash would, without running any program.

It keeps variables, functions and the directory; follows ``if``/``case``/``&&``/``||`` whose
conditions it can evaluate (both ways, merged, where it cannot), loops over known words
(a loop over unknown ones runs once and what it changes becomes unknown), functions and
``source``d files; and hands each program the script would execute to the caller's visitor.
Word expansion is in ``expansion``, ``[[ ]]``/``test`` in ``conditions``, builtins in ``builtins``.
"""

from __future__ import annotations

import os
import re
from dataclasses import replace

from megatron_estimator.inputs.bash.arith import ArithError, Arithmetic, ArithUnknown
from megatron_estimator.inputs.bash.builtins import BUILTINS
from megatron_estimator.inputs.bash.commands import CommandVisitor, ExecutedCommand
from megatron_estimator.inputs.bash.conditions import Conditions
from megatron_estimator.inputs.bash.expansion import Expansion
from megatron_estimator.inputs.bash.lexer import Lexer
from megatron_estimator.inputs.bash.pattern import glob_to_regex
from megatron_estimator.inputs.bash.state import FunctionReturn, ImpureCommand, LoopJump, ScriptExit, ShellState
from megatron_estimator.inputs.bash.syntax import (
    AndOr, ArithCmd, ArithFor, Assign, Case, CondCmd, For, FuncDef, Group, If, ListNode, Pipeline, ShellSyntaxError,
    Simple, While, Word,
)
from megatron_estimator.inputs.bash.values import (
    MAX_DEPTH, MAX_LOOP_ITERATIONS, NAME, UNSUPPORTED, ArrayValue, Cause, Field, Origin, Seg, Var,
    causes_of, fallback_text, is_known, lit_seg, text_of, value_key,
)


class Interpreter(Expansion, Conditions):
    """Runs a parsed script on a ``ShellState`` without running any program.

    ``reader``: the ``ShellReader`` it belongs to (the file, the sourced files, the problems).
    ``visitor``: told of each program the script would execute, and of notes.
    ``nested``: a ``sh -c`` string read for the caller, not the script itself.
    """

    def __init__(self, reader, state: ShellState, visitor: CommandVisitor, nested: bool = False):
        self.reader = reader
        self.visitor = visitor
        self.nested = nested
        self.state = state
        self.conditions: list[str] = []
        self.depth = 0
        self.sandbox = 0           # > 0 inside $(...)
        self.capture: list = []            # output inside $(...): text (str) and located segments (Seg)
        self.current_line: Origin | None = None
        self.func_depth = 0
        self.local_frames: list[dict] = []
        self.decided: list[str] = []     # the known conditions whose branch is running
        # The script's own arguments when the caller did not say them: "$@" of the script
        # (not of a function) cannot be known then.
        self.unknown_script_args: list | None = None
        self.unknown_args_advice = ""    # added to the problem of "$@" when they are not known
        self.loop_depth = 0
        self.unset_in_condition: list = []   # the unset variables the condition being read took as ''

    # ---- branching ------------------------------------------------------------------

    def branch(self, paths: list, reason: str, origin: Origin):
        """Run each path (a callable) on its own copy of the state and merge what survives."""
        base = self.state
        alive: list[tuple[ShellState, int | None]] = []
        for path in paths:
            self.state = base.fork()
            self.conditions.append(reason)
            try:
                status = path()
                alive.append((self.state, status))
            except (ScriptExit, FunctionReturn, LoopJump):
                pass
            finally:
                self.conditions.pop()
        self.state = base
        if not alive:
            raise ScriptExit(None)
        self.state = self.merge([s for s, _ in alive], reason, origin)
        statuses = {st for _, st in alive}
        status = statuses.pop() if len(statuses) == 1 else None
        self.state.status = status
        return status

    def merge(self, states: list[ShellState], reason: str, origin: Origin) -> ShellState:
        if len(states) == 1:
            return states[0]
        first = states[0]
        merged = first.fork()
        names = set()
        for st in states:
            names.update(st.vars)
        for name in names:
            values = [st.vars.get(name) for st in states]
            keys = {None if v is None else value_key(v.value) for v in values}
            if len(keys) == 1:
                present = next((v for v in values if v is not None), None)
                if present is None:
                    merged.vars.pop(name, None)
                else:
                    exported = any(v is not None and v.exported for v in values)
                    merged.vars[name] = replace(present, exported=exported)
                continue
            origins = [v.origin for v in values if v is not None and v.origin is not None]
            cause = Cause(UNSUPPORTED, origin, name,
                          f"{name} is set differently depending on {reason}, which cannot be decided statically"
                          + (f" (set at {', '.join(str(o) for o in origins[:3])})" if origins else ""))
            exported = any(v is not None and v.exported for v in values)
            merged.vars[name] = Var(cause, exported, False, origins[0] if origins else origin)
        pos_keys = {(value_key(ArrayValue(tuple(enumerate(st.positional)))) if isinstance(st.positional, list)
                     else ("cause",)) for st in states}
        if len(pos_keys) > 1:
            merged.positional = Cause(UNSUPPORTED, origin, "$@",
                                      f"the script's arguments depend on {reason}, which cannot be decided statically")
        for st in states[1:]:
            for fname, fdef in st.functions.items():
                merged.functions.setdefault(fname, fdef)
        if len({st.cwd for st in states}) > 1:
            merged.cwd = None
        merged.allexport = any(st.allexport for st in states)
        merged.nounset = next((st.nounset for st in states if st.nounset is not None), None)
        return merged

    def taint(self, before: ShellState, after: ShellState, reason: str, origin: Origin, what: str) -> None:
        """Variables a loop of unknown iterations changed become unknown."""
        for name, var in after.vars.items():
            old = before.vars.get(name)
            if old is not None and value_key(old.value) == value_key(var.value):
                continue
            cause = Cause(UNSUPPORTED, origin, name,
                          f"{name} is built in the {what} at {origin}, whose iterations cannot be known statically")
            self.state.vars[name] = Var(cause, var.exported or (old.exported if old else False), False, var.origin)

    # ---- running --------------------------------------------------------------------

    def run_list(self, node: ListNode):
        status = self.state.status
        for and_or, background in node.items:
            if background:
                saved = self.state
                self.state = saved.fork()
                try:
                    self.run_and_or(and_or)
                except (ScriptExit, FunctionReturn):
                    pass
                finally:
                    self.state = saved
                status = 0
                self.state.status = 0
            else:
                status = self.run_and_or(and_or)
        return status

    def guard(self, taken, other, condition: str, unset: list):
        """A condition decided only by reading unset variables as '': when the branch it takes
        stops the script (a guard: ``[ -z "$1" ] && exit 1``), the check cannot know whether the
        job gets them, and assumes it does (the other branch), saying so."""
        saved, exit_note = self.state, self.reader.exit_note
        self.state = saved.fork()
        try:
            return taken()
        except ScriptExit:
            self.state, self.reader.exit_note = saved, exit_note
            names = ", ".join(dict.fromkeys(c.subject for c in unset))
            self.reader.assumed_guards.append(
                f"{unset[0].origin} {unset[0].subject}: the script stops when {condition} holds, which it does "
                f"here only because {names} is not set; the check assumes the job sets it and goes on")
            return other()

    def run_and_or(self, node: AndOr):
        self.unset_in_condition = []
        status = self.run_pipeline(node.first)
        unset = list(self.unset_in_condition)
        for n, (op, pipeline) in enumerate(node.rest):
            if n == 0 and unset and status is not None and not self.sandbox and (
                    (op == "&&" and status == 0) or (op == "||" and status != 0)):
                status = self.guard(lambda p=pipeline: self.run_pipeline(p), lambda s=status: 1 - min(s, 1),
                                    f"`{describe(node.first)}` at {node.first.origin}", unset)
                continue
            if status is None:
                def run_it(p=pipeline):
                    return self.run_pipeline(p)

                def skip(s=status):
                    return s
                reason = f"whether `{describe(node.first)}` succeeds at {node.first.origin}"
                status = self.branch([run_it, skip], reason, pipeline.origin)
                continue
            if (op == "&&" and status == 0) or (op == "||" and status != 0):
                status = self.run_pipeline(pipeline)
        self.state.status = status
        return status

    def run_pipeline(self, node: Pipeline):
        if len(node.commands) == 1:
            status = self.run_command(node.commands[0])
        else:
            status = None
            for command in node.commands:
                saved = self.state
                self.state = saved.fork()
                try:
                    status = self.run_command(command)
                except (ScriptExit, FunctionReturn):
                    status = None
                finally:
                    self.state = saved
        if node.negate and status is not None:
            status = 0 if status else 1
        self.state.status = status
        return status

    def run_command(self, node):
        over = self.state.budget.step()
        if over is not None:
            raise ShellSyntaxError(getattr(node, "origin", Origin(self.reader.display, 0)), over, UNSUPPORTED)
        self.depth += 1
        if self.depth > MAX_DEPTH * 4:
            self.depth -= 1
            raise ShellSyntaxError(getattr(node, "origin", Origin(self.reader.display, 0)),
                                   "the script nests calls too deeply to follow", UNSUPPORTED)
        try:
            if isinstance(node, Simple):
                status = self.run_simple(node)
            elif isinstance(node, If):
                status = self.run_if(node, 0)
            elif isinstance(node, For):
                status = self.run_for(node)
            elif isinstance(node, ArithFor):
                status = self.run_arith_for(node)
            elif isinstance(node, While):
                status = self.run_while(node)
            elif isinstance(node, Case):
                status = self.run_case(node)
            elif isinstance(node, Group):
                if node.subshell:
                    saved = self.state
                    self.state = saved.fork()
                    try:
                        status = self.run_list(node.body)
                    except ScriptExit as exc:
                        status = exc.status
                    finally:
                        self.state = saved
                else:
                    status = self.run_list(node.body)
            elif isinstance(node, FuncDef):
                self.state.functions[node.name] = node.body
                status = 0
            elif isinstance(node, CondCmd):
                status = self.run_cond(node)
            elif isinstance(node, ArithCmd):
                value = self.arith_word(node.expr, node.origin)
                status = None if isinstance(value, Cause) else (0 if value else 1)
            else:
                status = 0
        finally:
            self.depth -= 1
        self.state.status = status
        return status

    def run_if(self, node: If, k: int):
        if k >= len(node.clauses):
            if node.else_body is not None:
                return self.run_list(node.else_body)
            return 0
        cond, body, origin = node.clauses[k]
        self.unset_in_condition = []
        status = self.run_list(cond)
        unset = list(self.unset_in_condition)
        if status is not None and unset and not self.sandbox:
            taken = (lambda: self.run_list(body)) if status == 0 else (lambda: self.run_if(node, k + 1))
            other = (lambda: self.run_if(node, k + 1)) if status == 0 else (lambda: self.run_list(body))
            return self.guard(taken, other, f"`{describe(cond)}` at {origin}", unset)
        if status is None:
            reason = f"`{describe(cond)}` at {origin}"
            return self.branch([lambda: self.run_list(body), lambda: self.run_if(node, k + 1)], reason, origin)
        if status == 0:
            self.decided.append(f"`{describe(cond)}` at {origin} is true")
            try:
                return self.run_list(body)
            finally:
                self.decided.pop()
        return self.run_if(node, k + 1)

    def run_case(self, node: Case):
        word = self.expand_scalar(node.word, tilde=True)
        text = fallback_text(word)
        items = node.items
        if text is None:
            reason = f"the value of `{node.word.raw}` at {node.origin}"
            paths = [lambda body=body: self.run_list(body) for _, body, _ in items] + [lambda: 0]
            return self.branch(paths, reason, node.origin)
        k = 0
        while k < len(items):
            patterns, body, terminator = items[k]
            matched = None
            for pattern in patterns:
                chunks, causes = self.pattern_chunks(pattern)
                if causes:
                    matched = None
                    reason = f"the pattern `{pattern.raw}` at {node.origin}"
                    rest = items[k:]
                    paths = [lambda body=b: self.run_list(body) for _, b, _ in rest] + [lambda: 0]
                    return self.branch(paths, reason, node.origin)
                if re.fullmatch(glob_to_regex(chunks), text, re.S):
                    matched = True
                    break
            if matched:
                status = self.run_list(body)
                while terminator == ";&" and k + 1 < len(items):
                    k += 1
                    status = self.run_list(items[k][1])
                    terminator = items[k][2]
                return status
            k += 1
        return 0

    def in_loop(self, run, node):
        """``run(node)`` one loop deeper (``break`` / ``continue`` know how many loops enclose them)."""
        self.loop_depth += 1
        try:
            return run(node)
        finally:
            self.loop_depth -= 1

    def run_for(self, node: For):
        return self.in_loop(self._run_for, node)

    def _run_for(self, node: For):
        if node.words is None:
            pos = self.state.positional
            fields = None if isinstance(pos, Cause) else list(pos)
        else:
            fields = self.expand_fields(node.words)
            if any(f.uncertain or f.causes for f in fields):
                fields = None
        if fields is None:
            return self.abstract_loop(node.body, node.origin, f"`for {node.var}` loop", {node.var: Cause(
                UNSUPPORTED, node.origin, node.var, f"{node.var} takes values that cannot be known statically")})
        status = 0
        for n, item in enumerate(fields):
            if n >= MAX_LOOP_ITERATIONS:
                break
            self.set_var(node.var, item.segs, node.origin)
            try:
                status = self.run_list(node.body)
            except LoopJump as jump:
                if jump.levels > 1:
                    raise LoopJump(jump.kind, jump.levels - 1)
                if jump.kind == "break":
                    break
        return status

    def run_arith_for(self, node: ArithFor):
        return self.in_loop(self._run_arith_for, node)

    def _run_arith_for(self, node: ArithFor):
        init = self.arith_word(node.init, node.origin)
        if isinstance(init, Cause):
            return self.abstract_loop(node.body, node.origin, "`for ((...))` loop", {})
        status = 0
        for _ in range(MAX_LOOP_ITERATIONS):
            cond = self.arith_word(node.cond, node.origin) if node.cond.raw.strip() else 1
            if isinstance(cond, Cause):
                return self.abstract_loop(node.body, node.origin, "`for ((...))` loop", {})
            if not cond:
                return status
            try:
                status = self.run_list(node.body)
            except LoopJump as jump:
                if jump.levels > 1:
                    raise LoopJump(jump.kind, jump.levels - 1)
                if jump.kind == "break":
                    return status
            step = self.arith_word(node.step, node.origin)
            if isinstance(step, Cause):
                return self.abstract_loop(node.body, node.origin, "`for ((...))` loop", {})
        return self.abstract_loop(node.body, node.origin, "`for ((...))` loop", {})

    def run_while(self, node: While):
        return self.in_loop(self._run_while, node)

    def _run_while(self, node: While):
        status = 0
        what = "`until` loop" if node.until else "`while` loop"
        for _ in range(MAX_LOOP_ITERATIONS):
            cond = self.run_list(node.cond)
            if cond is None:
                return self.abstract_loop(node.body, node.origin, what, {})
            if (cond == 0) == node.until:
                return status
            try:
                status = self.run_list(node.body)
            except LoopJump as jump:
                if jump.levels > 1:
                    raise LoopJump(jump.kind, jump.levels - 1)
                if jump.kind == "break":
                    return status
        return self.abstract_loop(node.body, node.origin, what, {})

    def abstract_loop(self, body: ListNode, origin: Origin, what: str, unknown_vars: dict):
        """Run a loop body once on a copy; what it changes becomes unknown."""
        before = self.state
        self.state = before.fork()
        for name, cause in unknown_vars.items():
            self.set_var(name, cause, origin)
        self.conditions.append(f"the {what} at {origin}")
        try:
            self.run_list(body)
        except (ScriptExit, FunctionReturn, LoopJump):
            pass
        finally:
            self.conditions.pop()
        after = self.state
        self.state = before
        self.taint(before, after, what, origin, what)
        for name in unknown_vars:
            self.state.vars[name] = Var(unknown_vars[name], False, False, origin)
        self.state.status = None
        return None

    # ---- simple commands ------------------------------------------------------------

    def run_simple(self, node: Simple):
        self.current_line = node.origin
        if not node.words:
            status = 0
            for assign in node.assigns:
                self.assign(assign, node.origin)
            return status
        head = node.words[0]
        if isinstance(head, Assign):
            return 0
        head_fields = self.word_fields(head)
        rest_words = node.words[1:]
        if head_fields and not head_fields[0].causes:
            name = head_fields[0].text
        else:
            name = None
        if name in ("declare", "typeset", "local", "export", "readonly") and len(head_fields) == 1:
            return self.declaration(name, rest_words, node)
        fields = head_fields + self.expand_fields([w for w in rest_words if isinstance(w, Word)])
        over = self.state.budget.size(fields, "this command")
        if over is not None:
            raise ShellSyntaxError(node.origin, over, UNSUPPORTED)
        if not fields:
            for assign in node.assigns:
                self.assign(assign, node.origin)
            return 0
        if name is None:
            if fields[0].causes:
                if self.sandbox:
                    raise ImpureCommand(f"`{head.raw}`")
                self.unknown_program(fields, node)
                return None
            name = fields[0].text
        temp_env: dict[str, tuple[tuple, Origin]] = {}
        for assign in node.assigns:
            if assign.array is None and assign.index is None:
                temp_env[assign.name] = (self.expand_scalar(assign.value, tilde=True) if assign.value else (), assign.origin)
        if name in self.state.functions:
            return self.call_function(name, fields, temp_env, node)
        handler = BUILTINS.get(name)
        if handler is not None:
            return handler(self, fields, node, temp_env)
        return self.external(fields, temp_env, node)

    def external(self, fields: list[Field], temp_env: dict, node: Simple):
        name = os.path.basename(fields[0].text)
        if self.sandbox:
            return self.pure_command(name, fields, node)
        self.report(fields, temp_env, node, resolved=True)
        return None

    def pure_command(self, name: str, fields: list[Field], node: Simple | None = None):
        if name == "cat" and node is not None and all(f.text == "-" for f in fields[1:]):
            # ``cat <<EOF`` (``CMD=$(cat <<EOF ... EOF)``): its output is the here-document's
            # text, each character where it is written, unknown values kept as such
            body = self.here_document(node)
            if body is not None:
                self.capture.extend(body)
                return 0
        args = []
        for f in fields[1:]:
            text = fallback_text(f.segs)
            if text is None or (f.uncertain and f.causes):
                raise ImpureCommand(f"`{fields[0].text}` with an argument that cannot be known statically")
            args.append(text)
        if name == "dirname":
            paths = [a for a in args if not a.startswith("-")]
            if not paths:
                raise ImpureCommand("`dirname` without a path")
            self.capture.append("".join(path_dirname(p) + "\n" for p in paths))
            return 0
        if name in ("realpath", "readlink"):
            options = [a for a in args if a.startswith("-")]
            paths = [a for a in args if not a.startswith("-")]
            if name == "readlink" and not any(o.strip("-") in ("f", "e", "m", "canonicalize") for o in options):
                raise ImpureCommand("`readlink` without -f")
            if not paths or self.state.cwd is None and not all(p.startswith("/") for p in paths):
                raise ImpureCommand(f"`{name}` of a path relative to a directory that cannot be known statically")
            # the script being read is on this machine: its path resolves here as it would there
            self.capture.append("".join(os.path.realpath(os.path.join(self.state.cwd or "/", p)) + "\n" for p in paths))
            return 0
        if name == "basename":
            plain = [a for a in args if not a.startswith("-")]
            if not plain:
                raise ImpureCommand("`basename` without a path")
            base = plain[0].rstrip("/").rsplit("/", 1)[-1] or "/"
            if len(plain) > 1 and base.endswith(plain[1]) and base != plain[1]:
                base = base[: -len(plain[1])]
            self.capture.append(base + "\n")
            return 0
        raise ImpureCommand(f"`{fields[0].text}`")

    def unknown_program(self, fields: list[Field], node: Simple) -> None:
        self.report(fields, {}, node, resolved=False)

    def report(self, fields: list[Field], temp_env: dict, node: Simple, resolved: bool) -> None:
        """Tell the visitor of a program the script executes here."""
        self.visitor.command(ExecutedCommand(tuple(fields), node.origin, dict(temp_env), dict(self.state.vars),
                                             tuple(self.conditions), resolved, self.current_line,
                                             self.here_document(node), self.state.cwd))

    def here_document(self, node: Simple) -> tuple | None:
        """The text a here-document on the command gives its standard input, as segments: the body
        as written when the delimiter is quoted, else expanded as bash does (parameters, command
        and arithmetic substitution; a backslash quotes only ``$``, a backquote, itself and a newline)."""
        doc = next((r.heredoc for r in reversed(node.redirects) if r.heredoc is not None), None)
        if doc is None:
            return None
        if not doc.text:
            return ()
        if doc.quoted:
            return (Seg(doc.text, tuple(doc.origins)),)
        end = doc.origins[-1]
        lexer = Lexer(doc.text + "\x00", list(doc.origins) + [end])
        parts = lexer.read_parts(stop="\x00", in_dquote=True, heredoc=True)
        return self.expand_scalar(Word(parts, doc.origins[0], doc.text))

    def call_function(self, name: str, fields: list[Field], temp_env: dict, node: Simple):
        body = self.state.functions[name]
        if self.func_depth >= MAX_DEPTH:
            raise ShellSyntaxError(node.origin, f"function {name} calls itself too deeply to follow", UNSUPPORTED)
        saved_positional = self.state.positional
        self.state.positional = list(fields[1:])
        saved_vars = {}
        for var_name, (segs, origin) in temp_env.items():
            saved_vars[var_name] = self.state.vars.get(var_name)
            self.set_var(var_name, segs, origin, export=True)
        self.local_frames.append({})
        self.func_depth += 1
        try:
            status = self.run_command(body)
        except FunctionReturn as ret:
            status = ret.status
        finally:
            self.func_depth -= 1
            frame = self.local_frames.pop()
            for var_name, old in {**saved_vars, **frame}.items():
                if old is None:
                    self.state.vars.pop(var_name, None)
                else:
                    self.state.vars[var_name] = old
            self.state.positional = saved_positional
        return status

    def assign(self, a: Assign, origin: Origin, *, export: bool | None = None, integer: bool | None = None,
               as_array: bool = False) -> None:
        old = self.state.vars.get(a.name)
        if integer is None and old is not None:
            integer = old.integer
        if a.array is not None:
            if a.append and old is not None and isinstance(old.value, Cause):
                self.set_var(a.name, old.value, a.origin, export=export)
                return
            elems: dict[int, Field] = {}
            if a.append and old is not None:
                elems = old.value.as_dict() if isinstance(old.value, ArrayValue) else {0: Field(old.value)}
            next_index = (max(elems) + 1) if elems else 0
            for item in a.array:
                if isinstance(item, tuple):
                    key = self.arith_index(item[0], a.origin)
                    if isinstance(key, Cause):
                        self.set_var(a.name, key, a.origin, export=export)
                        return
                    elems[key] = Field(self.expand_scalar(item[1], tilde=True), False, item[1].origin)
                    next_index = key + 1
                    continue
                for f in self.word_fields(item):
                    elems[next_index] = f
                    next_index += 1
            self.set_var(a.name, ArrayValue.of(elems), a.origin, export=export, integer=integer)
            return
        value = self.expand_scalar(a.value, tilde=True) if a.value is not None else ()
        if integer:
            result = self.arith_value(value, a.origin)
            value = result
        if a.index is not None:
            key = self.arith_index(a.index, a.origin)
            if isinstance(key, Cause) or (old is not None and isinstance(old.value, Cause)):
                self.set_var(a.name, key if isinstance(key, Cause) else old.value, a.origin, export=export)
                return
            elems = {}
            if old is not None:
                elems = old.value.as_dict() if isinstance(old.value, ArrayValue) else {0: Field(old.value)}
            if a.append and key in elems:
                value = tuple(elems[key].segs) + tuple(value)
            elems[key] = Field(tuple(value), False, a.origin)
            self.set_var(a.name, ArrayValue.of(elems), a.origin, export=export, integer=integer)
            return
        if a.append and old is not None:
            if isinstance(old.value, Cause):
                value = old.value
            elif isinstance(old.value, ArrayValue):
                elems = old.value.as_dict()
                base = elems.get(0, Field(())).segs
                elems[0] = Field(tuple(base) + tuple(value), False, a.origin)
                self.set_var(a.name, ArrayValue.of(elems), a.origin, export=export, integer=integer)
                return
            elif integer:
                value = self.arith_value(tuple(old.value) + (lit_seg("+", a.origin),) + tuple(value), a.origin)
            else:
                value = tuple(old.value) + tuple(value)
        if as_array and not isinstance(value, Cause):
            value = ArrayValue.of({0: Field(tuple(value))})
        self.set_var(a.name, value, a.origin, export=export, integer=integer)

    def arith_value(self, segs, origin: Origin):
        if not is_known(segs):
            return causes_of(segs)[0]
        try:
            return (lit_seg(str(Arithmetic(self, text_of(segs), origin).run()), origin),)
        except ArithUnknown as exc:
            return exc.cause
        except ArithError as exc:
            return Cause(UNSUPPORTED, origin, text_of(segs), f"`{text_of(segs)}` cannot be evaluated: {exc}")

    def declaration(self, builtin: str, words: list, node: Simple):
        flags: set[str] = set()
        unflags: set[str] = set()
        items = []
        for w in words:
            if isinstance(w, Word):
                lit = w.literal()
                if lit is not None and len(lit) > 1 and lit[0] in "-+" and not items:
                    (flags if lit[0] == "-" else unflags).update(lit[1:])
                    continue
            items.append(w)
        export = builtin == "export" or "x" in flags
        if builtin == "export" and "n" in flags:
            export = False
        integer = True if "i" in flags else None
        in_function = bool(self.local_frames)
        local = in_function and (builtin == "local" or (builtin in ("declare", "typeset") and "g" not in flags))
        if "f" in flags or "p" in flags and not items:
            return 0
        for item in items:
            if isinstance(item, Assign):
                if local:
                    self.local_frames[-1].setdefault(item.name, self.state.vars.get(item.name))
                if "A" in flags:
                    cause = Cause(UNSUPPORTED, item.origin, item.name,
                                  f"{item.name} is an associative array (declare -A), which this tool does not follow")
                    self.set_var(item.name, cause, item.origin, export=export)
                    continue
                self.assign(item, node.origin, export=export if export else None, integer=integer,
                            as_array="a" in flags)
                if builtin == "export" and "n" in flags:
                    var = self.state.vars[item.name]
                    self.state.vars[item.name] = replace(var, exported=False)
                continue
            for f in self.word_fields(item):
                text = text_of(f.segs)
                if f.causes:
                    continue
                if "=" in text and NAME.fullmatch(text.split("=", 1)[0].rstrip("+")):
                    var_name, _, value = text.partition("=")
                    seg_value = (lit_seg(value, f.segs[0].origins[0] if f.segs and f.segs[0].origins else node.origin),)
                    if local:
                        self.local_frames[-1].setdefault(var_name, self.state.vars.get(var_name))
                    self.set_var(var_name, seg_value, node.origin, export=export if export else None,
                                 integer=integer)
                    continue
                if not NAME.fullmatch(text):
                    continue
                old = self.state.vars.get(text)
                if local:
                    self.local_frames[-1].setdefault(text, old)
                    if old is not None and builtin == "local":
                        self.state.vars.pop(text, None)
                        old = None
                if old is None:
                    if "a" in flags:
                        self.set_var(text, ArrayValue(), node.origin, export=export if export else None)
                    elif builtin == "export" or "x" in flags:
                        # exported but unset: nothing reaches the environment
                        pass
                    continue
                exported = old.exported
                if export:
                    exported = True
                if builtin == "export" and "n" in flags:
                    exported = False
                if "x" in unflags:
                    exported = False
                self.state.vars[text] = replace(old, exported=exported,
                                                origin=old.origin if old.origin is not None else (
                                                    node.origin if exported and not old.exported else None))
        return 0


def path_dirname(path: str) -> str:
    stripped = path.rstrip("/")
    if not stripped:
        return "/" if path.startswith("/") else "."
    if "/" not in stripped:
        return "."
    head = stripped.rsplit("/", 1)[0].rstrip("/")
    return head or "/"


def describe(node) -> str:
    raw = getattr(node, "raw", "") or ""
    raw = " ".join(raw.split()).rstrip(";").rstrip()
    return raw if len(raw) <= 60 else raw[:57] + "..."

