"""NeMo-RL (NVIDIA-NeMo/RL): ``uv run examples/run_grpo.py --config X.yaml key=value ...``.

Its example programs (``examples/run_grpo.py``, ``run_sft.py``, ``run_dpo.py`` ...) parse
``--config`` with argparse's ``parse_known_args``; every other word is a Hydra override applied to
the loaded config (``nemo_rl/utils/config.py`` ``parse_hydra_overrides``).  ``--config`` is a path
relative to the working directory; without it the program loads its default,
``os.path.join(os.path.dirname(__file__), "configs", "<name>.yaml")`` (``run_grpo.py:81-84``:
``grpo_math_1B.yaml``), read here from the program's source.  The config is read by
``inputs/trees/nemo_rl.py`` (``read_nemo_rl``): the policy's Megatron settings and the world size
(``cluster.num_nodes`` x ``cluster.gpus_per_node``).  Facts from NVIDIA-NeMo/RL 7ea279ab.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    from typing import Sequence

from megatron_estimator.inputs.frameworks.adapter import ArgvRead, Framework
from megatron_estimator.inputs.frameworks.tree_launch import LaunchWords, as_argv_read, config_not_found, file_relative_default
from megatron_estimator.inputs.rawargs import RawArgs

_CONFIG = "--config"


class _Launch:
    """The launch's words as the example program reads them, and the config file (or why not)."""

    def __init__(self, argv: Sequence[str], locations: Sequence[str] | None, path: str | None,
                 base_dirs: Sequence[str]):
        words = LaunchWords(argv, locations, {_CONFIG: "config"}, "NeMo-RL",
                            "a flag of NeMo-RL's example programs (--config, then key.path=value overrides)")
        self.overrides, self.override_at, self.problems = words.overrides, words.override_at, words.problems
        config = words.values.get("config")
        self.file = self.missing = None
        self.how = f"--config {config}"
        if config is None:
            parts = file_relative_default(path)
            if parts is None:
                self.missing = ("no --config, and the program's default config cannot be told: "
                                + ("its source is not on this machine" if path is None else
                                   f"{path} has no os.path.join(os.path.dirname(__file__), ...yaml)"))
                return
            self.file = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(path)), *parts))
            self.how = f"no --config: the program's default {'/'.join(parts)} ({path})"
            if not os.path.isfile(self.file):
                self.missing, self.file = f"{self.how}: no such file", None
            return
        dirs = ("",) if os.path.isabs(config) else tuple(base_dirs) or (os.getcwd(),)
        found = next((os.path.join(d, config) for d in dirs if os.path.isfile(os.path.join(d, config))), None)
        if found is None:
            self.missing = f"--config {config}: no such file (relative to the working directory)"
        else:
            self.file = os.path.normpath(found)


def _read_argv(argv, locations, entry, path, base_dirs, specs, release) -> ArgvRead:
    from megatron_estimator.inputs.trees.common import extra_problem
    from megatron_estimator.inputs.trees.nemo_rl import read_nemo_rl

    where = entry.location
    missing = extra_problem(where, "a NeMo-RL launch")
    if missing is not None:
        return ArgvRead(RawArgs({}, where), (missing,))
    launch = _Launch(argv, locations, path, base_dirs)
    if launch.file is None:
        return config_not_found(where, "NeMo-RL", launch.problems, launch.missing)
    reading = read_nemo_rl(launch.file, launch.overrides, release=release, overrides_at=launch.override_at)
    said = (f"NeMo-RL: {launch.file} ({launch.how}) with this launch's {len(launch.overrides)} override(s) "
            "(nemo_rl/utils/config.py load_config, parse_hydra_overrides)",)
    return as_argv_read(reading, where, said, launch.problems)


def _launch_skip(argv: Sequence[str], path: str | None, script: str, release: str = "main",
                 base_dirs: Sequence[str] = ()) -> str | None:
    from megatron_estimator.inputs.trees.common import extra_problem
    from megatron_estimator.inputs.trees.nemo_rl import read_nemo_rl

    if extra_problem(script, "it") is not None:
        return "not checked: a NeMo-RL launch needs pip install 'megatron-estimator[frameworks]'"
    launch = _Launch([a.strip("\"'") for a in argv], None, path, base_dirs)
    if launch.file is None:
        return f"not checked: NeMo-RL launch: {launch.missing}"
    return read_nemo_rl(launch.file, launch.overrides, release=release).skip


def _confirm(argv: Sequence[str]) -> bool:
    """Only --config and key=value words: NeMo-RL's command line, not Megatron flags."""
    words = [w.strip("\"'") for w in argv]
    return all(w.split("=", 1)[0] == _CONFIG or (not w.startswith("-") and "=" in w)
                               or (i > 0 and words[i - 1] == _CONFIG) for i, w in enumerate(words))


FRAMEWORK = Framework(
    name="NeMo-RL",
    entry_patterns=("examples/run_*.py",),
    imports=("nemo_rl",),
    read_argv=_read_argv,
    launch_skip=_launch_skip,
    confirm=_confirm,
)
