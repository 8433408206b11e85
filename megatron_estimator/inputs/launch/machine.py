"""What a launch script asks of the machine it runs on, answered from what the caller states.

Launch scripts size their launcher from the node they run on: Pai-Megatron-Patch's
``GPUS_PER_NODE=`python -c "import torch; print(torch.cuda.device_count())"``` and slime's
``$(nvidia-smi -L | wc -l)`` print the node's GPU count (slime asks ``command -v nvidia-smi``
first: a node of ``--gpus-per-node`` GPUs has it).  The checking machine is not the job's,
so the count is the caller's ``--gpus-per-node N`` (``check``), said in a notice where a script
reads it; without it the command's output stays unknown, with the way to supply it.
"""

from __future__ import annotations

import re
from collections.abc import Callable

# Commands whose output is the number of GPUs the node has (torch counts the visible ones;
# ``nvidia-smi -L`` / ``--list-gpus`` / ``--query-gpu=...`` print one line per GPU).
_GPU_COUNT = (
    re.compile(r"^\s*python[0-9.]*\s+-c\s+.*\btorch\.cuda\.device_count\(\)", re.S),
    re.compile(r"^\s*nvidia-smi\b[^|]*?(?<!\S)(?:-L|--list-gpus|--query-gpu=\S*)(?!\S)[^|]*\|\s*wc\s+-l\b", re.S),
)

_GPU_TOOL = re.compile(r"^command -v nvidia-smi$")     # a node with GPUs has the driver's tool

GPUS_PER_NODE_ADVICE = "give the node's GPU count with --gpus-per-node N"


def gpu_count_probe(gpus_per_node: int | None, notices: list[str]) -> Callable[[str, str], tuple[str | None, str] | None]:
    """The reader's ``machine_output``: for a command that prints the node's GPU count, its
    output (``gpus_per_node``) or None with why it is not known; None for any other command.
    Each use is a notice in ``notices`` ('file:line `cmd`: ...')."""

    def probe(text: str, where: str) -> tuple[str | None, str] | None:
        if _GPU_TOOL.match(text):
            return (None, "") if gpus_per_node is None else ("nvidia-smi", "")
        if not any(p.search(text) for p in _GPU_COUNT):
            return None
        if gpus_per_node is None:
            return None, (f"it prints the number of GPUs of the node the job runs on, which the check "
                          f"cannot see; {GPUS_PER_NODE_ADVICE}")
        notices.append(f"{where}: it prints the number of GPUs of the node the job runs on, "
                       f"taken as {gpus_per_node} (--gpus-per-node)")
        return str(gpus_per_node), ""

    return probe
