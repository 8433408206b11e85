"""verl (volcengine/verl): ``python3 -m verl.trainer.main_ppo --config-path P --config-name N key=value ...``.

The entry program is a Hydra application (``@hydra.main(config_path="config",
config_name="ppo_trainer")`` in ``verl/trainer/main_ppo.py``); Hydra parses its whole argv:
``--config-path``/``-cp`` (absolute, or relative to the entry program's folder, as Hydra resolves
a ``config_path`` relative to the file that declares ``@hydra.main``), ``--config-name``/``-cn``,
``--config-dir``/``-cd`` (an extra search folder) and trailing overrides in Hydra's grammar
(``a.b=1``, ``+a.b=1``, ``~a.b``).  Megatron's parser never sees these words.  The composed
config is read by ``inputs/trees/verl.py`` (``read_verl``), which gives the actor's Megatron
settings and the world size (``trainer.nnodes`` x ``trainer.n_gpus_per_node``).

Facts from volcengine/verl b178a3cd: the Hydra programs in ``verl/trainer`` (``main_ppo.py:35``,
``main_generation.py:43`` ...), the examples' ``--config-path=config`` / ``./config``.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    from typing import Sequence

from megatron_estimator.core.problems import Problem
from megatron_estimator.inputs.frameworks.adapter import ArgvRead, Framework
from megatron_estimator.inputs.frameworks.tree_launch import LaunchWords, as_argv_read, config_not_found, hydra_main
from megatron_estimator.inputs.rawargs import RawArgs

# Hydra's own command-line options that take a value (hydra/_internal/utils.py get_args_parser).
_VALUE = {"--config-path": "config_path", "-cp": "config_path", "--config-name": "config_name",
          "-cn": "config_name", "--config-dir": "config_dir", "-cd": "config_dir"}
# What verl's Ray runtime env sets in every worker, the Megatron trainers among them, over the
# launch's environment (verl/trainer/constants_ppo.py PPO_RAY_RUNTIME_ENV, passed to ray.init by
# main_ppo.py run_ppo): the one variable of it Megatron's checks read.
RUNTIME_ENV = (("CUDA_DEVICE_MAX_CONNECTIONS", "1"),)
# verl's programs that train nothing: what each does.
_NOT_TRAINING = {"main_generation": "verl's offline generation", "main_generation_server": "verl's generation server",
                 "main_eval": "verl's evaluation"}
# verl's SFT trainers: fsdp_sft_trainer.py is FSDP only; sft_trainer.py / sft_trainer_ray.py pick an
# engine config group (sft_trainer_engine.yaml defaults: engine@engine: fsdp; engine=megatron).
_SFT = ("fsdp_sft_trainer", "sft_trainer", "sft_trainer_ray")


def _sft_reason(program: str, overrides: Sequence[str]) -> str:
    engine = next((o.split("=", 1)[1] for o in reversed(overrides) if o.split("=", 1)[0] == "engine"), "fsdp")
    if program == "fsdp_sft_trainer" or engine != "megatron":
        return f"verl's SFT trainer {program} with the {engine} engine: not Megatron"
    return (f"not checked: verl's SFT trainer {program} with the megatron engine: its engine config is not read "
            "here (the estimator reads verl's PPO trainer configs)")


class _Launch:
    """The launch's words as Hydra reads them, and the config file they name (or why not)."""

    def __init__(self, argv: Sequence[str], locations: Sequence[str] | None, path: str | None, where: str):
        words = LaunchWords(argv, locations, _VALUE, "verl",
                            "an option of verl's Hydra command line (--config-path, --config-name, "
                            "--config-dir, then key=value overrides)")
        self.values, self.overrides, self.override_at = words.values, words.overrides, words.override_at
        self.problems = words.problems
        declared = hydra_main(path)
        folder = self.values.get("config_path") or (declared or (None, None))[0]
        name = self.values.get("config_name") or (declared or (None, None))[1]
        self.file = self.missing = None
        program = f"verl's entry program{f' {path}' if path else ''}"
        if name is None:
            self.missing = (f"no --config-name, and {program} is not readable here to tell its "
                            "@hydra.main config_name" if declared is None else f"{program} names no config_name")
        elif folder is None:
            self.missing = f"no --config-path, and {program} is not readable here to tell its @hydra.main config_path"
        elif not os.path.isabs(folder) and path is None:
            self.missing = (f"--config-path {folder} is relative to verl's entry program, which is not on this "
                            "machine: run from verl's checkout, or put it on the job's PYTHONPATH")
        else:
            base = folder if os.path.isabs(folder) else os.path.join(os.path.dirname(os.path.abspath(path)), folder)
            file = os.path.join(base, name if name.endswith((".yaml", ".yml")) else name + ".yaml")
            if os.path.isfile(file):
                self.file = os.path.normpath(file)
            else:
                self.missing = f"the config {name} is not in {os.path.normpath(base)} (--config-path {folder})"


def _program(path: str | None, entry_script: str) -> str:
    return os.path.splitext(os.path.basename(path or entry_script.replace(".", "/")))[0]


def _read_argv(argv, locations, entry, path, base_dirs, specs, release) -> ArgvRead:
    from megatron_estimator.inputs.trees.common import extra_problem
    from megatron_estimator.inputs.trees.verl import read_verl

    where = entry.location
    missing = extra_problem(where, "a verl launch")
    if missing is not None:
        return ArgvRead(RawArgs({}, where), (missing,))
    launch = _Launch(argv, locations, path, where)
    program = _program(path, entry.script)
    if program in _SFT or program in _NOT_TRAINING:
        why = _sft_reason(program, launch.overrides) if program in _SFT else f"{_NOT_TRAINING[program]}, no training"
        return ArgvRead(RawArgs({}, where), (Problem("unsupported-stack", where, f"verl launch: {why}"),))
    if launch.file is None:
        return config_not_found(where, "verl", launch.problems, launch.missing)
    reading = read_verl(launch.file, launch.overrides, release=release, overrides_at=launch.override_at)
    said = (f"verl: {launch.file} composed by Hydra with this launch's {len(launch.overrides)} override(s) "
            "(as verl's @hydra.main does)",)
    read = as_argv_read(reading, where, said, launch.problems)
    said = (f"verl: its Ray workers run with {', '.join(f'{k}={v}' for k, v in RUNTIME_ENV)} "
            "(verl/trainer/constants_ppo.py PPO_RAY_RUNTIME_ENV, main_ppo.py run_ppo)",)
    return replace(read, assumptions=read.assumptions + said, environment=RUNTIME_ENV)


def _launch_skip(argv: Sequence[str], path: str | None, script: str, release: str = "main",
                 base_dirs: Sequence[str] = ()) -> str | None:
    from megatron_estimator.inputs.trees.common import extra_problem
    from megatron_estimator.inputs.trees.verl import read_verl

    program = _program(path, script)
    if program in _NOT_TRAINING:
        return f"starts no training: it runs {_NOT_TRAINING[program]} ({script})"
    if extra_problem(script, "it") is not None:
        return "not checked: a verl launch needs pip install 'megatron-estimator[frameworks]'"
    launch = _Launch([a.strip("\"'") for a in argv], None, path, script)
    if program in _SFT:
        return _sft_reason(program, launch.overrides)
    if launch.file is None:
        return f"not checked: verl launch: {launch.missing}"
    return read_verl(launch.file, launch.overrides, release=release).skip


FRAMEWORK = Framework(
    name="verl",
    entry_patterns=("verl/trainer/main_ppo.py", "verl/trainer/main_*.py"),
    imports=("verl",),
    read_argv=_read_argv,
    launch_skip=_launch_skip,
)
