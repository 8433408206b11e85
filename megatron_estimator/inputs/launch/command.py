"""A training launch command taken apart: its launcher, the training script and Megatron's flags.

``walk.parse_launch_command(argv)`` reads a command such as::

    torchrun --nproc-per-node 8 --nnodes 2 pretrain_gpt.py --num-layers 32 ...
    srun -N 2 --ntasks-per-node 8 numactl --cpunodebind=0 python -u pretrain_gpt.py ...
    env NVTE_FLASH_ATTN=0 uv run --no-sync python -m torch.distributed.run ... pretrain_gpt.py ...
    bash -c 'torchrun --standalone --nproc_per_node=8 pretrain_gpt.py ...'

and finds the program that runs the training script (walking through wrappers such as
``env``, ``numactl``, ``nsys profile``, ``taskset``, ``nohup``, ``time``, ``timeout``,
``stdbuf``, ``nice``, ``uv run``, ``singularity exec``), the script itself, the tokens after it
(Megatron's), and how many processes the launch starts (the world size) with a sentence that
says where that number came from.

The world size is read from the launcher that starts the Megatron processes:

* torchrun / ``python -m torch.distributed.run`` / ``torch.distributed.launch`` /
  ``ft_launcher``: ``--nnodes`` (the minimum of ``MIN:MAX``) times ``--nproc-per-node``; when an
  option is absent, torchrun's own fallback ``PET_NNODES`` / ``PET_NPROC_PER_NODE`` from the
  environment, then its defaults (1 and 1) -- torch/distributed/run.py ``get_args_parser`` and
  torch/distributed/argparse_util.py ``env``.  ``--nproc-per-node gpu|auto`` is resolved only
  when the environment names the GPUs (``CUDA_VISIBLE_DEVICES``, ``SLURM_GPUS_ON_NODE``).
* srun: ``-n``; else nodes times ``--ntasks-per-node``; what the command leaves out comes from
  the Slurm allocation in the environment (``SLURM_NTASKS``, ``SLURM_NNODES`` /
  ``SLURM_JOB_NUM_NODES``, ``SLURM_NTASKS_PER_NODE``, ``SLURM_TASKS_PER_NODE`` such as
  ``8(x2)``).
* mpirun / mpiexec: ``-np`` / ``-n``; else processes per node (``-N``, ``--npernode``,
  ``-ppn``) times the nodes of ``-H`` or of the Slurm allocation.
* plain ``python`` (or a script run directly): ``WORLD_SIZE`` from the environment, the
  variable Megatron itself reads (megatron/training/arguments.py), else 1.

Environment variables a wrapper sets (``env VAR=x``, ``mpirun -x VAR=x``, ``srun
--export=VAR=x``, ``VAR=x cmd`` inside ``sh -c``) count as environment for the launch and are
returned in ``LaunchCommand.environment``.  The caller's explicit ``--world-size`` wins over
all of this (``api.world_size_for``, where every front resolves the world size).

``execute.exec_launch(command)`` replaces the current process with the untouched command.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from megatron_estimator.core.problems import Problem

COMMAND_LOCATION = "<command>"

TORCHRUN_FAMILY = ("torchrun", "torch.distributed.run", "torch.distributed.launch", "ft_launcher")


@dataclass(frozen=True)
class LaunchCommand:
    """A launch command taken apart; ``argv`` is the command exactly as given."""

    argv: tuple[str, ...]
    launcher: str                      # the program that starts the training processes
    script: str | None                 # the training script (a path, or a module with -m)
    script_index: int | None           # index of ``script`` in ``tokens``
    megatron_argv: tuple[str, ...]     # the tokens after the script: Megatron's flags
    world_size: int | None
    world_size_source: str             # where ``world_size`` came from, or why it is unknown
    script_is_module: bool = False     # ``python -m pkg.mod`` / ``torchrun -m pkg.mod``
    # ``argv`` with a ``sh -c`` string replaced by the command inside it (equal to ``argv``
    # when there is none); ``script_index`` indexes this.
    tokens: tuple[str, ...] = ()
    # One location per token of ``tokens`` (``train.sh:14``), when the caller gave them.
    locations: tuple | None = None
    # Indices in ``tokens`` of the launcher options (and their values) the world size was read from.
    world_size_tokens: tuple[int, ...] = ()
    # Every program on the way to the script, outermost first: ('env', 'srun', 'torchrun').
    launchers: tuple[str, ...] = ()
    # Variables the command itself sets for the launch (env VAR=x, mpirun -x VAR=x, ...).
    environment: tuple[tuple[str, str], ...] = ()

    @property
    def megatron_locations(self) -> tuple | None:
        if self.locations is None or self.script_index is None:
            return None
        return self.locations[self.script_index + 1:]

    @property
    def environment_dict(self) -> dict[str, str]:
        return dict(self.environment)


@dataclass(frozen=True)
class SplitCommand:
    """One simple command found inside a ``sh -c`` string, ready to be walked."""

    tokens: tuple[str, ...]
    locations: tuple | None = None
    # Variables set for this command by the string itself (``X=1 cmd``, ``export X=1; cmd``).
    environment: tuple[tuple[str, str], ...] = ()


# A reader of ``sh -c`` strings: (string, environment, positional parameters $0 $1 ...,
# location of the string) -> the simple commands the string runs, in order, and problems.
CommandStringSplitter = Callable[
    [str, Mapping[str, str], Sequence[str], "str | None"],
    "tuple[tuple[SplitCommand, ...], tuple[Problem, ...]]",
]


def unknown_world_size_problem(command: LaunchCommand) -> Problem:
    """The problem to report when a world size is needed and neither command nor caller gives one."""
    return Problem(
        "unknown-world-size",
        COMMAND_LOCATION,
        f"the world size is not known ({command.world_size_source}); pass --world-size",
    )

