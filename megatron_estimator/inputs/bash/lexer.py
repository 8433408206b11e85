"""Characters to words: blanks, comments, here-documents, operators, and the parts of a word
(quotes, ``$VAR``, ``${...}``, ``$(...)``, backquotes, ``$((...))``, ``$'...'``), each located."""

from __future__ import annotations

import re
from typing import Sequence

from megatron_estimator.inputs.bash.syntax import Arith, CmdSub, HereDoc, Lit, Param, ShellSyntaxError, Word
from megatron_estimator.inputs.bash.values import NAME, Origin

METACHARS = frozenset(" \t\n;&|()<>")


class Lexer:
    """The character level of the shell parser: positions, blanks, operators and words."""

    def __init__(self, text: str, origins: Sequence[Origin]):
        self.s = text
        self.o = list(origins)
        self.n = len(text)
        self.i = 0
        self.heredocs: list[HereDoc] = []
        if self.n and not self.o:
            raise ValueError("origins needed")
        self._end = origins[-1] if origins else Origin("<empty>", 1)

    # ---- character helpers ------------------------------------------------------------

    def origin(self, i: int | None = None) -> Origin:
        i = self.i if i is None else i
        if i < self.n:
            return self.o[i]
        return self._end

    def peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.s[j] if j < self.n else ""

    def startswith(self, text: str) -> bool:
        return self.s.startswith(text, self.i)

    def error(self, message: str, i: int | None = None) -> ShellSyntaxError:
        return ShellSyntaxError(self.origin(i), message)

    def skip_blanks(self) -> None:
        """Spaces, tabs, line continuations and comments (not newlines)."""
        while self.i < self.n:
            c = self.s[self.i]
            if c in " \t\r":
                self.i += 1
            elif c == "\\" and self.peek(1) == "\n":
                self.i += 2
            elif c == "#":
                while self.i < self.n and self.s[self.i] != "\n":
                    self.i += 1
            else:
                break

    def newline(self) -> bool:
        """Consume one newline (and the here-documents that start after it)."""
        if self.peek() != "\n":
            return False
        self.i += 1
        while self.heredocs:
            doc = self.heredocs.pop(0)
            chars: list[str] = []
            origins: list[Origin] = []
            while self.i < self.n:
                end = self.s.find("\n", self.i)
                end = self.n if end < 0 else end
                begin = self.i
                if doc.strip:
                    while begin < end and self.s[begin] == "\t":
                        begin += 1
                line = self.s[begin:end]
                # unquoted: a backslash-newline joins the next line before the delimiter is looked for
                while not doc.quoted and end < self.n and (len(line) - len(line.rstrip("\\"))) % 2:
                    nxt = self.s.find("\n", end + 1)
                    nxt = self.n if nxt < 0 else nxt
                    line = line[:-1] + self.s[end + 1:nxt]
                    end = nxt
                self.i = min(end + 1, self.n)
                if line == doc.delimiter:
                    doc.closed = True
                    break
                stop = min(end + 1, self.n)
                chars.append(self.s[begin:stop])
                origins.extend(self.o[begin:stop])
            doc.text = "".join(chars)
            doc.origins = tuple(origins)
        return True

    def skip_linebreaks(self) -> None:
        while True:
            self.skip_blanks()
            if not self.newline():
                return

    def op(self) -> str | None:
        """The control or redirection operator at the current position, if any."""
        self.skip_blanks()
        for candidate in (";;&", ";;", ";&", "&&", "||", "|&", "&>>", "&>", ">>", "<<<", "<<-", "<<", ">&", "<&",
                          ">|", "<>", ";", "&", "|", "(", ")", "<", ">", "\n"):
            if self.startswith(candidate):
                return candidate
        return None


    def word_from_range(self, begin: int, end: int) -> Word:
        """The text between ``begin`` and ``end`` read as the inside of double quotes."""
        sub = Lexer(self.s[begin:end] + "\x00", list(self.o[begin:end]) + [self.origin(end)])
        parts = sub.read_parts(stop="\x00", in_dquote=True)
        return Word(parts, self.origin(begin), self.s[begin:end])

    # ---- words ---------------------------------------------------------------------

    def parse_word(self, pattern: bool = False, assignment: bool = False, regex: bool = False) -> Word:
        self.skip_blanks()
        start = self.i
        origin = self.origin()
        parts = self.read_parts(stop=None, in_dquote=False, pattern=pattern, regex=regex)
        if self.i == start:
            raise self.error(f"expected a word, found {self.peek()!r}")
        return Word(parts, origin, self.s[start:self.i])

    def read_parts(self, stop: str | None, in_dquote: bool, pattern: bool = False, regex: bool = False,
                   heredoc: bool = False) -> list:
        """Read word parts up to an unquoted metacharacter (or ``stop``, for ${...} args);
        ``heredoc``: a here-document's body, where a backslash does not quote a double quote."""
        parts: list = []
        buf: list[str] = []
        buf_o: list[Origin] = []
        buf_quoted = in_dquote

        def flush() -> None:
            nonlocal buf, buf_o
            if buf:
                parts.append(Lit("".join(buf), tuple(buf_o), buf_quoted))
                buf, buf_o = [], []

        def add(ch: str, at: int, quoted: bool) -> None:
            nonlocal buf_quoted
            if buf and buf_quoted != quoted:
                flush()
            buf_quoted = quoted
            buf.append(ch)
            buf_o.append(self.o[at])

        depth = 0
        while self.i < self.n:
            c = self.s[self.i]
            if stop is not None and c == stop and (stop != "\x00") and depth == 0:
                break
            if stop == "\x00" and c == "\x00":
                break
            if stop is None and not in_dquote and c in "<>" and self.peek(1) == "(":
                flush()
                start = self.i
                end = self.matching(self.i + 2, "(", ")")
                source = (self.s[self.i + 2:end], tuple(self.o[self.i + 2:end]))
                self.i = end + 1
                parts.append(CmdSub(source, self.o[start], self.s[start:self.i], False))
                continue
            if stop is None and not in_dquote:
                if c in METACHARS:
                    if regex and c in "()|":
                        add(c, self.i, False)
                        self.i += 1
                        continue
                    if pattern and c == "(" and buf and buf[-1] in "@!?*+":
                        depth += 1        # extglob @(a|b)
                        add(c, self.i, False)
                        self.i += 1
                        continue
                    if pattern and depth and c in "|)":
                        if c == ")":
                            depth -= 1
                        add(c, self.i, False)
                        self.i += 1
                        continue
                    break
            if stop == "}" and c == "{" and not in_dquote:
                pass
            if c == "\\":
                nxt = self.peek(1)
                if nxt == "\n":
                    self.i += 2
                    continue
                if in_dquote and stop != "}":
                    if nxt in ("$`\\" if heredoc else "$`\"\\"):
                        add(nxt, self.i + 1, True)
                        self.i += 2
                    else:
                        add("\\", self.i, True)
                        self.i += 1
                    continue
                if nxt == "":
                    add("\\", self.i, True)
                    self.i += 1
                    continue
                add(nxt, self.i + 1, True)
                self.i += 2
                continue
            if c == "'" and not in_dquote:
                end = self.s.find("'", self.i + 1)
                if end < 0:
                    raise self.error("a single quote is not closed")
                flush()
                parts.append(Lit(self.s[self.i + 1:end], tuple(self.o[self.i + 1:end]), True))
                self.i = end + 1
                continue
            if c == '"' and not in_dquote:
                flush()
                open_at = self.i
                self.i += 1
                inner = self.read_parts(stop='"', in_dquote=True)
                if self.peek() != '"':
                    raise self.error("a double quote is not closed", open_at)
                self.i += 1
                if not inner:
                    inner = [Lit("", (), True)]
                parts.extend(inner)
                continue
            if c == '"' and in_dquote and stop == '"':
                break
            if c == "$":
                nxt = self.peek(1)
                if nxt == "'" and not in_dquote:
                    flush()
                    parts.append(self.read_ansi_c())
                    continue
                if nxt == '"' and not in_dquote:
                    self.i += 1
                    continue
                part = self.read_dollar(in_dquote)
                if part is not None:
                    flush()
                    parts.append(part)
                    continue
                add("$", self.i, in_dquote)
                self.i += 1
                continue
            if c == "`":
                flush()
                parts.append(self.read_backtick(in_dquote))
                continue
            if stop == "}" and c == "}" and depth == 0:
                break
            if c == "~" and not in_dquote and not buf and not parts:
                add(c, self.i, False)
                self.i += 1
                continue
            add(c, self.i, in_dquote)
            self.i += 1
        flush()
        return parts

    def read_ansi_c(self) -> Lit:
        start = self.i
        self.i += 2
        out: list[str] = []
        outo: list[Origin] = []
        escapes = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b",
                   "f": "\f", "v": "\v", "\\": "\\", "'": "'", '"': '"', "?": "?"}
        while self.i < self.n and self.s[self.i] != "'":
            c = self.s[self.i]
            if c == "\\" and self.i + 1 < self.n:
                nxt = self.s[self.i + 1]
                if nxt in escapes:
                    out.append(escapes[nxt])
                    outo.append(self.o[self.i])
                    self.i += 2
                    continue
                m = re.compile(r"x([0-9A-Fa-f]{1,2})|([0-7]{1,3})").match(self.s, self.i + 1)
                if m:
                    out.append(chr(int(m.group(1), 16) if m.group(1) else int(m.group(2), 8)))
                    outo.append(self.o[self.i])
                    self.i = m.end()
                    continue
            out.append(c)
            outo.append(self.o[self.i])
            self.i += 1
        if self.i >= self.n:
            raise self.error("a $'...' string is not closed", start)
        self.i += 1
        return Lit("".join(out), tuple(outo), True)

    def read_backtick(self, in_dquote: bool) -> CmdSub:
        start = self.i
        self.i += 1
        chars: list[str] = []
        origins: list[Origin] = []
        while self.i < self.n and self.s[self.i] != "`":
            if self.s[self.i] == "\\" and self.peek(1) in "$`\\":
                self.i += 1
            chars.append(self.s[self.i])
            origins.append(self.o[self.i])
            self.i += 1
        if self.i >= self.n:
            raise self.error("a ` command substitution is not closed", start)
        self.i += 1
        return CmdSub(("".join(chars), tuple(origins)), self.o[start], self.s[start:self.i], in_dquote)

    def matching(self, start: int, open_: str, close: str) -> int:
        """Index of the ``close`` that balances the ``open_`` just before ``start``."""
        depth = 1
        j = start
        while j < self.n:
            c = self.s[j]
            if c == "\\":
                j += 2
                continue
            if c == "'" and open_ == "(":
                end = self.s.find("'", j + 1)
                j = (end if end >= 0 else self.n) + 1
                continue
            if c == '"':
                k = j + 1
                while k < self.n and self.s[k] != '"':
                    k += 2 if self.s[k] == "\\" else 1
                j = k + 1
                continue
            if c == open_:
                depth += 1
            elif c == close:
                depth -= 1
                if depth == 0:
                    return j
            j += 1
        raise self.error(f"{open_} is not closed with {close}", start - 1)

    def read_dollar(self, in_dquote: bool):
        start = self.i
        origin = self.o[start]
        nxt = self.peek(1)
        if self.startswith("$(("):
            end = self.find_arith_end(self.i + 3)
            if end is not None:
                expr = self.word_from_range(self.i + 3, end)
                self.i = end + 2
                return Arith(expr, origin, self.s[start:self.i], in_dquote)
        if nxt == "(":
            end = self.matching(self.i + 2, "(", ")")
            source = (self.s[self.i + 2:end], tuple(self.o[self.i + 2:end]))
            self.i = end + 1
            return CmdSub(source, origin, self.s[start:self.i], in_dquote)
        if nxt == "[":
            end = self.matching(self.i + 2, "[", "]")
            expr = self.word_from_range(self.i + 2, end)
            self.i = end + 1
            return Arith(expr, origin, self.s[start:self.i], in_dquote)
        if nxt == "{":
            return self.read_brace_param(in_dquote)
        match = NAME.match(self.s, self.i + 1)
        if match:
            self.i = match.end()
            return Param(match.group(0), origin, self.s[start:self.i], in_dquote)
        if nxt and (nxt.isdigit() or nxt in "@*#?$!-"):
            self.i += 2
            return Param(nxt, origin, self.s[start:self.i], in_dquote)
        return None

    def find_arith_end(self, j: int) -> int | None:
        depth = 0
        while j < self.n:
            if self.s[j] == "(":
                depth += 1
            elif self.s[j] == ")":
                if depth == 0:
                    return j if self.s.startswith("))", j) else None
                depth -= 1
            j += 1
        return None

    def read_brace_param(self, in_dquote: bool) -> Param:
        start = self.i
        origin = self.o[start]
        self.i += 2
        length = False
        indirect = False
        if self.peek() == "#" and self.peek(1) not in ("}", ""):
            length = True
            self.i += 1
        elif self.peek() == "!" and self.peek(1) not in ("}", ""):
            indirect = True
            self.i += 1
        match = NAME.match(self.s, self.i) or re.compile(r"\d+|[@*#?$!-]").match(self.s, self.i)
        if not match:
            raise self.error("bad ${...} substitution", start)
        name = match.group(0)
        self.i = match.end()
        index: Word | str | None = None
        if self.peek() == "[":
            end = self.matching(self.i + 1, "[", "]")
            inner = self.s[self.i + 1:end]
            index = inner if inner in ("@", "*") else self.word_from_range(self.i + 1, end)
            self.i = end + 1
        param = Param(name, origin, "", in_dquote, index)
        if length:
            param.op = "len"
        elif indirect:
            param.op = "indirect"
        rest = self.s[self.i:self.i + 3]
        if self.peek() == "}":
            self.i += 1
        elif length or indirect:
            if indirect and self.peek() in "@*" and self.peek(1) == "}":
                self.i += 2
                param.op = "names"
            else:
                raise self.error("bad ${#...} or ${!...} substitution", start)
        else:
            op = None
            for candidate in (":-", ":=", ":+", ":?", "##", "%%", "//", "/#", "/%", "^^", ",,", "-", "=", "+", "?",
                              "#", "%", "/", "^", ",", "@", ":"):
                if rest.startswith(candidate):
                    op = candidate
                    break
            if op is None:
                raise self.error("bad ${...} substitution", start)
            self.i += len(op)
            if op == ":":
                param.op = "substr"
                param.arg = self.read_until_in_brace(":}")
                if self.peek() == ":":
                    self.i += 1
                    param.arg2 = self.read_until_in_brace("}")
            elif op in ("/", "//", "/#", "/%"):
                param.op = op
                param.arg = self.read_until_in_brace("/}")
                if self.peek() == "/":
                    self.i += 1
                    param.arg2 = self.read_until_in_brace("}")
            elif op == "@":
                param.op = "@" + self.peek()
                self.i += 1
            else:
                param.op = op
                param.arg = self.read_until_in_brace("}", in_dquote=in_dquote)
            if self.peek() != "}":
                raise self.error("a ${ substitution is not closed with }", start)
            self.i += 1
        param.spelling = self.s[start:self.i]
        return param

    def read_until_in_brace(self, stops: str, in_dquote: bool = False) -> Word:
        """A word inside ${...} up to one of ``stops`` (quotes and expansions allowed)."""
        origin = self.origin()
        start = self.i
        parts: list = []
        while self.i < self.n and self.s[self.i] not in stops:
            if self.s[self.i] in "'\"$`\\":
                if self.s[self.i] == "'" and in_dquote:
                    parts.append(Lit("'", (self.o[self.i],), True))
                    self.i += 1
                    continue
                sub_start = self.i
                sub_parts = self._one_unit(in_dquote)
                parts.extend(sub_parts)
                if self.i == sub_start:
                    self.i += 1
                continue
            if self.s[self.i] == "{":
                end = self.matching(self.i + 1, "{", "}")
                parts.append(Lit(self.s[self.i:end + 1], tuple(self.o[self.i:end + 1]), in_dquote))
                self.i = end + 1
                continue
            parts.append(Lit(self.s[self.i], (self.o[self.i],), in_dquote))
            self.i += 1
        return Word(parts, origin, self.s[start:self.i])

    def _one_unit(self, in_dquote: bool) -> list:
        """One quoted string, escape or expansion inside ${...}."""
        c = self.s[self.i]
        if c == "\\":
            nxt = self.peek(1)
            if nxt == "\n":
                self.i += 2
                return []
            self.i += 2
            return [Lit(nxt, (self.o[self.i - 1],), True)]
        if c == "'":
            end = self.s.find("'", self.i + 1)
            if end < 0:
                raise self.error("a single quote is not closed")
            lit = Lit(self.s[self.i + 1:end], tuple(self.o[self.i + 1:end]), True)
            self.i = end + 1
            return [lit]
        if c == '"':
            open_at = self.i
            self.i += 1
            inner = self.read_parts(stop='"', in_dquote=True)
            if self.peek() != '"':
                raise self.error("a double quote is not closed", open_at)
            self.i += 1
            return inner or [Lit("", (), True)]
        if c == "`":
            return [self.read_backtick(in_dquote)]
        if c == "$":
            part = self.read_dollar(in_dquote)
            if part is not None:
                return [part]
            self.i += 1
            return [Lit("$", (self.o[self.i - 1],), in_dquote)]
        self.i += 1
        return [Lit(c, (self.o[self.i - 1],), in_dquote)]

