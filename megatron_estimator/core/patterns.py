"""Regular expressions compiled on first use (issue 14: start-up).

Importing ``re`` (with ``enum``, which it needs) is a fair share of Python's own start-up, so
the modules on the CLI's start-up paths keep their patterns as ``LazyPattern`` constants: the
same ``re.compile(pattern, flags)``, made the first time a method is called.  Where a pattern
would be tried on every token or line, its caller first asks a plain string question that a
match requires (``might_be_negative_number``), so that ``re`` is imported only when the
answer could be yes.
"""

from __future__ import annotations


class LazyPattern:
    """``re.compile(pattern, *flags)`` on first use; ``flags`` are names of ``re`` flags
    ("MULTILINE", "IGNORECASE")."""

    __slots__ = ("_pattern", "_flags", "_compiled", "_prefix")

    def __init__(self, pattern: str, *flags: str, literal_prefix: str = ""):
        # literal_prefix: what every match of an anchored pattern starts with (no flags):
        # match() answers None for other texts without compiling.
        self._pattern = pattern
        self._flags = flags
        self._compiled = None
        self._prefix = literal_prefix

    def match(self, text: str, *args):
        if self._prefix and not text.startswith(self._prefix):
            return None
        return self.compiled().match(text, *args)

    def compiled(self):
        if self._compiled is None:
            import re

            value = 0
            for name in self._flags:
                value |= getattr(re, name)
            self._compiled = re.compile(self._pattern, value)
        return self._compiled

    def __getattr__(self, name: str):       # match, search, fullmatch, finditer, findall, sub, pattern...
        return getattr(self.compiled(), name)


def might_be_negative_number(token: str) -> bool:
    """False when ``token`` certainly does not start with "-" and a decimal digit or "."
    (what argparse's negative-number and number-like patterns need first)."""
    return len(token) > 1 and token[0] == "-" and (token[1] == "." or token[1].isdecimal())


class _LazyRe:
    """The ``re`` module, imported on first attribute use: ``from megatron_estimator.core.patterns
    import lazy_re as re`` in a module whose calls of ``re`` are off the start-up paths."""

    def __getattr__(self, name: str):
        import re

        return getattr(re, name)


lazy_re = _LazyRe()


def is_shell_assignment(word: str) -> bool:
    """``re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", word)``: ``NAME=value`` (ASCII name)."""
    name, equals, _ = word.partition("=")
    return bool(equals) and name != "" and not name[0].isdigit() and name.isascii() and (
        name.replace("_", "a").isalnum())


_NAME_START = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_")
_NAME_CHARS = _NAME_START | frozenset("0123456789")


class _NameMatch:
    """A match of ``NamePattern``: ``group()`` / ``group(0)``, ``start()``, ``end()``, ``span()``."""
    __slots__ = ("string", "_start", "_end")

    def __init__(self, string: str, start: int, end: int):
        self.string, self._start, self._end = string, start, end

    def group(self, index: int = 0) -> str:
        if index != 0:
            raise IndexError("no such group")
        return self.string[self._start:self._end]

    def start(self, index: int = 0) -> int:
        return self._start

    def end(self, index: int = 0) -> int:
        return self._end

    def span(self, index: int = 0) -> tuple[int, int]:
        return self._start, self._end


class NamePattern:
    """``re.compile(r"[A-Za-z_][A-Za-z0-9_]*")``'s ``match`` and ``fullmatch`` (a shell name),
    without ``re``: the shell reader tries it on every ``$`` and command word
    (``tests/test_patterns.py`` compares the two)."""
    pattern = r"[A-Za-z_][A-Za-z0-9_]*"

    def match(self, string: str, pos: int = 0, endpos: int | None = None) -> _NameMatch | None:
        end = len(string) if endpos is None else max(0, min(endpos, len(string)))
        pos = max(pos, 0)
        if pos >= end or string[pos] not in _NAME_START:
            return None
        j = pos + 1
        while j < end and string[j] in _NAME_CHARS:
            j += 1
        return _NameMatch(string, pos, j)

    def fullmatch(self, string: str, pos: int = 0, endpos: int | None = None) -> _NameMatch | None:
        found = self.match(string, pos, endpos)
        end = len(string) if endpos is None else max(0, min(endpos, len(string)))
        return found if found is not None and found.end() == end else None


def split_posix_comments(text: str) -> list[str]:
    """``shlex.split(text, comments=True)`` without ``shlex`` (which imports ``re``): POSIX
    quoting ('...', "..." with backslash escapes of " and \\ , a backslash outside quotes),
    "#" starts a comment to the end of the line; ValueError for an unclosed quote or a final
    backslash, as shlex.  ``tests/test_patterns.py`` compares the two."""
    tokens: list[str] = []
    i, n = 0, len(text)
    state: str | None = " "
    while state is not None:
        token, quoted, escaped = "", False, "a"
        while True:
            c = text[i] if i < n else ""
            i += 1
            if state == " ":
                if not c:
                    state = None
                    break
                if c in " \t\r\n":
                    if token or quoted:
                        break
                elif c == "#":
                    at = text.find("\n", i)
                    i = n if at < 0 else at + 1
                elif c == "\\":
                    escaped, state = "a", c
                elif c in "'\"":
                    state = c
                else:
                    token, state = c, "a"
            elif state in ("'", '"'):
                quoted = True
                if not c:
                    raise ValueError("No closing quotation")
                if c == state:
                    state = "a"
                elif c == "\\" and state == '"':
                    escaped, state = state, c
                else:
                    token += c
            elif state == "\\":
                if not c:
                    raise ValueError("No escaped character")
                if escaped in ("'", '"') and c != state and c != escaped:
                    token += state
                token += c
                state = escaped
            else:                                    # in a word
                if not c:
                    state = None
                    break
                if c in " \t\r\n":
                    state = " "
                    if token or quoted:
                        break
                elif c == "#":
                    at = text.find("\n", i)
                    i = n if at < 0 else at + 1
                    state = " "
                    if token or quoted:
                        break
                elif c in "'\"":
                    state = c
                elif c == "\\":
                    escaped, state = "a", c
                else:
                    token += c
        if not (token or quoted):
            break
        tokens.append(token)
    return tokens
