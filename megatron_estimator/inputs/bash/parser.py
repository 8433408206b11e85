"""The shell grammar: lists, and-or lists, pipelines, compound commands (``if``, ``for``,
``while``/``until``, ``case``, ``[[ ]]``, ``(( ))``, groups, functions), redirections and
assignments, read by recursive descent over the ``Lexer``'s words.

``parse(text, origins)`` is the entry: one ``Origin`` per character of ``text``.
"""

from __future__ import annotations

import re
from typing import Sequence

from megatron_estimator.inputs.bash.lexer import METACHARS, Lexer
from megatron_estimator.inputs.bash.syntax import (
    AndOr, ArithCmd, ArithFor, Assign, Case, CondCmd, For, FuncDef, Group, HereDoc, If, ListNode, Pipeline, Redirect,
    Simple, While, Word,
)
from megatron_estimator.inputs.bash.values import NAME, Origin


_EMPTY_PARENS = re.compile(r"\([ \t]*\)")


class Parser(Lexer):
    """A recursive-descent parser for bash."""

    # ---- scripts and lists ------------------------------------------------------------

    def parse_script(self) -> ListNode:
        body = self.parse_list(set())
        self.skip_linebreaks()
        if self.i < self.n:
            raise self.error(f"unexpected {self.s[self.i:self.i + 10].split()[0] if self.s[self.i:].split() else self.s[self.i]!r}")
        return body

    def at_end_word(self, ends: set) -> bool:
        """Is the next word one of the reserved words ``ends`` (in command position)?"""
        self.skip_blanks()
        if not ends:
            return False
        for word in ends:
            if self.startswith(word):
                after = self.s[self.i + len(word):self.i + len(word) + 1]
                if word in (")", ";;", ";&", ";;&"):
                    return True
                if after == "" or after in METACHARS:
                    return True
        return False

    def parse_list(self, ends: set) -> ListNode:
        self.skip_linebreaks()
        begin = self.i
        node = self._parse_list(ends)
        node.raw = self.s[begin:self.i].strip()
        return node

    def _parse_list(self, ends: set) -> ListNode:
        items = []
        while True:
            self.skip_linebreaks()
            if self.i >= self.n or self.at_end_word(ends):
                break
            if self.op() in (")", ";;", ";&", ";;&") and ")" not in ends and ";;" not in ends:
                raise self.error(f"unexpected {self.op()!r}")
            if self.op() in (")", ";;", ";&", ";;&"):
                break
            and_or = self.parse_and_or(ends)
            sep = self.op()
            background = False
            if sep == "&":
                self.i += 1
                background = True
            elif sep == ";":
                self.i += 1
            elif sep == "\n":
                pass
            items.append((and_or, background))
            if sep not in ("&", ";", "\n"):
                # the list ends here (a reserved word, ')' or ';;' follows, or the input ends)
                self.skip_blanks()
                if self.i < self.n and not (self.at_end_word(ends) or self.op() in (")", ";;", ";&", ";;&")):
                    raise self.error(f"unexpected {self.s[self.i:].split()[0]!r}")
                if self.i >= self.n or self.at_end_word(ends) or self.op() in (")", ";;", ";&", ";;&"):
                    break
        return ListNode(items)

    def parse_and_or(self, ends: set) -> AndOr:
        first = self.parse_pipeline(ends)
        rest = []
        while True:
            op = self.op()
            if op not in ("&&", "||"):
                break
            self.i += 2
            self.skip_linebreaks()
            rest.append((op, self.parse_pipeline(ends)))
        return AndOr(first, rest)

    def parse_pipeline(self, ends: set) -> Pipeline:
        self.skip_blanks()
        origin = self.origin()
        negate = False
        while True:
            self.skip_blanks()
            if self.startswith("!") and self.peek(1) in (" ", "\t"):
                negate = not negate
                self.i += 1
                continue
            if self.startswith("time") and (self.peek(4) in (" ", "\t")):
                # the `time` keyword times the pipeline; -p is its only option
                self.i += 4
                self.skip_blanks()
                if self.startswith("-p") and self.peek(2) in (" ", "\t"):
                    self.i += 2
                continue
            break
        begin = self.i
        commands = [self.parse_command(ends)]
        while self.op() in ("|", "|&"):
            self.i += 2 if self.startswith("|&") else 1
            self.skip_linebreaks()
            commands.append(self.parse_command(ends))
        return Pipeline(commands, negate, origin, self.s[begin:self.i].strip())

    # ---- commands ------------------------------------------------------------------

    def parse_command(self, ends: set):
        self.skip_blanks()
        origin = self.origin()
        start = self.i
        if self.op() == "(":
            if self.startswith("(("):
                return self.parse_arith_command()
            self.i += 1
            body = self.parse_list({")"})
            self.skip_linebreaks()
            if self.peek() != ")":
                raise self.error("a ( subshell is not closed with )", start)
            self.i += 1
            return Group(body, True, origin, self.parse_redirects())
        word = self.peek_word()
        if word == "{":
            self.i += 1
            body = self.parse_list({"}"})
            self.expect_word("}", start, "a { group is not closed with }")
            return Group(body, False, origin, self.parse_redirects())
        if word == "if":
            return self.parse_if()
        if word in ("while", "until"):
            return self.parse_while(word)
        if word == "for":
            return self.parse_for()
        if word == "case":
            return self.parse_case()
        if word == "function":
            return self.parse_function_keyword()
        if word == "[[":
            return self.parse_cond()
        if word in ("then", "elif", "else", "fi", "do", "done", "esac", "}"):
            raise self.error(f"unexpected {word!r}")
        # name() compound
        match = NAME.match(self.s, self.i)
        if match:
            j = match.end()
            k = j
            while k < self.n and self.s[k] in " \t":
                k += 1
            empty_parens = _EMPTY_PARENS.match(self.s, k)
            if empty_parens:
                name = match.group(0)
                self.i = empty_parens.end()
                self.skip_linebreaks()
                body = self.parse_command(ends)
                return FuncDef(name, body, origin)
        return self.parse_simple()

    def peek_word(self) -> str | None:
        """The next word if it is a plain unquoted literal (for reserved words)."""
        self.skip_blanks()
        j = self.i
        while j < self.n and self.s[j] not in METACHARS and self.s[j] not in "'\"\\$`":
            j += 1
        if j < self.n and self.s[j] not in METACHARS:
            return None
        return self.s[self.i:j] or None

    def expect_word(self, word: str, start: int, message: str) -> None:
        self.skip_linebreaks()
        if self.peek_word() != word:
            raise self.error(message, start)
        self.i += len(word)

    def parse_if(self) -> If:
        start = self.i
        origin = self.origin()
        self.i += 2
        clauses = []
        else_body = None
        while True:
            cond = self.parse_list({"then"})
            self.expect_word("then", start, "`if` without `then`")
            body = self.parse_list({"elif", "else", "fi"})
            clauses.append((cond, body, origin))
            self.skip_linebreaks()
            word = self.peek_word()
            if word == "elif":
                origin = self.origin()
                self.i += 4
                continue
            if word == "else":
                self.i += 4
                else_body = self.parse_list({"fi"})
                self.expect_word("fi", start, "`if` without `fi`")
                break
            if word == "fi":
                self.i += 2
                break
            raise self.error("`if` without `fi`", start)
        return If(clauses, else_body, clauses[0][2])

    def parse_while(self, keyword: str) -> While:
        start = self.i
        origin = self.origin()
        self.i += len(keyword)
        cond = self.parse_list({"do"})
        self.expect_word("do", start, f"`{keyword}` without `do`")
        body = self.parse_list({"done"})
        self.expect_word("done", start, f"`{keyword}` without `done`")
        self.parse_redirects()
        return While(cond, body, keyword == "until", origin)

    def parse_for(self):
        start = self.i
        origin = self.origin()
        self.i += 3
        self.skip_blanks()
        if self.startswith("(("):
            self.i += 2
            end = self.s.find("))", self.i)
            if end < 0:
                raise self.error("`for ((` without `))`", start)
            inner = self.s[self.i:end]
            pieces = inner.split(";")
            if len(pieces) != 3:
                raise self.error("`for ((init; cond; step))` needs two semicolons", start)
            words = []
            offset = self.i
            for piece in pieces:
                words.append(self.word_from_range(offset, offset + len(piece)))
                offset += len(piece) + 1
            self.i = end + 2
            self.skip_blanks()
            if self.peek() == ";":
                self.i += 1
            self.skip_linebreaks()
            body = self.parse_do_body(start)
            return ArithFor(words[0], words[1], words[2], body, origin)
        match = NAME.match(self.s, self.i)
        if not match:
            raise self.error("`for` needs a variable name", start)
        var = match.group(0)
        self.i = match.end()
        self.skip_linebreaks()
        words = None
        if self.peek_word() == "in":
            self.i += 2
            words = []
            while True:
                self.skip_blanks()
                op = self.op()
                if op in (";", "\n"):
                    self.i += 1
                    break
                if self.i >= self.n:
                    break
                words.append(self.parse_word())
        else:
            self.skip_blanks()
            if self.peek() == ";":
                self.i += 1
        self.skip_linebreaks()
        body = self.parse_do_body(start)
        return For(var, words, body, origin)

    def parse_do_body(self, start: int) -> ListNode:
        self.skip_linebreaks()
        word = self.peek_word()
        if word == "do":
            self.i += 2
            body = self.parse_list({"done"})
            self.expect_word("done", start, "`for` without `done`")
        elif word == "{":
            self.i += 1
            body = self.parse_list({"}"})
            self.expect_word("}", start, "`for` body not closed with }")
        else:
            raise self.error("`for` without `do`", start)
        self.parse_redirects()
        return body

    def parse_case(self) -> Case:
        start = self.i
        origin = self.origin()
        self.i += 4
        self.skip_blanks()
        word = self.parse_word()
        self.skip_linebreaks()
        if self.peek_word() != "in":
            raise self.error("`case` without `in`", start)
        self.i += 2
        items = []
        while True:
            self.skip_linebreaks()
            if self.peek_word() == "esac":
                self.i += 4
                break
            if self.i >= self.n:
                raise self.error("`case` without `esac`", start)
            self.skip_blanks()
            if self.peek() == "(":
                self.i += 1
            patterns = []
            while True:
                self.skip_blanks()
                patterns.append(self.parse_word(pattern=True))
                self.skip_blanks()
                if self.peek() == "|":
                    self.i += 1
                    continue
                if self.peek() == ")":
                    self.i += 1
                    break
                raise self.error("a `case` pattern must end with )")
            body = self.parse_list({"esac", ";;", ";&", ";;&"})
            self.skip_linebreaks()
            terminator = ";;"
            for candidate in (";;&", ";;", ";&"):
                if self.startswith(candidate):
                    terminator = candidate
                    self.i += len(candidate)
                    break
            items.append((patterns, body, terminator))
        return Case(word, items, origin)

    def parse_function_keyword(self) -> FuncDef:
        origin = self.origin()
        self.i += len("function")
        self.skip_blanks()
        match = NAME.match(self.s, self.i) or re.compile(r"[^\s()]+").match(self.s, self.i)
        if not match:
            raise self.error("`function` needs a name")
        name = match.group(0)
        self.i = match.end()
        self.skip_blanks()
        if self.startswith("()"):
            self.i += 2
        self.skip_linebreaks()
        body = self.parse_command(set())
        return FuncDef(name, body, origin)

    def parse_cond(self) -> CondCmd:
        start = self.i
        origin = self.origin()
        self.i += 2
        tokens: list = []
        regex_next = False
        while True:
            self.skip_blanks()
            if self.peek() == "\n":
                self.newline()
                continue
            if self.i >= self.n:
                raise self.error("`[[` without `]]`", start)
            if self.peek_word() == "]]":
                self.i += 2
                break
            matched = None
            for candidate in ("&&", "||", "(", ")", "!", "<", ">"):
                if self.startswith(candidate) and not (candidate == "!" and self.peek(1) not in " \t"):
                    if candidate in ("<", ">") and tokens and tokens[-1] in ("(",):
                        pass
                    matched = candidate
                    break
            if matched and not regex_next:
                tokens.append(matched)
                self.i += len(matched)
                continue
            word = self.parse_word(regex=regex_next)
            regex_next = word.literal() == "=~"
            tokens.append(word)
        return CondCmd(tokens, origin)

    def parse_arith_command(self) -> ArithCmd:
        start = self.i
        origin = self.origin()
        self.i += 2
        depth = 0
        j = self.i
        while j < self.n:
            if self.s.startswith("))", j) and depth == 0:
                break
            if self.s[j] == "(":
                depth += 1
            elif self.s[j] == ")":
                depth -= 1
            j += 1
        else:
            raise self.error("`((` without `))`", start)
        word = self.word_from_range(self.i, j)
        self.i = j + 2
        return ArithCmd(word, origin)

    def parse_redirects(self) -> list:
        redirects = []
        while True:
            self.skip_blanks()
            save = self.i
            redirect = self.try_redirect()
            if redirect is None:
                self.i = save
                return redirects
            redirects.append(redirect)

    def try_redirect(self) -> Redirect | None:
        origin = self.origin()
        j = self.i
        while j < self.n and self.s[j].isdigit():
            j += 1
        if j < self.n and self.s[j] == "{":
            pass
        rest = self.s[j:j + 3]
        op = None
        for candidate in ("&>>", "&>", ">>", "<<<", "<<-", "<<", ">&", "<&", ">|", "<>", "<", ">"):
            if rest.startswith(candidate):
                op = candidate
                break
        if op is None or (j > self.i and op.startswith("&")):
            return None
        if op in ("<", ">") and self.s.startswith("(", j + 1):
            return None                      # <(...) / >(...): process substitution, a word
        self.i = j + len(op)
        self.skip_blanks()
        if op in ("<<", "<<-"):
            word = self.parse_word()
            quoted = any(c in word.raw for c in "'\"\\")
            delimiter = word.plain() if word.plain() is not None else word.raw
            delimiter = delimiter.replace("'", "").replace('"', "")
            doc = HereDoc(delimiter, op == "<<-", quoted)
            self.heredocs.append(doc)
            return Redirect(op, None, origin, doc)
        process_substitution = self.s.startswith("<(", self.i) or self.s.startswith(">(", self.i)
        if self.i >= self.n or (self.s[self.i] in "\n;&|()<>" and not process_substitution):
            raise self.error(f"redirection {op} without a target")
        return Redirect(op, self.parse_word(), origin)

    def parse_simple(self) -> Simple:
        origin = self.origin()
        assigns: list = []
        words: list = []
        redirects: list = []
        while True:
            self.skip_blanks()
            if self.i >= self.n:
                break
            c = self.s[self.i]
            if c == "&" and self.s.startswith("&>", self.i):
                c = ">"                          # &> FILE / &>> FILE: a redirection, not the & operator
            if c in "\n;&|)" or (c == "(" and not words):
                if c == "(" and not words and not assigns:
                    raise self.error("unexpected (")
                break
            if c == "(":
                raise self.error("unexpected ( in a command")
            redirect = self.try_redirect()
            if redirect is not None:
                redirects.append(redirect)
                continue
            if c in "<>":
                raise self.error(f"bad redirection {c}")
            is_decl = bool(words) and words[0].literal() in ("declare", "typeset", "local", "export", "readonly")
            if not words or is_decl:
                assign = self.try_assignment()
                if assign is not None:
                    (words if is_decl else assigns).append(assign)
                    continue
            words.append(self.parse_word())
        if not words and not assigns and not redirects:
            raise self.error("expected a command")
        return Simple(assigns, words, redirects, origin)

    def try_assignment(self) -> Assign | None:
        match = NAME.match(self.s, self.i)       # re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\[)?")
        if not match:
            return None
        origin = self.origin()
        start = self.i
        name = match.group(0)
        j = match.end()
        index = None
        if self.s.startswith("[", j):
            j += 1
            depth = 1
            k = j
            while k < self.n and depth:
                if self.s[k] == "[":
                    depth += 1
                elif self.s[k] == "]":
                    depth -= 1
                k += 1
            if depth:
                return None
            index = self.word_from_range(j, k - 1)
            j = k
        append = False
        if self.s.startswith("+=", j):
            append = True
            j += 2
        elif self.s.startswith("=", j):
            j += 1
        else:
            return None
        self.i = j
        if self.peek() == "(" and index is None:
            self.i += 1
            elems = []
            while True:
                self.skip_blanks()
                if self.peek() == "\n":
                    self.newline()
                    continue
                if self.i >= self.n:
                    raise self.error(f"the array {name}=( is not closed with )", start)
                if self.peek() == ")":
                    self.i += 1
                    break
                sub = self.s.startswith("[", self.i) and re.compile(r"\[([^\]]*)\]=").match(self.s, self.i)
                if sub:
                    key = self.word_from_range(self.i + 1, sub.end() - 2)
                    self.i = sub.end()
                    value = self.parse_word() if self.i < self.n and self.s[self.i] not in " \t\n)" else Word([], self.origin(), "")
                    elems.append((key, value))
                    continue
                elems.append(self.parse_word())
            return Assign(name, origin, append, None, None, elems, self.s[start:self.i])
        if self.i >= self.n or self.s[self.i] in " \t\n;&|)":
            value = Word([], origin, "")
        else:
            value = self.parse_word(assignment=True)
        return Assign(name, origin, append, index, value, None, self.s[start:self.i])


def parse(text: str, origins: Sequence[Origin]) -> ListNode:
    return Parser(text, origins).parse_script()


def source_origins(text: str, file: str, first_line: int = 1) -> list[Origin]:
    origins: list[Origin] = []
    line = first_line
    current = Origin(file, line)
    for ch in text:
        origins.append(current)
        if ch == "\n":
            line += 1
            current = Origin(file, line)
    return origins
