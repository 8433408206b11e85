"""Child process of scripts/megatron_releases: build one Megatron-LM checkout's real argparse
parser and print its flags as JSON (one object per flag, registration order) on stdout.

    python scripts/megatron_release_dump.py CHECKOUT OUTPUT_JSON

Runs in its own interpreter because it imports the checkout's ``megatron`` package (never the
estimator's).  Modules of the checkout that fail to import for want of a GPU-only dependency
(triton kernels and the like) are replaced by inert stand-ins, one at a time, until
``megatron/training/arguments.py`` imports; none of them registers flags.  The parser is built
twice: as ``parse_args`` builds it (``add_megatron_arguments``), and again with the optional
extensions present (megatron.core.extensions.kitchen's HAVE_KITCHEN forced true, then
``megatron/post_training/arguments.py add_modelopt_args`` as the extra_args_provider that
pretrain_gpt.py passes when nvidia-modelopt is installed); flags only in the second are
marked ``conditional`` (``kitchen`` / ``modelopt``).  Whatever the checkout prints goes to
stderr.
"""

from __future__ import annotations

import argparse
import enum
import importlib.abc
import importlib.machinery
import json
import os
import sys
import traceback
import types
import typing
import warnings

ROOT = os.path.abspath(sys.argv[1])
STUBS: set[str] = set()
FORCED: dict[str, types.ModuleType] = {}


class _Inert:
    """Stands in for anything a stubbed module exports: callable (a decorator returns its
    argument), subscriptable, a base class, falsy."""

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return _Inert()

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Inert()

    def __mro_entries__(self, bases):
        return (object,)

    def __getitem__(self, key):
        return _Inert()

    def __iter__(self):
        return iter(())

    def __bool__(self):
        return False


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Inert()


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name in FORCED or name in STUBS:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        if spec.name in FORCED:
            return FORCED[spec.name]
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def _forget_checkout_modules() -> None:
    for name in [n for n in sys.modules if n == "megatron" or n.startswith("megatron.")]:
        del sys.modules[name]


def _import(name: str):
    """Import ``name`` from the checkout, stubbing the checkout's modules that cannot import."""
    import importlib

    for _ in range(200):
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as exc:
            frames = [f for f in traceback.extract_tb(exc.__traceback__)
                      if f.filename.startswith(ROOT + os.sep + "megatron")]
            if not frames:
                raise
            module = os.path.relpath(frames[-1].filename, ROOT)[:-3].replace(os.sep, ".")
            module = module.removesuffix(".__init__")
            if module in STUBS or module == name:
                raise
            print(f"stub {module} (needs {exc.name})", file=sys.stderr)
            STUBS.add(module)
            _forget_checkout_modules()
    raise RuntimeError(f"cannot import {name}")


def _type_name(action: argparse.Action) -> str:
    kind = action.type
    if kind is None:
        return ""
    choices = list(action.choices) if action.choices is not None else []
    members = [c for c in choices if isinstance(c, enum.Enum)]
    if isinstance(action.default, enum.Enum) or members:
        cls = type(action.default) if isinstance(action.default, enum.Enum) else type(members[0])
        return "signal.Signals" if cls.__name__ == "Signals" else cls.__name__
    name = getattr(kind, "__name__", type(kind).__name__)
    if name == "<lambda>" and "--cuda-graph-scope" in action.option_strings:
        # 0.16-0.17: lambda scope: CudaGraphScope[scope] if scope != "full" else scope
        return "cuda_graph_scope"
    if name == "<lambda>":
        raise SystemExit(f"{action.option_strings[0]}: a lambda type; name it in megatron_release_dump.py")
    return name


def _value(value):
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, (list, tuple)):
        return type(value)(_value(v) for v in value)
    return value


def _action_name(action: argparse.Action) -> str:
    names = {
        argparse._StoreAction: "store",
        argparse._StoreTrueAction: "store_true",
        argparse._StoreFalseAction: "store_false",
        argparse._StoreConstAction: "store_const",
        argparse._AppendAction: "append",
        argparse.BooleanOptionalAction: "argparse.BooleanOptionalAction",
    }
    return names.get(type(action), type(action).__name__)


def _describe(action: argparse.Action) -> dict:
    action_name = _action_name(action)
    flag_action = action_name in ("store_true", "store_false", "argparse.BooleanOptionalAction")
    nargs = "" if flag_action or action.nargs is None else str(action.nargs)
    default = _value(action.default)
    if isinstance(default, str) and action.type in (int, float):
        default = action.type(default)     # argparse converts a string default through the type
    choices = "" if action.choices is None else "|".join(str(_value(c)) for c in action.choices)
    const = "" if flag_action or action.const is None else repr(_value(action.const))
    return {
        "flag": action.option_strings[0],
        "aliases": ",".join(action.option_strings[1:]),
        "dest": action.dest,
        "action": action_name,
        "type": _type_name(action),
        "nargs": nargs,
        "default": repr(default),
        "choices": choices,
        "const": const,
    }


def _flags(parser: argparse.ArgumentParser) -> list[dict]:
    return [_describe(a) for a in parser._actions
            if a.option_strings and not isinstance(a, argparse._HelpAction)]


def main() -> None:
    warnings.simplefilter("ignore")
    sys.stdout = sys.stderr                 # the checkout's logging and prints
    sys.meta_path.insert(0, _StubFinder())
    sys.path.insert(0, ROOT)
    if not hasattr(typing, "override"):     # releases from 0.18 import typing.override (3.12)
        typing.override = lambda function: function
    arguments = _import("megatron.training.arguments")
    plain = _flags(arguments.add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False)))

    kitchen = types.ModuleType("megatron.core.extensions.kitchen")
    kitchen.HAVE_KITCHEN = True
    kitchen.KitchenSpecProvider = object
    FORCED[kitchen.__name__] = kitchen
    sys.modules[kitchen.__name__] = kitchen
    parser = arguments.add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    kitchen_flags = {f["flag"] for f in _flags(parser)} - {f["flag"] for f in plain}
    if os.path.exists(os.path.join(ROOT, "megatron", "post_training", "arguments.py")):
        parser = _import("megatron.post_training.arguments").add_modelopt_args(parser)
    plain_flags = {f["flag"] for f in plain}
    out = []
    for flag in _flags(parser):
        name = flag["flag"]
        flag["conditional"] = "" if name in plain_flags else "kitchen" if name in kitchen_flags else "modelopt"
        out.append(flag)
    with open(sys.argv[2], "w", encoding="utf-8") as handle:
        json.dump(out, handle, indent=0)


if __name__ == "__main__":
    main()
