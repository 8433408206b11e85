"""The job's environment and stack: CUDA_DEVICE_MAX_CONNECTIONS, attention backends set by
variables, deterministic mode, the Transformer Engine version.  Their codes are notes, not
refusals, unless the environment read is the job's (config/resolve.py ENVIRONMENT_RULES).

Each rule has the signature ``rule(ns, raw, env, run)`` (``_common.Rule``) and cites the Megatron file
and line it mirrors and the releases it holds for; ``config/rules/__init__.py`` lists every rule
in the order it runs.
"""

from __future__ import annotations

from typing import Iterator, Mapping

from megatron_estimator.config.run_context import RunContext
from megatron_estimator.core.problems import Problem
from megatron_estimator.inputs.rawargs import RawArgs
from megatron_estimator.config.rules._common import Namespace, _flag, _release_said, release_behaviour


def environment(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/core/models/common/language_module/language_module.py _set_attention_backend
    if ns.get("transformer_impl") != "transformer_engine":
        return
    backend = ns.get("attention_backend", "auto")
    expected = {
        "local": {"NVTE_FLASH_ATTN": "0", "NVTE_FUSED_ATTN": "0", "NVTE_UNFUSED_ATTN": "0"},
        "flash": {"NVTE_FLASH_ATTN": "1", "NVTE_FUSED_ATTN": "0", "NVTE_UNFUSED_ATTN": "0"},
        "fused": {"NVTE_FLASH_ATTN": "0", "NVTE_FUSED_ATTN": "1", "NVTE_UNFUSED_ATTN": "0"},
        "unfused": {"NVTE_FLASH_ATTN": "0", "NVTE_FUSED_ATTN": "0", "NVTE_UNFUSED_ATTN": "1"},
        "auto": {"NVTE_FLASH_ATTN": "1", "NVTE_FUSED_ATTN": "1", "NVTE_UNFUSED_ATTN": "1"},
    }.get(backend, {})
    for var, value in expected.items():
        if var in env and env[var] != value:
            yield Problem("attention-backend-env-conflict", raw.location("attention_backend"),
                          f"{var}={env[var]} in the environment conflicts with --attention-backend {backend} "
                          f"(Megatron expects {var}={value} and stops); unset it or choose the matching "
                          "--attention-backend")


def device_connections(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # arguments.py validate_args (d98e8a64 lines 1453-1478): before Blackwell, TP or CP asserts
    # CUDA_DEVICE_MAX_CONNECTIONS=1 (Megatron-FSDP / torch FSDP2 / the MoE expert-parallel overlap
    # only warn).  Without a named GPU the run's assumed generation stands in, and is said.
    arch = run.gpu_compute_capability
    assumed = arch is None
    arch = run.assumed_compute_capability if assumed else arch
    if arch is None or (ns.get("tensor_model_parallel_size") or 1) <= 1 and (ns.get("context_parallel_size") or 1) <= 1:
        return
    if ns.get("use_megatron_fsdp") or ns.get("use_torch_fsdp2") or ns.get("overlap_moe_expert_parallel_comm"):
        return
    gpu = f"compute capability {arch:g}" + (", assumed: no --gpu named" if assumed else "")
    if arch >= 10 or env.get("CUDA_DEVICE_MAX_CONNECTIONS") == "1":
        if assumed:
            yield Problem("gpu-generation-assumed", "--gpu",
                          f"GPU generation: no --gpu named; the CUDA_DEVICE_MAX_CONNECTIONS rule of tensor / context "
                          f"parallelism assumed compute capability {arch:g} (it applies before Blackwell, 10)")
    else:
        launch = run.launch_location      # a script's launch line, where its environment applies
        yield Problem("cuda-device-max-connections",
                      f"{launch} CUDA_DEVICE_MAX_CONNECTIONS" if launch else "CUDA_DEVICE_MAX_CONNECTIONS",
                      f"tensor or context parallelism on this GPU ({gpu}) needs CUDA_DEVICE_MAX_CONNECTIONS=1 in "
                      f"the environment; Megatron stops otherwise (it is {env.get('CUDA_DEVICE_MAX_CONNECTIONS', 'unset')})")


def fsdp_device_connections(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    # megatron/training/arguments.py validate_args (main d98e8a64): Megatron-FSDP and torch
    # FSDP2 assert CUDA_DEVICE_MAX_CONNECTIONS is not "1", on every GPU generation.
    fsdp = next((d for d in ("use_megatron_fsdp", "use_torch_fsdp2") if ns.get(d)), None)
    if fsdp is None or env.get("CUDA_DEVICE_MAX_CONNECTIONS") != "1":
        return
    launch = run.launch_location
    yield Problem("fsdp-cuda-device-max-connections",
                  f"{launch} CUDA_DEVICE_MAX_CONNECTIONS" if launch else "CUDA_DEVICE_MAX_CONNECTIONS",
                  f"{_flag(fsdp)} needs CUDA_DEVICE_MAX_CONNECTIONS unset or above 1; the environment sets "
                  "it to 1 and Megatron stops")


# The environment codes: notes, not refusals, unless the environment read is the job's
# (config/resolve.py ENVIRONMENT_RULES).
DETERMINISTIC_ENVIRONMENT = "deterministic-mode-environment"


def deterministic_mode(ns: Namespace, raw: RawArgs, env: Mapping[str, str], run: RunContext) -> Iterator[Problem]:
    """--deterministic-mode: through 0.18 megatron/training/arguments.py validate_args asserts
    no --use-flash-attn, no --cross-entropy-loss-fusion and NCCL_ALGO set to one of five
    algorithms; from 3ab71eeb3e (#5041, 0.19) megatron/training/determinism.py
    apply_determinism_to_args requires cross_entropy_loss_fusion and tp_comm_overlap off and
    checks the determinism variables that are set (apply_determinism_env)."""
    if not ns.get("deterministic_mode"):
        return
    said = _release_said(run)
    for dest in filter(None, release_behaviour("deterministic_mode_forbids", run).split(",")):
        if ns.get(dest):
            flag = "--" + dest.replace("_", "-")
            yield Problem("deterministic-mode-conflict", raw.location(dest),
                          f"{flag} cannot be used with --deterministic-mode ({said} refuses it): drop one")
    where = (lambda var: f"{run.launch_location} {var}" if run.launch_location else var)
    mode, _, choices = release_behaviour("deterministic_nccl_algo", run).partition(":")
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
    for item in filter(None, release_behaviour("deterministic_env_values", run).split(";")):
        var, _, values = item.partition("=")
        allowed = values.split("|")
        if env.get(var) is not None and env[var] not in allowed:
            yield Problem(DETERMINISTIC_ENVIRONMENT, where(var),
                          f"--deterministic-mode accepts {var} = {' or '.join(allowed)} only ({said}); "
                          f"it is {env[var]!r}")
    for var in filter(None, release_behaviour("deterministic_env_one", run).split(",")):
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
            needs.append(("delay_wgrad_compute", release_behaviour("delay_wgrad_overlap_te_min", run),
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
