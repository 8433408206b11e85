"""Megatron's cross-field rules whose content depends on the release checked against.

Each rule reads its release's facts from ``data/megatron_behaviour.tsv``
(``megatron.behaviour.behaviour``: the chosen release, or ``main`` as of a day) and mirrors the
Megatron file that row cites.  ``config/rules.py`` appends ``RELEASE_RULES`` to its own, so they
run with the same signature (``rule(ns, raw, env, run)``) wherever those do (``resolve_config``,
the planner's validity).
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

from megatron_estimator.config.run_context import RunContext
from megatron_estimator.core.problems import Problem
from megatron_estimator.inputs.rawargs import RawArgs

Namespace = Mapping[str, Any]

# The environment codes: notes, not refusals, unless the environment read is the job's
# (config/resolve.py ENVIRONMENT_RULES).
DETERMINISTIC_ENVIRONMENT = "deterministic-mode-environment"


def _behaviour(rule: str) -> str:
    from megatron_estimator.megatron.behaviour import behaviour
    return behaviour(rule)


def _release_said() -> str:
    from megatron_estimator.megatron.releases import chosen_release
    chosen = chosen_release()
    return f"Megatron {chosen.version}" + (f" as of {chosen.as_of}" if chosen.as_of else "")


def deterministic_mode(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    """--deterministic-mode: through 0.18 megatron/training/arguments.py validate_args asserts
    no --use-flash-attn, no --cross-entropy-loss-fusion and NCCL_ALGO set to one of five
    algorithms; from 3ab71eeb3e (#5041, 0.19) megatron/training/determinism.py
    apply_determinism_to_args requires cross_entropy_loss_fusion and tp_comm_overlap off and
    checks the determinism variables that are set (apply_determinism_env)."""
    if not ns.get("deterministic_mode"):
        return
    said = _release_said()
    for dest in filter(None, _behaviour("deterministic_mode_forbids").split(",")):
        if ns.get(dest):
            flag = "--" + dest.replace("_", "-")
            yield Problem("deterministic-mode-conflict", raw.location(dest),
                          f"{flag} cannot be used with --deterministic-mode ({said} refuses it): drop one")
    where = (lambda var: f"{run.launch_location} {var}" if run.launch_location else var)
    mode, _, choices = _behaviour("deterministic_nccl_algo").partition(":")
    accepted = choices.split(",")
    nccl = env.get("NCCL_ALGO")
    if mode == "required" and nccl not in accepted:
        now = "is not set" if nccl is None else f"is {nccl!r}"
        yield Problem(DETERMINISTIC_ENVIRONMENT, where("NCCL_ALGO"),
                      f"--deterministic-mode needs NCCL_ALGO set to one of {', '.join(accepted)} ({said}); "
                      f"it {now}")
    elif mode == "optional" and nccl is not None:
        tokens = [t.strip() for t in nccl.split(",") if t.strip()]
        if not tokens or any(t not in accepted for t in tokens):
            yield Problem(DETERMINISTIC_ENVIRONMENT, where("NCCL_ALGO"),
                          f"--deterministic-mode accepts NCCL_ALGO tokens {', '.join(accepted)} only ({said}); "
                          f"it is {nccl!r}")
    for item in filter(None, _behaviour("deterministic_env_values").split(";")):
        var, _, values = item.partition("=")
        allowed = values.split("|")
        if env.get(var) is not None and env[var] not in allowed:
            yield Problem(DETERMINISTIC_ENVIRONMENT, where(var),
                          f"--deterministic-mode accepts {var} = {' or '.join(allowed)} only ({said}); "
                          f"it is {env[var]!r}")
    for var in filter(None, _behaviour("deterministic_env_one").split(",")):
        if env.get(var) and not env[var].startswith("1"):
            yield Problem(DETERMINISTIC_ENVIRONMENT, where(var),
                          f"{var}={env[var]!r} turns determinism off under --deterministic-mode ({said} "
                          "refuses it): unset it or set it to 1")


RELEASE_RULES = [deterministic_mode]
