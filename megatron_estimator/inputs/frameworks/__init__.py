"""Frameworks that launch Megatron-LM through their own entry programs: one declared adapter each.

A framework (slime, Pai-Megatron-Patch, ...) runs Megatron's parser from its own entry program
and adds flags through its own ``extra_args_provider``; it may compute the world size from its
own flags, fill or force Megatron arguments, and change what a micro batch holds.  Each is a
``Framework`` record in its own module (``slime.py``, ``pai.py``, ``mindspeed.py``), listed in
``FRAMEWORKS``; nothing about a framework lives in the launch reader.  A record declares:

- how it is recognised: the end of its entry program's path (``entry_patterns``: ``*`` matches
  one path segment's characters), or an import of one of its packages in the entry program
  (``imports``);
- its extra flags: read from its argument module (``provider_files``, relative to the job's
  working tree: the entry program's directory and its parents, then the search directories)
  when that source is reachable, else from its flag table in ``data/frameworks/`` (written by
  ``scripts/gen_framework_flags`` from a checkout, whose commit the table's first line states);
- ``adapt``: what it does with the flags (``Adaptation``: the world size, the Megatron settings
  it fills or forces, the assumptions in words, each with the framework source it follows);
- ``unsupported``: for a stack the estimator does not model, why: the launch is one
  ``unsupported-stack`` problem, never an estimate of something else.

``DEVELOPERS.md`` "Add a framework" is the checklist.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    from typing import Sequence

    from megatron_estimator.megatron.flags import FlagSpec

from megatron_estimator.inputs.frameworks.adapter import Adaptation, Framework, FrameworkFlags, load_flag_table, table_release


def _frameworks() -> tuple[Framework, ...]:
    from megatron_estimator.inputs.frameworks.bridge import FRAMEWORK as BRIDGE
    from megatron_estimator.inputs.frameworks.chatlearn import FRAMEWORK as CHATLEARN
    from megatron_estimator.inputs.frameworks.mindspeed import FRAMEWORK as MINDSPEED
    from megatron_estimator.inputs.frameworks.pai import FRAMEWORK as PAI
    from megatron_estimator.inputs.frameworks.nemo_rl import FRAMEWORK as NEMO_RL
    from megatron_estimator.inputs.frameworks.slime import FRAMEWORK as SLIME
    from megatron_estimator.inputs.frameworks.verl import FRAMEWORK as VERL

    return (MINDSPEED, SLIME, PAI, BRIDGE, VERL, NEMO_RL, CHATLEARN)


def _matches(path: str, pattern: str) -> bool:
    import fnmatch

    path = "/" + path.replace("\\", "/").lstrip("./")
    parts, keys = path.split("/"), pattern.split("/")
    return len(parts) > len(keys) and all(fnmatch.fnmatchcase(p, k) for p, k in zip(parts[-len(keys):], keys))


def _imports(source_path: str | None) -> set[str]:
    if source_path is None:
        return set()
    import ast

    try:
        with open(source_path, encoding="utf-8", errors="replace") as handle:
            tree = ast.parse(handle.read())
    except (OSError, SyntaxError, ValueError):
        return set()
    found: set[str] = set()
    for node in ast.walk(tree):
        names = [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else \
            [a.name for a in node.names] if isinstance(node, ast.Import) else []
        for name in names:     # each package and its parents: megatron.bridge.recipes -> megatron, megatron.bridge
            parts = name.split(".")
            found.update(".".join(parts[:n]) for n in range(1, len(parts) + 1))
    return found


def recognise(script: str, is_module: bool = False, path: str | None = None,
              argv: Sequence[str] = (), megatron_script: bool = False,
              base_dirs: Sequence[str] = ()) -> Framework | None:
    """The framework whose entry program ``script`` is (``path``: its file, when found; its
    imports decide first; else the end of its path, confirmed by one of the framework's own
    flags in ``argv``), or None for Megatron-LM's own (``megatron_script``: ``script`` is one of
    ``entry_script.ENTRY_SCRIPTS``) or an unknown program.  A relative ``script`` that was not
    found is matched as the launch names it and as it would be in each of ``base_dirs`` (the
    directories it is looked for in): Pai-Megatron-Patch runs ``pretrain_x.py`` from
    ``examples/<model>/``."""
    imported = _imports(path)
    frameworks = _frameworks()
    for framework in frameworks:
        if imported & set(framework.imports):
            return framework
    if path is not None and imported:
        return None                 # a readable program that imports none of theirs
    if megatron_script:
        return None                 # Megatron-LM's own (examples/multimodal/train.py)
    name = script.replace(".", "/") + ".py" if is_module else script
    names = [name] + ([os.path.join(d, name) for d in base_dirs]
                      if path is None and not is_module and not os.path.isabs(name) else [])
    for framework in frameworks:
        if any(_matches(n, p) for p in framework.entry_patterns for n in names):
            if framework.flag_table is None:      # no flags of its own: its name, and what confirms it
                if framework.confirm is None or framework.confirm(argv):
                    return framework
                continue
            own = {o for spec in load_flag_table(framework.flag_table) for o in spec.option_strings}
            if any(t.split("=", 1)[0] in own for t in argv if t.startswith("--")):
                return framework    # its name, and flags of its own: a program of the framework
    return None


def non_training_program(paths: Sequence[str]) -> tuple[Framework, str] | None:
    """The framework one of whose programs that train no Megatron model ``paths`` name (the
    program as launched, or where it was found), and what that program does; None for none."""
    for framework in _frameworks():
        for pattern, what in framework.non_training:
            if any(_matches(os.path.normpath(p), pattern) for p in paths):     # ../llama2/x.py, found
                return framework, what
    return None


def _tree_roots(path: str | None, search_dirs: Sequence[str], python_path: str = "") -> list[str]:
    roots: list[str] = []
    if path is not None:
        here = os.path.dirname(os.path.abspath(path))
        while True:
            roots.append(here)
            parent = os.path.dirname(here)
            if parent == here:
                break
            here = parent
    roots.extend(search_dirs)
    roots.extend(p for p in python_path.split(os.pathsep) if p)      # the job's, not this process's
    return list(dict.fromkeys(roots))


def framework_flags(framework: Framework, path: str | None, search_dirs: Sequence[str] = (), release: str = "main",
                    python_path: str = "") -> tuple[tuple[FlagSpec, ...], str]:
    """The framework's own flags (those Megatron's parser does not register) and where they were
    read: its argument modules on the job's tree (the entry program's folders, ``search_dirs``,
    the job's ``python_path``), else its flag table."""
    from megatron_estimator.inputs.argv import SCRIPT_CONDITION
    from megatron_estimator.megatron.flags import flag_table

    table = flag_table(release)
    specs: list = []
    origin = ""
    for root in _tree_roots(path, search_dirs, python_path) if framework.provider_files else ():
        files = [os.path.join(root, f) for f in framework.provider_files]
        files = [f for f in files if os.path.isfile(f)] if os.path.isfile(files[0]) else []
        if files:                   # the tree of the framework: its main argument module, and the others it has
            from megatron_estimator.inputs.script_flags import read_module_flags

            for file in files:
                specs.extend(read_module_flags(file).specs)
            origin = "its source " + ", ".join(files)
            break
    if not origin and framework.flag_table is not None:
        specs = list(load_flag_table(framework.flag_table))
        origin = f"its flag table data/frameworks/{framework.flag_table} ({table_release(framework.flag_table)})"
    own = tuple(replace(s, conditional=SCRIPT_CONDITION) for s in specs
                if not any(o in table for o in s.option_strings))
    return own, origin


def adapt(framework: Framework, argv: Sequence[str], specs: Sequence[FlagSpec], opaque=frozenset()) -> Adaptation:
    if framework.adapt is None:
        return Adaptation()
    return framework.adapt(FrameworkFlags(tuple(argv), tuple(specs), frozenset(opaque)))
