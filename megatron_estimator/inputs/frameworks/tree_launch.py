"""What the launches of tree-configured frameworks (verl, NeMo-RL) share: the facts read from
their entry program's source (``ast``, never run), the located words of a launch, and a
``TreeReading`` (``inputs/trees``) as the ``ArgvRead`` the launch reader takes."""

from __future__ import annotations

import ast
import re
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    from typing import Sequence

from megatron_estimator.core.problems import Problem
from megatron_estimator.core.resources import read_input_text
from megatron_estimator.inputs.frameworks.adapter import ArgvRead
from megatron_estimator.inputs.rawargs import RawArgs


def _tree(path: str | None) -> ast.AST | None:
    if path is None:
        return None
    try:
        return ast.parse(read_input_text(path, "python", errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return None


def _text(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def hydra_main(path: str | None) -> tuple[str | None, str | None] | None:
    """(config_path, config_name) of the ``@hydra.main(...)`` decorator in the program ``path``,
    or None when it is not readable or has none."""
    for node in ast.walk(_tree(path) or ast.Module(body=[], type_ignores=[])):
        if isinstance(node, ast.Call) and (isinstance(node.func, ast.Attribute) and node.func.attr == "main"
                                           and isinstance(node.func.value, ast.Name) and node.func.value.id == "hydra"):
            words = {k.arg: _text(k.value) for k in node.keywords if k.arg}
            return words.get("config_path"), words.get("config_name")
    return None


def _is_file_dir(node: ast.AST) -> bool:
    """``os.path.dirname(__file__)`` (or ``dirname(__file__)``)."""
    if not isinstance(node, ast.Call) or len(node.args) != 1:
        return False
    name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
    return name == "dirname" and isinstance(node.args[0], ast.Name) and node.args[0].id == "__file__"


def file_relative_default(path: str | None) -> tuple[str, ...] | None:
    """The parts of the first ``os.path.join(os.path.dirname(__file__), "a", "b.yaml")`` in the
    program ``path`` whose last part is a YAML file (NeMo-RL's default ``--config``), or None."""
    for node in ast.walk(_tree(path) or ast.Module(body=[], type_ignores=[])):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join" \
                and node.args and _is_file_dir(node.args[0]):
            parts = tuple(_text(a) for a in node.args[1:])
            if parts and None not in parts and parts[-1].endswith((".yaml", ".yml")):
                return parts
    return None


def word_at(argv: Sequence[str], locations: Sequence[str] | None, index: int) -> str:
    """Where the launch gives its word ``index`` (``file:line``), or the word itself."""
    if locations is not None and index < len(locations):
        return str(locations[index])
    return argv[index].split("=", 1)[0]


def as_argv_read(reading, where: str, said: tuple[str, ...], launch_problems: Sequence[Problem] = ()
                 ) -> ArgvRead:
    """A ``TreeReading`` as the launch reader's ``ArgvRead``: the launch's own word problems, then
    the settings, problems, notes and the config's own world size."""
    raw = reading.raw if reading.raw.settings or reading.problems else RawArgs({}, where)
    return ArgvRead(raw, (*launch_problems, *reading.problems), said + tuple(reading.notes), reading.world_size,
                    reading.world_size_source)


def config_not_found(where: str, framework: str, launch_problems: Sequence[Problem], missing: str) -> ArgvRead:
    """The ``ArgvRead`` of a launch whose config file cannot be found: its word problems and why."""
    return ArgvRead(RawArgs({}, where), (*launch_problems, Problem("config-not-found", where,
                                                                   f"{framework} launch: {missing}")))


# A variable the launch reader could not expand (it says so in a notice): bash expands an unset
# one to nothing.  Names only: a Hydra interpolation (``${data.x}``, ``${oc.env:X}``) is kept.
_UNSET = re.compile(r"\$\{[A-Za-z_]\w*\}|\$[A-Za-z_]\w*|\$\{@[^}]*\}|\$[@*]")


def as_bash_expands(token: str) -> str:
    """``token`` with the variables the launch reader left unexpanded removed, as bash does."""
    return _UNSET.sub("", token)


class LaunchWords:
    """A tree-configured program's words: the values of its own options (``options``: option
    string -> name), the key.path=value overrides that follow (with where each was written), and
    one located problem per word that is neither (``framework`` and ``accepted`` word them)."""

    def __init__(self, argv: Sequence[str], locations: Sequence[str] | None, options: dict[str, str],
                 framework: str, accepted: str):
        self.values: dict[str, str] = {}
        self.overrides: list[str] = []
        self.override_at: list[str] = []
        self.problems: list[Problem] = []
        i = 0
        while i < len(argv):
            token = as_bash_expands(argv[i])        # what the launch's notices say bash would pass
            option, eq, inline = token.partition("=")
            if not token:
                i += 1
                continue
            if option in options:
                self.values[options[option]] = inline if eq else (argv[i + 1] if i + 1 < len(argv) else "")
                i += 1 if eq else 2
                continue
            if token.startswith("-"):
                self.problems.append(Problem("unknown-flag", word_at(argv, locations, i),
                                             f"{option}: not {accepted}"))
            elif "=" in token or token.startswith("~"):
                self.overrides.append(token)
                self.override_at.append(word_at(argv, locations, i))
            else:
                self.problems.append(Problem("invalid-override", word_at(argv, locations, i),
                                             f"{token!r}: {framework} takes key.path=value overrides (Hydra's grammar)"))
            i += 1
