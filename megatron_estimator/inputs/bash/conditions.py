"""Conditions: ``[[ ... ]]`` and ``test`` / ``[ ... ]``, evaluated where the operands are known.

A file test (``-f``, ``-d`` ...) or an operand that cannot be known statically gives None
(undecided): the interpreter then follows both branches.  ``Conditions`` is a part of ``Interpreter``.
"""

from __future__ import annotations

import re

from megatron_estimator.inputs.bash.arith import ArithError, Arithmetic, ArithUnknown
from megatron_estimator.inputs.bash.pattern import glob_to_regex
from megatron_estimator.inputs.bash.syntax import CondCmd, Word
from megatron_estimator.inputs.bash.values import Field, Origin, fallback_text


class Conditions:
    """``[[ ]]`` and ``test``: the condition half of the interpreter."""

    # ---- tests --------------------------------------------------------------------

    def run_cond(self, node: CondCmd):
        tokens = node.tokens
        self._cond_pos = 0
        try:
            value = self.cond_or(tokens)
        except CondError:
            return None
        if self._cond_pos != len(tokens):
            return None
        if value is None:
            return None
        return 0 if value else 1

    def cond_or(self, tokens):
        left = self.cond_and(tokens)
        while self._cond_pos < len(tokens) and tokens[self._cond_pos] == "||":
            self._cond_pos += 1
            right = self.cond_and(tokens)
            left = True if (left is True or right is True) else (None if (left is None or right is None) else False)
        return left

    def cond_and(self, tokens):
        left = self.cond_not(tokens)
        while self._cond_pos < len(tokens) and tokens[self._cond_pos] == "&&":
            self._cond_pos += 1
            right = self.cond_not(tokens)
            left = False if (left is False or right is False) else (None if (left is None or right is None) else True)
        return left

    def cond_not(self, tokens):
        if self._cond_pos < len(tokens) and tokens[self._cond_pos] == "!":
            self._cond_pos += 1
            value = self.cond_not(tokens)
            return None if value is None else not value
        if self._cond_pos < len(tokens) and tokens[self._cond_pos] == "(":
            self._cond_pos += 1
            value = self.cond_or(tokens)
            if self._cond_pos >= len(tokens) or tokens[self._cond_pos] != ")":
                raise CondError()
            self._cond_pos += 1
            return value
        return self.cond_primary(tokens)

    def cond_text(self, word) -> str | None:
        if isinstance(word, str):
            return word
        segs = self.expand_scalar(word, tilde=True)
        self.note_unset(s.cause for s in segs if s.cause is not None)
        return fallback_text(segs)

    def note_unset(self, causes) -> None:
        """A condition read an unset variable as '' (what bash does): kept, so that a guard that
        would stop the script on it (``[ -z "$1" ] && exit 1``) can be assumed to pass."""
        self.unset_in_condition.extend(c for c in causes if c.fallback == "")

    def cond_primary(self, tokens):
        k = self._cond_pos
        if k >= len(tokens):
            raise CondError()
        first = tokens[k]
        first_lit = first.literal() if isinstance(first, Word) else first
        nxt = tokens[k + 1] if k + 1 < len(tokens) else None
        nxt_lit = nxt.literal() if isinstance(nxt, Word) else nxt
        # binary
        if nxt_lit in BINARY_TESTS or nxt_lit in ("<", ">", "=~"):
            if k + 2 >= len(tokens):
                raise CondError()
            right = tokens[k + 2]
            self._cond_pos = k + 3
            left_text = self.cond_text(first)
            if nxt_lit in ("==", "=", "!="):
                if left_text is None:
                    return None
                chunks, causes = self.pattern_chunks(right) if isinstance(right, Word) else ([(right, True)], [])
                if causes:
                    return None
                matched = re.fullmatch(glob_to_regex(chunks), left_text, re.S) is not None
                return matched if nxt_lit != "!=" else not matched
            if nxt_lit == "=~":
                if left_text is None or not isinstance(right, Word):
                    return None
                chunks, causes = self.pattern_chunks(right)
                if causes:
                    return None
                regex = "".join(re.escape(t) if q else t for t, q in chunks)
                try:
                    return re.search(regex, left_text) is not None
                except re.error:
                    return None
            right_text = self.cond_text(right)
            return binary_test(nxt_lit, left_text, right_text, arith=lambda t: self.cond_arith(t, first))
        if isinstance(first, Word) and first_lit in UNARY_TESTS and nxt is not None and nxt not in ("&&", "||", ")"):
            self._cond_pos = k + 2
            return self.unary_test(first_lit, self.cond_text(nxt))
        self._cond_pos = k + 1
        text = self.cond_text(first)
        return None if text is None else bool(text)

    def cond_arith(self, text: str, word) -> int | None:
        origin = word.origin if isinstance(word, Word) else self.current_line or Origin(self.reader.display, 0)
        try:
            return Arithmetic(self, text, origin).run()
        except (ArithUnknown, ArithError):
            return None

    def unary_test(self, op: str, operand: str | None):
        if operand is None:
            return None
        if op == "-z":
            return operand == ""
        if op == "-n":
            return operand != ""
        if op == "-v":
            name = operand.split("[", 1)[0]
            return name in self.state.vars
        return None       # file tests and shell options: known only on the machine that runs the script

    def test_builtin(self, fields: list[Field], closing: bool):
        args: list[str] = []
        for f in fields[1:]:
            self.note_unset(f.causes)
            if f.uncertain and all(c.fallback == "" for c in f.causes) and all(
                    s.cause is not None or s.text == "" for s in f.segs):
                continue          # an unquoted unset variable: bash drops the word
            text = fallback_text(f.segs)
            if text is None or f.uncertain:
                return None
            args.append(text)
        if closing:
            if not args or args[-1] != "]":
                return 2
            args = args[:-1]
        try:
            value = TestEvaluator(self, args).run()
        except CondError:
            return 2
        if value is None:
            return None
        return 0 if value else 1


class CondError(Exception):
    pass


BINARY_TESTS = frozenset({"=", "==", "!=", "<", ">", "-eq", "-ne", "-lt", "-le", "-gt", "-ge", "-nt", "-ot", "-ef"})
UNARY_TESTS = frozenset({"-a", "-b", "-c", "-d", "-e", "-f", "-g", "-h", "-k", "-p", "-r", "-s", "-t", "-u", "-w",
                          "-x", "-G", "-L", "-N", "-O", "-S", "-z", "-n", "-v", "-o", "-R"})


def binary_test(op: str, left: str | None, right: str | None, arith=None):
    if left is None or right is None:
        return None
    if op in ("=", "=="):
        return left == right
    if op == "!=":
        return left != right
    if op == "<":
        return left < right
    if op == ">":
        return left > right
    if op in ("-eq", "-ne", "-lt", "-le", "-gt", "-ge"):
        if arith is not None:
            a, b = arith(left), arith(right)
        else:
            try:
                a, b = int(left.strip()), int(right.strip())
            except ValueError:
                raise CondError()
        if a is None or b is None:
            return None
        return {"-eq": a == b, "-ne": a != b, "-lt": a < b, "-le": a <= b, "-gt": a > b, "-ge": a >= b}[op]
    return None      # -nt, -ot, -ef compare files


class TestEvaluator:
    """test / [ over already expanded arguments (POSIX rules, -a / -o / ! / parentheses)."""

    def __init__(self, interp, args: list[str]):
        self.interp = interp
        self.args = args
        self.k = 0

    def run(self):
        if not self.args:
            return False
        if len(self.args) == 1:
            return self.args[0] != ""
        if len(self.args) == 2 and self.args[0] == "!":
            return self.args[1] == ""
        if len(self.args) == 3 and self.args[1] in BINARY_TESTS:
            return binary_test(self.args[1], self.args[0], self.args[2])
        value = self.or_()
        if self.k != len(self.args):
            raise CondError()
        return value

    def or_(self):
        left = self.and_()
        while self.k < len(self.args) and self.args[self.k] == "-o":
            self.k += 1
            right = self.and_()
            left = True if (left is True or right is True) else (None if None in (left, right) else False)
        return left

    def and_(self):
        left = self.not_()
        while self.k < len(self.args) and self.args[self.k] == "-a":
            self.k += 1
            right = self.not_()
            left = False if (left is False or right is False) else (None if None in (left, right) else True)
        return left

    def not_(self):
        if self.k < len(self.args) and self.args[self.k] == "!":
            self.k += 1
            value = self.not_()
            return None if value is None else not value
        return self.primary()

    def primary(self):
        args = self.args
        k = self.k
        if k >= len(args):
            raise CondError()
        if args[k] == "(":
            self.k += 1
            value = self.or_()
            if self.k >= len(args) or args[self.k] != ")":
                raise CondError()
            self.k += 1
            return value
        if k + 2 < len(args) + 0 and k + 1 < len(args) and args[k + 1] in BINARY_TESTS and k + 2 < len(args):
            self.k = k + 3
            return binary_test(args[k + 1], args[k], args[k + 2])
        if args[k] in UNARY_TESTS and k + 1 < len(args):
            self.k = k + 2
            return self.interp.unary_test(args[k], args[k + 1])
        self.k = k + 1
        return args[k] != ""

