"""Megatron-LM's command-line flags: the table of what ``megatron/training/arguments.py`` registers.

The table (``data/megatron_flags.tsv``, written by ``scripts/import_flags``) describes every
flag that ``megatron/training/arguments.py`` registers: option strings, dest, argparse action,
type converter, nargs, default, choices, and whether an optional extension must be installed
for the flag to exist.  ``flag_table(label)`` loads a release's once, lazily; it answers lookups by option
string or dest, and Megatron's defaults.  ``convert_value`` converts one value string as the
flag's converter does (``moe_freq_type``, ``tuple_type``, ...) and checks its choices.

Values are Python values as Megatron's namespace would hold them, except that enum members
(``--attention-backend``, ``--exit-signal``, ``--cuda-graph-modules``) are kept by member name
(``'flash'``, ``'SIGTERM'``, ``'attn'``): the estimator does not import Megatron.

Flags that exist only with an optional extension (``conditional``: ``modelopt`` for
nvidia-modelopt, ``kitchen`` for megatron.core.extensions.kitchen) are in the table;
``CONDITIONS`` says what each condition means.  Reading a command line with this table is
``megatron_estimator.inputs.argv``.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any, Iterator, Sequence

from megatron_estimator.megatron.releases import NEWEST
from megatron_estimator.core.resources import read_data_text

TABLE_FILE = "megatron_flags.tsv"
BOOLEAN_OPTIONAL = "argparse.BooleanOptionalAction"
FLAG_ACTIONS = ("store_true", "store_false", BOOLEAN_OPTIONAL)

CONDITIONS = {
    "modelopt": "registered only when nvidia-modelopt is installed (the extra_args_provider of "
                "pretrain_gpt.py / pretrain_hybrid.py); without it Megatron rejects the flag",
    "kitchen": "registered only when megatron.core.extensions.kitchen is importable "
               "(arguments.py _add_kitchen_quantization_arguments); without it Megatron rejects the flag",
}


@dataclass(frozen=True)
class FlagSpec:
    """One flag as Megatron's parser registers it."""

    flag: str                       # first option string, e.g. "--num-layers"
    aliases: tuple[str, ...]        # the other option strings, e.g. ("--disable-x",)
    dest: str                       # namespace attribute, e.g. "num_layers"
    action: str                     # store | store_true | store_false | argparse.BooleanOptionalAction
    type: str | None                # converter name ("int", "moe_freq_type", "AttnBackend"...), None: the string
    nargs: int | str | None         # None (one value), "?", "*", "+" or a count
    default: Any                    # the namespace value when the flag is not given
    choices: tuple | None           # allowed values after conversion (enum members by name)
    const: Any
    conditional: str                # "" always registered; else "modelopt" or "kitchen"

    def __hash__(self) -> int:      # defaults may be lists; the first option string is unique
        return hash(self.flag)

    @property
    def option_strings(self) -> tuple[str, ...]:
        return (self.flag, *self.aliases)

    @property
    def takes_value(self) -> bool:
        return self.action not in FLAG_ACTIONS

    @property
    def always_registered(self) -> bool:
        return not self.conditional


# -- reading the table ------------------------------------------------------------------------

_LITERALS = {"None": None, "True": True, "False": False}


# The forms most of the table's cells take, read without ast.literal_eval (which costs 20 ms
# over the table at every start); tests/test_flags.py holds read_literal to ast.literal_eval
# on every cell.
_INT = re.compile(r"-?\d+\Z")
_FLOAT = re.compile(r"-?(\d+\.\d*|\d*\.\d+)(e[-+]?\d+)?\Z|-?\d+e[-+]?\d+\Z")
_PLAIN_STR = re.compile(r"'[^'\\]*'\Z")


def read_literal(text: str) -> Any:
    """The value of a Python literal as ``repr`` writes it (``ast.literal_eval``)."""
    if text in _LITERALS:
        return _LITERALS[text]
    if _INT.match(text):
        return int(text)
    if _FLOAT.match(text):
        return float(text)
    if _PLAIN_STR.match(text):
        return text[1:-1]
    return ast.literal_eval(text)


def _copy(value: Any) -> Any:
    return list(value) if isinstance(value, list) else value


class FlagTable:
    """Megatron's flags, looked up by option string or by dest.  FlagSpecs are built on demand."""

    def __init__(self, rows: Sequence[Sequence[str]]):
        self._rows = rows
        self._specs: list[FlagSpec | None] = [None] * len(rows)
        self._by_option: dict[str, int] = {}
        self._by_dest: dict[str, list[int]] = {}
        for index, row in enumerate(rows):
            self._by_option[row[0]] = index
            if row[1]:
                for alias in row[1].split(","):
                    self._by_option[alias] = index
            self._by_dest.setdefault(row[2], []).append(index)
        self._defaults: dict[str, Any] | None = None
        self._namespace: tuple[dict[str, Any], tuple[str, ...]] | None = None

    @classmethod
    def from_text(cls, text: str) -> "FlagTable":
        lines = text.splitlines()
        start = 0
        while start < len(lines) and lines[start].startswith("#"):
            start += 1
        header = lines[start].split("\t")
        if header[:10] != ["flag", "aliases", "dest", "action", "type", "nargs", "default",
                           "choices", "const", "conditional"]:
            raise ValueError(f"{TABLE_FILE}: unexpected header {header!r}")
        return cls([line.split("\t") for line in lines[start + 1:] if line])

    def _spec(self, index: int) -> FlagSpec:
        spec = self._specs[index]
        if spec is None:
            flag, aliases, dest, action, type_name, nargs, default, choices, const, conditional = self._rows[index][:10]
            spec = FlagSpec(
                flag=flag,
                aliases=tuple(aliases.split(",")) if aliases else (),
                dest=dest,
                action=action,
                type=type_name or None,
                nargs=int(nargs) if nargs.isdigit() else (nargs or None),
                default=read_literal(default),
                choices=_typed_choices(choices, type_name) if choices else None,
                const=read_literal(const) if const else None,
                conditional=conditional,
            )
            self._specs[index] = spec
        return spec

    # lookups
    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self) -> Iterator[FlagSpec]:
        return (self._spec(i) for i in range(len(self._rows)))

    def __contains__(self, option: object) -> bool:
        return option in self._by_option

    def by_option(self, option: str) -> FlagSpec | None:
        """The flag that ``option`` (an exact option string, e.g. ``--no-x``) belongs to."""
        index = self._by_option.get(option)
        return None if index is None else self._spec(index)

    def by_dest(self, dest: str) -> FlagSpec | None:
        """The first flag registered for ``dest`` (the one whose default argparse keeps)."""
        indexes = self._by_dest.get(dest)
        return None if indexes is None else self._spec(indexes[0])

    def specs_for_dest(self, dest: str) -> tuple[FlagSpec, ...]:
        """Every flag that stores into ``dest``, in registration order (usually one;
        ``--yarn-correction-range-round-to-int`` and its ``--no-`` twin share one)."""
        return tuple(self._spec(i) for i in self._by_dest.get(dest, ()))

    def dests(self) -> tuple[str, ...]:
        return tuple(self._by_dest)

    def option_strings(self, *, include_conditional: bool = True) -> tuple[str, ...]:
        if include_conditional:
            return tuple(self._by_option)
        return tuple(o for o, i in self._by_option.items() if not self._rows[i][9])

    def _all_defaults(self) -> dict[str, Any]:
        if self._defaults is None:
            defaults: dict[str, Any] = {}
            for row in self._rows:
                # argparse sets each dest's default once, from the first action registered for it.
                if row[2] not in defaults:
                    defaults[row[2]] = read_literal(row[6])
            self._defaults = defaults
        return self._defaults

    def default(self, dest: str) -> Any:
        """Megatron's default for ``dest`` (a fresh copy when it is a list); KeyError if unknown."""
        return _copy(self._all_defaults()[dest])

    def _plain_namespace(self) -> tuple[dict[str, Any], tuple[str, ...]]:
        # Built once per table, and flag_table caches one table per release: the defaults
        # are keyed by the chosen release.
        if self._namespace is None:
            everything = self._all_defaults()
            plain = {dest: everything[dest] for dest, indexes in self._by_dest.items()
                     if not self._rows[indexes[0]][9]}
            self._namespace = plain, tuple(d for d, v in plain.items() if isinstance(v, list))
        return self._namespace

    def namespace_default(self, dest: str) -> Any:
        """``defaults().get(dest)`` without building the namespace: the default of an
        always-registered dest (a fresh copy when it is a list), None for any other."""
        return _copy(self._plain_namespace()[0].get(dest))

    def defaults(self) -> dict[str, Any]:
        """Every always-registered dest -> its default: Megatron's namespace before parsing.
        A new dict each call, its list defaults fresh copies (the table itself is read once)."""
        plain, lists = self._plain_namespace()
        namespace = dict(plain)
        for dest in lists:
            namespace[dest] = list(plain[dest])
        return namespace


def _typed_choices(text: str, type_name: str) -> tuple:
    values = text.split("|")
    if type_name == "int":
        return tuple(int(v) for v in values)
    if type_name == "float":
        return tuple(float(v) for v in values)
    return tuple(values)


HISTORY_FILE = "megatron_flag_history.tsv"


def flag_table(label: str = NEWEST) -> FlagTable:
    """The flags of release ``label`` (of ``data/megatron_releases.tsv``; a run's is
    ``RunContext.release.version``, a reader is given it), read once per release."""
    return _flag_table(label)


@cache
def _flag_table(label: str) -> FlagTable:
    """Main from ``megatron_flags.tsv``, another release by expanding the interval table for it alone."""
    if label == "main":
        return FlagTable.from_text(read_data_text(TABLE_FILE))
    from megatron_estimator.megatron.releases import labels, order_of
    at = order_of(label)
    order = {name: index for index, name in enumerate(labels())}
    rows = [row[:10] for row in _history_rows() if order[row[10]] <= at <= order[row[11]]]
    return FlagTable(rows)


@cache
def _history_rows() -> tuple[list[str], ...]:
    lines = read_data_text(HISTORY_FILE).splitlines()
    start = 0
    while lines[start].startswith("#"):
        start += 1
    return tuple(line.split("\t") for line in lines[start + 1:] if line)


def flag_history(option: str) -> tuple[tuple[str, str, str], ...]:
    """Every release interval in which ``option`` exists: ``(first, last, dest)`` rows."""
    found = []
    for row in _history_rows():
        if row[0] == option or (row[1] and option in row[1].split(",")):
            found.append((row[10], row[11], row[2]))
    return tuple(found)


def history_message(option: str, label: str = NEWEST) -> str | None:
    """Why ``option``, unknown to release ``label``, is known to
    another release: "removed in 0.18.0", "needs Megatron 0.18.0 or later", or its new
    spelling; None when no known release has it."""
    from megatron_estimator.megatron.releases import labels, order_of

    history = flag_history(option)
    if not history:
        return None
    at = order_of(label)
    names = labels()
    later = [first for first, _, _ in history if order_of(first) > at]
    earlier = [last for _, last, _ in history if order_of(last) < at]
    where = f"Megatron {label}" if label != "main" else "Megatron main"
    if later:
        first = min(later, key=order_of)
        return f"not in {where}; it needs Megatron {first} or later"
    last = max(earlier, key=order_of)
    removed_in = names[order_of(last) + 1]
    message = f"not in {where}; removed in {removed_in} (last in {last})"
    table = flag_table(label)
    dests = {dest for _, _, dest in history}
    for dest in dests:
        spec = table.by_dest(dest)
        if spec is not None:
            return message + f"; it is spelled {spec.flag} now"
    return message


def dest_for_option(option: str, release: str = NEWEST) -> str | None:
    """The dest that an exact option string stores into in release ``release``, or None for an
    unknown option."""
    spec = flag_table(release).by_option(option)
    return None if spec is None else spec.dest


def closest_flags(option: str, n: int = 3, extra: Sequence[str] = (), *, release: str = NEWEST) -> list[str]:
    """Up to ``n`` option strings of release ``release`` closest to ``option`` (a misspelling), best first;
    ``extra``: more known option strings (an entry script's own flags).

    ``--num_layers`` and ``-num-layers`` find ``--num-layers`` first, a short name other tools
    use finds its flag alone (``--tp``: ``--tensor-model-parallel-size``, ``short_options``);
    otherwise difflib's similarity ratio, at least 0.6, decides.
    """
    from megatron_estimator.core.hints import close_matches
    from megatron_estimator.megatron.short_options import megatron_flag_for

    table = flag_table(release)
    name = option.split("=", 1)[0]
    normalized = "--" + name.lstrip("-").replace("_", "-")
    found: list[str] = []
    long_form = megatron_flag_for(normalized)
    if long_form is not None and long_form in table:
        return [long_form]          # a short name means one flag: no near spellings beside it
    for candidate in (name, normalized):
        if (candidate in table or candidate in extra) and candidate not in found:
            found.append(candidate)
    known = table.option_strings() + tuple(extra) if extra else table.option_strings()
    for match in close_matches(normalized, known, n=n + len(found), fold_case=False):
        if match not in found:
            found.append(match)
    return found[:n]


# -- converters -------------------------------------------------------------------------------


class FlagValueError(ValueError):
    """A value that a flag's converter rejects; the message says what was expected."""


class FlagChoiceError(ValueError):
    """A converted value that is not among the flag's choices."""

    def __init__(self, value: Any, choices: tuple):
        self.value, self.choices = value, choices
        super().__init__(f"invalid choice {value!r}")


# arguments.py _eval_pattern: a pattern may hold only digits, commas, brackets, parentheses, + and *.
_PATTERN_CHARS = re.compile(r"[^,\d\[\]\(\)\+\*]")
_MAX_PATTERN_LENGTH = 1_000_000
_PATTERN_HELP = ("an integer or a layer pattern such as ([1]*3+[0]*1)*3 "
                 "(digits, commas, brackets, parentheses, + and * only, no spaces)")

# megatron/core/transformer/enums.py CudaGraphModule, and the deprecated whole-graph spellings
# that arguments.py _parse_cuda_graph_modules_arg passes through as strings.
CUDA_GRAPH_MODULES = ("attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba")
CUDA_GRAPH_DEPRECATED_SCOPES = ("full", "full_iteration", "full_iteration_inference")


def eval_layer_pattern(text: str) -> list[int]:
    """A per-layer pattern such as ``([0]*3+[1]*58)`` or ``[1,0,1]``, evaluated safely (a
    fresh list; each text is evaluated once, ``_layer_pattern``).

    Megatron (arguments.py ``_eval_pattern``) checks the characters and calls ``eval``; here the
    expression is walked with ``ast``: list literals of integers, ``*`` (repetition, or integer
    product) and ``+`` (concatenation, or integer sum), with parentheses.  The result must be a
    flat list of integers, which is what the model builders accept (transformer_block.py).
    """
    return list(_layer_pattern(text))


@lru_cache(maxsize=256)
def _layer_pattern(text: str) -> tuple[int, ...]:
    if _PATTERN_CHARS.search(text):
        raise FlagValueError("a layer pattern may hold only digits, commas, brackets, parentheses, "
                             "+ and * (no spaces)")
    import ast

    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise FlagValueError("not a valid layer pattern") from None

    def value(node: ast.AST) -> int | list[int]:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.List):
            items = [value(e) for e in node.elts]
            if not all(isinstance(i, int) for i in items):
                raise FlagValueError("a layer pattern's lists must hold integers, not lists")
            return items
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Add):
                if isinstance(left, list) != isinstance(right, list):
                    raise FlagValueError("+ joins two lists or adds two integers")
                if isinstance(left, list) and len(left) + len(right) > _MAX_PATTERN_LENGTH:
                    raise FlagValueError("the layer pattern is too long")
                return left + right
            if isinstance(left, list) or isinstance(right, list):
                if isinstance(left, list) and isinstance(right, list):
                    raise FlagValueError("* repeats a list an integer number of times")
                items, times = (left, right) if isinstance(left, list) else (right, left)
                if len(items) * times > _MAX_PATTERN_LENGTH:
                    raise FlagValueError("the layer pattern is too long")
                return items * times
            product = left * right
            if product > _MAX_PATTERN_LENGTH ** 2:
                raise FlagValueError("the layer pattern's numbers are too large")
            return product
        raise FlagValueError("a layer pattern may use only lists of integers, + and *")

    try:
        result = value(tree.body)
    except RecursionError:
        raise FlagValueError("the layer pattern is nested too deeply") from None
    if not isinstance(result, list):
        raise FlagValueError("a layer pattern must evaluate to a list")
    return tuple(result)


def _freq_type(text: str) -> int | list[int]:
    # arguments.py moe_freq_type / la_freq_type / no_rope_freq_type: a pattern when it holds '[',
    # else an integer.
    if "[" in text:
        return eval_layer_pattern(text)
    try:
        return int(text)
    except ValueError:
        raise FlagValueError(f"expected {_PATTERN_HELP}") from None


def _tuple_type(text: str) -> tuple[int, ...]:
    # arguments.py tuple_type: "1,2,3" or "(1,2,3)".
    try:
        return tuple(int(i) for i in text.strip("()").split(","))
    except ValueError:
        raise FlagValueError("expected comma-separated integers such as 1,2 or (1,2)") from None


def _cuda_graph_module(text: str) -> str:
    # arguments.py _parse_cuda_graph_modules_arg: the deprecated scopes as strings, else a
    # CudaGraphModule member by name (kept here by name).
    if text in CUDA_GRAPH_DEPRECATED_SCOPES or text in CUDA_GRAPH_MODULES:
        return text
    raise FlagValueError(f"expected one of {', '.join(CUDA_GRAPH_MODULES)} (or the deprecated "
                         f"{', '.join(CUDA_GRAPH_DEPRECATED_SCOPES)})")


def _cuda_graph_scope(text: str) -> str:
    # arguments.py 0.16.1-0.17.1: ``CudaGraphScope[scope] if scope != "full" else scope`` (kept by
    # name; megatron/core/transformer/enums.py CudaGraphScope, core_v0.17.1 lines 64-71: the
    # modules, full_iteration, and full_iteration_inference, which 0.16.1 does not have yet).
    if text == "full" or text in CUDA_GRAPH_MODULES or text in ("full_iteration", "full_iteration_inference"):
        return text
    raise FlagValueError(f"expected full or one of {', '.join(CUDA_GRAPH_MODULES)}, full_iteration, "
                         "full_iteration_inference")


def _number(kind, description):
    def convert(text: str):
        try:
            return kind(text)
        except ValueError:
            raise FlagValueError(f"expected {description}") from None
    return convert


_CONVERTERS = {
    "int": _number(int, "an integer"),
    "float": _number(float, "a number"),
    "str": str,
    "bool": bool,            # argparse calls bool(text): any non-empty string is True
    "moe_freq_type": _freq_type,
    "la_freq_type": _freq_type,
    "no_rope_freq_type": _freq_type,
    "tuple_type": _tuple_type,
    "_parse_cuda_graph_modules_arg": _cuda_graph_module,
    "cuda_graph_scope": _cuda_graph_scope,
}
ENUM_TYPES = ("AttnBackend", "signal.Signals")   # looked up by member name; the choices are the names
CONVERTER_TYPES = frozenset(_CONVERTERS) | frozenset(ENUM_TYPES)


def convert_value(spec: FlagSpec, text: str) -> Any:
    """One value string converted as Megatron's converter for ``spec`` does, choices checked.

    Raises ``FlagValueError`` (the type is wrong) or ``FlagChoiceError`` (not among the choices).
    """
    if spec.type in ENUM_TYPES or spec.type is None:
        value = text
    else:
        converter = _CONVERTERS.get(spec.type)
        if converter is None:
            raise FlagValueError(f"{spec.flag}: no converter for type {spec.type!r}")
        value = converter(text)
    if spec.choices is not None and value not in spec.choices:
        raise FlagChoiceError(value, spec.choices)
    return value
