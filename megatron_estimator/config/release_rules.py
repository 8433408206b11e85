"""Megatron's cross-field rules whose content depends on the release checked against.

Each rule reads its release's facts from ``data/megatron_behaviour.tsv``
(``megatron.behaviour.behaviour``: the chosen release, or ``main`` as of a day) and mirrors the
Megatron file that row cites.  ``config/rules.py`` appends ``RELEASE_RULES`` to its own, so they
run with the same signature (``rule(ns, raw, env, run)``) wherever those do (``resolve_config``,
the planner's validity).
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

Namespace = Mapping[str, Any]

from megatron_estimator.config.run_context import RunContext
from megatron_estimator.core.problems import Problem
from megatron_estimator.inputs.rawargs import RawArgs


# The environment codes: notes, not refusals, unless the environment read is the job's
# (config/resolve.py ENVIRONMENT_RULES).
DETERMINISTIC_ENVIRONMENT = "deterministic-mode-environment"


def _behaviour(rule: str, run: RunContext) -> str:
    from megatron_estimator.megatron.behaviour import behaviour
    return behaviour(rule, run.release)


def _release_said(run: RunContext) -> str:
    chosen = run.release
    return f"Megatron {chosen.version}" + (f" as of {chosen.as_of}" if chosen.as_of else "")


def deterministic_mode(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    """--deterministic-mode: through 0.18 megatron/training/arguments.py validate_args asserts
    no --use-flash-attn, no --cross-entropy-loss-fusion and NCCL_ALGO set to one of five
    algorithms; from 3ab71eeb3e (#5041, 0.19) megatron/training/determinism.py
    apply_determinism_to_args requires cross_entropy_loss_fusion and tp_comm_overlap off and
    checks the determinism variables that are set (apply_determinism_env)."""
    if not ns.get("deterministic_mode"):
        return
    said = _release_said(run)
    for dest in filter(None, _behaviour("deterministic_mode_forbids", run).split(",")):
        if ns.get(dest):
            flag = "--" + dest.replace("_", "-")
            yield Problem("deterministic-mode-conflict", raw.location(dest),
                          f"{flag} cannot be used with --deterministic-mode ({said} refuses it): drop one")
    where = (lambda var: f"{run.launch_location} {var}" if run.launch_location else var)
    mode, _, choices = _behaviour("deterministic_nccl_algo", run).partition(":")
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
    for item in filter(None, _behaviour("deterministic_env_values", run).split(";")):
        var, _, values = item.partition("=")
        allowed = values.split("|")
        if env.get(var) is not None and env[var] not in allowed:
            yield Problem(DETERMINISTIC_ENVIRONMENT, where(var),
                          f"--deterministic-mode accepts {var} = {' or '.join(allowed)} only ({said}); "
                          f"it is {env[var]!r}")
    for var in filter(None, _behaviour("deterministic_env_one", run).split(",")):
        if env.get(var) and not env[var].startswith("1"):
            yield Problem(DETERMINISTIC_ENVIRONMENT, where(var),
                          f"{var}={env[var]!r} turns determinism off under --deterministic-mode ({said} "
                          "refuses it): unset it or set it to 1")


def te_version_key(text: str) -> tuple | None:
    """``2.8.0.dev0+40c69e7`` -> ``((2, 8, 0), 0)``: the release numbers and 0 for a dev, 1 for
    an rc / alpha / beta, 2 for a final release, the order ``packaging.version`` gives them (what
    megatron/core/utils.py ``is_te_min_version`` compares); None when it is not a version."""
    import re

    found = re.match(r"v?(\d+(?:\.\d+)*)(?:\.?(dev|rc|a|b|post)\d*)?", text.strip())
    if not found:
        return None
    numbers = tuple(int(x) for x in found.group(1).split("."))
    numbers = numbers + (0,) * (3 - len(numbers))
    stage = {"dev": 0, "rc": 1, "a": 1, "b": 1}.get(found.group(2) or "", 2)
    return numbers, stage


def te_version(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    """What megatron/training/arguments.py validate_args asks of the installed Transformer Engine
    (``is_te_min_version``), when the job's version is known (``run.transformer_engine``: ``run``
    reads it from the job's package metadata).  The flags involved exist only in some releases;
    the flag table refuses them elsewhere."""
    have = te_version_key(run.transformer_engine) if run.transformer_engine else None
    if have is None:
        return
    installed = f"the job's Transformer Engine is {run.transformer_engine}"
    needs = []
    if ns.get("fp4"):
        needs.append(("fp4", "2.7.0.dev0", "--fp4-format (NVFP4BlockScaling)"))
    for dest in ("qk_clip", "log_max_attention_logit"):
        if ns.get(dest):
            needs.append((dest, "2.9.0", "--" + dest.replace("_", "-")))
    if ns.get("delay_wgrad_compute"):
        if ns.get("overlap_grad_reduce"):
            needs.append(("delay_wgrad_compute", _behaviour("delay_wgrad_overlap_te_min", run),
                          "--delay-wgrad-compute with --overlap-grad-reduce"))
        if not ns.get("gradient_accumulation_fusion", True):
            needs.append(("delay_wgrad_compute", "2.7.0", "--delay-wgrad-compute with --no-gradient-accumulation-fusion"))
    for dest, minimum, what in needs:
        if have < te_version_key(minimum):
            yield Problem("transformer-engine-version", raw.location(dest),
                          f"{what} needs Transformer Engine >= {minimum} ({_release_said(run)}); {installed}")
    if ns.get("fine_grained_activation_offloading") and have >= te_version_key("2.10.0") \
            and env.get("NVTE_CPU_OFFLOAD_V1", "0") != "1":
        where = f"{run.launch_location} NVTE_CPU_OFFLOAD_V1" if run.launch_location else "NVTE_CPU_OFFLOAD_V1"
        yield Problem(TE_ENVIRONMENT, where,
                      f"--fine-grained-activation-offloading with Transformer Engine >= 2.10.0 needs "
                      f"NVTE_CPU_OFFLOAD_V1=1 ({_release_said(run)}); {installed}")


TE_ENVIRONMENT = "transformer-engine-environment"


def rampup_with_train_iters(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    """megatron/training/arguments.py validate_args through 0.17: iteration-based training
    (--train-iters) asserts no --rampup-batch-size (from 29e798a48d, 0.17, not under
    --skip-train); 532ad926b4 (0.18) replaced the rampup scheduler and dropped the check."""
    when = _behaviour("rampup_with_train_iters_rejected", run)
    if not ns.get("rampup_batch_size") or not ns.get("train_iters") or when == "never" \
            or when == "unless_skip_train" and ns.get("skip_train"):
        return
    yield Problem("rampup-with-train-iters", raw.location("rampup_batch_size"),
                  f"--rampup-batch-size cannot be used with iteration-based training (--train-iters) in "
                  f"{_release_said(run)}; give --train-samples instead")


RELEASE_RULES = [deterministic_mode, te_version, rampup_with_train_iters]
