"""The flags a custom entry script adds to Megatron's parser, read statically with ``ast``.

Megatron's entry scripts pass a function to the parser as ``extra_args_provider``
(megatron/training/arguments.py ``parse_args(extra_args_provider=None, ...)``, also taken by
``parse_and_validate_args``, ``initialize_megatron`` and, in older releases, ``pretrain``); it
receives the ``argparse.ArgumentParser`` and registers its own options, usually on a group
(``group = parser.add_argument_group(...)`` then ``group.add_argument(...)``).  Megatron's own
examples do this: ``pretrain_vlm.py`` ``add_vlm_extra_args``, ``examples/multimodal/train.py``
(``add_multimodal_extra_args`` from ``multimodal_args.py`` beside it), ``examples/mimo``.

``read_script_flags(path)`` parses the script (never imports or runs it), finds every
``extra_args_provider=`` argument (and the first positional argument of ``parse_args`` /
``parse_and_validate_args`` / ``initialize_megatron``), follows the function it names -- in the
script, or in a module it imports that lies beside it or under the search directories -- and
the functions that function passes the parser (or a group) to, and reads each
``add_argument`` call: option strings, ``dest``, ``action``, ``type``, ``nargs``, ``choices``,
``default``, ``const``.  Each becomes a ``megatron.flags.FlagSpec`` (``conditional`` =
``SCRIPT_CONDITION``), so the argv reader can parse the script's flags with the right arity.
What cannot be read statically (an option string computed at run time) is counted in
``ScriptFlags.unreadable_calls``.  The script's imports of megatron-core model packages are
kept too (``model_imports``): they say which model it builds.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass
from typing import Any, Sequence
from megatron_estimator.core.resources import read_input_text

from megatron_estimator.inputs.argv import SCRIPT_CONDITION
from megatron_estimator.megatron.flags import BOOLEAN_OPTIONAL, FlagSpec

# The Megatron functions that take the provider as their first positional argument.
_PROVIDER_TAKERS = ("parse_args", "parse_and_validate_args", "initialize_megatron")
# argparse actions that take no value on the command line.
_NO_VALUE_ACTIONS = ("store_true", "store_false", "store_const", "append_const", "count", "help", "version")
_PLAIN_TYPES = ("int", "float", "str", "bool")
_MAX_DEPTH = 12          # functions followed from a provider, at most
_BUILTINS = frozenset({"print", "isinstance", "getattr", "hasattr", "setattr", "len", "id", "type", "vars",
                       "repr", "str", "super", "callable"})


@dataclass(frozen=True)
class ScriptFlags:
    """What ``read_script_flags`` found in an entry script."""

    path: str
    specs: tuple[FlagSpec, ...] = ()           # the script's own flags, in registration order
    error: str | None = None                   # why the script could not be read (then nothing else is set)
    providers: tuple[str, ...] = ()            # the extra_args_provider functions followed
    files: tuple[str, ...] = ()                # every file read (the script first)
    unreadable_calls: int = 0                  # add_argument calls whose option strings are computed
    model_imports: tuple[str, ...] = ()        # megatron.core.models.* packages the script imports
    missed: tuple[str, ...] = ()               # what could not be followed (a provider, a helper not found)

    @property
    def incomplete(self) -> str | None:
        """Why the script's flags may be more than ``specs``, or None when every one was read."""
        reasons = list(self.missed)
        if self.unreadable_calls:
            n = self.unreadable_calls
            reasons.append("1 add_argument call computes its option strings" if n == 1
                           else f"{n} add_argument calls compute their option strings")
        return "; ".join(reasons) or None

    @property
    def readable(self) -> bool:
        return self.error is None

    @property
    def option_strings(self) -> tuple[str, ...]:
        return tuple(o for spec in self.specs for o in spec.option_strings)


class _Module:
    """One parsed file: its top-level functions and the names it imports."""

    def __init__(self, path: str, tree: ast.Module):
        self.path = path
        self.functions: dict[str, ast.FunctionDef] = {}
        self.imports: dict[str, tuple[str, str | None, int]] = {}   # name -> (module, attribute, level)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions.setdefault(node.name, node)
            elif isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    self.imports.setdefault(alias.asname or alias.name, (node.module or "", alias.name, node.level))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    self.imports.setdefault(alias.asname or alias.name.split(".")[0],
                                            (alias.name if alias.asname else alias.name.split(".")[0], None, 0))


def _parse_file(path: str) -> tuple[ast.Module | None, str | None]:
    try:
        text = read_input_text(path, "python")
    except (OSError, UnicodeDecodeError) as exc:
        return None, getattr(exc, "strerror", None) or str(exc)
    try:
        return ast.parse(text, filename=path), None
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        line = getattr(exc, "lineno", None)
        return None, f"not valid Python{f' (line {line})' if line else ''}"


class _Reader:
    def __init__(self, script: str, search_dirs: Sequence[str]):
        self.script = script
        self.search_dirs = tuple(dict.fromkeys(search_dirs))
        self.modules: dict[str, _Module | None] = {}
        self.specs: list[FlagSpec] = []
        self.seen_options: set[str] = set()
        self.followed: set[tuple[str, str]] = set()
        self.providers: list[str] = []
        self.unreadable_calls = 0
        self.missed: list[str] = []

    def module(self, path: str) -> _Module | None:
        if path not in self.modules:
            tree, _ = _parse_file(path)
            self.modules[path] = _Module(path, tree) if tree is not None else None
        return self.modules[path]

    def module_file(self, name: str, level: int, importer: str) -> str | None:
        """The file of module ``name`` (``a.b``; ``level`` dots of a relative import) as seen from
        ``importer``: beside it for relative imports, else under the script's directory, its
        parents and the search directories."""
        parts = name.split(".") if name else []
        if level:
            base = os.path.dirname(importer)
            for _ in range(level - 1):
                base = os.path.dirname(base)
            bases = [base]
        else:
            bases = [os.path.dirname(importer)]
            here = os.path.dirname(os.path.abspath(self.script))
            while True:
                bases.append(here)
                parent = os.path.dirname(here)
                if parent == here:
                    break
                here = parent
            bases.extend(self.search_dirs)
        for base in dict.fromkeys(bases):
            stem = os.path.join(base, *parts) if parts else base
            for candidate in (stem + ".py", os.path.join(stem, "__init__.py")):
                if parts and os.path.isfile(candidate):
                    return candidate
        return None

    def function(self, module: _Module, name: str, depth: int = 0) -> tuple[_Module, ast.FunctionDef] | None:
        """The definition of ``name`` as ``module`` sees it: its own, or one it imports."""
        if name in module.functions:
            return module, module.functions[name]
        if name in module.imports and depth < 4:
            source, attribute, level = module.imports[name]
            if attribute is None:
                return None
            path = self.module_file(source, level, module.path)
            if path is None:
                # ``from pkg import mod`` then ``mod.fn``: handled by ``attribute_function``
                return None
            other = self.module(path)
            if other is not None:
                return self.function(other, attribute, depth + 1)
        return None

    def attribute_function(self, module: _Module, node: ast.Attribute) -> tuple[_Module, ast.FunctionDef] | None:
        """``mod.fn`` where ``mod`` is a module the file imports."""
        if not isinstance(node.value, ast.Name) or node.value.id not in module.imports:
            return None
        source, attribute, level = module.imports[node.value.id]
        dotted = f"{source}.{attribute}" if attribute is not None and source else (attribute or source)
        path = self.module_file(dotted, level, module.path)
        other = self.module(path) if path is not None else None
        return (other, other.functions[node.attr]) if other is not None and node.attr in other.functions else None

    def callee(self, module: _Module, node: ast.expr) -> tuple[_Module, ast.FunctionDef] | None:
        if isinstance(node, ast.Name):
            return self.function(module, node.id)
        if isinstance(node, ast.Attribute):
            return self.attribute_function(module, node)
        if isinstance(node, ast.Call) and _name_of(node.func) in ("partial", "functools.partial") and node.args:
            return self.callee(module, node.args[0])
        return None

    def provider_expressions(self, tree: ast.Module) -> list[ast.expr]:
        found: list[ast.expr] = []
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            for keyword in node.keywords:
                if keyword.arg == "extra_args_provider":
                    found.append(keyword.value)
            if _name_of(node.func).split(".")[-1] in _PROVIDER_TAKERS and node.args:
                found.append(node.args[0])
        expanded: list[ast.expr] = []
        while found:
            expr = found.pop(0)
            if isinstance(expr, ast.IfExp):          # add_modelopt_args if has_modelopt else None
                found[:0] = [expr.body, expr.orelse]
            elif isinstance(expr, ast.BoolOp):
                found[:0] = list(expr.values)
            elif not (isinstance(expr, ast.Constant) and expr.value is None):
                expanded.append(expr)
        return expanded

    def follow(self, module: _Module, fn: ast.FunctionDef | ast.Lambda, depth: int) -> None:
        name = getattr(fn, "name", "lambda")
        key = (module.path, f"{name}:{fn.lineno}:{fn.col_offset}")
        if key in self.followed or depth > _MAX_DEPTH:
            return
        self.followed.add(key)
        args = fn.args.posonlyargs + fn.args.args
        parsers = {a.arg for a in args[:1]}          # the parser the provider is handed
        for node in _walk_in_order(fn):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                value = node.value
                method = value.func.attr if isinstance(value.func, ast.Attribute) else None
                if method in ("add_argument_group", "add_mutually_exclusive_group") or (
                        method is None and any(_is_name_in(a, parsers) for a in value.args)):
                    for target in node.targets:
                        if isinstance(target, ast.Name):
                            parsers.add(target.id)
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr == "add_argument":
                self.add_argument(node)
            elif any(_is_name_in(a, parsers) for a in node.args) or any(
                    _is_name_in(k.value, parsers) for k in node.keywords):
                if _name_of(func) in _BUILTINS or (isinstance(func, ast.Attribute) and _is_name_in(func.value, parsers)):
                    continue
                target = self.callee(module, func)
                if target is not None:
                    self.follow(target[0], target[1], depth + 1)
                else:
                    self.missed.append(f"{name} hands the parser to {_name_of(func) or 'a call'}, "
                                       "whose source was not found")

    def add_argument(self, call: ast.Call) -> None:
        options: list[str] = []
        for arg in call.args:
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                options.append(arg.value)
            else:
                self.unreadable_calls += 1
                return
        options = [o for o in options if o.startswith("-")]
        if not options:
            return                                    # a positional argument: Megatron has none
        keywords = {k.arg: k.value for k in call.keywords if k.arg is not None}
        action = _action(keywords.get("action"))
        long = [o for o in options if o.startswith("--")]
        dest = _literal(keywords.get("dest"))
        if not isinstance(dest, str):
            dest = (long[0] if long else options[0]).lstrip("-").replace("-", "_")
        if action == BOOLEAN_OPTIONAL:                # argparse adds --no-x for each --x
            options += ["--no-" + o[2:] for o in long]
        if action in _NO_VALUE_ACTIONS:
            action = "store_true" if action != "store_false" else "store_false"
        elif action != BOOLEAN_OPTIONAL:
            action = "store"
        type_name = _name_of(keywords["type"]) if "type" in keywords else None
        type_name = type_name if type_name in _PLAIN_TYPES else None
        nargs = _literal(keywords.get("nargs"))
        if not (nargs is None or nargs in ("?", "*", "+") or (isinstance(nargs, int) and nargs >= 0)):
            nargs = "*"                                # computed nargs: take what follows
        if nargs == 0:
            action = "store_true"
        choices = _literal(keywords.get("choices"))
        choices = tuple(choices) if isinstance(choices, (list, tuple)) and all(
            isinstance(c, (str, int, float)) and not isinstance(c, bool) for c in choices) else None
        if choices is not None and type_name is None and not all(isinstance(c, str) for c in choices):
            choices = None
        fresh = [o for o in options if o not in self.seen_options]
        if not fresh:
            return
        self.seen_options.update(fresh)
        self.specs.append(FlagSpec(
            flag=fresh[0], aliases=tuple(fresh[1:]), dest=dest, action=action, type=type_name,
            nargs=nargs if action == "store" else None, default=_literal(keywords.get("default")),
            choices=choices, const=_literal(keywords.get("const")), conditional=SCRIPT_CONDITION))


def _walk_in_order(fn: ast.FunctionDef | ast.Lambda):
    """The nodes of a function body in source order (assignments before the calls after them)."""
    nodes = [n for n in ast.walk(fn) if hasattr(n, "lineno")]
    nodes.sort(key=lambda n: (n.lineno, n.col_offset, 0 if isinstance(n, ast.stmt) else 1))
    return nodes


def _is_name_in(node: ast.expr, names: set[str]) -> bool:
    return isinstance(node, ast.Name) and node.id in names


def _name_of(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _name_of(node.value)
        return f"{inner}.{node.attr}" if inner else node.attr
    return ""


def _action(node: ast.expr | None) -> str:
    if node is None:
        return "store"
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if _name_of(node).endswith("BooleanOptionalAction"):
        return BOOLEAN_OPTIONAL
    return "store"                                     # a custom Action class: assume it takes a value


def _literal(node: ast.expr | None) -> Any:
    if node is None:
        return None
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
        return None


MODEL_PACKAGE = "megatron.core.models."


def _model_imports(tree: ast.Module) -> tuple[str, ...]:
    """The ``megatron.core.models.<family>`` packages the script imports (its own imports only)."""
    found: list[str] = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            if name.startswith(MODEL_PACKAGE):
                package = name[len(MODEL_PACKAGE):].split(".")[0]
                if package and package not in found:
                    found.append(package)
    return tuple(found)


def read_script_flags(path: str, search_dirs: Sequence[str] = ()) -> ScriptFlags:
    """The flags the entry script at ``path`` registers through its ``extra_args_provider``;
    ``search_dirs``: where its absolute imports may also resolve (the working directory)."""
    tree, error = _parse_file(path)
    if tree is None:
        return ScriptFlags(path, error=error)
    reader = _Reader(path, search_dirs)
    module = _Module(path, tree)
    reader.modules[path] = module
    for expr in reader.provider_expressions(tree):
        if isinstance(expr, ast.Lambda):             # extra_args_provider=lambda parser: add_mine(parser)
            reader.providers.append("lambda")
            reader.follow(module, expr, 0)
            continue
        target = reader.callee(module, expr)
        if target is None:
            reader.missed.append(f"its extra_args_provider {ast.unparse(expr)} was not found")
            continue
        reader.providers.append(target[1].name)
        reader.follow(target[0], target[1], 0)
    files = tuple(p for p, m in reader.modules.items() if m is not None)
    return ScriptFlags(path, specs=tuple(reader.specs), providers=tuple(dict.fromkeys(reader.providers)),
                       files=files, unreadable_calls=reader.unreadable_calls, model_imports=_model_imports(tree),
                       missed=tuple(dict.fromkeys(reader.missed)))


# Calls that register a flag in a framework's argument module: argparse's own, and
# Pai-Megatron-Patch's ``patch_if_not_exist(group, "--flag", ...)`` (megatron_patch/arguments.py),
# whose first argument is the group, and slime's ``reset_arg(parser, "--flag", ...)`` (slime/utils/arguments.py).
_REGISTERING_CALLS = {"add_argument": 0, "patch_if_not_exist": 1, "reset_arg": 1}


def read_module_flags(path: str) -> ScriptFlags:
    """Every flag the module at ``path`` registers anywhere in it (a framework's argument module,
    whose providers are built by factories and nested functions: every registering call is read)."""
    tree, error = _parse_file(path)
    if tree is None:
        return ScriptFlags(path, error=error)
    reader = _Reader(path, ())
    calls = sorted((n for n in ast.walk(tree) if isinstance(n, ast.Call)), key=lambda n: (n.lineno, n.col_offset))
    for call in calls:
        name = _name_of(call.func).rsplit(".", 1)[-1]
        if name in _REGISTERING_CALLS:
            skip = _REGISTERING_CALLS[name]
            reader.add_argument(ast.Call(func=call.func, args=call.args[skip:], keywords=call.keywords))
    return ScriptFlags(path, specs=tuple(reader.specs), files=(path,), unreadable_calls=reader.unreadable_calls)
