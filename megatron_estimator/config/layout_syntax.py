"""The ``--pipeline-model-parallel-layout`` mini-language.

Syntax, as megatron/core/transformer/pipeline_parallel_layer_layout.py
(``PipelineParallelLayerLayout.parse_str_to_list``) reads it: ``E`` embedding, ``t``
transformer (decoder) layer, ``m`` multi-token-prediction layer, ``L`` loss, ``|`` separates
stages; commas are cosmetic; ``(...)*n`` repeats a group (groups do not nest) and ``x*n``
repeats one character.  Stage ``i`` of the flat list runs on pipeline rank ``i % pp`` as its
virtual stage ``i // pp``.  Example: ``Et*2|(tt|)*5t|tmL``.

``parse_layout`` returns the stages as tuples of characters or raises ``LayoutSyntaxError``
with the position of the fault, so the caller can say exactly what is wrong.
"""

from __future__ import annotations

from functools import lru_cache

LAYER_CHARS = {"E": "embedding", "t": "transformer layer", "m": "MTP layer", "L": "loss"}


class LayoutSyntaxError(ValueError):
    def __init__(self, message: str, position: int):
        super().__init__(message)
        self.position = position


def _read_count(text: str, pos: int) -> tuple[int, int]:
    start = pos
    while pos < len(text) and text[pos].isdigit():
        pos += 1
    if pos == start:
        raise LayoutSyntaxError("'*' must be followed by a repeat count", start)
    return int(text[start:pos]), pos


def _expand(text: str) -> str:
    out: list[str] = []
    pos = 0
    while pos < len(text):
        char = text[pos]
        if char == "(":
            close = text.find(")", pos + 1)
            if close < 0:
                raise LayoutSyntaxError("'(' is never closed", pos)
            body = text[pos + 1:close]
            if "(" in body:
                raise LayoutSyntaxError("groups cannot nest: Megatron's parser does not expand them", pos)
            if not body:
                raise LayoutSyntaxError("empty group '()'", pos)
            if close + 1 >= len(text) or text[close + 1] != "*":
                raise LayoutSyntaxError("a group '(...)' must be followed by '*n'", close)
            count, pos = _read_count(text, close + 2)
            out.append(_expand(body) * count)
        elif char == ")":
            raise LayoutSyntaxError("')' without a matching '('", pos)
        elif char == "*":
            if not out or not out[-1]:
                raise LayoutSyntaxError("'*' must follow a layer character or a group", pos)
            count, pos = _read_count(text, pos + 1)
            last = out.pop()
            out.append(last[:-1] + last[-1] * count)
        else:
            out.append(char)
            pos += 1
    return "".join(out)


@lru_cache(maxsize=1024)         # a pure function of the text, parsed again and again by the planner
def parse_layout(text: str) -> tuple[tuple[str, ...], ...]:
    cleaned = text.replace(",", "").replace(" ", "")
    expanded = _expand(cleaned)
    stages: list[tuple[str, ...]] = []
    for stage in expanded.split("|"):
        for char in stage:
            if char not in LAYER_CHARS:
                known = ", ".join(f"{c} ({name})" for c, name in LAYER_CHARS.items())
                raise LayoutSyntaxError(
                    f"invalid layer character {char!r}; known: {known}, '|' between stages",
                    text.find(char),
                )
        stages.append(tuple(stage))
    return tuple(stages)


def count_layout_stages(text: str) -> int | None:
    try:
        return len(parse_layout(text))
    except LayoutSyntaxError:
        return None
