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
