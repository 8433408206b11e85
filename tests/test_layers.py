"""The package's folders are its layers, and imports run one way (DEVELOPERS.md, "Layout").

Every import in the package, deferred ones included, is read with ``ast``: a module may import
only from its own layer or a lower one; ``report`` and ``planner`` share a layer and do not import
each other; the front (CLI, settings, pytest plugin) reaches the rest only through ``api``,
``report`` and ``core``; and no two modules import each other, even through others.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "megatron_estimator"
NAME = "megatron_estimator"

# Bottom to top.
LAYERS = ("core", "megatron", "inputs", "config", "model", "results", "report", "planner", "api", "front")
RANK = {"core": 0, "megatron": 1, "inputs": 2, "config": 3, "model": 4, "results": 5,
        "report": 6, "planner": 6, "api": 7, "front": 8}
FRONT = {"cli", "settings", "pytest_plugin", "__main__", "__init__"}
API = {"api", "request"}             # the api layer: api.py and the request it builds (request.py)
FRONT_MAY_IMPORT = {"core", "api", "report", "front"}
MAX_LINES = 800


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def layer_of(module: str) -> str:
    head = module.split(".")[0]
    if head in FRONT:
        return "front"
    if head in API:
        return "api"
    assert head in RANK, f"{module}: not in a layer; put it in one of {', '.join(LAYERS)}"
    return head


def _imports(module: str, path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: set[str] = set()
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                stem = ".".join([NAME] + base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            names = [stem] + [f"{stem}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            if name == NAME or not name.startswith(NAME + "."):
                continue
            target = name[len(NAME) + 1:]
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != module:
                out.add(target)
    return out


GRAPH = {module: _imports(module, path) for module, path in MODULES.items()}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_run_down_the_layers(module):
    mine = layer_of(module)
    wrong = []
    for target in sorted(GRAPH[module]):
        theirs = layer_of(target)
        if mine == "front":
            ok = theirs in FRONT_MAY_IMPORT
        elif {mine, theirs} == {"report", "planner"}:
            ok = False
        else:
            ok = RANK[theirs] <= RANK[mine]
        if not ok:
            wrong.append(f"{module} ({mine}) imports {target} ({theirs})")
    assert not wrong, "\n".join(wrong)


def test_core_imports_nothing_above_itself():
    assert {m: sorted(t) for m, t in GRAPH.items()
            if layer_of(m) == "core" and any(layer_of(x) != "core" for x in t)} == {}


def test_no_import_circles():
    circles = []
    for start in GRAPH:
        stack, seen = [(start, (start,))], set()
        while stack:
            node, trail = stack.pop()
            for nxt in GRAPH[node]:
                if nxt == start:
                    circles.append(" -> ".join(trail + (start,)))
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, trail + (nxt,)))
    assert not circles, "\n".join(sorted(set(circles)))


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_over_the_size_limit(module):
    lines = MODULES[module].read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_LINES, f"{module}: {lines} lines; split it by responsibility"


def test_the_layer_check_sees_a_wrong_way_import():
    # The check itself must be able to fail: a model module importing the report is refused.
    assert RANK[layer_of("report.text")] > RANK[layer_of("model.stage")]
    assert layer_of("cli") == "front" and "model" not in FRONT_MAY_IMPORT


# -- no machine paths: tests and scripts run on any machine -----------------------------------
# A quoted absolute path of two or more parts (the pattern ../shared/hooks/before-stop greps
# for) must start at a system folder or at one of the made-up roots the tests use for inputs
# that are never read (/nowhere/ckpt, /data, ...); tmp_path is how a test names a real file.
ABSOLUTE = re.compile(r"[\"'](/[A-Za-z0-9_.+-]+){2,}")
ALLOWED_ROOTS = {"proc", "dev", "tmp", "usr", "bin", "etc", "sys", "opt",
                 "nowhere", "x", "a", "ckpt", "data", "path", "some"}


def machine_paths(text: str) -> list[str]:
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for match in ABSOLUTE.finditer(line):
            path = match.group(0)[1:]
            if path.split("/")[1].lower() not in ALLOWED_ROOTS:
                found.append(f"{number}: {path}")
    return found


def test_no_test_or_script_names_a_machine_path():
    top = PACKAGE.parent
    files = [p for folder in ("tests", "scripts") for p in sorted((top / folder).rglob("*"))
             if p.is_file() and p.suffix in ("", ".py", ".sh", ".md", ".tsv", ".yaml", ".toml") and "__pycache__" not in p.parts]
    found = [f"{p.relative_to(top)}:{hit}" for p in files for hit in machine_paths(p.read_text(encoding="utf-8", errors="replace"))]
    assert not found, "machine paths (keep data in tests/data, or use tmp_path):\n" + "\n".join(found)


def test_the_machine_path_check_can_fail():
    tree, home = "/".join(("", "work", "tools", "mlm_tree")), "/".join(("", "home", "me", "shared"))
    assert machine_paths(f'TREE = Path("{tree}")\nx = "/tmp/seed/a"') == [f"1: {tree}"]
    assert machine_paths(f"root = '{home}'") == [f"1: {home}"]
    assert machine_paths('p = "/nowhere/ckpt"; q = "/proc/self/status"; r = "../shared/x"') == []
