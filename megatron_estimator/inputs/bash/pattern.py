"""Bash patterns (``case``, ``[[ == ]]``, ``${VAR#pattern}``) as regular expressions."""

from __future__ import annotations

import re


def glob_to_regex(chunks: list[tuple[str, bool]]) -> str:
    """A bash pattern (text, quoted) chunks -> a regular expression (whole match)."""
    out: list[str] = []
    for text, quoted in chunks:
        if quoted:
            out.append(re.escape(text))
            continue
        i = 0
        while i < len(text):
            c = text[i]
            if c == "*":
                out.append(".*")
            elif c == "?":
                out.append(".")
            elif c == "[":
                end = text.find("]", i + 2 if text[i + 1:i + 2] in ("!", "^") else i + 1)
                if end < 0:
                    out.append(re.escape(c))
                else:
                    body = text[i + 1:end]
                    if body[:1] in ("!", "^"):
                        body = "^" + body[1:]
                    out.append("[" + body.replace("\\", "\\\\") + "]")
                    i = end
            elif c == "\\" and i + 1 < len(text):
                i += 1
                out.append(re.escape(text[i]))
            else:
                out.append(re.escape(c))
            i += 1
    return "".join(out)

