"""The launchers that start the training processes, and how many each starts (the world size).

* torchrun / ``python -m torch.distributed.run`` / ``torch.distributed.launch`` /
  ``ft_launcher``: ``--nnodes`` (the minimum of ``MIN:MAX``) times ``--nproc-per-node``; when an
  option is absent, torchrun's own fallback ``PET_NNODES`` / ``PET_NPROC_PER_NODE`` from the
  environment, then its defaults (1 and 1) -- torch/distributed/run.py ``get_args_parser`` and
  torch/distributed/argparse_util.py ``env``.
* srun: ``-n``; else nodes times ``--ntasks-per-node``; what the command leaves out comes from
  the Slurm allocation in the environment.
* mpirun / mpiexec: ``-np`` / ``-n``; else processes per node times the nodes of ``-H`` or of
  the Slurm allocation.

``DistributedLaunchers`` is a part of the walk (``walk._Walk``): it reads the walk's tokens,
environment and option parser.
"""

from __future__ import annotations

import re

from megatron_estimator.inputs.launch.programs import (
    MPIRUN, PYTHON_NAME, SIMPLE_WRAPPERS, SRUN, Opt, Options, ParsedOptions,
    program_name,
)


class DistributedLaunchers:
    """torchrun, srun and mpirun: the programs that start processes, and their world sizes."""

    def torchrun(self, start: int, name: str, spec: Options) -> None:
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
            if PYTHON_NAME.match(program_name(program)) or program_name(program) in SIMPLE_WRAPPERS:
                saved = self.launcher
                self.program(index)       # the processes it starts run this program
                self.launcher = saved
                return
            return self.fail(f"{name} --no-python runs {program}, which is not a python script")
        return self.found(index, module=False)

    def torchrun_world_size(self, name: str, nnodes: Opt | None, nproc: Opt | None) -> tuple[int | None, str]:
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
        parsed = self.parse_options(i + 1, SRUN, "srun")
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

    def _int_option(self, opt: Opt, program: str, allow_range: bool = False) -> int | None:
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

    def _gpus_per_node(self, opt: Opt) -> int | None:
        raw = opt.value or ""
        count = raw.rsplit(":", 1)[-1]
        try:
            return int(count)
        except ValueError:
            self.problems.add("invalid-launcher-option", self.where(opt.index, opt.spelled),
                              f"srun {opt.spelled} {raw!r} is not a GPU count (N or TYPE:N)")
            return None

    def srun_world_size(self, parsed: ParsedOptions) -> tuple[int | None, str]:
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
        parsed = self.parse_options(i + 1, MPIRUN, name)
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

    def mpirun_world_size(self, parsed: ParsedOptions, name: str) -> tuple[int | None, str]:
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

