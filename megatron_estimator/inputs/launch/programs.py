"""The programs a launch walks through, and how each spells its options (getopt / argparse style):
launchers (torchrun, srun, mpirun...), wrappers (env, numactl, nsys, taskset, timeout, uv run,
singularity exec...), python and shells."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
import re
from typing import Mapping


@dataclass(frozen=True)
class Options:
    """How one program spells its options (getopt / argparse style)."""

    values: Mapping[str, str]                   # option spelling -> canonical name; takes a value
    flags: Mapping[str, str] = field(default_factory=dict)    # spelling -> canonical; no value
    optional: frozenset[str] = frozenset()     # long options whose value must be glued with '='
    pairs: frozenset[str] = frozenset()        # options taking two values (mpirun --mca k v)
    single_dash_long: bool = False             # -np, -hostfile (mpirun)
    abbreviations: bool = True                 # unique prefixes of long options accepted
    strict: bool = False                       # unknown options are errors (argparse)
    short_equals: bool = False                 # -r=3 means -r 3 (argparse)


def aliases(*groups: tuple[str, ...]) -> dict[str, str]:
    """Each group: spellings of one option; the canonical name is the first long spelling."""
    table: dict[str, str] = {}
    for spellings in groups:
        canonical = next((s for s in spellings if s.startswith("--")), spellings[0]).lstrip("-").replace("_", "-")
        for spelling in spellings:
            table[spelling] = canonical
    return table


# torch/distributed/run.py get_args_parser(): options with action=env take a value,
# action=check_env options are flags.  torch/distributed/launch.py adds --use-env.
TORCHRUN = Options(
    values=aliases(
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
    flags=aliases(
        ("--standalone",), ("-m", "--module"), ("--no-python", "--no_python"),
        ("--run-path", "--run_path"), ("--virtual-local-rank", "--virtual_local_rank"),
        ("-h", "--help"),
    ),
    strict=True,
    short_equals=True,
)
TORCH_LAUNCH = Options(
    values=TORCHRUN.values,
    flags={**TORCHRUN.flags, **aliases(("--use-env", "--use_env"))},
    strict=True,
    short_equals=True,
)
# nvidia-resiliency-ext's ft_launcher takes torchrun's options plus its own --ft-* ones.
FT_LAUNCHER = Options(
    values={**TORCHRUN.values, **aliases(("--ft-cfg-path", "--ft_cfg_path"), ("--ft-param-rank-section-timeouts",),
                                           ("--ft-param-rank-out-of-section-timeout",))},
    flags={**TORCHRUN.flags, **aliases(("--ignore-missing-fault-tol-cfg", "--ignore_missing_fault_tol_cfg"))},
)

# srun(1): options that take a required argument; those with an optional argument only take
# it glued (--exclusive=user); everything else is a flag.  Pyxis adds the --container-* ones.
SRUN = Options(
    values=aliases(
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
    flags=aliases(
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
MPIRUN = Options(
    values=aliases(
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
    flags=aliases(
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

NUMACTL = Options(
    values=aliases(
        ("-i", "--interleave"), ("-w", "--weighted-interleave"), ("-m", "--membind"),
        ("-N", "--cpunodebind"), ("-C", "--physcpubind"), ("-p", "--preferred"),
        ("-P", "--preferred-many"), ("-b", "--balancing"), ("-S", "--shm"), ("-f", "--file"),
        ("-M", "--shmmode"), ("-V", "--shmid"), ("-L", "--length"), ("-o", "--offset"),
    ),
    flags=aliases(
        ("-a", "--all"), ("-l", "--localalloc"), ("-s", "--show"), ("-H", "--hardware"),
        ("-t", "--strict"), ("-T", "--huge"), ("-u", "--touch"), ("-d", "--dump"), ("-D", "--dump-nodes"),
    ),
)

# `nsys profile` takes a value for almost every switch (--trace=cuda,nvtx, -o name, -f true).
NSYS = Options(
    values=aliases(
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
    flags=aliases(("-h", "--help"), ("-v", "--version")),
)

TASKSET = Options(
    values={},
    flags=aliases(("-a", "--all-tasks"), ("-c", "--cpu-list"), ("-p", "--pid"), ("-h", "--help")),
)

TIME = Options(
    values=aliases(("-f", "--format"), ("-o", "--output")),
    flags=aliases(("-a", "--append"), ("-p", "--portability"), ("-v", "--verbose"), ("-q", "--quiet")),
)

TIMEOUT = Options(
    values=aliases(("-s", "--signal"), ("-k", "--kill-after")),
    flags=aliases(("--preserve-status",), ("--foreground",), ("-v", "--verbose")),
)

STDBUF = Options(values=aliases(("-i", "--input"), ("-o", "--output"), ("-e", "--error")))

NICE = Options(values=aliases(("-n", "--adjustment")))

ENV = Options(
    values=aliases(("-u", "--unset"), ("-C", "--chdir"), ("-S", "--split-string")),
    flags=aliases(("-i", "--ignore-environment"), ("-0", "--null"), ("-v", "--debug")),
    optional=frozenset({"--default-signal", "--ignore-signal", "--block-signal"}),
)

# `uv run` options that take a value (uv's docs, `uv run --help`); -m/--module runs a module.
UV_RUN = Options(
    values=aliases(
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
    flags=aliases(
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
# ray/dashboard/modules/job/cli.py ``submit`` (click): the options before the entrypoint.  click
# takes no abbreviations; options of other ray releases are skipped as unknown ones.
RAY_JOB_SUBMIT = Options(
    values=aliases(
        ("--address",), ("--job-id",), ("--submission-id",), ("--runtime-env",), ("--runtime-env-json",),
        ("--working-dir",), ("--metadata-json",), ("--entrypoint-num-cpus",), ("--entrypoint-num-gpus",),
        ("--entrypoint-memory",), ("--entrypoint-resources",), ("--entrypoint-label-selector",),
        ("--headers",), ("--log-style",), ("--log-color",), ("--verify",),
    ),
    flags=aliases(("--no-wait",), ("-v", "--verbose"), ("--help",)),
    abbreviations=False,
)
CONTAINER_EXEC = Options(
    values=aliases(
        ("-B", "--bind"), ("--env",), ("--env-file",), ("-H", "--home"), ("-W", "--workdir"),
        ("-o", "--overlay"), ("-S", "--scratch"), ("--pwd",), ("--security",), ("--app",),
        ("--mount",), ("--network",), ("--network-args",), ("--hostname",), ("--dns",),
        ("--apply-cgroups",), ("--cpus",), ("--memory",), ("--add-caps",), ("--drop-caps",),
    ),
    flags=aliases(
        ("--nv",), ("--nvccli",), ("--rocm",), ("-c", "--contain"), ("-C", "--containall"),
        ("-e", "--cleanenv"), ("-w", "--writable"), ("--writable-tmpfs",), ("-f", "--fakeroot"),
        ("--no-home",), ("-i", "--ipc"), ("-p", "--pid"), ("-u", "--userns"), ("--no-mount",),
        ("--compat",), ("--no-init",), ("--no-privs",), ("--no-eval",), ("--no-nv",),
    ),
)

BASH_VALUE_OPTIONS = frozenset({"-o", "+o", "-O", "+O", "--rcfile", "--init-file"})
BASH_LONG_FLAGS = frozenset({
    "--login", "--norc", "--noprofile", "--posix", "--noediting", "--restricted", "--verbose",
    "--debugger", "--dump-strings", "--dump-po-strings", "--pretty-print", "--help", "--version",
})

# python(1): single-letter flags, and the options that take a value.
PYTHON_FLAGS = frozenset("bBdEhiIOPqsSuvVxR?")
PYTHON_LONG_FLAGS = frozenset({"--help", "--version", "--help-env", "--help-xoptions", "--help-all"})

PYTHON_NAME = re.compile(r"^python(\d+(\.\d+)*)?[a-z]?$")
MPI_NAMES = frozenset({"mpirun", "mpiexec", "orterun", "prterun", "mpiexec.hydra", "mpirun.openmpi",
                        "mpiexec.openmpi", "mpirun.mpich", "mpiexec.mpich"})
SHELLS = frozenset({"bash", "sh", "dash", "zsh", "ksh"})
SIMPLE_WRAPPERS = {
    "numactl": NUMACTL, "time": TIME, "timeout": None, "stdbuf": STDBUF, "nice": NICE,
    "nohup": None, "taskset": None, "exec": None,
}


def program_name(token: str) -> str:
    return os.path.basename(token)


def is_launch_program(token: str) -> bool:
    """Is this token a program the walk knows (a launcher, a wrapper, python, a *.py script)?"""
    return is_known_program(token)


def is_known_program(token: str) -> bool:
    """A token that is certainly a program (used to tell an unknown option's value from a program)."""
    name = program_name(token)
    return (
        token.endswith(".py")
        or bool(PYTHON_NAME.match(name))
        or name in ("torchrun", "ft_launcher", "srun", "env", "nsys", "uv", "singularity", "apptainer", "ray")
        or name in MPI_NAMES
        or name in SHELLS
        or name in SIMPLE_WRAPPERS
    )


# What an option parse found.


@dataclass
class Opt:
    name: str                 # canonical name, e.g. 'nproc-per-node'
    spelled: str              # as typed, without a glued value: '--nproc_per_node', '-N'
    value: str | None
    index: int                # token index of the option
    value_index: int | None   # token index of the value (== index when glued)
    values: tuple[str, ...] = ()   # for two-valued options


@dataclass
class ParsedOptions:
    options: list[Opt]
    program: int | None                       # index of the first token after the options
    unknown: list[tuple[int, str]]            # (index, spelling) of options not in the table

    def last(self, name: str) -> Opt | None:
        found = None
        for opt in self.options:
            if opt.name == name:
                found = opt
        return found

    def all(self, name: str) -> list[Opt]:
        return [opt for opt in self.options if opt.name == name]


