"""Megatron-Bridge (NVIDIA-NeMo/Megatron-Bridge): recipes that build a ``ConfigContainer``.

Its launcher ``scripts/training/run_recipe.py`` takes ``--recipe NAME`` (or ``--model`` and
``--mode``), convenience flags that stand for ``ConfigContainer`` overrides
(``COMMON_OVERRIDE_FIELDS``: ``-tp N`` is ``model.tensor_model_parallel_size=N``...) and
trailing ``key.path=value`` overrides in Hydra's grammar (``parse_known_args``: every word its
parser does not know is an override, ``_collect_overrides``); older launchers and the example
programs also take ``--config-file YAML``, an override file laid over the recipe first.
Megatron's parser never sees these words.

The recipe function is the truth for its defaults: where Megatron-Bridge is importable (the
job's tree: the entry program's repository ``src/`` on ``PYTHONPATH``), the recipe is built by
``recipe_runner.load_recipe`` in a subprocess with a time limit and dumped with
``ConfigContainer.to_yaml``; the overrides are laid over that dump and mapped by
``inputs/trees/bridge.py``.  Where it is not, the launch is one ``bridge-not-importable``
problem that says how to dump the config.  The world size is the launcher's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from functools import lru_cache
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    from typing import Sequence

from megatron_estimator.core.problems import Problem
from megatron_estimator.inputs.frameworks.adapter import ArgvRead, Framework
from megatron_estimator.inputs.rawargs import RawArgs

# run_recipe.py COMMON_OVERRIDE_FIELDS: convenience flag dest -> ConfigContainer key.
COMMON_OVERRIDE_FIELDS = {
    "max_steps": "train.train_iters", "global_batch_size": "train.global_batch_size",
    "micro_batch_size": "train.micro_batch_size", "seq_length": "dataset.seq_length",
    "tensor_model_parallel_size": "model.tensor_model_parallel_size",
    "pipeline_model_parallel_size": "model.pipeline_model_parallel_size",
    "context_parallel_size": "model.context_parallel_size",
    "virtual_pipeline_model_parallel_size": "model.virtual_pipeline_model_parallel_size",
    "expert_model_parallel_size": "model.expert_model_parallel_size",
    "expert_tensor_parallel_size": "model.expert_tensor_parallel_size",
    "lr": "optimizer.lr", "min_lr": "optimizer.min_lr", "warmup_iters": "scheduler.lr_warmup_iters",
    "pretrained_checkpoint": "checkpoint.pretrained_checkpoint", "save_dir": "checkpoint.save",
    "load_dir": "checkpoint.load", "save_interval": "checkpoint.save_interval",
}
# run_recipe.py: "-sl sets dataset.seq_length and synchronises the model" (sync_model_dataset_sequence_length).
_ALSO = {"dataset.seq_length": "model.seq_length"}
_CONFIG_FILE = ("--config-file", "--config_file")
_VALUE_FLAGS = ("--recipe", "--model", "--mode", "--dataset", "--step-func", "--step_func") + _CONFIG_FILE
TIME_LIMIT_S = 180

# Run in the job's Python: build the recipe as run_recipe.py does and dump it (or say why not).
_BUILD = r"""
import json, os, sys
entry_dir, name, out = sys.argv[1:4]
try:
    import megatron.bridge  # noqa: F401
except Exception as error:
    print(json.dumps({"importable": False, "error": f"{type(error).__name__}: {error}"}))
    sys.exit(0)
for folder in (entry_dir, os.path.join(os.path.dirname(entry_dir), "common")):
    sys.path.insert(0, folder)
try:
    try:
        from recipe_runner import load_recipe
        config = load_recipe(name)
    except ImportError:
        import megatron.bridge.recipes as recipes
        config = getattr(recipes, name)()
    config.to_yaml(out)
except Exception as error:
    print(json.dumps({"importable": True, "error": f"{type(error).__name__}: {error}"}))
    sys.exit(0)
print(json.dumps({"importable": True, "error": None}))
"""


def _split(argv: Sequence[str], locations: Sequence[str] | None, specs) -> tuple[dict, list, list, list]:
    """run_recipe.py's parse_known_args: (its own flags' values, the overrides (text, location),
    the override files (path, location), problems)."""
    from megatron_estimator.inputs.frameworks.adapter import load_flag_table

    # its source's flags, else (an older or partial copy) its flag table's
    own = {o: s for s in (*load_flag_table(FRAMEWORK.flag_table), *specs) for o in s.option_strings}
    values: dict = {}
    common: list = []                   # the convenience flags' overrides
    overrides: list = []                # the trailing key=value ones, which win (run_recipe.py's docstring)
    files: list = []
    problems: list = []
    at = lambda i: locations[i] if locations is not None and i < len(locations) else argv[i].split("=", 1)[0]   # noqa: E731
    i = 0
    while i < len(argv):
        token = argv[i]
        option, eq, inline = token.partition("=")
        if token.startswith("-") and not token.startswith("--") and len(token) > 1 and token[1:2].isdigit():
            option, eq = "", ""
        if option in own or option in _VALUE_FLAGS or option.lstrip("-") in COMMON_OVERRIDE_FIELDS:
            spec = own.get(option)
            takes = spec is None or spec.takes_value
            value = inline if eq else (argv[i + 1] if takes and i + 1 < len(argv) else True)
            where = at(i)
            i += 1 if eq or not takes else 2
            if option in _CONFIG_FILE:
                files.append((value, where))
                continue
            dest = spec.dest if spec is not None else option.lstrip("-").replace("-", "_")
            values[dest] = value
            field = COMMON_OVERRIDE_FIELDS.get(dest)
            if field is not None:
                common.append((f"{field}={value}", where))
                if field in _ALSO:
                    common.append((f"{_ALSO[field]}={value}", where))
            continue
        if token.startswith("-"):
            problems.append(Problem("unknown-flag", at(i), f"{option}: not a flag of Megatron-Bridge's run_recipe.py"))
        elif "=" in token or token.startswith("~"):
            overrides.append((token, at(i)))
        else:
            problems.append(Problem("invalid-override", at(i), f"{token!r}: run_recipe.py takes key.path=value "
                                    "overrides after its flags (_collect_overrides)"))
        i += 1
    return values, common + overrides, files, problems


def _recipe_name(values: dict) -> str | None:
    if values.get("recipe"):
        return str(values["recipe"])
    return None


def _job_env(entry_path: str | None) -> tuple[str, dict]:
    """The entry program's folder and the environment its Python runs in: the repository's
    ``src/`` (where Megatron-Bridge's package lives in a checkout) put on ``PYTHONPATH``."""
    entry_dir = os.path.dirname(os.path.abspath(entry_path)) if entry_path else os.getcwd()
    env = dict(os.environ)
    src = os.path.join(os.path.dirname(os.path.dirname(entry_dir)), "src")
    if os.path.isdir(src):
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
    return entry_dir, env


@lru_cache(maxsize=8)
def importable(entry_path: str | None) -> str | None:
    """None when ``import megatron.bridge`` works in the job's Python, else why not."""
    _, env = _job_env(entry_path)
    try:
        done = subprocess.run([sys.executable, "-c", "import megatron.bridge"], capture_output=True, text=True,
                              timeout=TIME_LIMIT_S, env=env)
    except subprocess.TimeoutExpired:
        return f"import megatron.bridge took more than {TIME_LIMIT_S} s"
    if done.returncode == 0:
        return None
    return (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]


def _build(entry_path: str | None, name: str) -> tuple[str | None, str | None, bool]:
    """(the dumped ConfigContainer YAML, the error, whether Megatron-Bridge was importable)."""
    import json

    entry_dir, env = _job_env(entry_path)
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "config.yaml")
        try:
            done = subprocess.run([sys.executable, "-c", _BUILD, entry_dir, name, out], capture_output=True,
                                  text=True, timeout=TIME_LIMIT_S, env=env, cwd=folder)
        except subprocess.TimeoutExpired:
            return None, f"building the recipe took more than {TIME_LIMIT_S} s", True
        last = (done.stdout.strip().splitlines() or ["{}"])[-1]
        try:
            said = json.loads(last)
        except ValueError:
            said = {"importable": True, "error": (done.stderr.strip().splitlines() or ["no output"])[-1]}
        if said.get("error") or not os.path.isfile(out):
            return None, said.get("error") or "no config was written", bool(said.get("importable"))
        from megatron_estimator.core.resources import read_input_text

        return read_input_text(out, "yaml"), None, True


def _not_checked(entry_path: str | None) -> str | None:
    """Why ``check --skip-unknown`` cannot check a launch of run_recipe.py here."""
    from megatron_estimator.inputs.trees.common import EXTRA, omegaconf_or_none

    if omegaconf_or_none() is None:
        return f"a Megatron-Bridge launch needs pip install '{EXTRA}'"
    why = importable(entry_path)
    if why is not None:
        return (f"a Megatron-Bridge launch: Megatron-Bridge is not importable by {sys.executable} ({why}); dump "
                "the recipe's config with ConfigContainer.to_yaml and check that file")
    return None


def _read_argv(argv, locations, entry, path, base_dirs, specs, release) -> ArgvRead:
    from megatron_estimator.inputs.trees.bridge import load_bridge_yaml
    from megatron_estimator.inputs.trees.common import missing_extra, omegaconf_or_none

    values, overrides, files, problems = _split(argv, locations, specs)
    where = entry.location
    if omegaconf_or_none() is None:
        return ArgvRead(RawArgs({}, where), (*problems, missing_extra(where, "a Megatron-Bridge launch")))
    name = _recipe_name(values)
    if name is None:
        how = f"--model {values['model']}" if values.get("model") else "no --recipe"
        return ArgvRead(RawArgs({}, where), (*problems, Problem(
            "bridge-recipe", where, f"Megatron-Bridge run_recipe.py with {how}: the estimator builds a named "
            "recipe function (--recipe NAME); or dump the config (ConfigContainer.to_yaml) and check that file")))
    text, error, importable = _build(path, name)
    dump = ("python -c \"from megatron.bridge.recipes import {0}; {0}().to_yaml('config.yaml')\" where "
            "Megatron-Bridge is installed, then check config.yaml".format(name))
    if overrides or files:
        dump += f" with this launch's {len(overrides) + len(files)} override(s) written into it"
    if text is None:
        code = "bridge-not-importable" if not importable else "bridge-recipe"
        why = (f"Megatron-Bridge is not importable by {sys.executable} ({error})" if not importable
               else f"building recipe {name} failed: {error}")
        return ArgvRead(RawArgs({}, where), (*problems, Problem(code, where, f"{why}; the recipe function holds "
                        f"this launch's model, so it is not estimated: dump its config with {dump}")))
    bodies = []
    for file, at in files:
        found = next((os.path.join(d, file) for d in ("", *base_dirs) if os.path.isfile(os.path.join(d, file))), None)
        if found is None:
            problems.append(Problem("file-not-found", at, f"--config-file {file}: no such file"))
            continue
        from megatron_estimator.core.resources import read_input_text

        bodies.append((found, read_input_text(found, "yaml")))
    loaded = load_bridge_yaml(f"recipe {name} (ConfigContainer.to_yaml)", text, overrides=overrides,
                              override_files=bodies, release=release)
    said = (f"Megatron-Bridge: recipe {name} built by its own function (recipe_runner.load_recipe) in a "
            f"subprocess, dumped with ConfigContainer.to_yaml; {len(overrides)} override(s) laid over it",)
    return ArgvRead(loaded.raw, (*problems, *loaded.problems), said + loaded.assumptions + loaded.notes)


FRAMEWORK = Framework(
    name="Megatron-Bridge",
    entry_patterns=("run_recipe.py",),
    flag_table="megatron_bridge_flags.tsv",
    provider_files=("scripts/training/run_recipe.py",),
    imports=("megatron.bridge",),
    read_argv=_read_argv,
    not_checked=_not_checked,
)
