"""The record a framework adapter declares (``Framework``), what it makes of a launch
(``Adaptation``), the launch's flags as it reads them (``FrameworkFlags``) and its flag tables
(``data/frameworks/``).  The registry and the reading are in ``__init__`` and ``reading``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    from typing import Any, Callable, Sequence

    from megatron_estimator.megatron.flags import FlagSpec


class _Unknown:
    """A flag's value that is not known statically (``${NUM_GPUS}`` set at run time)."""

    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN = _Unknown()


@dataclass(frozen=True)
class Adaptation:
    """What a framework makes of a launch's flags."""

    world_size: int | None = None
    world_size_source: str | None = None
    settings: dict = field(default_factory=dict)    # Megatron dest -> value it fills or forces
    assumptions: tuple[str, ...] = ()                # in words, each naming the framework source
    unknown: tuple[tuple[str, str], ...] = ()        # (flag, what it decides) whose value is not known here
    co_resident: tuple = ()                          # inputs/co_resident.CoResident: models beside the actor


@dataclass(frozen=True)
class ArgvRead:
    """What a framework that parses its whole argv itself (``Framework.read_argv``) made of it."""

    raw: Any
    problems: tuple = ()
    assumptions: tuple[str, ...] = ()
    world_size: int | None = None                    # the framework's own, from its config
    world_size_source: str | None = None
    environment: tuple[tuple[str, str], ...] = ()    # what it sets in its training processes (name, value)


@dataclass(frozen=True)
class Framework:
    name: str
    entry_patterns: tuple[str, ...]                  # ends of entry-program paths
    flag_table: str | None = None                    # data/frameworks/<file>
    provider_files: tuple[str, ...] = ()             # its argument modules, relative to its tree root
    imports: tuple[str, ...] = ()                    # packages whose import marks the entry program
    prefixes: tuple[str, ...] = ()                   # flags parsed apart by another parser (--sglang-*)
    adapt: Callable[[FrameworkFlags], Adaptation] | None = None
    unsupported: str | None = None                   # why the estimator does not model this stack
    # The framework parses its whole argv itself (Megatron's parser never sees it): (argv,
    # locations, entry, entry path, base dirs, its own flag specs, release) -> ArgvRead.
    read_argv: Callable[..., ArgvRead] | None = None
    # Why a launch of its entry program (its file, if found) cannot be checked here, or None;
    # ``check --skip-unknown`` says "not checked: <why>" for it.
    not_checked: Callable[[str | None], str | None] | None = None
    # data/frameworks/<file>: flags its patched Megatron-LM adds (flag, patches), which the
    # estimator does not model: such a launch is one ``unsupported-stack`` problem naming them.
    patched_megatron: str | None = None
    # Why ``check --skip-unknown`` passes over this launch, or None to check it: (argv, entry path,
    # entry script, release, base_dirs=) -> "<why it trains no Megatron model>" or "not checked: <why>".
    launch_skip: Callable[..., str | None] | None = None
    # Without a flag table, what confirms a program named like the framework's (its argv), or
    # None: the name suffices.
    confirm: Callable[[Sequence[str]], bool] | None = None
    # Its programs that train no Megatron model (an evaluation, text generation, a trainer of
    # another stack): (end of the program's path, ``*`` one segment's characters; what it does).
    # ``check --skip-unknown`` skips a launch of one, naming it.
    non_training: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class FrameworkFlags:
    """A launch's argv as the framework reads its own flags (the last occurrence wins, as argparse)."""

    argv: tuple[str, ...]
    specs: tuple[FlagSpec, ...]
    opaque: frozenset = frozenset()                  # indexes of tokens whose text is not known statically

    def _spec(self, option: str):
        return next((s for s in self.specs if option in s.option_strings), None)

    def given(self, option: str) -> bool:
        return any(t == option or t.startswith(option + "=") for t in self.argv)

    def value(self, option: str, default: Any = None) -> Any:
        spec = self._spec(option)
        found = default
        for i, token in enumerate(self.argv):
            if token == option:
                if spec is not None and not spec.takes_value:
                    found = spec.action != "store_false"
                elif i + 1 < len(self.argv):
                    found = UNKNOWN if i + 1 in self.opaque else self.argv[i + 1]
            elif token.startswith(option + "="):
                found = UNKNOWN if i in self.opaque else token.split("=", 1)[1]
            elif spec is not None and spec.action == "argparse.BooleanOptionalAction" and token == "--no-" + option[2:]:
                found = False
        if spec is not None and spec.type in ("int", "float") and isinstance(found, str):
            try:
                return int(found) if spec.type == "int" else float(found)
            except ValueError:
                return UNKNOWN
        return found


def load_flag_table(name: str):
    from megatron_estimator.core.resources import read_data_text
    from megatron_estimator.megatron.flags import FlagTable

    return tuple(FlagTable.from_text(read_data_text("frameworks", name)))


def table_release(name: str) -> str:
    """The source a flag table was generated from (its first line, after '# ')."""
    from megatron_estimator.core.resources import read_data_text

    first = read_data_text("frameworks", name).split("\n", 1)[0]
    return first.lstrip("# ").split(";")[0]


def patched_megatron_flags(name: str) -> tuple[str, dict[str, str]]:
    """A framework's patched-Megatron table (``Framework.patched_megatron``): its source (the
    first line) and flag -> the patches that add it."""
    from megatron_estimator.core.resources import read_data_text

    lines = read_data_text("frameworks", name).splitlines()
    rows = (line.split("\t") for line in lines[2:] if line.strip())
    return lines[0].lstrip("# ").split(";")[0], {flag: patches for flag, patches in rows}
