"""YAML with a line number for every mapping key and value.

``parse_yaml_with_lines`` composes the document with PyYAML's node API (``yaml.compose`` on
``SafeLoader``) and constructs every value exactly as ``yaml.safe_load`` would (YAML 1.1:
``1e-5`` is a string, ``1.0e-5`` a float, ``yes`` a boolean), keeping for each mapping entry
the line of its key and of its value.  Broken YAML is one ``yaml-syntax`` problem at
``file:line`` with PyYAML's own description; a key given twice in one mapping is a
``duplicate-key`` problem at the second occurrence (the last value is kept, as
``yaml.safe_load`` keeps it).  Nothing here raises on bad input.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping

import yaml

from megatron_estimator.core.problems import Problem
from megatron_estimator.core.resources import path_string, path_trouble, read_input_text, shown_path

_MERGE_TAG = "tag:yaml.org,2002:merge"


@dataclass(frozen=True)
class YamlNode:
    """One value of the document and where it sits.

    ``line`` is the 1-based line of the entry's key (for the root: of the node itself);
    ``value_line`` the line where the value starts.  ``entries`` holds a mapping's children
    by key (keys as strings), ``None`` for scalars and sequences.  ``plain`` and ``text``
    describe a scalar as written: unquoted or not, and its source text.
    """

    value: Any
    line: int
    value_line: int
    entries: Mapping[str, "YamlNode"] | None = None
    plain: bool = False
    text: str | None = None

    @property
    def is_mapping(self) -> bool:
        return self.entries is not None


@dataclass(frozen=True)
class YamlDocument:
    path: str
    root: YamlNode | None           # None: empty document, or it could not be read
    problems: tuple[Problem, ...]


def key_location(path: str, line: int, key_path: str = "") -> str:
    """The ``file:line key`` form every file location takes."""
    return f"{path}:{line} {key_path}" if key_path else f"{path}:{line}"


def load_yaml_with_lines(path: str | os.PathLike) -> YamlDocument:
    """Read and parse ``path``; unreadable files are a problem, never an exception."""
    name = shown_path(path)
    try:
        text = read_input_text(path, "yaml") if path_trouble(path) else read_input_text(path_string(path), "yaml")    # Path(path).read_text(), bounded
    except FileNotFoundError:
        return YamlDocument(name, None, (Problem("file-not-found", name, "no such file"),))
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return YamlDocument(name, None, (Problem("unreadable-file", name, f"cannot read the file: {reason}"),))
    return parse_yaml_with_lines(text, name)


# Bounds on a document (README.md "Limits"): nesting depth, and the nodes it holds once its
# aliases are expanded (a "billion laughs" document is a few lines that expand to 10^9 nodes).
# Both are counted on PyYAML's event stream, which neither recurses nor expands, before the
# document is composed; an alias of a collection still open (a self-referencing anchor) is
# refused there too.
MAX_DEPTH = 64
MAX_NODES = 200_000
# A syntax error is described by PyYAML's pure-Python parser (its messages name the character
# at fault) when the document is small enough to parse twice; libyaml's message otherwise.
_PYTHON_MESSAGE_CHARS = 1 << 18


def _bounds_problem(events, path: str, yaml) -> Problem | None:
    """The first bound the event stream passes (depth, expanded nodes, a recursive alias)."""
    sizes: dict[str, int] = {}      # anchor -> the nodes it expands to
    stack: list[list] = []          # open collections: [anchor, nodes so far]
    open_anchors: set[str] = set()
    total = 0
    start = (yaml.SequenceStartEvent, yaml.MappingStartEvent)
    end = (yaml.SequenceEndEvent, yaml.MappingEndEvent)
    for event in events:
        if isinstance(event, start):
            if len(stack) >= MAX_DEPTH:
                return Problem("yaml-too-deep", key_location(path, event.start_mark.line + 1),
                               f"collections nest deeper than {MAX_DEPTH} levels, the limit for a YAML file")
            stack.append([event.anchor, 1])
            if event.anchor is not None:
                open_anchors.add(event.anchor)
            continue
        if isinstance(event, end):
            anchor, nodes = stack.pop()
            if anchor is not None:
                sizes[anchor] = nodes
                open_anchors.discard(anchor)
        elif isinstance(event, yaml.ScalarEvent):
            nodes = 1
            if event.anchor is not None:
                sizes[event.anchor] = 1
        elif isinstance(event, yaml.AliasEvent):
            if event.anchor in open_anchors:
                return Problem("yaml-recursive-alias", key_location(path, event.start_mark.line + 1),
                               f"the alias *{event.anchor} refers to a collection that contains it "
                               "(a recursive YAML document cannot be read)")
            nodes = sizes.get(event.anchor, 1)
        else:
            continue
        if stack:
            stack[-1][1] += nodes
        else:
            total += nodes
        if total + sum(frame[1] for frame in stack[:1]) > MAX_NODES:
            return Problem("yaml-too-large", key_location(path, event.start_mark.line + 1),
                           f"the document holds more than {MAX_NODES:,} values once its aliases are "
                           "expanded, the limit for a YAML file")
    return None


def parse_yaml_with_lines(text: str, path: str) -> YamlDocument:
    loader = getattr(yaml, "CSafeLoader", None) or yaml.SafeLoader     # libyaml where installed
    try:
        try:
            bound = _bounds_problem(yaml.parse(text, Loader=loader), path, yaml)
        except UnicodeEncodeError:       # a lone surrogate: libyaml takes UTF-8 only
            loader = yaml.SafeLoader
            bound = _bounds_problem(yaml.parse(text, Loader=loader), path, yaml)
        if bound is not None:
            return YamlDocument(path, None, (bound,))
        node = yaml.compose(text, Loader=loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        if "maximum nesting depth" in str(getattr(exc, "problem", "")) and mark is not None:
            # libyaml's own bound (1000 levels), met while it scans ahead of the events
            return YamlDocument(path, None, (Problem(
                "yaml-too-deep", key_location(path, mark.line + 1),
                f"collections nest deeper than {MAX_DEPTH} levels, the limit for a YAML file"),))
        if loader is not yaml.SafeLoader and len(text) <= _PYTHON_MESSAGE_CHARS:
            try:
                for _event in yaml.parse(text, Loader=yaml.SafeLoader):
                    pass
            except yaml.YAMLError as described:
                exc = described
        return YamlDocument(path, None, (_syntax_problem(exc, path, text),))
    if node is None:
        return YamlDocument(path, None, ())
    builder = _Builder(path)
    try:
        root = builder.build(node, node.start_mark.line + 1, "")
    except (yaml.YAMLError, ValueError, TypeError) as exc:
        return YamlDocument(path, None, (_syntax_problem(exc, path, text),))
    return YamlDocument(path, root, tuple(builder.problems))


def _syntax_problem(exc: Exception, path: str, text: str = "") -> Problem:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    parts = [p for p in (getattr(exc, "context", None), getattr(exc, "problem", None)) if p]
    description = "; ".join(parts) if parts else str(exc)
    position = getattr(exc, "position", None)          # yaml.reader.ReaderError: an offset
    if mark is None and isinstance(position, int) and not isinstance(position, bool):
        line = text.count("\n", 0, position) + 1
        column = position - (text.rfind("\n", 0, position) + 1) + 1
        character = getattr(exc, "character", None)
        what = (f"#x{ord(character):04x}" if isinstance(character, str)
                else f"#x{character:02x}" if isinstance(character, int) else "")
        return Problem("yaml-syntax", key_location(path, line),
                       f"YAML syntax error: unacceptable character {what}: {getattr(exc, 'reason', '')} "
                       f"(column {column})".replace("  ", " "))
    if mark is None:
        return Problem("yaml-syntax", path, f"YAML syntax error: {description}")
    return Problem("yaml-syntax", key_location(path, mark.line + 1),
                   f"YAML syntax error: {description} (column {mark.column + 1})")


class _Builder:
    def __init__(self, path: str) -> None:
        self._constructor = yaml.SafeLoader("")
        self.path = path
        self.problems: list[Problem] = []

    def build(self, node, line: int, key_path: str) -> YamlNode:
        value_line = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            entries = self._mapping_entries(node, key_path)
            value = {key: child.value for key, child in entries.items()}
            return YamlNode(value, line, value_line, entries)
        try:
            value = self._constructor.construct_object(node, deep=True)
        except ValueError as exc:      # an integer past Python's digit limit, a bad timestamp
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read this value: {str(exc).split(';')[0]}", node.start_mark) from None
        if isinstance(node, yaml.ScalarNode):
            return YamlNode(value, line, value_line, None, not node.style, node.value)   # libyaml: ""
        return YamlNode(value, line, value_line)

    def _mapping_entries(self, node, key_path: str) -> dict[str, YamlNode]:
        merged: dict[str, YamlNode] = {}
        own: dict[str, YamlNode] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                merged.update(self._merged_entries(value_node, key_path))
                continue
            key = self._constructor.construct_object(key_node, deep=True)
            key = key if isinstance(key, str) else str(key)
            line = key_node.start_mark.line + 1
            child_path = f"{key_path}.{key}" if key_path else key
            if key in own:
                self.problems.append(Problem(
                    "duplicate-key", key_location(self.path, line, child_path),
                    f"{key} is given twice in this mapping (first at line {own[key].line}); "
                    f"YAML keeps only this later value"))
            own[key] = self.build(value_node, line, child_path)
        if not merged:
            return own
        merged.update(own)
        return merged

    def _merged_entries(self, value_node, key_path: str) -> dict[str, YamlNode]:
        """``<<: *anchor`` or ``<<: [*a, *b]``: earlier sources win, explicit keys win over all."""
        sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
        result: dict[str, YamlNode] = {}
        for source in reversed(sources):
            if not isinstance(source, yaml.MappingNode):
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", value_node.start_mark,
                    "a merge key (<<) needs a mapping or a list of mappings", source.start_mark)
            result.update(self._mapping_entries(source, key_path))
        return result
