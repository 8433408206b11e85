"""One argument checker for the Python fronts (the API and the pytest fixture; issue 30).

``@checked`` compares every argument of a call with the parameter's annotation before the body
runs; each wrong one is a ``Problem`` located at the parameter's name (``wrong-argument-type``),
all of them raised together as ``InvalidInput``.  The annotations are the table: ``str``, ``int``
(never ``bool``), ``bool``, ``float`` (an int too), ``os.PathLike``, classes, ``X | None``,
``Sequence[X]`` (never a ``str`` or ``bytes``), ``Mapping[K, V]``, ``tuple[...]``, ``Any``.
An unannotated parameter is not checked; ``@checked(name=type)`` gives or overrides one.
The values themselves (a negative size, an unknown flag) are the layers' own business.
"""

from __future__ import annotations

import collections.abc as abc
import functools
import inspect
import os
import types
import typing
from typing import Any, Callable

from megatron_estimator.core.problems import InvalidInput, Problem

_NONE = type(None)


def _name(hint: Any) -> str:
    """The annotation in words: ``str or None``, ``a sequence of str``."""
    if hint is Any:
        return "anything"
    if hint is None or hint is _NONE:
        return "None"
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_name(arg) for arg in args)
    if origin in (abc.Sequence, list, abc.Iterable, abc.Collection):
        return f"a sequence of {_name(args[0])}" if args else "a sequence"
    if origin is tuple:
        return "a tuple"
    if origin in (abc.Mapping, dict, abc.MutableMapping):
        return f"a mapping of {_name(args[0])} to {_name(args[1])}" if args else "a mapping"
    if origin in (abc.Callable,):
        return "a callable"
    if origin is typing.Literal:
        return " or ".join(repr(arg) for arg in args)
    return "os.PathLike" if hint is os.PathLike else getattr(hint, "__name__", str(hint))


def _wrong(value: Any, hint: Any) -> str | None:
    """None when ``value`` matches ``hint``; else what is wrong, in words (``item 2 is int``)."""
    if hint is Any or hint is object:
        return None
    if hint is None or hint is _NONE:
        return None if value is None else "is " + type(value).__name__
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        reasons = [_wrong(value, arg) for arg in args]
        if any(reason is None for reason in reasons):
            return None
        nested = [r for r in reasons if not r.startswith("is ")]  # a container of the right kind
        return nested[0] if len(nested) == 1 else "is " + type(value).__name__
    if origin is typing.Literal:
        return None if value in args else f"is {type(value).__name__}"
    if origin in (abc.Sequence, list, abc.Iterable, abc.Collection, tuple):
        if isinstance(value, (str, bytes, bytearray)) or not isinstance(value, origin if origin is not tuple
                                                                      else tuple):
            return "is " + type(value).__name__
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                return f"has {len(value)} items, not {len(args)}"
            pairs = zip(range(len(args)), value, args)
        else:
            item = args[0] if args else Any
            pairs = ((i, v, item) for i, v in enumerate(value))
        for i, item_value, item_hint in pairs:
            reason = _wrong(item_value, item_hint)
            if reason is not None:
                return f"item {i} {reason}"
        return None
    if origin in (abc.Mapping, dict, abc.MutableMapping):
        if not isinstance(value, abc.Mapping):
            return "is " + type(value).__name__
        key_hint, value_hint = args if args else (Any, Any)
        for key, item in value.items():
            reason = _wrong(key, key_hint)
            if reason is not None:
                return f"key {_short(key)} {reason}"
            reason = _wrong(item, value_hint)
            if reason is not None:
                return f"value of {_short(key)} {reason}"
        return None
    if origin is abc.Callable or hint is abc.Callable:
        return None if callable(value) else "is " + type(value).__name__
    if origin is not None:          # another generic: its class only
        hint = origin
    if hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif isinstance(hint, type):
        ok = isinstance(value, hint)
    else:
        return None                 # a hint this checker does not read (a TypeVar, a string)
    return None if ok else "is " + type(value).__name__


def _short(value: Any) -> str:
    """A key as a message may show it: short, one line (Problem escapes the rest)."""
    text = value if isinstance(value, str) else type(value).__name__
    return repr(text if len(text) <= 40 else text[:40] + "...")


def argument_problems(function: Callable, arguments: typing.Mapping[str, Any],
                      hints: typing.Mapping[str, Any]) -> list[Problem]:
    """One problem per argument of ``function`` (by name) that does not match its hint."""
    problems = []
    for name, value in arguments.items():
        if name not in hints:
            continue
        reason = _wrong(value, hints[name])
        if reason is not None:
            problems.append(Problem("wrong-argument-type", name,
                                    f"{function.__name__}() expects {_name(hints[name])}; the argument {reason}"))
    return problems


def _resolve(hint: Any) -> Any:
    """An override named ``"package.module:Name"`` (imported on first use: the fronts import
    the layers below lazily) or ``"...:Name | None"``; anything else as it is."""
    if not isinstance(hint, str):
        return hint
    import importlib

    target, optional = hint.removesuffix(" | None"), hint.endswith(" | None")
    module, _, name = target.partition(":")
    cls = getattr(importlib.import_module(module), name)
    return typing.Optional[cls] if optional else cls


def checked(function: Callable | None = None, /, **overrides: Any) -> Callable:
    """Decorator: wrong argument types raise ``InvalidInput`` (one located problem each) before
    the call.  Hints are read from the annotations the first time (forward references resolve
    by then); ``overrides`` give or replace the hint of a parameter by name."""
    if function is None:
        return lambda f: checked(f, **overrides)
    signature = inspect.signature(function)
    hints: dict[str, Any] | None = None

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        nonlocal hints
        if hints is None:
            resolved = typing.get_type_hints(function)
            hints = {name: resolved[name] for name in signature.parameters if name in resolved}
            hints.update({name: _resolve(hint) for name, hint in overrides.items()})
            hints.pop("self", None)
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as error:      # a missing or unknown argument
            raise InvalidInput([Problem("wrong-arguments", function.__name__, str(error))]) from None
        arguments = {name: value for name, value in bound.arguments.items()
                     if signature.parameters[name].kind not in (inspect.Parameter.VAR_POSITIONAL,
                                                                inspect.Parameter.VAR_KEYWORD)}
        problems = argument_problems(function, arguments, hints)
        if problems:
            raise InvalidInput(problems)
        return function(*args, **kwargs)

    wrapper.__signature__ = signature
    return wrapper
