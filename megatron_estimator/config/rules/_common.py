"""What the rule modules share: the rule signature, the release lookup and small readers of the
derived namespace.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

from megatron_estimator.config.run_context import RunContext
from megatron_estimator.core.problems import Problem
from megatron_estimator.inputs.rawargs import RawArgs


Namespace = Mapping[str, Any]
Rule = Callable[[Namespace, RawArgs, Mapping[str, str], RunContext], Iterable[Problem]]


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _ints(ns: Namespace, *dests: str) -> bool:
    """True when every dest holds a positive int (otherwise the schema already complained)."""
    for d in dests:
        value = ns.get(d)          # read once (the planner's namespace records each read)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            return False
    return True


def _release_said(run: RunContext) -> str:
    chosen = run.release
    return f"Megatron {chosen.version}" + (f" as of {chosen.as_of}" if chosen.as_of else "")


def _cuda_graph_impl(ns: Namespace) -> str:
    """``--cuda-graph-impl`` after validate_args (megatron/training/arguments.py): the deprecated
    ``--enable-cuda-graph`` means ``local``, ``--external-cuda-graph`` ``transformer_engine``."""
    if ns.get("enable_cuda_graph"):
        return "local"
    if ns.get("external_cuda_graph"):
        return "transformer_engine"
    return ns.get("cuda_graph_impl") or "none"


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _size(ns: Namespace, dest: str) -> int:
    value = _int(ns.get(dest))
    return value if value is not None else 1


def _modules(ns: Namespace, dest: str) -> list:
    value = ns.get(dest)
    if isinstance(value, str):
        return [value]
    return list(value) if isinstance(value, (list, tuple)) else []


def _selective_modules(ns: Namespace) -> list:
    """The selective-recompute modules (Megatron's default: core_attn), or [] without selective."""
    if ns.get("recompute_granularity") != "selective":
        return []
    return _modules(ns, "recompute_modules") or ["core_attn"]


def _graph_modules(ns: Namespace) -> list[str]:
    """--cuda-graph-modules (or the deprecated --cuda-graph-scope) as names; 'full' is none."""
    names = _modules(ns, "cuda_graph_modules") or _modules(ns, "cuda_graph_scope_deprecated")
    return [str(getattr(m, "name", m)) for m in names if str(getattr(m, "name", m)) != "full"]


def release_behaviour(rule: str, run: RunContext) -> str:
    """The run's Megatron release's value for ``rule`` (data/megatron_behaviour.tsv)."""
    from megatron_estimator.megatron.behaviour import behaviour
    return behaviour(rule, run.release)
