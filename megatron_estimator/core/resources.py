"""Where the project's data files are, installed or in a source checkout.

The JSON Schemas live in the repository's top-level ``schemas/`` folder and are installed as
the package data folder ``megatron_estimator/schemas`` (setup.cfg maps one onto the other).

Plain ``os.path`` strings: ``pathlib`` (with ``urllib`` and ``ipaddress`` behind it) is not
imported on the start-up path of every estimate; ``data_path`` gives a ``Path`` for callers
that want one.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache

_PACKAGE = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))


def schema_file(name: str) -> str:
    installed = os.path.join(_PACKAGE, "schemas", name)
    if os.path.isfile(installed):
        return installed
    return os.path.join(os.path.dirname(_PACKAGE), "schemas", name)


@lru_cache(maxsize=None)
def load_schema(name: str) -> dict:
    """A JSON Schema file of schemas/, read once per process."""
    with open(schema_file(name), encoding="utf-8") as f:
        return json.load(f)


@lru_cache(maxsize=None)
def schema_validator(name: str):
    """One jsonschema validator per schema file, built once per process."""
    import jsonschema

    schema = load_schema(name)
    return jsonschema.validators.validator_for(schema)(schema)


def data_file(*parts: str) -> str:
    return os.path.join(_PACKAGE, "data", *parts)


def read_data_text(*parts: str) -> str:
    with open(data_file(*parts), encoding="utf-8") as f:
        return f.read()


def schema_path(name: str):
    from pathlib import Path

    return Path(schema_file(name))


def data_path(*parts: str):
    from pathlib import Path

    return Path(data_file(*parts))


def path_string(path) -> str:
    """``str(pathlib.Path(path))`` without pathlib: "" is ".", repeated slashes, "." parts and
    trailing slashes go, a leading "//" (exactly two) stays, ".." stays.  The file checks on
    the start-up paths test this string with ``os.path``, so they answer as ``Path`` did
    (``Path("file.yaml/").exists()`` is True, ``os.path.exists("file.yaml/")`` is not)."""
    text = os.fspath(path)
    root = ""
    if text.startswith("/"):
        root = "//" if text.startswith("//") and not text.startswith("///") else "/"
    return (root + "/".join(part for part in text.split("/") if part and part != ".")) or "."


def path_suffix(path) -> str:
    """``pathlib.Path(path).suffix``: the last part's final ".xxx", "" when it has none or the
    part starts or ends with that dot."""
    name = path_string(path).rsplit("/", 1)[-1]
    if name in (".", ".."):
        return ""
    dot = name.rfind(".")
    return name[dot:] if 0 < dot < len(name) - 1 else ""


# -- bounded reads of the user's files --------------------------------------------------------
#
# Every file the user names (or that a launch leads to) is read through ``read_input``: it must
# be a regular file (or ``-``, standard input), opened without blocking (a FIFO never stalls
# the read), and is read up to a size cap per kind; past the cap the read stops and says so.
# README.md "Limits" states the caps; MEGATRON_ESTIMATOR_MAX_FILE_MB raises (or lowers) all.

_MIB = 1 << 20
FILE_CAPS = {                     # kind -> (what it is, in the message; bytes)
    "hf-config": ("HF config", 16 * _MIB),
    "vocab": ("vocabulary file", 48 * _MIB),      # the largest tokenizer.json known is about 33 MB
    "tokenizer": ("tokenizer file", 48 * _MIB),
    "yaml": ("YAML file", 16 * _MIB),
    "script": ("shell script", 1 * _MIB),       # the shell reader parses about 0.3 MiB a second
    "python": ("Python file", 4 * _MIB),
    "log": ("log", 64 * _MIB),
    "settings": ("settings file", 1 * _MIB),
    "metadata": ("package metadata file", 1 * _MIB),
}
CAP_VARIABLE = "MEGATRON_ESTIMATOR_MAX_FILE_MB"


class InputFileError(OSError):
    """A file that cannot be read within the limits: an ``OSError`` whose ``strerror`` is the
    sentence to print (so every ``except OSError`` reader reports it as it reports others)."""

    def __init__(self, message: str, code: str = "unreadable-file"):
        super().__init__(message)
        self.strerror = message
        self.code = code


def file_cap(kind: str) -> int:
    cap = FILE_CAPS[kind][1]
    given = os.environ.get(CAP_VARIABLE, "")
    if given.isdigit() and len(given) < 8 and int(given) > 0:
        cap = int(given) * _MIB
    return cap


def _describe_mode(mode: int) -> str:
    import stat

    for test, what in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return "not a regular file"


def special_file(path) -> str | None:
    """What ``path`` is when it exists and is neither a regular file nor a directory (a FIFO,
    a device, a socket), as ``read_input_bytes`` words its refusal; None otherwise."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return f"{_describe_mode(mode)}, not a regular file: give a file"


def shown_path(path) -> str:
    """A file name as a location: itself, or quoted (``": x"``, ``""``) when it is empty, holds
    ``": "`` or starts or ends with a space, so ``FILE: message`` still reads as one location."""
    name = os.fspath(path)
    name = os.fsdecode(name) if isinstance(name, bytes) else name
    if name and ": " not in name and name == name.strip():
        return name
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def path_trouble(path) -> str | None:
    """Why ``path`` cannot name a file at all (empty, a NUL byte, not encodable, too long), in
    words; None when it can.  The readers refuse such a path with this sentence (an
    ``InputFileError``), never with the ``ValueError`` the system call would raise."""
    name = os.fspath(path)
    if isinstance(name, str):
        try:
            name = os.fsencode(name)
        except UnicodeEncodeError:
            return "the path is not valid text for a file name (an unpaired surrogate): give a file"
    if not name:
        return "the path is empty: give a file"
    if b"\0" in name:
        return "the path holds a NUL byte, which no file name can: give a file"
    if len(name) > 4095 or any(len(part) > 255 for part in name.split(b"/")):
        return "the path is longer than a file name may be (4095 bytes, 255 a part): give a file"
    return None


def read_input_bytes(path, kind: str, *, head: int | None = None) -> bytes:
    """The bytes of ``path`` (``-``: standard input), at most the cap of ``kind``; ``head``:
    only the first ``head`` bytes, and no error for a longer file.  Raises ``InputFileError``
    (a regular file is required; over the cap) or ``OSError`` (not found, no permission)."""
    import stat

    cap = file_cap(kind)
    want = min(head, cap) if head is not None else cap + 1
    name = os.fspath(path)
    if isinstance(name, bytes):
        name = os.fsdecode(name)
    if name == "-":
        import sys

        data = sys.stdin.buffer.read(want)
    else:
        trouble = path_trouble(name)
        if trouble is not None:
            raise InputFileError(trouble, "bad-path")
        fd = os.open(name, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                raise InputFileError(f"{_describe_mode(mode)}, not a regular file: give a file", "not-a-file")
            chunks, left = [], want
            while left > 0:
                chunk = os.read(fd, min(left, 1 << 22))
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
            data = b"".join(chunks)
        finally:
            os.close(fd)
    if head is None and len(data) > cap:
        what, default = FILE_CAPS[kind]
        raise InputFileError(
            f"the {what} is larger than {cap // _MIB} MiB, the limit for it (set {CAP_VARIABLE} "
            f"to raise it; the default is {default // _MIB})", "file-too-large")
    return data


def read_input_text(path, kind: str, *, errors: str = "strict", head: int | None = None,
                    bom: bool = False) -> str:
    """``read_input_bytes`` decoded as UTF-8 with universal newlines, as ``open(path,
    encoding="utf-8")`` reads (``bom``: a leading byte-order mark dropped)."""
    data = read_input_bytes(path, kind, head=head)
    if bom and data[:3] == b"\xef\xbb\xbf":
        data = data[3:]
    text = data.decode("utf-8", errors=errors)
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text


# -- bounds met while parsing -----------------------------------------------------------------

def parse_bound_error(error: BaseException, text: str) -> tuple[int, str] | None:
    """(1-based line, sentence) when ``error`` from ``json.loads`` / ``tomllib.loads`` is one of
    the parsers' bounds, not a syntax error: nesting past Python's recursion limit, or an
    integer past its digit limit (``sys.get_int_max_str_digits``); None otherwise."""
    if isinstance(error, RecursionError):
        depth, deepest = 0, 0
        for index, char in enumerate(text):      # the first place the brackets nest past 100
            if char in "[{":
                depth += 1
                if depth > 100:
                    deepest = index
                    break
            elif char in "]}":
                depth -= 1
        return text.count("\n", 0, deepest) + 1, "values nest too deeply to read (arrays or tables inside one another)"
    message = str(error)
    if isinstance(error, ValueError) and "integer string conversion" in message:
        import re

        found = re.search(r"\d{4000,}", text)
        line = text.count("\n", 0, found.start()) + 1 if found else 1
        return line, f"an integer has too many digits to read ({message.split(';')[0].split(':')[-1].strip()})"
    return None
