"""The ``#SBATCH`` headers of an sbatch file, and the ``SLURM_*`` variables they make Slurm set.

sbatch reads ``#SBATCH`` lines only before the first command of the file (sbatch(1)).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from megatron_estimator.core.problems import Problem


@dataclass(frozen=True)
class SbatchHeaders:
    """What the ``#SBATCH`` lines at the top of the file ask Slurm for."""

    nodes: int | None = None
    ntasks: int | None = None
    ntasks_per_node: int | None = None
    gpus_per_node: int | None = None
    gpus: int | None = None
    # option -> (value, file:line, as written), e.g. ('nodes', ('2', 'job.sbatch:3', '--nodes=2'))
    given: tuple[tuple[str, tuple[str, str, str]], ...] = ()

    @property
    def present(self) -> bool:
        return bool(self.given)

    def slurm_environment(self) -> dict[str, tuple[str, str]]:
        # Slurm's output environment variables (sbatch(1), OUTPUT ENVIRONMENT VARIABLES)
        """The SLURM_* variables a job with these headers starts with: name -> (value, phrase)."""
        given = dict(self.given)

        def spelled(*names: str) -> str:
            parts = [f"{given[n][2]} ({given[n][1]})" for n in names if n in given]
            return "from #SBATCH " + " ".join(parts)

        env: dict[str, tuple[str, str]] = {}
        if not self.present:
            return env
        nodes = self.nodes
        why = spelled("nodes")
        if "nodes" in given:
            pass                              # given (None when it was not a count: a problem says so)
        elif self.ntasks is not None and self.ntasks_per_node is not None:
            nodes = -(-self.ntasks // self.ntasks_per_node)
            why = spelled("ntasks", "ntasks-per-node")
        elif self.ntasks is None:
            nodes = 1                         # sbatch allocates one node unless asked for more
            why = "from the #SBATCH default of 1 node"
        if nodes is not None:
            env["SLURM_NNODES"] = (str(nodes), why)
            env["SLURM_JOB_NUM_NODES"] = (str(nodes), why)
        ntasks = self.ntasks
        if ntasks is None and self.ntasks_per_node is not None and nodes is not None:
            ntasks = nodes * self.ntasks_per_node
        if ntasks is not None:
            why = spelled("ntasks") if "ntasks" in given else spelled("nodes", "ntasks-per-node")
            env["SLURM_NTASKS"] = (str(ntasks), why)
            env["SLURM_NPROCS"] = (str(ntasks), why)
        if self.ntasks_per_node is not None:
            env["SLURM_NTASKS_PER_NODE"] = (str(self.ntasks_per_node), spelled("ntasks-per-node"))
            if nodes is not None:
                env["SLURM_TASKS_PER_NODE"] = (f"{self.ntasks_per_node}(x{nodes})",
                                               spelled("nodes", "ntasks-per-node"))
        if self.gpus_per_node is not None:
            key = "gpus-per-node" if "gpus-per-node" in given else "gres"
            env["SLURM_GPUS_PER_NODE"] = (str(self.gpus_per_node), spelled(key))
            env["SLURM_GPUS_ON_NODE"] = (str(self.gpus_per_node), spelled(key))
        return env


_SBATCH_VALUE_OPTIONS = {"-N": "nodes", "--nodes": "nodes", "-n": "ntasks", "--ntasks": "ntasks",
                         "--ntasks-per-node": "ntasks-per-node", "--gpus-per-node": "gpus-per-node",
                         "--gres": "gres", "-G": "gpus", "--gpus": "gpus"}


def read_sbatch(text: str, display: str, line_locations=None,
                command_line: tuple | None = None) -> tuple[SbatchHeaders, list[Problem]]:
    """The #SBATCH lines before the first command (sbatch stops reading them there).

    ``line_locations``: the ``file:line`` of each line of ``text`` (a here-document's lines are
    where they are written in the script that feeds it to sbatch); None: ``display:N``.
    ``command_line``: (the options given to sbatch itself, their ``file:line``), read after the
    ``#SBATCH`` lines, which they override."""
    problems: list[Problem] = []
    given: dict[str, tuple[str, str]] = {}

    def take(tokens: list[str], where_line: str) -> None:
        k = 0
        while k < len(tokens):
            tok = tokens[k]
            name, eq, value = tok.partition("=")
            if tok.startswith("--") and name in _SBATCH_VALUE_OPTIONS:
                spelled = tok
                if not eq:
                    value = tokens[k + 1] if k + 1 < len(tokens) else ""
                    spelled = f"{tok} {value}"
                    k += 1
                given[_SBATCH_VALUE_OPTIONS[name]] = (value, where_line, spelled)
            elif not tok.startswith("--") and tok[:2] in _SBATCH_VALUE_OPTIONS:
                value = tok[2:]
                spelled = tok
                if not value:
                    value = tokens[k + 1] if k + 1 < len(tokens) else ""
                    spelled = f"{tok} {value}"
                    k += 1
                given[_SBATCH_VALUE_OPTIONS[tok[:2]]] = (value, where_line, spelled)
            k += 1

    for lineno, line in enumerate(text.splitlines(), 1):
        where_line = (str(line_locations[lineno - 1]) if line_locations is not None and lineno <= len(line_locations)
                      else f"{display}:{lineno}")
        stripped = line.strip()
        if lineno == 1 and stripped.startswith("#!"):
            continue
        if not stripped:
            continue
        if line.startswith("#SBATCH"):
            try:
                tokens = shlex.split(line[len("#SBATCH"):], comments=True)
            except ValueError:
                problems.append(Problem("invalid-launcher-option", where_line,
                                        "this #SBATCH line has an unclosed quote"))
                continue
            take(tokens, where_line)
            continue
        if stripped.startswith("#"):
            continue
        break
    if command_line is not None:             # sbatch's own options win over the script's (sbatch(1))
        take(list(command_line[0]), command_line[1])

    def count(key: str, allow_range: bool = False) -> int | None:
        if key not in given:
            return None
        raw, where, spelled = given[key]
        text_ = raw
        if allow_range:
            text_ = re.split(r"[-,]", raw, maxsplit=1)[0]
        if key in ("gpus-per-node", "gpus"):
            text_ = raw.rsplit(":", 1)[-1]
        if key == "gres":
            gpu = [g for g in raw.split(",") if g.split(":", 1)[0] == "gpu"]
            text_ = gpu[0].rsplit(":", 1)[-1] if gpu and ":" in gpu[0] else ""
            if not gpu:
                return None
        try:
            value = int(text_)
        except ValueError:
            value = None
        if value is None or value <= 0:
            problems.append(Problem("invalid-launcher-option", f"{where} {spelled.split('=')[0].split()[0]}",
                                    f"#SBATCH {spelled} is not a positive count"))
            return None
        return value

    gpn = count("gpus-per-node")
    if gpn is None and "gpus-per-node" not in given:
        gpn = count("gres")
    headers = SbatchHeaders(
        nodes=count("nodes", allow_range=True),
        ntasks=count("ntasks"),
        ntasks_per_node=count("ntasks-per-node"),
        gpus_per_node=gpn,
        gpus=count("gpus"),
        given=tuple(given.items()),
    )
    return headers, problems
