"""Settings a team shares, and where each value came from.

Four sources, the first that gives a key wins:

1. the command line (values the CLI passes in; ``None`` means the flag was not given);
2. the environment, ``MEGATRON_ESTIMATOR_<KEY>`` with ``-`` written ``_``
   (``MEGATRON_ESTIMATOR_BUDGET=80GiB``, ``MEGATRON_ESTIMATOR_CUDA_CONTEXT=600MiB``); an empty
   variable counts as unset;
3. a config file: ``megatron-estimator.toml`` (keys at the top level) or the
   ``[tool.megatron-estimator]`` table of a ``pyproject.toml``, in the current directory or the
   nearest directory above it, stopping at the filesystem root or at the first directory that
   holds ``.git``.  Only the nearest file is read; files further up are not merged in.  When
   one directory has both, ``megatron-estimator.toml`` wins (a file of its own says more than a
   table in a shared one) and the notes say that the pyproject table was ignored.  A
   ``pyproject.toml`` without the table does not count, and the walk goes on past it;
4. the defaults in ``SETTINGS``.

Keys are spelled ``cuda-context`` everywhere (``cuda_context`` is accepted in files and from
the CLI).  Every given value is checked, including ones a higher source overrides, so a broken
team file is reported even on a run that overrides it.  A bad value is an ``invalid-setting``
problem at its source and the next source's value (or the default) is used in its place, so
the settings stay usable for reporting the problems.

``gpu`` sets the budget to that GPU's capacity when no budget is given, or when the budget
comes from a lower source than the GPU (``--gpu h200`` on the command line outweighs a
``budget`` in the team's file; a ``--budget`` beside it outweighs the GPU).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Iterable, Mapping

from megatron_estimator.core.hints import TOML, describe_value
from megatron_estimator.core.problems import InvalidInput, Problem
from megatron_estimator.core.resources import CAP_VARIABLE, parse_bound_error, read_input_text
from megatron_estimator.core.units import MiB, byte_size, format_bytes

ENV_PREFIX = "MEGATRON_ESTIMATOR_"
# Variables in our namespace that are not settings: the CLI's traceback switch.
DEBUG_ENV_VAR = ENV_PREFIX + "DEBUG"
PYPROJECT = "pyproject.toml"
OWN_FILE = "megatron-estimator.toml"
TOOL_TABLE = ("tool", "megatron-estimator")
TOOL_TABLE_NAME = "[tool.megatron-estimator]"

COMMAND_LINE = "command line"
ENVIRONMENT = "environment"
CONFIG_FILE = "config file"
DEFAULT = "default"
GPU_CAPACITY = "gpu"                       # the budget taken from the GPU's capacity
_RANK = {DEFAULT: 0, CONFIG_FILE: 1, ENVIRONMENT: 2, COMMAND_LINE: 3}

FORMATS = ("text", "json", "markdown")


# ---------------------------------------------------------------------------------------
# Parsers: raw value (str from the environment or the CLI, any TOML value from a file) to
# the typed value, or ValueError with a message for people.

def _budget(raw: Any) -> int:
    value = _bytes(raw)
    if value <= 0:
        raise ValueError("must be more than 0 bytes")
    return value


def _bytes(raw: Any) -> int:
    return byte_size(raw)


def _gpu(raw: Any) -> "GpuSpec":
    if not isinstance(raw, str):
        raise ValueError(f"must name a GPU, such as h100, not {describe_value(raw, TOML)}")
    try:
        from megatron_estimator.api import lookup_gpu

        return lookup_gpu(raw)
    except InvalidInput as error:
        raise ValueError(error.problems[0].message) from None


def _format(raw: Any) -> str:
    if isinstance(raw, str) and raw.strip().lower() in FORMATS:
        return raw.strip().lower()
    from megatron_estimator.core.hints import did_you_mean

    hint = did_you_mean(raw, FORMATS) if isinstance(raw, str) else ""
    raise ValueError(f"must be one of {', '.join(FORMATS)}, not {describe_value(raw, TOML)}{hint}")


def _fraction(raw: Any, upper: float | None) -> float:
    if isinstance(raw, bool):
        raise ValueError(f"must be a fraction such as 0.05 or 5%, not {describe_value(raw, TOML)}")
    if isinstance(raw, (int, float)):
        value = float(raw)
    elif isinstance(raw, str):
        text = raw.strip()
        scale = 1.0
        if text.endswith("%"):
            text, scale = text[:-1].strip(), 0.01
        try:
            value = float(text) * scale
        except ValueError:
            raise ValueError(f"must be a fraction such as 0.05 or 5%, not {describe_value(raw, TOML)}") from None
    else:
        raise ValueError(f"must be a fraction such as 0.05 or 5%, not {describe_value(raw, TOML)}")
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"must be a finite fraction, not {describe_value(raw, TOML)}")
    if value < 0:
        raise ValueError(f"cannot be negative ({describe_value(raw, TOML)})")
    if upper is not None and value > upper:
        raise ValueError(f"must be at most {upper:g} ({upper * 100:g}%), not {describe_value(raw, TOML)}; "
                         f"write 0.05 or 5% for five percent")
    return value


def _fragmentation(raw: Any) -> float:
    return _fraction(raw, upper=1.0)


def _routing_imbalance(raw: Any) -> float:
    return _fraction(raw, upper=None)


def _stack(raw: Any) -> dict:
    """``torch=2.8,flash-attn=none,te=2.x`` (inputs/job_stack.py ``parse_stack``)."""
    if not isinstance(raw, str):
        raise ValueError(f"must be NAME=VERSION,... (torch, transformer-engine, flash-attn), not "
                         f"{describe_value(raw, TOML)}")
    from megatron_estimator.core.stack import parse_stack

    return parse_stack(raw)


def _flash_attn(raw: Any) -> str:
    """``none`` (not installed) or a version such as ``2.7.4.post1``."""
    text = raw.strip().lower() if isinstance(raw, str) else None
    if text in ("none", "absent", "not-installed"):
        return "none"
    from megatron_estimator.api import flash_attn_version

    if text is not None and flash_attn_version(text) is not None:
        return text
    raise ValueError(f"must be a flash-attn version such as 2.7.4, or none, not {describe_value(raw, TOML)}")


def _megatron_version(raw: Any) -> str:
    """A Megatron-LM release: ``0.16``, ``0.16.1``, ``core_v0.18.0``, ``0.18.0rc0`` or ``main``."""
    from megatron_estimator.api import megatron_release_label

    if not isinstance(raw, str):
        raise ValueError(f"must be a Megatron version such as 0.16.1 or main, not {describe_value(raw, TOML)}")
    megatron_release_label(raw)      # ValueError naming the supported releases
    return raw.strip()


def _resume(raw: Any) -> str:
    """``auto`` (the --load directory says), ``yes`` or ``no``."""
    text = raw.strip().lower() if isinstance(raw, str) else raw
    if text is True or text in ("yes", "true", "1", "on"):
        return "yes"
    if text is False or text in ("no", "false", "0", "off"):
        return "no"
    if text == "auto":
        return "auto"
    raise ValueError(f"must be auto, yes or no, not {describe_value(raw, TOML)}")


def _accept_flags(raw: Any) -> tuple[str, ...]:
    """Option strings accepted as the entry script's own: a list (``["--a", "--b"]``), or a
    string of them separated by commas or spaces (``--a,--b``)."""
    items = raw if isinstance(raw, (list, tuple)) else [raw]
    flags: dict[str, None] = {}         # in order, each once (a dict: no quadratic list search)
    for item in items:
        if not isinstance(item, str):
            raise ValueError(f"must be option strings such as --model-provider, not {describe_value(item, TOML)}")
        for flag in item.replace(",", " ").split():
            if not flag.startswith("-") or flag in ("-", "--") or "=" in flag:
                raise ValueError(f"must be option strings such as --model-provider (no values), not {flag!r}")
            flags.setdefault(flag, None)
    return tuple(flags)


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _bool(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str):
        folded = raw.strip().lower()
        if folded in _TRUE:
            return True
        if folded in _FALSE:
            return False
    raise ValueError(f"must be true or false (or 1/0, yes/no, on/off), not {describe_value(raw, TOML)}")


# ---------------------------------------------------------------------------------------
# The table of settings: every key, its type, its default and what it means.  The defaults
# are stated assumptions (see shared notes/memory-mechanics.md "Outside the allocator"); they
# match memory/overhead.py's ``Overheads``.

@dataclass(frozen=True)
class SettingSpec:
    key: str
    kind: str
    default: Any
    parse: Callable[[Any], Any]
    help: str

    @property
    def env_var(self) -> str:
        return ENV_PREFIX + self.key.upper().replace("-", "_")

    @property
    def attribute(self) -> str:
        return self.key.replace("-", "_")


SETTINGS: tuple[SettingSpec, ...] = (
    SettingSpec(
        "budget", "bytes", None, _budget,
        "memory per GPU the run must fit in, e.g. 80GiB, 79.1GiB, 80GB (80e9) or 85520809984B; "
        "a bare number is GiB (default: the gpu's capacity)",
    ),
    SettingSpec(
        "gpu", "gpu", None, _gpu,
        "the GPU to fit on (h100, h200, b200, mi300x, ...); sets the budget to its capacity "
        "when no budget is given",
    ),
    SettingSpec("format", "choice", "text", _format, "report format: text, json or markdown"),
    SettingSpec(
        "cuda-context", "bytes", 512 * MiB, _bytes,
        "assumed per-GPU memory of the CUDA context and loaded kernel images, outside PyTorch's "
        "caching allocator (300-500 MB is typical, more with many kernels); the cuBLAS workspace "
        "is counted separately",
    ),
    SettingSpec(
        "nccl-buffers", "bytes", 512 * MiB, _bytes,
        "assumed NCCL buffer memory per communicator (process group) a rank uses, outside the "
        "allocator (roughly 0.5-0.7 GB each, more with many channels)",
    ),
    SettingSpec(
        "fragmentation", "fraction", 0.05, _fragmentation,
        "caching-allocator fragmentation as a fraction of allocated memory (0.05 = 5%; runs with "
        "VPP and recompute have shown far more)",
    ),
    SettingSpec(
        "routing-imbalance", "fraction", 0.0, _routing_imbalance,
        "MoE routing imbalance: the hottest expert-parallel rank receives (1 + this) times the "
        "average token count (0 = perfectly balanced)",
    ),
    SettingSpec(
        "flash-attn", "version", None, _flash_attn,
        "the flash-attn package in the job's software stack: a version (2.7.4) or none.  It "
        "matters for deterministic training before Hopper, where Transformer Engine runs "
        "flash-attn >= 2.4.1 or else unfused attention with its s^2 memory (default: for run, "
        "the version in the job's package metadata, none when its site-packages hold no flash-attn; "
        "elsewhere a version >= 2.4.1 is assumed)",
    ),
    SettingSpec(
        "stack", "stack", None, _stack,
        "estimate and check: the job's software stack where run cannot read it, NAME=VERSION,... "
        "(torch, transformer-engine or te, flash-attn; a version such as 2.8 or 2.x, or none), e.g. "
        "torch=2.8,flash-attn=none,te=2.x: the same facts run takes from the job's package metadata "
        "(a package not named stays assumed; the flash-attn setting wins for flash-attn)",
    ),
    SettingSpec(
        "megatron-version", "release", None, _megatron_version,
        "the job's Megatron-LM release (0.14 to 0.19, or main).  Given on the command line it "
        "wins; else the megatron/core/package_info.py of the launched Megatron-LM tree (or one on "
        "the job's PYTHONPATH); else this setting from the environment or a config file; else a "
        "NeMo container tag in the launch script; else (run only) the installed megatron-core; else "
        "main, the newest supported",
    ),
    SettingSpec(
        "resume", "choice", "auto", _resume,
        "whether the run resumes from a checkpoint: auto (its --load directory holds one: "
        "latest_checkpointed_iteration.txt), yes or no.  A resumed run with "
        "--ckpt-fully-parallel-load keeps the load's broadcast buffers into its first step",
    ),
    SettingSpec(
        "warn-only", "bool", False, _bool,
        "report an over-budget configuration but exit 0 (invalid input still fails)",
    ),
    SettingSpec(
        "accept-flags", "flags", (), _accept_flags,
        "flags unknown to Megatron that the launch's entry script adds itself (its extra_args_provider), "
        "accepted when the script cannot be read: a list such as [\"--model-provider\", \"--image-size\"]; "
        "each takes the values that follow it up to the next flag",
    ),
)

_SPECS: dict[str, SettingSpec] = {spec.key: spec for spec in SETTINGS}
_ENV_VARS: dict[str, SettingSpec] = {spec.env_var: spec for spec in SETTINGS}


def setting_keys() -> tuple[str, ...]:
    return tuple(_SPECS)


def _spec(key: str) -> SettingSpec:
    spec = _SPECS.get(key.replace("_", "-"))
    if spec is None:
        raise KeyError(f"no setting {key!r} (settings: {', '.join(_SPECS)})")
    return spec


def show_value(key: str, value: Any) -> str:
    """A setting's value as a report shows it: ``80.00 GiB``, ``5%``, ``h100-sxm-80gb``, ``none``."""
    spec = _spec(key)
    if value is None and spec.kind == "version":
        return ">= 2.4.1 (assumed)"
    if value is None and spec.kind == "release":
        return "detected, else main"
    if value is None and spec.kind == "stack":
        return "not stated"
    if value is None:
        return "none"
    if spec.kind == "bytes":
        return format_bytes(value)
    if spec.kind == "gpu":
        return value.name
    if spec.kind == "fraction":
        return f"{value:g} ({value * 100:g}%)"
    if spec.kind == "bool":
        return "true" if value else "false"
    if spec.kind == "flags":
        return ", ".join(value) if value else "none"
    if spec.kind == "stack":
        return ",".join(f"{name}={version}" for name, version in value.items())
    return str(value)


def settings_help() -> tuple[tuple[str, str, str, str], ...]:
    """``(key, environment variable, default as shown, help)`` for every setting."""
    return tuple((s.key, s.env_var, show_value(s.key, s.default), s.help) for s in SETTINGS)


# ---------------------------------------------------------------------------------------
# Resolved settings

@dataclass(frozen=True)
class SettingEntry:
    key: str
    value: Any
    # "command line --budget", "MEGATRON_ESTIMATOR_BUDGET", "repo/megatron-estimator.toml:3 budget",
    # "repo/pyproject.toml:7 [tool.megatron-estimator] budget", "default"
    source: str
    origin: str                  # COMMAND_LINE | ENVIRONMENT | CONFIG_FILE | DEFAULT | GPU_CAPACITY

    @property
    def given(self) -> bool:
        return self.origin != DEFAULT


@dataclass(frozen=True)
class Settings:
    budget: int | None
    gpu: GpuSpec | None            # megatron.gpus.GpuSpec, looked up through api.lookup_gpu
    format: str
    cuda_context: int
    nccl_buffers: int
    fragmentation: float
    routing_imbalance: float
    flash_attn: str | None
    stack: dict | None
    megatron_version: str | None
    resume: str
    warn_only: bool
    accept_flags: tuple[str, ...]
    entries: Mapping[str, SettingEntry] = field(hash=False, repr=False)
    config_file: str | None = None           # the file read, if any
    notes: tuple[str, ...] = ()              # facts worth reporting that are not problems

    def entry(self, key: str) -> SettingEntry:
        return self.entries[_spec(key).key]

    def source(self, key: str) -> str:
        """Where a value came from, for reports: ``command line --budget``, ``default``, ..."""
        return self.entry(key).source

    def rows(self) -> tuple[tuple[str, str, str], ...]:
        """``(key, value as shown, source)`` for every setting, in table order."""
        return tuple((key, show_value(key, e.value), e.source) for key, e in self.entries.items())


def _settings(entries: dict[str, SettingEntry], config_file: str | None, notes: Iterable[str]) -> Settings:
    values = {_SPECS[key].attribute: entry.value for key, entry in entries.items()}
    return Settings(**values, entries=MappingProxyType(dict(entries)), config_file=config_file,
                    notes=tuple(notes))


def default_settings() -> Settings:
    """Every setting at its default."""
    return _settings({s.key: SettingEntry(s.key, s.default, DEFAULT, DEFAULT) for s in SETTINGS}, None, ())


# ---------------------------------------------------------------------------------------
# Config files

@dataclass(frozen=True)
class ConfigFile:
    path: str
    in_pyproject: bool                        # True: the [tool.megatron-estimator] table of a pyproject.toml
    table: Mapping[str, Any]                  # the settings table as TOML read it
    key_lines: Mapping[str, int]              # key as written -> line number, where found

    def location(self, key: str) -> str:
        line = self.key_lines.get(key)
        where = f"{self.path}:{line}" if line is not None else self.path
        return f"{where} {TOOL_TABLE_NAME} {key}" if self.in_pyproject else f"{where} {key}"


def _read_text(path: str, problems: list[Problem]) -> str | None:
    try:
        return read_input_text(path, "settings")
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else error
        problems.append(Problem("unreadable-config", path, f"cannot read the file: {reason}"))
        return None


def _load_toml(text: str, path: str, problems: list[Problem]) -> dict | None:
    try:
        import tomllib
    except ModuleNotFoundError:                # Python 3.10
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            problems.append(Problem("toml-unavailable", path,
                                    f"reading {path} needs the tomli package on Python < 3.11 "
                                    f"(pip install tomli)"))
            return None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        problems.append(_toml_problem(str(error), path))
        return None
    except (RecursionError, ValueError) as error:      # a parser bound: nesting, integer digits
        bound = parse_bound_error(error, text)
        if bound is None:
            raise
        problems.append(Problem("toml-syntax", f"{path}:{bound[0]}", f"cannot read: {bound[1]}"))
        return None


def _toml_problem(message: str, path: str) -> Problem:
    """``Expected '=' ... (at line 3, column 9)`` -> a ``toml-syntax`` problem at ``path:3``."""
    import re

    found = re.search(r"\s*\(at line (\d+), column (\d+)\)\s*$", message)
    if found is None:
        found_eof = re.search(r"\s*\(at end of document\)\s*$", message)
        if found_eof is not None:
            return Problem("toml-syntax", path, message[: found_eof.start()] + " (at the end of the file)")
        return Problem("toml-syntax", path, message)
    line, column = found.groups()
    return Problem("toml-syntax", f"{path}:{line}", f"{message[: found.start()]} (column {column})")


def _key_path(text: str) -> tuple[str, ...]:
    """``tool."megatron-estimator"`` -> ``("tool", "megatron-estimator")``."""
    parts = []
    for part in text.split("."):
        part = part.strip()
        if len(part) >= 2 and part[0] == part[-1] and part[0] in "\"'":
            part = part[1:-1]
        parts.append(part)
    return tuple(parts)


def _key_lines(text: str, table: tuple[str, ...]) -> dict[str, int]:
    """Line numbers of the keys set directly in ``table`` (``()``: the top level).

    tomllib keeps no positions, so this scans the lines: table headers, ``key =`` lines and
    dotted keys (``megatron-estimator.budget = ...`` under ``[tool]``), skipping the insides of
    multi-line strings.  Good enough to point at a line; the values come from tomllib.
    """
    lines: dict[str, int] = {}
    current: tuple[str, ...] = ()
    in_string: str | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if in_string is not None:
            if stripped.count(in_string) % 2 == 1:
                in_string = None
            continue
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.startswith("["):
            header = stripped.split("#", 1)[0].strip()
            if header.startswith("[[") and header.endswith("]]"):
                current = ("[[", ) + _key_path(header[2:-2])     # array of tables: never ours
            elif header.endswith("]"):
                current = _key_path(header[1:-1])
            continue
        if "=" in stripped:
            key_text, value_text = stripped.split("=", 1)
            path = current + _key_path(key_text)
            if len(path) == len(table) + 1 and path[: len(table)] == table:
                lines.setdefault(path[-1], number)
            for quote in ('"""', "'''"):
                if value_text.count(quote) % 2 == 1:
                    in_string = quote
                    break
    return lines


def find_config_file(cwd: str, problems: list[Problem] | None = None,
                     notes: list[str] | None = None) -> ConfigFile | None:
    """The config file for ``cwd``: the nearest ``megatron-estimator.toml`` or pyproject table.

    Problems reading or parsing a candidate go into ``problems``; a pyproject table ignored
    beside a ``megatron-estimator.toml`` is said in ``notes``.
    """
    problems = [] if problems is None else problems
    notes = [] if notes is None else notes
    directory = os.path.abspath(cwd)
    while True:
        own = os.path.join(directory, OWN_FILE)
        pyproject = os.path.join(directory, PYPROJECT)
        found = None
        if os.path.isfile(own):
            text = _read_text(own, problems)
            data = None if text is None else _load_toml(text, own, problems)
            if data is not None:
                found = ConfigFile(own, False, data, _key_lines(text, ()))
            else:                                  # unreadable or broken: reported, nothing read
                found = ConfigFile(own, False, {}, {})
        if os.path.isfile(pyproject):
            # beside a megatron-estimator.toml the pyproject is not read: its problems are not ours
            table = _pyproject_table(pyproject, problems if found is None else [])
            if table is not None:
                if found is not None:
                    notes.append(f"{pyproject} {TOOL_TABLE_NAME} is ignored: {own} in the same "
                                 f"directory takes precedence")
                else:
                    found = table
        if found is not None:
            return found
        if os.path.exists(os.path.join(directory, ".git")):
            return None
        parent = os.path.dirname(directory)
        if parent == directory:
            return None
        directory = parent


def _pyproject_table(path: str, problems: list[Problem]) -> ConfigFile | None:
    """The ``[tool.megatron-estimator]`` table of a pyproject.toml, or None when it has none."""
    text = _read_text(path, problems)
    if text is None or "megatron-estimator" not in text and "megatron_estimator" not in text:
        return None                            # not ours: not even parsed (nor tomllib imported)
    data = _load_toml(text, path, problems)
    if data is None:
        return ConfigFile(path, True, {}, {})  # broken: reported, nothing read
    tool = data.get("tool")
    if not isinstance(tool, dict) or "megatron-estimator" not in tool:
        return None
    table = tool["megatron-estimator"]
    if not isinstance(table, dict):
        problems.append(Problem("invalid-setting", path,
                                f"{TOOL_TABLE_NAME} must be a table of settings, not {describe_value(table, TOML)}"))
        return ConfigFile(path, True, {}, {})
    return ConfigFile(path, True, table, _key_lines(text, TOOL_TABLE))


# ---------------------------------------------------------------------------------------
# Loading

# A value as a source gave it: (key, raw value, location, origin).
_Given = tuple


def _from_cli(cli_values: Mapping[str, Any]) -> list[_Given]:
    given = []
    for name, raw in cli_values.items():
        key = name.replace("_", "-")
        if key not in _SPECS:
            raise KeyError(f"the CLI passed an unknown setting {name!r} (settings: {', '.join(_SPECS)})")
        if raw is not None:
            given.append((key, raw, f"{COMMAND_LINE} --{key}", COMMAND_LINE))
    return given


def _from_environment(environ: Mapping[str, str], problems: list[Problem]) -> list[_Given]:
    given = []
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX) or name in (DEBUG_ENV_VAR, CAP_VARIABLE):   # not settings
            continue
        spec = _ENV_VARS.get(name)
        if spec is None:
            from megatron_estimator.core.hints import did_you_mean

            problems.append(Problem(
                "unknown-setting", name,
                f"{name} is not a setting{did_you_mean(name, _ENV_VARS)} "
                f"(settings: {', '.join(_ENV_VARS)})",
            ))
            continue
        raw = environ[name]
        if raw.strip():
            given.append((spec.key, raw, name, ENVIRONMENT))
    return given


def _from_file(config: ConfigFile, problems: list[Problem]) -> list[_Given]:
    given: dict[str, _Given] = {}
    spellings: dict[str, str] = {}
    for written, raw in config.table.items():
        key = written.replace("_", "-")
        location = config.location(written)
        if key not in _SPECS:
            from megatron_estimator.core.hints import did_you_mean

            problems.append(Problem(
                "unknown-setting", location,
                f"{written!r} is not a setting{did_you_mean(key, _SPECS)} (settings: {', '.join(_SPECS)})",
            ))
            continue
        if key in spellings:
            problems.append(Problem(
                "duplicate-setting", location,
                f"{written} and {spellings[key]} are the same setting ({given[key][2]}); keep one",
            ))
            continue
        spellings[key] = written
        given[key] = (key, raw, location, CONFIG_FILE)
    return list(given.values())


def load_settings(cli_values: Mapping[str, Any], environ: Mapping[str, str] | None = None,
                  cwd: str | os.PathLike | None = None) -> tuple[Settings, tuple[Problem, ...]]:
    """The settings in force, each with its source, and every problem found in any source.

    ``cli_values`` maps setting keys (``budget`` or ``cuda_context`` style) to what the command
    line gave, ``None`` for flags not given.  ``environ`` defaults to ``os.environ`` and
    ``cwd`` to the current directory.
    """
    environ = os.environ if environ is None else environ
    cwd = os.getcwd() if cwd is None else os.fspath(cwd)
    problems: list[Problem] = []
    notes: list[str] = []

    given = _from_cli(cli_values)
    given += _from_environment(environ, problems)
    config = find_config_file(cwd, problems, notes)
    if config is not None:
        given += _from_file(config, problems)

    chosen: dict[str, SettingEntry] = {}
    for key, raw, location, origin in given:  # in precedence order: the first valid value wins
        try:
            value = _SPECS[key].parse(raw)
        except ValueError as error:
            problems.append(Problem("invalid-setting", location, str(error)))   # the location names the key
            continue
        chosen.setdefault(key, SettingEntry(key, value, location, origin))

    entries = {}
    for spec in SETTINGS:
        entries[spec.key] = chosen.get(spec.key) or SettingEntry(spec.key, spec.default, DEFAULT, DEFAULT)
    _budget_from_gpu(entries, notes)
    return _settings(entries, config.path if config is not None else None, notes), tuple(problems)


def _budget_from_gpu(entries: dict[str, SettingEntry], notes: list[str]) -> None:
    gpu, budget = entries["gpu"], entries["budget"]
    if gpu.value is None:
        return
    spec: GpuSpec = gpu.value
    if budget.given and _RANK[budget.origin] >= _RANK[gpu.origin]:
        notes.append(f"budget {format_bytes(budget.value)} from {budget.source} is used instead of "
                     f"the {spec.name} capacity {format_bytes(spec.total_memory_bytes)} ({gpu.source})")
        return
    if budget.given:
        notes.append(f"the {spec.name} capacity from {gpu.source} replaces budget "
                     f"{format_bytes(budget.value)} from {budget.source}")
    entries["budget"] = SettingEntry(
        "budget", spec.total_memory_bytes,
        f"{spec.name} capacity ({spec.memory_figure}; gpu from {gpu.source})", GPU_CAPACITY,
    )
