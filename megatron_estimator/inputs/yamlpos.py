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
from megatron_estimator.core.resources import path_string

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
    name = str(path)
    try:
        with open(path_string(path), encoding="utf-8") as f:     # Path(path).read_text(), without pathlib
            text = f.read()
    except FileNotFoundError:
        return YamlDocument(name, None, (Problem("file-not-found", name, "no such file"),))
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return YamlDocument(name, None, (Problem("unreadable-file", name, f"cannot read the file: {reason}"),))
    return parse_yaml_with_lines(text, name)


def parse_yaml_with_lines(text: str, path: str) -> YamlDocument:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        return YamlDocument(path, None, (_syntax_problem(exc, path),))
    if node is None:
        return YamlDocument(path, None, ())
    builder = _Builder(path)
    try:
        root = builder.build(node, node.start_mark.line + 1, "")
    except (yaml.YAMLError, ValueError, TypeError) as exc:
        return YamlDocument(path, None, (_syntax_problem(exc, path),))
    return YamlDocument(path, root, tuple(builder.problems))


def _syntax_problem(exc: Exception, path: str) -> Problem:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    parts = [p for p in (getattr(exc, "context", None), getattr(exc, "problem", None)) if p]
    description = "; ".join(parts) if parts else str(exc)
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
        value = self._constructor.construct_object(node, deep=True)
        if isinstance(node, yaml.ScalarNode):
            return YamlNode(value, line, value_line, None, node.style is None, node.value)
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
