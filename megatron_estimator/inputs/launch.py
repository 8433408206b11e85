"""Split a training launch command into its launcher, the training script and Megatron's flags.

``parse_launch_command(argv)`` reads a command such as::

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
all of this: ``resolve_world_size(command, override)``.

``exec_launch(command)`` replaces the current process with the untouched command.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from megatron_estimator.core.problems import Problem, ProblemCollector

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


def parse_launch_command(
    argv: Sequence[str],
    environ: Mapping[str, str] | None = None,
    *,
    locations: Sequence[object] | None = None,
    env_origins: Mapping[str, str] | None = None,
    split_command_string: CommandStringSplitter | None = None,
) -> tuple[LaunchCommand, tuple[Problem, ...]]:
    """Take a launch command apart (see the module docstring).

    ``environ`` is the environment the command would run in (``os.environ`` when None).
    ``locations`` (one per token) and ``env_origins`` (variable -> phrase such as
    ``from #SBATCH --nodes=2 (job.sbatch:3)``) make messages and sentences say where things
    were written.  A location is a string (``train.sh:14``) or any object whose ``str()`` is
    one; it is handed back untouched in ``LaunchCommand.locations``.  A location object with
    a true ``unresolved`` attribute (a reason) marks a token that is not known statically:
    it is never read as a count or a program; a ``via`` attribute (where the value was set)
    is added to the world-size sentence.  ``split_command_string`` reads ``sh -c`` strings;
    by default the shell loader's reader (megatron_estimator/loaders/shell.py), so the string
    means what bash would make of it.
    """
    argv = tuple(argv)
    if locations is not None and len(locations) != len(argv):
        raise ValueError("locations must have one entry per argv token")
    walk = _Walk(
        argv,
        tuple(locations) if locations is not None else None,
        dict(os.environ if environ is None else environ),
        dict(env_origins or {}),
        split_command_string,
    )
    return walk.run()


def resolve_world_size(command: LaunchCommand, override: int | None = None) -> tuple[int | None, str]:
    """The world size to use and a sentence saying where it came from.

    ``override`` (the caller's ``--world-size``) wins over everything the command says.
    """
    if override is not None:
        sentence = f"--world-size {override} given to the estimator"
        if command.world_size is not None and command.world_size != override:
            sentence += f" (the launch command itself says {command.world_size}: {command.world_size_source})"
        return override, sentence
    return command.world_size, command.world_size_source


def unknown_world_size_problem(command: LaunchCommand) -> Problem:
    """The problem to report when a world size is needed and neither command nor caller gives one."""
    return Problem(
        "unknown-world-size",
        COMMAND_LOCATION,
        f"the world size is not known ({command.world_size_source}); pass --world-size",
    )


def exec_launch(command: LaunchCommand) -> None:
    """Replace this process with the launch command: the same argv, the same environment.

    The environment is the one this process started with: the interpreter may have added to
    ``os.environ`` on its own (PEP 538 locale coercion sets LC_CTYPE=C.UTF-8 when the locale
    is C), which the job must not inherit.  Raises OSError when the command cannot be run.
    """
    environment = started_environment()
    if environment is None:
        os.execvp(command.argv[0], list(command.argv))
    os.execvpe(command.argv[0], list(command.argv), environment)


def started_environment() -> dict[str, str] | None:
    """This process's environment as it was at exec time (Linux ``/proc/self/environ``, which
    later ``setenv`` calls do not change), or None where that cannot be read."""
    try:
        with open("/proc/self/environ", "rb") as handle:
            block = handle.read()
    except OSError:
        return None
    environment = {}
    for entry in block.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep and name:
            environment[os.fsdecode(name)] = os.fsdecode(value)
    return environment


# --------------------------------------------------------------------------------------
# Option tables.
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Options:
    """How one program spells its options (getopt / argparse style)."""

    values: Mapping[str, str]                   # option spelling -> canonical name; takes a value
    flags: Mapping[str, str] = field(default_factory=dict)    # spelling -> canonical; no value
    optional: frozenset[str] = frozenset()     # long options whose value must be glued with '='
    pairs: frozenset[str] = frozenset()        # options taking two values (mpirun --mca k v)
    single_dash_long: bool = False             # -np, -hostfile (mpirun)
    abbreviations: bool = True                 # unique prefixes of long options accepted
    strict: bool = False                       # unknown options are errors (argparse)
    short_equals: bool = False                 # -r=3 means -r 3 (argparse)


def _aliases(*groups: tuple[str, ...]) -> dict[str, str]:
    """Each group: spellings of one option; the canonical name is the first long spelling."""
    table: dict[str, str] = {}
    for spellings in groups:
        canonical = next((s for s in spellings if s.startswith("--")), spellings[0]).lstrip("-").replace("_", "-")
        for spelling in spellings:
            table[spelling] = canonical
    return table


# torch/distributed/run.py get_args_parser(): options with action=env take a value,
# action=check_env options are flags.  torch/distributed/launch.py adds --use-env.
_TORCHRUN = _Options(
    values=_aliases(
        ("--nnodes",), ("--nproc-per-node", "--nproc_per_node"),
        ("--rdzv-backend", "--rdzv_backend"), ("--rdzv-endpoint", "--rdzv_endpoint"),
        ("--rdzv-id", "--rdzv_id"), ("--rdzv-conf", "--rdzv_conf"),
        ("--max-restarts", "--max_restarts"), ("--monitor-interval", "--monitor_interval"),
        ("--start-method", "--start_method"), ("--event-log-handler", "--event_log_handler"),
        ("--role",), ("--log-dir", "--log_dir"), ("-r", "--redirects"), ("-t", "--tee"),
        ("--local-ranks-filter", "--local_ranks_filter"),
        ("--duplicate-stdout-filters", "--duplicate_stdout_filters"),
        ("--duplicate-stderr-filters", "--duplicate_stderr_filters"),
        ("--node-rank", "--node_rank"), ("--master-addr", "--master_addr"),
        ("--master-port", "--master_port"), ("--local-addr", "--local_addr"),
        ("--logs-specs", "--logs_specs"), ("--numa-binding", "--numa_binding"),
        ("--signals-to-handle", "--signals_to_handle"), ("--shutdown-timeout", "--shutdown_timeout"),
    ),
    flags=_aliases(
        ("--standalone",), ("-m", "--module"), ("--no-python", "--no_python"),
        ("--run-path", "--run_path"), ("--virtual-local-rank", "--virtual_local_rank"),
        ("-h", "--help"),
    ),
    strict=True,
    short_equals=True,
)
_TORCH_LAUNCH = _Options(
    values=_TORCHRUN.values,
    flags={**_TORCHRUN.flags, **_aliases(("--use-env", "--use_env"))},
    strict=True,
    short_equals=True,
)
# nvidia-resiliency-ext's ft_launcher takes torchrun's options plus its own --ft-* ones.
_FT_LAUNCHER = _Options(
    values={**_TORCHRUN.values, **_aliases(("--ft-cfg-path", "--ft_cfg_path"), ("--ft-param-rank-section-timeouts",),
                                           ("--ft-param-rank-out-of-section-timeout",))},
    flags={**_TORCHRUN.flags, **_aliases(("--ignore-missing-fault-tol-cfg", "--ignore_missing_fault_tol_cfg"))},
)

# srun(1): options that take a required argument; those with an optional argument only take
# it glued (--exclusive=user); everything else is a flag.  Pyxis adds the --container-* ones.
_SRUN = _Options(
    values=_aliases(
        ("-A", "--account"), ("--acctg-freq",), ("-B", "--extra-node-info"), ("--bb",), ("--bbf",),
        ("--begin",), ("-c", "--cpus-per-task"), ("--cluster-constraint",), ("-M", "--clusters"),
        ("--comment",), ("-C", "--constraint"), ("--container",), ("--container-id",),
        ("-S", "--core-spec"), ("--cores-per-socket",), ("--cpu-bind",), ("--cpu_bind",),
        ("--cpu-freq",), ("--cpus-per-gpu",), ("--deadline",), ("--delay-boot",),
        ("-d", "--dependency"), ("-m", "--distribution"), ("-D", "--chdir"), ("-e", "--error"),
        ("--epilog",), ("--export",), ("--extra",), ("--gid",), ("--gpu-bind",), ("--gpu-freq",),
        ("-G", "--gpus"), ("--gpus-per-node",), ("--gpus-per-socket",), ("--gpus-per-task",),
        ("--gres",), ("--gres-flags",), ("--het-group",), ("--hint",), ("-i", "--input"),
        ("--jobid",), ("-J", "--job-name"), ("-L", "--licenses"), ("--mail-type",),
        ("--mail-user",), ("--mcs-label",), ("--mem",), ("--mem-bind",), ("--mem_bind",),
        ("--mem-per-cpu",), ("--mem-per-gpu",), ("--mincpus",), ("--mpi",), ("--msg-timeout",),
        ("--network",), ("-N", "--nodes"), ("-n", "--ntasks"), ("--ntasks-per-core",),
        ("--ntasks-per-gpu",), ("--ntasks-per-node",), ("--ntasks-per-socket",),
        ("--ntasks-per-tres",), ("--open-mode",), ("-o", "--output"), ("-p", "--partition"),
        ("--power",), ("--prefer",), ("--profile",), ("--prolog",), ("-q", "--qos"),
        ("-r", "--relative"), ("--reservation",), ("--segment",), ("--signal",),
        ("--slurmd-debug",), ("--sockets-per-node",), ("--switches",), ("--task-epilog",),
        ("--task-prolog",), ("--tasks-per-node",), ("--thread-spec",), ("-T", "--threads"),
        ("--threads-per-core",), ("-t", "--time"), ("--time-min",), ("--tmp",), ("--tres-bind",),
        ("--tres-per-task",), ("--uid",), ("-W", "--wait"), ("--wckey",), ("-w", "--nodelist"),
        ("-x", "--exclude"), ("--nodefile",), ("--accel-bind",),
        ("--container-image",), ("--container-mounts",), ("--container-workdir",),
        ("--container-name",), ("--container-save",), ("--container-env",),
    ),
    flags=_aliases(
        ("-E", "--preserve-env"), ("-H", "--hold"), ("-h", "--help"), ("-l", "--label"),
        ("-O", "--overcommit"), ("-Q", "--quiet"), ("-s", "--oversubscribe"), ("-u", "--unbuffered"),
        ("-V", "--version"), ("-v", "--verbose"), ("-X", "--disable-status"), ("-Z", "--no-allocate"),
        ("-I", "--immediate"), ("-K", "--kill-on-bad-exit"), ("-k", "--no-kill"),
        ("--contiguous",), ("--exact",), ("--exclusive",), ("--multi-prog",), ("--overlap",),
        ("--pty",), ("--quit-on-interrupt",), ("--spread-job",), ("--test-only",),
        ("--use-min-nodes",), ("--whole",), ("--usage",), ("--external-launcher",),
        ("--bcast",), ("--compress",), ("--nice",), ("--propagate",), ("--resv-ports",),
        ("--send-libs",), ("--x11",),
        ("--container-mount-home",), ("--no-container-mount-home",), ("--container-remap-root",),
        ("--no-container-remap-root",), ("--container-writable",), ("--container-readonly",),
        ("--container-entrypoint",), ("--no-container-entrypoint",),
    ),
    optional=frozenset({"--exclusive", "--immediate", "--kill-on-bad-exit", "--no-kill", "--bcast",
                        "--compress", "--nice", "--propagate", "--resv-ports", "--send-libs", "--x11"}),
)

# mpirun (Open MPI) / mpiexec (MPICH Hydra, Intel MPI).  Open MPI spells long options with
# one dash too (-np, -hostfile); --mca / -genv take two values.
_MPIRUN = _Options(
    values=_aliases(
        ("-np", "--np"), ("-n", "--n"), ("-c",), ("-N",), ("-npernode", "--npernode"),
        ("-npersocket", "--npersocket"), ("-ppn",), ("-perhost",), ("-H", "-host", "--host"),
        ("-hosts",), ("-hostfile", "--hostfile"), ("-machinefile", "--machinefile"), ("-f",),
        ("-x",), ("-map-by", "--map-by"), ("-rank-by", "--rank-by"), ("-bind-to", "--bind-to"),
        ("-wdir", "--wdir"), ("-wd",), ("-prefix", "--prefix"), ("-output-filename", "--output-filename"),
        ("--output",), ("-timeout", "--timeout"), ("-cpus-per-proc", "--cpus-per-proc"),
        ("-cpus-per-rank", "--cpus-per-rank"), ("-launcher",), ("-bootstrap",), ("-iface",),
        ("-genvlist",), ("-envlist",), ("-app", "--app"), ("-tune", "--tune"),
        ("--personality",), ("--runtime-options",), ("--rankfile", "-rf"), ("-s", "--preload-files"),
        ("--pmixmca",),
    ),
    flags=_aliases(
        ("-tag-output", "--tag-output"), ("-report-bindings", "--report-bindings"),
        ("--allow-run-as-root", "-allow-run-as-root"), ("-oversubscribe", "--oversubscribe"),
        ("-display-map", "--display-map"), ("-bind-to-core", "--bind-to-core"), ("-v", "--verbose"),
        ("-q", "--quiet"), ("-l",), ("-print-rank-map",), ("-genvall",), ("-genvnone",),
        ("-h", "--help"), ("-V", "--version"), ("--noprefix",), ("-timestamp-output", "--timestamp-output"),
        ("--merge-stderr-to-stdout",), ("--use-hwthread-cpus",),
    ),
    pairs=frozenset({"-mca", "--mca", "-gmca", "--gmca", "-genv", "-env", "--prtemca", "-prtemca"}),
    single_dash_long=True,
    abbreviations=False,
)

_NUMACTL = _Options(
    values=_aliases(
        ("-i", "--interleave"), ("-w", "--weighted-interleave"), ("-m", "--membind"),
        ("-N", "--cpunodebind"), ("-C", "--physcpubind"), ("-p", "--preferred"),
        ("-P", "--preferred-many"), ("-b", "--balancing"), ("-S", "--shm"), ("-f", "--file"),
        ("-M", "--shmmode"), ("-V", "--shmid"), ("-L", "--length"), ("-o", "--offset"),
    ),
    flags=_aliases(
        ("-a", "--all"), ("-l", "--localalloc"), ("-s", "--show"), ("-H", "--hardware"),
        ("-t", "--strict"), ("-T", "--huge"), ("-u", "--touch"), ("-d", "--dump"), ("-D", "--dump-nodes"),
    ),
)

# `nsys profile` takes a value for almost every switch (--trace=cuda,nvtx, -o name, -f true).
_NSYS = _Options(
    values=_aliases(
        ("-o", "--output"), ("-t", "--trace"), ("-s", "--sample"), ("-b", "--backtrace"),
        ("-c", "--capture-range"), ("--capture-range-end",), ("-d", "--duration"), ("-y", "--delay"),
        ("-e", "--env-var"), ("-f", "--force-overwrite"), ("-w", "--show-output"),
        ("-x", "--stop-on-exit"), ("-n", "--inherit-environment"), ("-p", "--nvtx-capture"),
        ("--stats",), ("--export",), ("--cuda-memory-usage",), ("--cudabacktrace",),
        ("--cpuctxsw",), ("--gpu-metrics-devices",), ("--gpu-metrics-device",),
        ("--gpu-metrics-frequency",), ("--gpu-metrics-set",), ("--gpuctxsw",), ("--kill",),
        ("--osrt-threshold",), ("--python-sampling",), ("--python-sampling-frequency",),
        ("--python-backtrace",), ("--pytorch",), ("--cuda-graph-trace",), ("--cuda-flush-interval",),
        ("--trace-fork-before-exec",), ("--wait",), ("--session-new",), ("--session",),
        ("--run-as",), ("--nic-metrics",), ("--sampling-frequency",), ("--sampling-period",),
        ("--cpu-core-events",), ("--event-sample",), ("--nvtx-domain-include",),
        ("--nvtx-domain-exclude",), ("--cuda-event-trace",), ("--cuda-um-cpu-page-faults",),
        ("--cuda-um-gpu-page-faults",), ("--mpi-impl",), ("--hotkey-capture",), ("--duration-frequency",),
        ("--start-frame-index",), ("--flush-on-cudaprofilerstop",), ("--command-file",),
        ("--capture-range-op",), ("--resolve-symbols",), ("--python-functions-trace",),
    ),
    flags=_aliases(("-h", "--help"), ("-v", "--version")),
)

_TASKSET = _Options(
    values={},
    flags=_aliases(("-a", "--all-tasks"), ("-c", "--cpu-list"), ("-p", "--pid"), ("-h", "--help")),
)

_TIME = _Options(
    values=_aliases(("-f", "--format"), ("-o", "--output")),
    flags=_aliases(("-a", "--append"), ("-p", "--portability"), ("-v", "--verbose"), ("-q", "--quiet")),
)

_TIMEOUT = _Options(
    values=_aliases(("-s", "--signal"), ("-k", "--kill-after")),
    flags=_aliases(("--preserve-status",), ("--foreground",), ("-v", "--verbose")),
)

_STDBUF = _Options(values=_aliases(("-i", "--input"), ("-o", "--output"), ("-e", "--error")))

_NICE = _Options(values=_aliases(("-n", "--adjustment")))

_ENV = _Options(
    values=_aliases(("-u", "--unset"), ("-C", "--chdir"), ("-S", "--split-string")),
    flags=_aliases(("-i", "--ignore-environment"), ("-0", "--null"), ("-v", "--debug")),
    optional=frozenset({"--default-signal", "--ignore-signal", "--block-signal"}),
)

# `uv run` options that take a value (uv's docs, `uv run --help`); -m/--module runs a module.
_UV_RUN = _Options(
    values=_aliases(
        ("--with",), ("--with-editable",), ("--with-requirements",), ("-p", "--python"),
        ("--project",), ("--directory",), ("--package",), ("--extra",), ("--group",),
        ("--only-group",), ("--no-group",), ("--env-file",), ("--index",), ("--default-index",),
        ("-i", "--index-url"), ("--extra-index-url",), ("-f", "--find-links"), ("--index-strategy",),
        ("--keyring-provider",), ("--resolution",), ("--prerelease",), ("--fork-strategy",),
        ("--exclude-newer",), ("--exclude-newer-package",), ("--link-mode",), ("--config-file",),
        ("--cache-dir",), ("--color",), ("--refresh-package",), ("--reinstall-package",),
        ("-P", "--upgrade-package"), ("--no-binary-package",), ("--no-build-package",),
        ("-C", "--config-setting"), ("--config-settings-package",), ("--no-build-isolation-package",),
        ("--python-platform",), ("--allow-insecure-host",), ("--no-extra",), ("--index-url-file",),
    ),
    flags=_aliases(
        ("--no-sync",), ("--frozen",), ("--locked",), ("--isolated",), ("--no-project",),
        ("--all-extras",), ("--no-dev",), ("--dev",), ("--only-dev",), ("--all-groups",),
        ("--no-default-groups",), ("--active",), ("--no-active",), ("-q", "--quiet"), ("-v", "--verbose"),
        ("--offline",), ("--no-cache",), ("-n",), ("--no-editable",), ("--exact",), ("--inexact",),
        ("--no-env-file",), ("--refresh",), ("--reinstall",), ("-U", "--upgrade"), ("--compile-bytecode",),
        ("--no-build-isolation",), ("--no-build",), ("--no-binary",), ("--no-index",), ("--native-tls",),
        ("--no-python-downloads",), ("--managed-python",), ("--no-managed-python",), ("-s", "--script"),
        ("--gui-script",), ("--no-progress",), ("--no-config",), ("--all-packages",), ("-m", "--module"),
        ("-h", "--help"),
    ),
)

# singularity / apptainer exec [options] IMAGE COMMAND ...
_CONTAINER_EXEC = _Options(
    values=_aliases(
        ("-B", "--bind"), ("--env",), ("--env-file",), ("-H", "--home"), ("-W", "--workdir"),
        ("-o", "--overlay"), ("-S", "--scratch"), ("--pwd",), ("--security",), ("--app",),
        ("--mount",), ("--network",), ("--network-args",), ("--hostname",), ("--dns",),
        ("--apply-cgroups",), ("--cpus",), ("--memory",), ("--add-caps",), ("--drop-caps",),
    ),
    flags=_aliases(
        ("--nv",), ("--nvccli",), ("--rocm",), ("-c", "--contain"), ("-C", "--containall"),
        ("-e", "--cleanenv"), ("-w", "--writable"), ("--writable-tmpfs",), ("-f", "--fakeroot"),
        ("--no-home",), ("-i", "--ipc"), ("-p", "--pid"), ("-u", "--userns"), ("--no-mount",),
        ("--compat",), ("--no-init",), ("--no-privs",), ("--no-eval",), ("--no-nv",),
    ),
)

_BASH_VALUE_OPTIONS = frozenset({"-o", "+o", "-O", "+O", "--rcfile", "--init-file"})
_BASH_LONG_FLAGS = frozenset({
    "--login", "--norc", "--noprofile", "--posix", "--noediting", "--restricted", "--verbose",
    "--debugger", "--dump-strings", "--dump-po-strings", "--pretty-print", "--help", "--version",
})

# python(1): single-letter flags, and the options that take a value.
_PYTHON_FLAGS = frozenset("bBdEhiIOPqsSuvVxR?")
_PYTHON_LONG_FLAGS = frozenset({"--help", "--version", "--help-env", "--help-xoptions", "--help-all"})

_PYTHON_NAME = re.compile(r"^python(\d+(\.\d+)*)?[a-z]?$")
_MPI_NAMES = frozenset({"mpirun", "mpiexec", "orterun", "prterun", "mpiexec.hydra", "mpirun.openmpi",
                        "mpiexec.openmpi", "mpirun.mpich", "mpiexec.mpich"})
_SHELLS = frozenset({"bash", "sh", "dash", "zsh", "ksh"})
_SIMPLE_WRAPPERS = {
    "numactl": _NUMACTL, "time": _TIME, "timeout": None, "stdbuf": _STDBUF, "nice": _NICE,
    "nohup": None, "taskset": None, "exec": None,
}


def _program_name(token: str) -> str:
    return os.path.basename(token)


def is_launch_program(token: str) -> bool:
    """Is this token a program the walk knows (a launcher, a wrapper, python, a *.py script)?"""
    return _is_known_program(token)


def _is_known_program(token: str) -> bool:
    """A token that is certainly a program (used to tell an unknown option's value from a program)."""
    name = _program_name(token)
    return (
        token.endswith(".py")
        or bool(_PYTHON_NAME.match(name))
        or name in ("torchrun", "ft_launcher", "srun", "env", "nsys", "uv", "singularity", "apptainer")
        or name in _MPI_NAMES
        or name in _SHELLS
        or name in _SIMPLE_WRAPPERS
    )


# --------------------------------------------------------------------------------------
# Generic option parsing.
# --------------------------------------------------------------------------------------


@dataclass
class _Opt:
    name: str                 # canonical name, e.g. 'nproc-per-node'
    spelled: str              # as typed, without a glued value: '--nproc_per_node', '-N'
    value: str | None
    index: int                # token index of the option
    value_index: int | None   # token index of the value (== index when glued)
    values: tuple[str, ...] = ()   # for two-valued options


@dataclass
class _Parsed:
    options: list[_Opt]
    program: int | None                       # index of the first token after the options
    unknown: list[tuple[int, str]]            # (index, spelling) of options not in the table

    def last(self, name: str) -> _Opt | None:
        found = None
        for opt in self.options:
            if opt.name == name:
                found = opt
        return found

    def all(self, name: str) -> list[_Opt]:
        return [opt for opt in self.options if opt.name == name]


class _Walk:
    """Walks a command from its first token to the training script."""

    def __init__(self, argv, locations, env, env_origins, splitter):
        self.argv = argv
        self.tokens: list[str] = list(argv)
        self.locs: list | None = list(locations) if locations is not None else None
        self.env: dict[str, str] = env
        self.env_origins: dict[str, str] = env_origins
        self.assigned: dict[str, str] = {}        # set by the command itself
        self.assigned_by: dict[str, str] = {}     # variable -> the program that set it
        self.splitter = splitter
        self.chain: list[str] = []
        self.problems = ProblemCollector()
        # (kind, world size or None, sentence, token indices read) of every program that starts processes
        self.spawners: list[tuple[str, int | None, str, tuple[int, ...]]] = []
        self.read: list[int] = []      # token indices read by the world-size computation under way
        self.unknown_program: str | None = None
        self.script: str | None = None
        self.script_index: int | None = None
        self.is_module = False
        self.launcher: str | None = None
        self.failure: str | None = None          # why no script was found

    # ---- helpers ---------------------------------------------------------------------

    def loc(self, index: int | None) -> str:
        if self.locs is not None and index is not None and 0 <= index < len(self.locs):
            return str(self.locs[index] or "")
        return ""

    def where(self, index: int | None, spelled: str) -> str:
        """Problem location for an option: its spelling, prefixed by its file:line if known."""
        loc = self.loc(index)
        return f"{loc} {spelled}" if loc else spelled

    def at(self, index: int | None) -> str:
        """' (train.sh:14)' for a sentence, when token locations are known."""
        loc = self.loc(index)
        return f" ({loc})" if loc else ""

    def said(self, opt: "_Opt") -> str:
        """An option as a sentence names it: '--nnodes 2 (train.sh:14)'; with where a value
        that came through a variable was set, when the location object says (its ``via``)."""
        loc = self.loc(opt.index)
        via = None
        if self.locs is not None and opt.value_index is not None and opt.value_index < len(self.locs):
            via = getattr(self.locs[opt.value_index], "via", None)
        where = ", ".join(x for x in (loc, via) if x)
        return f"{opt.spelled} {opt.value}" + (f" ({where})" if where else "")

    def unresolved(self, index: int | None) -> str | None:
        """Why token ``index`` is not known statically (from its location object), or None."""
        if self.locs is not None and index is not None and 0 <= index < len(self.locs):
            return getattr(self.locs[index], "unresolved", None) or None
        return None

    def set_env(self, name: str, value: str, by: str) -> None:
        self.env[name] = value
        self.assigned[name] = value
        self.assigned_by[name] = by

    def env_phrase(self, name: str) -> str:
        value = self.env[name]
        if name in self.assigned:
            return f"{name}={value} set by {self.assigned_by[name]} on the command"
        origin = self.env_origins.get(name)
        if origin:
            return f"{name}={value} {origin}"
        return f"{name}={value} in the environment"

    def env_int(self, name: str) -> int | None:
        """An integer environment variable; a problem when it is set but not a positive integer."""
        raw = self.env.get(name)
        if raw is None or raw.strip() == "":
            return None
        try:
            value = int(raw.strip())
        except ValueError:
            value = None
        if value is None or value <= 0:
            self.problems.add("invalid-launch-environment", name,
                              f"{name}={raw!r} is not a positive integer")
            return None
        return value

    def fail(self, message: str) -> None:
        self.failure = message

    def parse_options(self, start: int, spec: _Options, program: str) -> _Parsed:
        tokens = self.tokens
        options: list[_Opt] = []
        unknown: list[tuple[int, str]] = []
        long_names = sorted(s for s in (*spec.values, *spec.flags, *spec.optional, *spec.pairs) if s.startswith("--"))
        i = start
        while i < len(tokens):
            tok = tokens[i]
            if tok == "--":
                return _Parsed(options, i + 1 if i + 1 < len(tokens) else None, unknown)
            if not tok.startswith("-") or tok == "-":
                return _Parsed(options, i, unknown)
            if tok.startswith("--") or (spec.single_dash_long and len(tok.partition("=")[0]) > 2):
                name, eq, glued = tok.partition("=")
                spelled = self._match_long(name, spec, long_names, i, program)
                if spelled is None:        # ambiguous: a problem was recorded; skip a value if one follows
                    if eq or i + 1 >= len(tokens) or _is_known_program(tokens[i + 1]) or tokens[i + 1].startswith("-"):
                        i += 1
                    else:
                        i += 2
                    continue
                if spelled in spec.pairs:
                    vals = tokens[i + 1:i + 3]
                    if len(vals) < 2:
                        self.problems.add("invalid-launcher-option", self.where(i, name),
                                          f"{program} {name} takes two values")
                        return _Parsed(options, None, unknown)
                    options.append(_Opt(spelled.lstrip("-"), name, vals[1], i, i + 2, tuple(vals)))
                    i += 3
                    continue
                if spelled in spec.values:
                    canonical = spec.values[spelled]
                    if eq:
                        options.append(_Opt(canonical, name, glued, i, i))
                        i += 1
                        continue
                    if i + 1 >= len(tokens):
                        self.problems.add("invalid-launcher-option", self.where(i, name),
                                          f"{program} {name} needs a value and none follows")
                        return _Parsed(options, None, unknown)
                    options.append(_Opt(canonical, name, tokens[i + 1], i, i + 1))
                    i += 2
                    continue
                if spelled in spec.flags or spelled in spec.optional:
                    canonical = spec.flags.get(spelled, spelled.lstrip("-"))
                    if eq and spelled not in spec.optional and spec.strict:
                        self.problems.add("invalid-launcher-option", self.where(i, name),
                                          f"{program} {name} is a switch and takes no value (got {glued!r})")
                    options.append(_Opt(canonical, name, glued if eq else None, i, i if eq else None))
                    i += 1
                    continue
                # not in the table
                if spec.strict:
                    self.problems.add("invalid-launcher-option", self.where(i, name),
                                      f"{program} has no option {name}")
                unknown.append((i, name))
                if eq or i + 1 >= len(tokens) or _is_known_program(tokens[i + 1]) or tokens[i + 1].startswith("-"):
                    i += 1
                else:
                    i += 2      # an unknown option followed by a word that is no program: its value
                continue
            # short options, getopt style: -N2, -lN 2, -uB
            j = 1
            while j < len(tok):
                spelled = "-" + tok[j]
                if spelled in spec.values:
                    rest = tok[j + 1:]
                    if spec.short_equals and rest.startswith("="):
                        rest = rest[1:]
                    if rest:
                        options.append(_Opt(spec.values[spelled], spelled, rest, i, i))
                        i += 1
                    elif i + 1 < len(tokens):
                        options.append(_Opt(spec.values[spelled], spelled, tokens[i + 1], i, i + 1))
                        i += 2
                    else:
                        self.problems.add("invalid-launcher-option", self.where(i, spelled),
                                          f"{program} {spelled} needs a value and none follows")
                        return _Parsed(options, None, unknown)
                    break
                if spelled in spec.flags:
                    options.append(_Opt(spec.flags[spelled], spelled, None, i, None))
                elif spec.strict:
                    self.problems.add("invalid-launcher-option", self.where(i, spelled),
                                      f"{program} has no option {spelled}")
                else:
                    unknown.append((i, spelled))
                j += 1
            else:
                i += 1
        return _Parsed(options, None, unknown)

    def _match_long(self, name: str, spec: _Options, long_names: list[str], index: int, program: str) -> str | None:
        known = (*spec.values, *spec.flags, *spec.optional, *spec.pairs)
        if name in known or not name.startswith("--") or not spec.abbreviations:
            return name
        matches = [n for n in long_names if n.startswith(name)]
        if not matches:
            return name
        canon = {spec.values.get(m) or spec.flags.get(m) or m for m in matches}
        # argparse (torchrun) accepts a prefix of exactly one option string, so `--nproc` (both
        # --nproc-per-node and --nproc_per_node) is ambiguous; getopt_long (srun, ...) accepts a
        # prefix whose matches all mean the same option.
        if len(matches) == 1 or (not spec.strict and len(canon) == 1):
            return matches[0]
        self.problems.add("invalid-launcher-option", self.where(index, name),
                          f"{program} {name} is ambiguous: it could be {', '.join(matches)}")
        return None

    # ---- the walk ----------------------------------------------------------------------

    def run(self) -> tuple[LaunchCommand, tuple[Problem, ...]]:
        if not self.tokens:
            self.fail("the command is empty")
        else:
            self.program(0)
        if self.script is None:
            seen = " ".join(self.tokens[:12]) + (" ..." if len(self.tokens) > 12 else "")
            reason = self.failure or "no training script was found"
            self.problems.add("no-training-script", COMMAND_LOCATION,
                              f"{reason} (the command was: {seen})" if self.tokens else reason)
        world_size, source, used = self.world_size()
        script_index = self.script_index
        command = LaunchCommand(
            argv=self.argv,
            launcher=self.launcher or (self.chain[-1] if self.chain else ""),
            script=self.script,
            script_index=script_index,
            megatron_argv=tuple(self.tokens[script_index + 1:]) if script_index is not None else (),
            world_size=world_size,
            world_size_source=source,
            script_is_module=self.is_module,
            tokens=tuple(self.tokens),
            locations=tuple(self.locs) if self.locs is not None else None,
            launchers=tuple(self.chain),
            environment=tuple(self.assigned.items()),
            world_size_tokens=used,
        )
        return command, self.problems.problems

    def world_size(self) -> tuple[int | None, str, tuple[int, ...]]:
        if self.script is None:
            return None, "no training script was found, so no launcher either", ()
        if self.unknown_program is not None:
            return None, (f"{self.unknown_program} is not a launcher this tool knows, so how many processes "
                          "it starts is unknown"), ()
        torchruns = [s for s in self.spawners if s[0] in TORCHRUN_FAMILY]
        if torchruns:
            return torchruns[-1][1], torchruns[-1][2], torchruns[-1][3]
        if self.spawners:
            return self.spawners[-1][1], self.spawners[-1][2], self.spawners[-1][3]
        # plain python / the script run directly: Megatron reads WORLD_SIZE
        # (megatron/training/arguments.py: int(os.getenv("WORLD_SIZE", '1')))
        size = self.env_int("WORLD_SIZE")
        if size is not None:
            return size, self.env_phrase("WORLD_SIZE"), ()
        if "WORLD_SIZE" in self.env and self.env["WORLD_SIZE"].strip():
            return None, f"WORLD_SIZE={self.env['WORLD_SIZE']!r} is not a positive integer", ()
        what = "plain python" if self.launcher == "python" else "the script run directly"
        return 1, f"{what}: 1 process", ()

    def spawned(self, kind: str, size: int | None, sentence: str) -> None:
        self.spawners.append((kind, size, sentence, tuple(self.read)))
        self.read = []

    def note_read(self, opt: "_Opt | None") -> None:
        if opt is not None:
            self.read.append(opt.index)
            if opt.value_index is not None and opt.value_index != opt.index:
                self.read.append(opt.value_index)

    def opaque(self, opt: "_Opt", program: str) -> str | None:
        """A sentence when the value of ``opt`` is not known statically, else None."""
        reason = self.unresolved(opt.value_index)
        if reason is None:
            return None
        return f"{program} {self.said(opt)} is not known statically: {reason}"

    def program(self, i: int) -> None:
        """Dispatch on the program at token ``i``."""
        if i is None or i >= len(self.tokens):
            last = self.chain[-1] if self.chain else "the command"
            self.fail(f"{last} is not followed by a program to run")
            return
        tok = self.tokens[i]
        name = _program_name(tok)
        reason = self.unresolved(i)
        if reason is not None and not tok.endswith(".py"):
            self.fail(f"the program `{tok}`{self.at(i)} is not known statically: {reason}")
            return
        if tok.endswith(".py"):
            self.chain.append("script")
            self.launcher = self.launcher or "script"
            return self.found(i, module=False)
        if _PYTHON_NAME.match(name):
            return self.python(i)
        if name in ("torchrun", "ft_launcher"):
            self.chain.append(name)
            spec = _FT_LAUNCHER if name == "ft_launcher" else _TORCHRUN
            return self.torchrun(i + 1, name, spec)
        if name == "srun":
            return self.srun(i)
        if name in _MPI_NAMES:
            return self.mpirun(i, name)
        if name == "env":
            return self.env_wrapper(i)
        if name in _SHELLS:
            return self.shell(i, name)
        if name == "nsys":
            return self.nsys(i)
        if name == "uv":
            return self.uv(i)
        if name in ("singularity", "apptainer"):
            return self.container(i, name)
        if name in _SIMPLE_WRAPPERS:
            return self.simple_wrapper(i, name)
        # A program this tool does not know (deepspeed, accelerate, a site wrapper): the first
        # *.py after it is taken as the script, but how many processes it starts is unknown.
        self.chain.append(name)
        for j in range(i + 1, len(self.tokens)):
            if self.tokens[j].endswith(".py") and not self.tokens[j].startswith("-"):
                self.unknown_program = name
                self.launcher = name
                return self.found(j, module=False)
        self.fail(f"{name} is not python, torchrun or a launcher this tool knows, and no *.py script follows it")

    def found(self, index: int, module: bool) -> None:
        self.script = self.tokens[index]
        self.script_index = index
        self.is_module = module

    # ---- python and torchrun --------------------------------------------------------

    def python(self, i: int) -> None:
        self.chain.append("python")
        tokens = self.tokens
        j = i + 1
        while j < len(tokens):
            tok = tokens[j]
            if tok == "-":
                return self.fail("python reads its program from standard input (-)")
            if tok.startswith("--"):
                name, eq, _ = tok.partition("=")
                if name == "--check-hash-based-pycs":
                    j += 1 if eq else 2
                    continue
                if name in _PYTHON_LONG_FLAGS:
                    return self.fail(f"python {name} runs no script")
                return self.fail(f"python has no option {name}")
            if tok.startswith("-") and len(tok) > 1:
                k = 1
                advance = 1
                while k < len(tok):
                    ch = tok[k]
                    if ch in _PYTHON_FLAGS:
                        k += 1
                        continue
                    if ch in "WX":
                        advance = 1 if k + 1 < len(tok) else 2
                        break
                    if ch == "c":
                        return self.fail("python -c runs a command string, not a training script")
                    if ch == "m":
                        if k + 1 < len(tok):
                            return self.module(tok[k + 1:], j, glued=True)
                        if j + 1 >= len(tokens):
                            return self.fail("python -m is not followed by a module")
                        return self.module(tokens[j + 1], j + 1, glued=False)
                    return self.fail(f"python has no option -{ch}")
                j += advance
                continue
            # the program file
            if _program_name(tok) == "torchrun":
                self.chain.append("torchrun")
                return self.torchrun(j + 1, "torchrun", _TORCHRUN)
            self.launcher = self.launcher or "python"
            return self.found(j, module=False)
        return self.fail("python is not given a script")

    def module(self, module: str, index: int, glued: bool) -> None:
        if module in ("torch.distributed.run", "torch.distributed.launch"):
            self.chain.append(module)
            spec = _TORCH_LAUNCH if module == "torch.distributed.launch" else _TORCHRUN
            return self.torchrun(index + 1, module, spec)
        self.launcher = self.launcher or "python"
        if glued:
            # python -mpkg.mod: the module name shares the token with -m; point at that token
            self.script = module
            self.script_index = index
            self.is_module = True
            return
        return self.found(index, module=True)

    def torchrun(self, start: int, name: str, spec: _Options) -> None:
        before = len(self.problems)
        parsed = self.parse_options(start, spec, name)
        refused = len(self.problems) > before       # argparse stops at a bad option: nothing starts
        self.launcher = name
        nnodes = parsed.last("nnodes")
        nproc = parsed.last("nproc-per-node")
        self.note_read(nnodes)
        self.note_read(nproc)
        opaque = (self.opaque(nnodes, name) if nnodes else None) or (self.opaque(nproc, name) if nproc else None)
        if opaque:
            size, sentence = None, opaque
        else:
            size, sentence = self.torchrun_world_size(name, nnodes, nproc)
        if refused and size is not None:
            size, sentence = None, f"{name} would refuse its options, so it starts no process"
        self.spawned(name, size, sentence)
        if parsed.program is None:
            return self.fail(f"{name} is not given a training script")
        index = parsed.program
        flags = {opt.name for opt in parsed.options}
        if "module" in flags:
            return self.found(index, module=True)
        if "no-python" in flags and "run-path" not in flags:
            program = self.tokens[index]
            if program.endswith(".py"):
                return self.found(index, module=False)
            if _PYTHON_NAME.match(_program_name(program)) or _program_name(program) in _SIMPLE_WRAPPERS:
                saved = self.launcher
                self.program(index)       # the processes it starts run this program
                self.launcher = saved
                return
            return self.fail(f"{name} --no-python runs {program}, which is not a python script")
        return self.found(index, module=False)

    def torchrun_world_size(self, name: str, nnodes: _Opt | None, nproc: _Opt | None) -> tuple[int | None, str]:
        parts = [name]
        # --- nodes: the minimum of MIN:MAX counts (torch/distributed/run.py parse_min_max_nnodes)
        if nnodes is not None:
            raw, origin = nnodes.value, self.said(nnodes)
            where = self.where(nnodes.index, nnodes.spelled)
        elif "PET_NNODES" in self.env:
            raw, origin, where = self.env["PET_NNODES"], self.env_phrase("PET_NNODES"), "PET_NNODES"
        else:
            raw, origin, where = "1", "default --nnodes 1", None
        nodes = self._parse_nnodes(raw, where, name)
        # --- processes per node
        if nproc is not None:
            praw, porigin = nproc.value, self.said(nproc)
            pwhere = self.where(nproc.index, nproc.spelled)
        elif "PET_NPROC_PER_NODE" in self.env:
            praw, porigin, pwhere = self.env["PET_NPROC_PER_NODE"], self.env_phrase("PET_NPROC_PER_NODE"), "PET_NPROC_PER_NODE"
        else:
            praw, porigin, pwhere = "1", "default --nproc-per-node 1", None
        per_node, device_note = self._parse_nproc(praw, pwhere, name)
        if nodes is None or (per_node is None and device_note is None):
            return None, f"{name}: invalid {'--nnodes' if nodes is None else '--nproc-per-node'} value"
        node_part = origin
        if nodes is not None and ":" in raw:
            node_part += f" (minimum {nodes})"
        if per_node is None:
            return None, f"{name} {porigin}: {device_note}"
        proc_part = porigin + (f" ({device_note})" if device_note else "")
        parts.append(proc_part)
        parts.append("x")
        parts.append(node_part)
        return nodes * per_node, " ".join(parts)

    def _parse_nnodes(self, raw: str, where: str | None, name: str) -> int | None:
        pieces = raw.split(":")
        try:
            numbers = [int(p) for p in pieces]
        except ValueError:
            numbers = []
        if len(pieces) > 2 or not numbers or not (0 < numbers[0] <= numbers[-1]):
            self.problems.add("invalid-launcher-option", where or "--nnodes",
                              f"{name} --nnodes {raw!r} is not a node count or a MIN:MAX range with 0 < MIN <= MAX")
            return None
        return numbers[0]

    def _parse_nproc(self, raw: str, where: str | None, name: str) -> tuple[int | None, str | None]:
        """(processes per node, note); (None, note) when a device count is needed but unknown."""
        try:
            value = int(raw)
        except ValueError:
            value = None
        if value is not None:
            if value <= 0:
                self.problems.add("invalid-launcher-option", where or "--nproc-per-node",
                                  f"{name} --nproc-per-node {raw!r} must be a positive number of processes")
                return None, None
            return value, None
        if raw in ("gpu", "auto"):
            # torch/distributed/run.py determine_local_world_size: one process per visible device
            visible = self.env.get("CUDA_VISIBLE_DEVICES")
            if visible is not None and visible.strip():
                count = len([d for d in visible.split(",") if d.strip()])
                return count, f"{self.env_phrase('CUDA_VISIBLE_DEVICES')}: {count} GPUs"
            gpus = self.env_int("SLURM_GPUS_ON_NODE")
            if gpus is not None:
                return gpus, f"{self.env_phrase('SLURM_GPUS_ON_NODE')}"
            return None, ("one process per GPU of the machine it runs on, which the environment does not say "
                          "(no CUDA_VISIBLE_DEVICES or SLURM_GPUS_ON_NODE)")
        if raw in ("cpu", "xpu"):
            return None, f"one process per {raw.upper()} device of the machine it runs on, which is unknown here"
        self.problems.add("invalid-launcher-option", where or "--nproc-per-node",
                          f"{name} --nproc-per-node {raw!r} is not a number nor one of gpu, auto, cpu, xpu")
        return None, None

    # ---- srun and mpirun --------------------------------------------------------------

    def srun(self, i: int) -> None:
        self.chain.append("srun")
        parsed = self.parse_options(i + 1, _SRUN, "srun")
        for opt in parsed.all("export"):
            self._export_list(opt.value or "", "srun --export")
        counted = [parsed.last(k) for k in ("ntasks", "nodes", "ntasks-per-node", "tasks-per-node")]
        for opt in counted:
            self.note_read(opt)
        opaque = next((self.opaque(o, "srun") for o in counted if o is not None and self.opaque(o, "srun")), None)
        if opaque:
            size, sentence = None, opaque
        else:
            size, sentence = self.srun_world_size(parsed)
        self.spawned("srun", size, sentence)
        self.launcher = "srun"
        if parsed.program is None:
            return self.fail("srun is not given a program")
        return self.program(parsed.program)

    def _export_list(self, value: str, by: str) -> None:
        for item in value.split(","):
            if "=" in item:
                var, _, val = item.partition("=")
                if re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", var):
                    self.set_env(var, val, by)

    def _int_option(self, opt: _Opt, program: str, allow_range: bool = False) -> int | None:
        raw = opt.value or ""
        text = raw
        if allow_range:
            text = re.split(r"[-,:]", raw, maxsplit=1)[0] if raw else raw
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value <= 0:
            form = " or a MIN-MAX range" if allow_range else ""
            self.problems.add("invalid-launcher-option", self.where(opt.index, opt.spelled),
                              f"{program} {opt.spelled} {raw!r} is not a positive count{form}")
            return None
        return value

    def _gpus_per_node(self, opt: _Opt) -> int | None:
        raw = opt.value or ""
        count = raw.rsplit(":", 1)[-1]
        try:
            return int(count)
        except ValueError:
            self.problems.add("invalid-launcher-option", self.where(opt.index, opt.spelled),
                              f"srun {opt.spelled} {raw!r} is not a GPU count (N or TYPE:N)")
            return None

    def srun_world_size(self, parsed: _Parsed) -> tuple[int | None, str]:
        ntasks_opt = parsed.last("ntasks")
        nodes_opt = parsed.last("nodes")
        ntpn_opt = parsed.last("ntasks-per-node") or parsed.last("tasks-per-node")
        gpn_opt = parsed.last("gpus-per-node")
        if gpn_opt is not None:
            self._gpus_per_node(gpn_opt)          # checked; GPUs do not decide how many tasks run
        ntasks = self._int_option(ntasks_opt, "srun") if ntasks_opt else None
        nodes = self._int_option(nodes_opt, "srun", allow_range=True) if nodes_opt else None
        ntpn = self._int_option(ntpn_opt, "srun") if ntpn_opt else None
        bad = (ntasks_opt and ntasks is None) or (nodes_opt and nodes is None) or (ntpn_opt and ntpn is None)
        if bad:
            return None, "srun: invalid task or node count"

        spelled = self.said

        if ntasks is not None:
            return ntasks, f"srun {spelled(ntasks_opt)}"
        if nodes is not None or ntpn is not None:
            parts = ["srun"]
            if nodes is not None:
                parts.append(spelled(nodes_opt) + (f" (minimum {nodes})" if not nodes_opt.value.isdigit() else ""))
            else:
                env_nodes = self._env_nodes()
                if env_nodes is not None:
                    nodes = env_nodes[0]
                    parts.append(f"with {env_nodes[1]}")
                else:
                    nodes = 1
                    parts.append("on 1 node (no node count given)")
            if ntpn is not None:
                parts.append(spelled(ntpn_opt))
            else:
                per = self._env_tasks_per_node("SLURM_NTASKS_PER_NODE")
                if per is not None and len(set(per)) == 1:
                    ntpn = per[0]
                    parts.append(f"with {self.env_phrase('SLURM_NTASKS_PER_NODE')}")
                else:
                    ntpn = 1
                    parts.append("with 1 task per node (no --ntasks-per-node given)")
            return nodes * ntpn, " ".join(parts)
        # Nothing on the command: srun runs the allocation it is inside of.
        for var in ("SLURM_NTASKS", "SLURM_NPROCS"):
            value = self.env_int(var)
            if value is not None:
                return value, f"srun with {self.env_phrase(var)}"
        env_nodes = self._env_nodes()
        per = self._env_tasks_per_node("SLURM_NTASKS_PER_NODE")
        if env_nodes is not None and per is not None and len(set(per)) == 1:
            return env_nodes[0] * per[0], f"srun with {env_nodes[1]} and {self.env_phrase('SLURM_NTASKS_PER_NODE')}"
        layout = self._env_tasks_per_node("SLURM_TASKS_PER_NODE")
        if layout is not None:
            return sum(layout), f"srun with {self.env_phrase('SLURM_TASKS_PER_NODE')}"
        if env_nodes is not None:
            return env_nodes[0], f"srun with {env_nodes[1]}: 1 task per node"
        return 1, "srun with no task or node count, outside a Slurm allocation: 1 task"

    def _env_nodes(self) -> tuple[int, str] | None:
        for var in ("SLURM_NNODES", "SLURM_JOB_NUM_NODES"):
            value = self.env_int(var)
            if value is not None:
                return value, self.env_phrase(var)
        return None

    def _env_tasks_per_node(self, var: str) -> list[int] | None:
        """'8', '8(x2)', '8(x2),4' -> the count on each node ([8], [8, 8], [8, 8, 4])."""
        raw = self.env.get(var)
        if raw is None or not raw.strip():
            return None
        counts: list[int] = []
        for item in raw.strip().split(","):
            match = re.fullmatch(r"\s*(\d+)\s*(?:\(x(\d+)\))?\s*", item)
            if not match or int(match.group(1)) <= 0:
                self.problems.add("invalid-launch-environment", var,
                                  f"{var}={raw!r} is not a task layout such as 8 or 8(x2)")
                return None
            counts.extend([int(match.group(1))] * int(match.group(2) or 1))
        return counts

    def mpirun(self, i: int, name: str) -> None:
        self.chain.append(name)
        parsed = self.parse_options(i + 1, _MPIRUN, name)
        for opt in parsed.options:
            if opt.name == "x" and opt.value and "=" in opt.value:
                var, _, val = opt.value.partition("=")
                self.set_env(var, val, f"{name} -x")
            elif opt.spelled in ("-genv", "-env") and len(opt.values) == 2:
                self.set_env(opt.values[0], opt.values[1], f"{name} {opt.spelled}")
        counted = [parsed.last(k) for k in ("np", "n", "c", "N", "npernode", "ppn", "perhost", "map-by", "host", "hosts")]
        for opt in counted:
            self.note_read(opt)
        opaque = next((self.opaque(o, name) for o in counted if o is not None and self.opaque(o, name)), None)
        if opaque:
            size, sentence = None, opaque
        else:
            size, sentence = self.mpirun_world_size(parsed, name)
        self.spawned(name, size, sentence)
        self.launcher = name
        if parsed.program is None:
            return self.fail(f"{name} is not given a program")
        return self.program(parsed.program)

    def mpirun_world_size(self, parsed: _Parsed, name: str) -> tuple[int | None, str]:
        count_opt = parsed.last("np") or parsed.last("n") or parsed.last("c")
        if count_opt is not None:
            value = self._int_option(count_opt, name)
            if value is None:
                return None, f"{name}: invalid process count"
            return value, f"{name} {self.said(count_opt)}"
        per_opt = None
        for key in ("N", "npernode", "ppn", "perhost"):
            per_opt = per_opt or parsed.last(key)
        map_by = parsed.last("map-by")
        per = None
        per_text = ""
        if per_opt is not None:
            per = self._int_option(per_opt, name)
            if per is None:
                return None, f"{name}: invalid processes-per-node count"
            per_text = self.said(per_opt)
        elif map_by is not None and re.fullmatch(r"ppr:(\d+):node(:.*)?", map_by.value or ""):
            per = int(re.fullmatch(r"ppr:(\d+):node(:.*)?", map_by.value).group(1))
            per_text = self.said(map_by)
        hosts_opt = parsed.last("host") or parsed.last("hosts")
        host_slots = None
        if hosts_opt is not None and hosts_opt.value:
            host_slots = []
            for host in hosts_opt.value.split(","):
                _host, _, slots = host.partition(":")
                host_slots.append(int(slots) if slots.isdigit() else 1)
        if per is not None:
            if host_slots is not None:
                return per * len(host_slots), f"{name} {per_text} x {len(host_slots)} hosts of {hosts_opt.spelled} {hosts_opt.value}"
            env_nodes = self._env_nodes()
            if env_nodes is not None:
                return per * env_nodes[0], f"{name} {per_text} with {env_nodes[1]}"
            return None, f"{name} {per_text} per node, but the number of nodes (a host file or the allocation) is not in the command"
        if host_slots is not None:
            return sum(host_slots), f"{name} {hosts_opt.spelled} {hosts_opt.value}: one process per slot"
        for var in ("SLURM_NTASKS", "SLURM_NPROCS"):
            value = self.env_int(var)
            if value is not None:
                return value, f"{name} with {self.env_phrase(var)}"
        env_nodes = self._env_nodes()
        layout = self._env_tasks_per_node("SLURM_NTASKS_PER_NODE")
        if env_nodes is not None and layout is not None and len(set(layout)) == 1:
            return env_nodes[0] * layout[0], f"{name} with {env_nodes[1]} and {self.env_phrase('SLURM_NTASKS_PER_NODE')}"
        return None, (f"{name} without -np starts one process per slot of its host file or allocation, "
                      "which the command does not show")

    # ---- wrappers -----------------------------------------------------------------------

    def env_wrapper(self, i: int) -> None:
        self.chain.append("env")
        tokens = self.tokens
        parsed_end = i + 1
        j = i + 1
        while j < len(tokens):
            tok = tokens[j]
            if tok in ("-i", "--ignore-environment", "-"):
                for var in list(self.env):
                    del self.env[var]
                self.assigned.clear()
                self.chain[-1] = "env -i"
                j += 1
                continue
            if tok == "--":
                j += 1
                break
            if tok.startswith("-u") or tok.startswith("--unset"):
                if tok in ("-u", "--unset"):
                    var = tokens[j + 1] if j + 1 < len(tokens) else ""
                    j += 2
                else:
                    var = tok[2:] if tok.startswith("-u") and not tok.startswith("--") else tok.partition("=")[2]
                    j += 1
                self.env.pop(var, None)
                self.assigned.pop(var, None)
                continue
            if tok in ("-C", "--chdir"):
                j += 2
                continue
            if tok.startswith("--chdir=") or (tok.startswith("-C") and len(tok) > 2):
                j += 1
                continue
            if tok in ("-S", "--split-string") or tok.startswith("--split-string=") or (tok.startswith("-S") and len(tok) > 2):
                if tok in ("-S", "--split-string"):
                    text, consumed = (tokens[j + 1] if j + 1 < len(tokens) else ""), 2
                elif tok.startswith("--"):
                    text, consumed = tok.partition("=")[2], 1
                else:
                    text, consumed = tok[2:], 1
                import shlex

                pieces = shlex.split(text)
                loc = self.locs[j] if self.locs is not None else None
                self.tokens[j:j + consumed] = pieces
                if self.locs is not None:
                    self.locs[j:j + consumed] = [loc] * len(pieces)
                continue
            if tok.startswith("-") and len(tok) > 1:
                j += 1                 # -0, -v, --debug, --ignore-signal=...: no effect here
                continue
            break
        parsed_end = j
        while parsed_end < len(tokens) and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", tokens[parsed_end]):
            var, _, value = tokens[parsed_end].partition("=")
            self.set_env(var, value, "env")
            parsed_end += 1
        if parsed_end >= len(tokens):
            return self.fail("env is not given a program")
        return self.program(parsed_end)

    def simple_wrapper(self, i: int, name: str) -> None:
        self.chain.append(name)
        tokens = self.tokens
        if name in ("nohup", "exec"):
            j = i + 1
            if name == "exec":
                while j < len(tokens) and tokens[j] in ("-c", "-l"):
                    j += 1
                if j < len(tokens) and tokens[j] == "-a":
                    j += 2
            if j < len(tokens) and tokens[j] == "--":
                j += 1
            return self.program(j)
        if name == "taskset":
            parsed = self.parse_options(i + 1, _TASKSET, "taskset")
            if parsed.program is None:
                return self.fail("taskset is not given a CPU mask and a program")
            return self.program(parsed.program + 1)      # skip the mask / CPU list
        if name == "timeout":
            parsed = self.parse_options(i + 1, _TIMEOUT, "timeout")
            if parsed.program is None:
                return self.fail("timeout is not given a duration and a program")
            return self.program(parsed.program + 1)      # skip the duration
        if name == "nice" and i + 1 < len(tokens) and re.fullmatch(r"-\d+", tokens[i + 1]):
            return self.program(i + 2)                   # nice -10 cmd (old form)
        spec = _SIMPLE_WRAPPERS[name]
        parsed = self.parse_options(i + 1, spec, name)
        if parsed.program is None:
            return self.fail(f"{name} is not given a program")
        return self.program(parsed.program)

    def nsys(self, i: int) -> None:
        tokens = self.tokens
        sub = tokens[i + 1] if i + 1 < len(tokens) else ""
        if sub not in ("profile", "launch", "nvprof"):
            self.chain.append("nsys")
            return self.fail(f"nsys {sub} does not run a program (expected nsys profile or nsys launch)")
        self.chain.append(f"nsys {sub}")
        parsed = self.parse_options(i + 2, _NSYS, f"nsys {sub}")
        for opt in parsed.all("env-var"):
            for item in (opt.value or "").split(","):
                if "=" in item:
                    var, _, val = item.partition("=")
                    self.set_env(var, val, "nsys --env-var")
        if parsed.program is None:
            return self.fail(f"nsys {sub} is not given a program")
        return self.program(parsed.program)

    def uv(self, i: int) -> None:
        tokens = self.tokens
        if i + 1 >= len(tokens) or tokens[i + 1] != "run":
            self.chain.append("uv")
            sub = tokens[i + 1] if i + 1 < len(tokens) else ""
            return self.fail(f"uv {sub} does not run a training script (expected uv run)".replace("  ", " "))
        self.chain.append("uv run")
        parsed = self.parse_options(i + 2, _UV_RUN, "uv run")
        if parsed.program is None:
            return self.fail("uv run is not given a program")
        if parsed.last("module") is not None:
            self.launcher = self.launcher or "python"
            self.chain.append("python")
            return self.module(tokens[parsed.program], parsed.program, glued=False)
        if tokens[parsed.program].endswith(".py"):
            self.chain.append("python")            # uv run x.py runs it with the project's python
            self.launcher = self.launcher or "python"
            return self.found(parsed.program, module=False)
        return self.program(parsed.program)

    def container(self, i: int, name: str) -> None:
        tokens = self.tokens
        sub = tokens[i + 1] if i + 1 < len(tokens) else ""
        if sub not in ("exec", "run"):
            self.chain.append(name)
            return self.fail(f"{name} {sub} does not run a program this tool can follow (expected {name} exec)")
        self.chain.append(f"{name} {sub}")
        parsed = self.parse_options(i + 2, _CONTAINER_EXEC, f"{name} {sub}")
        for opt in parsed.all("env"):
            for item in (opt.value or "").split(","):
                if "=" in item:
                    var, _, val = item.partition("=")
                    self.set_env(var, val, f"{name} --env")
        if parsed.program is None or parsed.program + 1 >= len(tokens):
            return self.fail(f"{name} {sub} is not given an image and a program")
        return self.program(parsed.program + 1)         # skip the image

    def shell(self, i: int, name: str) -> None:
        tokens = self.tokens
        j = i + 1
        has_c = False
        while j < len(tokens):
            tok = tokens[j]
            if tok == "--":
                j += 1
                break
            if tok in _BASH_VALUE_OPTIONS:
                j += 2
                continue
            if tok in _BASH_LONG_FLAGS:
                j += 1
                continue
            if len(tok) > 1 and tok[0] in "-+" and not tok.startswith("--"):
                if "c" in tok[1:]:
                    has_c = True
                j += 1
                continue
            break
        if not has_c:
            self.chain.append(name)
            if j < len(tokens):
                return self.fail(f"{name} runs the shell script {tokens[j]}; read that file as a launch script")
            return self.fail(f"{name} is not given a command")
        if j >= len(tokens):
            self.chain.append(f"{name} -c")
            return self.fail(f"{name} -c is not given a command string")
        self.chain.append("sh -c")
        string = tokens[j]
        positional = tuple(tokens[j + 1:])
        splitter = self.splitter
        if splitter is None:
            from megatron_estimator.inputs.bash.reader import split_command_string as splitter  # the shell loader reads shell source
        string_loc = self.locs[j] if self.locs is not None else None
        commands, problems = splitter(string, dict(self.env), positional, str(string_loc) if string_loc else None)
        self.problems.extend(problems)
        seen = []
        for command in commands:
            if not command.tokens:
                continue
            seen.append(command.tokens[0])
            env = dict(self.env)
            env.update(command.environment)
            trial, _ = parse_launch_command(command.tokens, env, split_command_string=splitter)
            if trial.script is None:
                continue
            prefix = self.tokens[:j]
            self.tokens = prefix + list(command.tokens)
            if self.locs is not None:
                inner = list(command.locations) if command.locations is not None else [string_loc] * len(command.tokens)
                self.locs = self.locs[:j] + inner
            elif command.locations is not None:
                self.locs = [None] * j + list(command.locations)
            for var, value in command.environment:
                self.set_env(var, value, "sh -c")
            return self.program(j)
        if not seen:
            return self.fail(f"{name} -c starts no program, only shell builtins")
        return self.fail(f"{name} -c runs {', '.join(seen)}, and none of it starts a training script")
