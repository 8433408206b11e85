"""A Megatron-LM training log read back into the settings it ran with and the memory it used.

Three kinds of line are read; everything else in the log is passed over.

- The arguments block that rank 0 prints at start-up (megatron/training/arguments.py
  ``_print_args``): a header ``------------------------ arguments ------------------------``,
  then one line per namespace attribute, ``'  {} {} {}'.format(name, '.' * (48 - len(name)),
  value)`` sorted case-insensitively (a name of 48 characters or more has no dots), then
  ``-------------------- end of arguments ---------------------``.  Values are Python
  ``str()``: ``None``, ``True``, numbers, lists, ``torch.bfloat16``, enum members
  (``AttnBackend.auto``; ``signal.Signals`` prints its number on Python >= 3.11).  Each
  attribute that is a flag's dest becomes a ``RawSetting`` located ``train.log:LINE name``;
  values equal to the flag's default are left out (as if not given).  Attributes that are no
  flag (``world_size``, ``data_parallel_size``, ``params_dtype``, ...) are Megatron's derived
  values: ``world_size`` gives the world size, the rest are ignored.
- ``report_memory`` lines (megatron/training/utils.py): ``[Rank N] (after K iterations) memory
  (MB) | allocated: A | max allocated: B | reserved: C | max reserved: D``, optionally
  ``| total device memory used: E`` (``--log-device-memory-used``); each figure is MiB
  (``/ (1024 * 1024)``) with two decimals.  Only data-parallel rank 0 of each model-parallel
  group prints one.  The name says when: ``(after K iterations)`` (training.py
  ``training_log``, K optimizer steps done), ``(before|after save_checkpoint for iteration K)``
  (training.py ``save_checkpoint_and_time``); ``MemoryReport.iteration`` is K.
- checkpointing.py ``load_checkpoint``'s ``  successfully loaded checkpoint from DIR [ t 1/2,
  p 1/1 ] at iteration N``: the iteration training resumes after (``MegatronLog.loaded_iteration``).
- PyTorch's CUDA out-of-memory message (c10/cuda/CUDACachingAllocator.cpp ``malloc``):
  ``CUDA out of memory. Tried to allocate X. GPU D has a total capacity of T of which F is
  free. [Process P has M memory in use. ]*[Including non-PyTorch memory, this process has M
  memory in use. ][L allowed; ]Of the allocated memory A is allocated by PyTorch, [with G
  allocated in private pools (e.g., CUDA Graphs), ]and U is reserved by PyTorch but
  unallocated.``  Sizes are c10's ``format_size``: ``N bytes`` up to 1024, else two decimals
  of KiB, MiB or GiB.

Lines may carry a launcher's prefix: torchrun's ``[default0]:`` (``[{role}{local_rank}]:``,
torch/distributed/elastic/multiprocessing/tail_log.py) or srun ``--label``'s ``0: `` (the
global task id).  Lines of several ranks may be interleaved; the arguments block is taken
from the stream (prefix) that printed its header.  A log cut short is read as far as it goes.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from megatron_estimator.core.problems import Problem, ProblemCollector
from megatron_estimator.core.resources import read_input_text, shown_path
from megatron_estimator.core.units import GiB, KiB, MiB
from megatron_estimator.inputs.rawargs import RawArgs, RawSetting

HEADER = re.compile(r"-{24} arguments -{24}\s*$")
END = re.compile(r"-{20} end of arguments -{21}\s*$")
# '  {name} {dots} {value}': the dots are empty for a name of 48 characters or more.
ARGUMENT = re.compile(r"  (?P<name>[A-Za-z_]\w*) (?P<dots>\.*) ?(?P<value>.*)\Z")
_MIB_FIGURE = r"(-?\d{1,15}(?:\.\d{1,15})?)"   # bounded: a longer figure is no report's
MEMORY = re.compile(
    r"\[Rank (?P<rank>\d{1,9})\] (?P<name>.{0,200}?) ?memory \(MB\)"   # bounded name: linear on any line
    rf" \| allocated: {_MIB_FIGURE} \| max allocated: {_MIB_FIGURE}"
    rf" \| reserved: {_MIB_FIGURE} \| max reserved: {_MIB_FIGURE}"
    rf"(?: \| total device memory used: {_MIB_FIGURE})?")
# The iteration a report_memory name was printed at: "(after K iterations)",
# "(before save_checkpoint for iteration K)".
REPORT_ITERATION = re.compile(r"after (\d{1,12}) iterations|for iteration (\d{1,12})")
LOADED = re.compile(r"successfully loaded checkpoint from .* at iteration (?P<iteration>\d{1,12})")
_SIZE = r"\d{1,20}(?:\.\d{1,15})? (?:bytes|KiB|MiB|GiB)"
OOM = re.compile(
    rf"CUDA out of memory\. Tried to allocate (?P<requested>{_SIZE})\. GPU (?P<device>\d{{1,9}}) has a total "
    rf"capacity of (?P<total>{_SIZE}) of which (?P<free>{_SIZE}) is free\. "
    rf"(?:Process \d+ has {_SIZE} memory in use\. )*"
    rf"(?:Including non-PyTorch memory, this process has (?P<process>{_SIZE}) memory in use\. )?"
    rf"(?:(?P<allowed>{_SIZE}) allowed; )?"
    rf"Of the allocated memory (?P<allocated>{_SIZE}) is allocated by PyTorch, "
    rf"(?:with (?P<private>{_SIZE}) allocated in private pools \(e\.g\., CUDA Graphs\), )?"
    rf"and (?P<unallocated>{_SIZE}) is reserved by PyTorch but unallocated\.")
# ranks of at most 9 digits (a longer number is no rank, and past 4,300 digits int() refuses it)
TORCHRUN_PREFIX = re.compile(r"\[(?P<role>[A-Za-z_][\w-]*?)(?P<rank>\d{1,9})\]:")
SRUN_PREFIX = re.compile(r"(?P<rank>\d{1,9}): ")
_UNITS = {"bytes": 1, "KiB": KiB, "MiB": MiB, "GiB": GiB}
# arguments.py validate_args dtype_map: the optimizer/grad dtype flags become torch dtypes.
_DTYPE_CHOICE = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16",
                 "torch.uint8": "fp8"}
_ENUM_REPR = re.compile(r"<\w+\.(\w+): [^>]*>")


@dataclass(frozen=True)
class MemoryReport:
    """One ``report_memory`` line: the rank's allocator figures, in bytes (from MiB, 2 decimals)."""
    rank: int
    name: str                  # "(after 2 iterations)"
    allocated: int
    max_allocated: int
    reserved: int
    max_reserved: int
    device_used: int | None    # total device memory used (--log-device-memory-used)
    location: str

    @property
    def iteration(self) -> int | None:
        """The optimizer steps done when the line was printed; None for a name that says none."""
        match = REPORT_ITERATION.search(self.name)
        return None if match is None else int(match.group(1) or match.group(2))


@dataclass(frozen=True)
class OutOfMemory:
    """PyTorch's CUDA out-of-memory message; rank None when the line names none."""
    rank: int | None
    rank_source: str
    device: int
    requested: int
    total_capacity: int
    free: int
    process_in_use: int | None   # "this process has ... memory in use" (PyTorch and the rest)
    allocated: int               # allocated by PyTorch (private pools included)
    reserved_unallocated: int
    location: str

    @property
    def reserved(self) -> int:
        return self.allocated + self.reserved_unallocated


@dataclass(frozen=True)
class MegatronLog:
    raw: RawArgs
    problems: tuple[Problem, ...]
    world_size: int | None = None
    world_size_location: str | None = None
    memory: tuple[MemoryReport, ...] = ()
    out_of_memory: tuple[OutOfMemory, ...] = ()
    notes: tuple[str, ...] = ()
    derived: dict[str, str] = field(default_factory=dict)   # namespace-only attributes, as printed
    loaded_iteration: int | None = None       # "successfully loaded checkpoint ... at iteration N"
    loaded_location: str | None = None


def size_bytes(text: str) -> int:
    """c10 ``format_size`` text (``1.50 GiB``, ``512 bytes``) back to bytes (nearest byte)."""
    number, unit = text.split(" ")
    return round(float(number) * _UNITS[unit])


def mib_bytes(text: str) -> int:
    """A ``report_memory`` figure (MiB, two decimals) back to bytes (nearest byte)."""
    return round(float(text) * MiB)


def _split_prefix(line: str) -> tuple[str | None, int | None, str]:
    """(stream key, rank, text) of a log line; the key is None for a line without a prefix."""
    match = TORCHRUN_PREFIX.match(line)
    if match:
        return match.group(0), int(match.group("rank")), line[match.end():]
    match = SRUN_PREFIX.match(line)
    if match:
        return match.group(0), int(match.group("rank")), line[match.end():]
    return None, None, line


def read_megatron_log(path: str | Path, release: str = "main") -> MegatronLog:
    """The log at ``path`` (``parse_megatron_log``), its arguments read by release ``release``'s flags."""
    name = shown_path(path)
    try:
        text = read_input_text(path, "log", errors="replace")
    except OSError as err:
        return MegatronLog(RawArgs(source=name), (Problem("unreadable-file", name, err.strerror or str(err)),))
    return parse_megatron_log(text, name, release)


def parse_megatron_log(text: str, name: str = "log", release: str = "main") -> MegatronLog:
    lines = text.split("\n")
    ends_cut = not text.endswith("\n")
    block: list[tuple[int, str]] = []
    block_stream: str | None = None
    in_block = block_done = False
    header_line = end_line = None
    memory: list[MemoryReport] = []
    ooms: list[OutOfMemory] = []
    offsets: dict[str, int] = {}     # torchrun stream -> global rank minus local rank
    torchrun_ooms: list[tuple[str, int, dict, str]] = []
    loaded: tuple[int, str] | None = None
    for number, line in enumerate(lines, start=1):
        line = line.rstrip("\r")
        stream, prefix_rank, body = _split_prefix(line)
        if in_block and stream == block_stream:   # another rank's lines in between are read below
            if END.match(body):
                in_block, block_done, end_line = False, True, number
                continue
            if HEADER.match(body):
                block, header_line = [], number   # printed again: the later block wins
                continue
            if body.strip():
                block.append((number, body))
            continue
        if not block_done and HEADER.match(body):
            in_block, block_stream, header_line, block = True, stream, number, []
            continue
        where = f"{name}:{number}"
        match = MEMORY.search(body)
        if match:
            figures = [mib_bytes(g) if g is not None else None for g in match.groups()[2:]]
            rank = int(match.group("rank"))
            memory.append(MemoryReport(rank, match.group("name"), figures[0], figures[1], figures[2],
                                       figures[3], figures[4], where))
            if stream is not None and stream.startswith("["):
                offsets.setdefault(stream, rank - prefix_rank)
            continue
        if loaded is None and "successfully loaded checkpoint" in body:
            match = LOADED.search(body)
            if match:
                loaded = int(match.group("iteration")), where
                continue
        match = OOM.search(body)
        if match:
            if stream is not None and stream.startswith("["):
                torchrun_ooms.append((stream, prefix_rank, match.groupdict(), where))
            else:
                source = "srun --label prefix" if stream is not None else "no rank prefix"
                ooms.append(_oom(match.groupdict(), prefix_rank, source, where))
    for stream, local, groups, where in torchrun_ooms:
        if stream in offsets:
            ooms.append(_oom(groups, local + offsets[stream], f"torchrun prefix {stream} local rank "
                             f"{local}, plus the node's offset its [Rank N] lines give", where))
        else:
            ooms.append(_oom(groups, local, f"torchrun prefix {stream} gives the local rank, read as the "
                             "global rank (the log of the first node)", where))
    load = {} if loaded is None else {"loaded_iteration": loaded[0], "loaded_location": loaded[1]}
    if header_line is None:
        return MegatronLog(RawArgs(source=name), (Problem(
            "no-arguments-block", name,
            "no Megatron arguments block in the log (the '------------------------ arguments "
            "------------------------' lines rank 0 prints at start-up); the configuration cannot "
            "be rebuilt from it"),), memory=tuple(memory), out_of_memory=tuple(ooms), **load)
    notes: list[str] = []
    if end_line is None:
        notes.append(f"{name}:{header_line}: the arguments block has no end line (a truncated log): "
                     f"read the {len(block)} lines it has")
        if ends_cut and block and block[-1][0] == len(lines):
            dropped = block.pop()
            notes.append(f"{name}:{dropped[0]}: its last line is cut off mid-line and is not read")
    cut_after = None if end_line is not None else (block[-1][0] if block else header_line)
    return replace(_settings(block, name, tuple(memory), tuple(ooms), notes, cut_after, release), **load)


def _oom(groups: dict, rank: int | None, source: str, where: str) -> OutOfMemory:
    return OutOfMemory(
        rank=rank, rank_source=source, device=int(groups["device"]),
        requested=size_bytes(groups["requested"]), total_capacity=size_bytes(groups["total"]),
        free=size_bytes(groups["free"]),
        process_in_use=size_bytes(groups["process"]) if groups.get("process") else None,
        allocated=size_bytes(groups["allocated"]),
        reserved_unallocated=size_bytes(groups["unallocated"]),
        location=where)


def _settings(block: list[tuple[int, str]], name: str, memory, ooms, notes: list[str],
              cut_after: int | None, release: str) -> MegatronLog:
    from megatron_estimator.megatron.flags import flag_table

    table = flag_table(release)
    problems = ProblemCollector()
    settings: dict[str, RawSetting] = {}
    derived: dict[str, str] = {}
    world_size = world_location = None
    for number, body in block:
        match = ARGUMENT.match(body)
        where = f"{name}:{number}"
        if match is None:
            if body.strip():
                problems.add("unreadable-argument", where,
                             f"not an arguments line ('  name ..... value'): {body.strip()[:80]!r}")
            continue
        dest, value_text = match.group("name"), match.group("value")
        location = f"{where} {dest}"
        spec = table.by_dest(dest)
        if spec is None:
            derived[dest] = value_text
            if dest == "world_size":
                try:
                    world_size, world_location = int(value_text), location
                except ValueError:
                    problems.add("invalid-value", location, f"world_size {value_text!r} is not an integer")
            continue
        try:
            value = namespace_value(spec, value_text)
        except ValueError as err:
            problems.add("invalid-value", location, f"{dest} = {value_text!r}: {err}")
            continue
        if value is None or value == spec.default or value == [spec.default]:
            continue   # as if not given (validate_args turns some scalars into one-item lists)
        settings[dest] = RawSetting(dest, value, location)
    if derived:
        shown = ", ".join(sorted(d for d in derived if d != "world_size")[:6])
        notes.append(f"{len(derived)} namespace entries are not flags (Megatron's derived values, or "
                     f"flags of another Megatron version): {shown}{', ...' if len(derived) > 7 else ''}; "
                     "world_size gives the world size, the rest are not read")
    # A setting not in the block is named in the log's terms; in a block cut short, say where it ends.
    cut = "" if cut_after is None else f" (the truncated arguments block ends at line {cut_after})"
    raw = RawArgs(settings, source=name, absent=lambda dest: f"{name} {dest}{cut}")
    return MegatronLog(raw, problems.problems, world_size, world_location, memory, ooms, tuple(notes), derived)


def namespace_value(spec, text: str) -> Any:
    """A value as ``str()`` printed it in the arguments block, as the flag's value.

    ValueError with the reason when it is not one the flag can hold."""
    from megatron_estimator.megatron.flags import ENUM_TYPES, FLAG_ACTIONS, convert_value

    if text == "None":
        return None
    if spec.action in FLAG_ACTIONS or spec.type == "bool":
        if text in ("True", "False"):
            return text == "True"
        raise ValueError("expected True or False")
    if text in _DTYPE_CHOICE and spec.choices is not None:
        text = _DTYPE_CHOICE[text]
    multiple = spec.nargs in ("+", "*") or isinstance(spec.nargs, int)
    if spec.type in ENUM_TYPES:
        return _enum_member(spec, text)
    if multiple or spec.type in ("moe_freq_type", "la_freq_type", "no_rope_freq_type", "tuple_type"):
        if text.startswith(("[", "(")):
            items = _ENUM_REPR.findall(text)
            if items:
                value: Any = items
            else:
                try:
                    value = ast.literal_eval(text)
                except (ValueError, SyntaxError):
                    raise ValueError("not a Python list as str() prints one") from None
            if spec.type == "tuple_type":
                return tuple(value)
            if isinstance(value, tuple):
                value = list(value)
            if spec.choices is not None:
                for item in value:
                    if item not in spec.choices:
                        raise ValueError(f"{item!r} is not one of {', '.join(map(str, spec.choices))}")
            return value
        if multiple:
            return [convert_value(spec, text)] if spec.type is not None else [text]
    try:
        return convert_value(spec, text)
    except ValueError as err:
        raise ValueError(str(err) if str(err) else "not a value of this flag") from None


def _enum_member(spec, text: str) -> str:
    member = text.rsplit(".", 1)[-1]
    if spec.type == "signal.Signals" and member.lstrip("-").isdigit():
        import signal

        try:
            member = signal.Signals(int(member)).name   # IntEnum str() is its number from Python 3.11
        except ValueError:
            raise ValueError(f"signal {member} is not known") from None
    if spec.choices is not None and member not in spec.choices:
        raise ValueError(f"{member!r} is not one of {', '.join(map(str, spec.choices))}")
    return member
