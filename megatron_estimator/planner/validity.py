"""Which layouts Megatron accepts: the checks ``estimate`` runs, run once per choice they read.

"Megatron accepts" means what ``config.resolve.resolve_config`` checks passes: the input is
validated once through ``resolve_config`` itself (``validate_model``: schema, model,
vocabulary), and each layout by ``config.rules.RULES`` on the namespace
``config.derive.derive_namespace`` builds for it (``layout_rules``; the environment rules
count only where the environment is the job's, as in ``resolve_config``).  The rules run
once per layout family (tp, cp, pp, split) and again only for the inner choices they read:
``RuleReads`` records which varied keys a rule looked at, and its verdict is reused for
every choice that agrees on them (the rules are pure functions of the namespace: the same
keys with the same values take the same path).  Nothing here decides validity itself: every
verdict is a rule's, and every reported candidate is re-validated on the normal path
(``planner.candidates``).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any, Callable

from megatron_estimator.config.run_context import RunContext
from megatron_estimator.core.problems import InvalidInput
from megatron_estimator.inputs.rawargs import RawArgs
from megatron_estimator.planner.space import RECOMPUTE_DESTS
from megatron_estimator.results.plan import Recompute

# The inner choices of a layout family, in loop order (EXPERT .. SP: their index in a choice),
# and the namespace keys each changes.
# Derivation (derive.derive_namespace) runs per batch choice; the expert sizes, recompute and
# sequence parallel are laid over the derived namespace: derive does not read ep and only
# defaults etp, and passes recompute and sequence parallel through for the values the
# planner sets (sequence parallel only with tp > 1, --recompute-activations off).
EXPERT, BATCH, RECOMPUTE, SP = 0, 1, 2, 3
_KEY_DIM = {"expert_model_parallel_size": EXPERT, "expert_tensor_parallel_size": EXPERT}
_KEY_DIM.update({key: BATCH for key in ("micro_batch_size", "global_batch_size", "num_microbatches",
                                          "use_distributed_optimizer", "use_layer_wise_distributed_optimizer")})
_KEY_DIM.update({key: RECOMPUTE for key in RECOMPUTE_DESTS})
_KEY_DIM["sequence_parallel"] = SP
ALL_DIMS = frozenset((EXPERT, BATCH, RECOMPUTE, SP))


def layout_rules(job_environment: bool) -> tuple[tuple, frozenset]:
    """(the rules every layout must pass, the problem codes that do not count):
    ``config.rules.RULES``, and ``config.resolve.ENVIRONMENT_RULES`` unless the environment is
    the job's (``resolve_config`` turns those into notes then)."""
    from megatron_estimator.config.resolve import ENVIRONMENT_RULES
    from megatron_estimator.config.rules import RULES

    return tuple(RULES), frozenset() if job_environment else frozenset(ENVIRONMENT_RULES)


def validate_model(given: RawArgs, raw: RawArgs, namespace: Mapping[str, Any], environ: Mapping[str, str], *,
                   compute_capability: float | None, flash_attn: str | None, job_environment: bool,
                   family=None, release):
    """Validate the input once, as ``estimate`` does: the types and ranges of everything the
    user gave (``given``), then the model alone (``raw``: the input without its layout, on one
    GPU with Megatron's default layout) through ``config.resolve.resolve_config`` (``family``: the
    ``ModelFamily`` it is of, as ``estimate`` tells it; ``release``: the ``ChosenRelease``).  Returns (its
    EstimatorConfig or None, the problems of the default layout); raises InvalidInput for
    problems of the model, which no layout removes."""
    from megatron_estimator.config.resolve import resolve_config
    from megatron_estimator.config.schema import check_config_schema

    everything = dict(namespace)
    everything.update({d: s.value for d, s in given.settings.items()})
    problems = check_config_schema(everything, given)
    if problems:
        raise InvalidInput(problems)
    try:
        return resolve_config(raw, world_size=1, world_size_source="plan", environ=environ,
                              compute_capability=compute_capability, flash_attn=flash_attn, resume="no",
                              job_environment=job_environment, family=family, release=release), ()
    except InvalidInput as err:
        # Problems of the default layout may vanish with another one; those of the model do not.
        if any(p.code in ("unknown-vocab-size", "missing-required") for p in err.problems):
            raise InvalidInput(err.problems) from None
        return None, tuple(err.problems)


BATCH_KEYS = tuple(key for key, dim in _KEY_DIM.items() if dim == BATCH)   # what derivation sets per batch choice


def derive_batches(ns: dict, batches: list[tuple[bool, int]], world: int, extra: Mapping[str, Any], release
                    ) -> tuple[list[tuple[bool, int]], list[dict]]:
    """The batch choices and their derived namespaces, without the choices that derive to the
    same namespace as an earlier one (Megatron-FSDP turns the distributed optimizer on anyway)."""
    from megatron_estimator.config.derive import derive_namespace

    kept, namespaces, seen = [], [], set()
    for do, mbs in batches:
        ns["use_distributed_optimizer"] = do
        ns["micro_batch_size"] = mbs
        derived, _ = derive_namespace(ns, world, release)
        derived.update(extra)
        key = tuple(repr(derived.get(k)) for k in BATCH_KEYS)
        if key in seen:
            continue
        seen.add(key)
        kept.append((do, mbs))
        namespaces.append(derived)
    return kept, namespaces


def accepted_pairs(verdicts: "RuleVerdicts", choice: list[int], recomputes: list, sps: tuple
                    ) -> tuple[list[tuple[int, Recompute, bool]], dict[str, int]]:
    """The (recompute, sequence parallel) choices the rules accept with this expert and batch
    choice, and the problem codes of the rejected ones with their counts."""
    ok, rejected = [], {}
    choice = list(choice)
    check = verdicts.check
    # A level with no table passes every choice: its check is skipped.
    by_recompute, by_sp = bool(verdicts.levels[RECOMPUTE]), bool(verdicts.levels[SP])
    for r, rec in enumerate(recomputes):
        choice[2] = r
        code = check(RECOMPUTE, choice) if by_recompute else None
        if code is not None:
            rejected[code] = rejected.get(code, 0) + len(sps)
            continue
        for s, sp in enumerate(sps):
            choice[3] = s
            code = check(SP, choice) if by_sp else None
            if code is not None:
                rejected[code] = rejected.get(code, 0) + 1
                continue
            ok.append((r, rec, sp))
    return ok, rejected


def expert_overlay(ep: int, etp: int) -> dict[str, Any]:
    return {"expert_model_parallel_size": ep, "expert_tensor_parallel_size": etp}


def recompute_overlay(rec: Recompute, sp: bool, derived: Mapping) -> dict[str, Any]:
    """The namespace keys a recompute / sequence-parallel choice sets over the derived namespace."""
    over = rec.settings()
    if rec.modules is None:
        over["recompute_modules"] = derived.get("recompute_modules")
    over["recompute_activations"] = False
    over["distribute_saved_activations"] = False
    over["sequence_parallel"] = sp
    return over


class RuleReads(Mapping):
    """The namespace a rule sees, ``over`` laid on ``base``, recording which inner choice
    dimensions the rule read."""
    __slots__ = ("_base", "_over", "dims")

    def __init__(self, base: Mapping, over: Mapping):
        self._base = base
        self._over = over
        self.dims: set[int] = set()

    # Every key of ``over`` is a choice dimension's (``_KEY_DIM``), so a key of none is the base's.
    def get(self, key, default=None, _dim_of=_KEY_DIM.get):
        dim = _dim_of(key)
        if dim is None:
            return self._base.get(key, default)
        self.dims.add(dim)
        over = self._over
        if key in over:
            return over[key]
        return self._base.get(key, default)

    def __getitem__(self, key, _dim_of=_KEY_DIM.get):
        dim = _dim_of(key)
        if dim is None:
            return self._base[key]
        self.dims.add(dim)
        over = self._over
        if key in over:
            return over[key]
        return self._base[key]

    def __contains__(self, key) -> bool:
        dim = _KEY_DIM.get(key)
        if dim is not None:
            self.dims.add(dim)
        return key in self._over or key in self._base

    def __iter__(self):
        self.dims.update(ALL_DIMS)
        return iter(self._base.keys() | self._over.keys())

    def __len__(self) -> int:
        self.dims.update(ALL_DIMS)
        return len(self._base.keys() | self._over.keys())


class RuleVerdicts:
    """Which inner choices of one layout family pass the rules.

    Each rule is run on the first value of every dimension; when it read a dimension it is
    run again for each value of it (and of any dimension it then reads), giving a table over
    the dimensions it read.  A table is checked in the loop over the last dimension it needs.
    """

    def __init__(self, rules, raw: RawArgs, env: Mapping[str, str], run: RunContext, sizes: tuple[int, ...],
                 view: Callable[[tuple[int, ...]], RuleReads], ignored: frozenset = frozenset()):
        self.sizes, self._view, self._raw, self._env, self._ignored = sizes, view, raw, env, ignored
        self._run_context = run
        self.failed: str | None = None           # a problem code every choice fails with
        self.levels: list[list[tuple[tuple[int, ...], dict]]] = [[] for _ in sizes]
        for rule in rules:
            dims, table = self._table(rule)
            if not dims:
                if table[()] is not None:
                    self.failed = table[()]
                    return
                continue
            if any(code is not None for code in table.values()):
                self.levels[max(dims)].append((dims, table))

    def _run(self, rule, choice: tuple[int, ...]) -> tuple[str | None, set[int]]:
        view = self._view(choice)
        for problem in rule(view, self._raw, self._env, self._run_context):
            if problem.code not in self._ignored:
                return problem.code, view.dims
        return None, view.dims

    def _table(self, rule) -> tuple[tuple[int, ...], dict]:
        code, read = self._run(rule, (0,) * len(self.sizes))
        dims = tuple(sorted(read))
        if not dims:
            return (), {(): code}
        while True:
            table: dict[tuple[int, ...], str | None] = {}
            for key in itertools.product(*(range(self.sizes[d]) for d in dims)):
                choice = [0] * len(self.sizes)
                for d, i in zip(dims, key):
                    choice[d] = i
                code, read = self._run(rule, tuple(choice))
                if not read <= set(dims):
                    dims = tuple(sorted(set(dims) | read))
                    break
                table[key] = code
            else:
                return dims, table

    def check(self, level: int, choice: list[int]) -> str | None:
        """The first problem code of the tables that complete at this loop level, or None."""
        for dims, table in self.levels[level]:
            code = table[(choice[dims[0]],) if len(dims) == 1 else tuple(choice[d] for d in dims)]
            if code is not None:
                return code
        return None


def family_verdicts(rules, raw: RawArgs, env: Mapping[str, str], run: RunContext, namespaces: list[dict],
                    experts: list[tuple[int, int]], recomputes: list[Recompute], sps: tuple[bool, ...],
                    ignored: frozenset = frozenset()) -> RuleVerdicts:
    """The rules' verdicts over a layout family's inner choices: the expert sizes, the batch
    choices (``namespaces``, one derived namespace each), recompute and sequence parallel."""
    first = namespaces[0]
    expert_over = [expert_overlay(ep, etp) for ep, etp in experts]
    rec_over = [[recompute_overlay(rec, sp, first) for sp in sps] for rec in recomputes]

    overlays: dict[tuple[int, int, int], dict] = {}

    def view(choice) -> RuleReads:
        e, b, r, s = choice
        over = overlays.get((e, r, s))
        if over is None:
            over = overlays[e, r, s] = {**expert_over[e], **rec_over[r][s]}
            # RuleReads.get reads a key of no choice dimension from the base namespace alone.
            assert all(key in _KEY_DIM for key in over), sorted(set(over) - set(_KEY_DIM))
        return RuleReads(namespaces[b], over)

    sizes = (len(experts), len(namespaces), len(recomputes), len(sps))
    return RuleVerdicts(rules, raw, env, run, sizes, view, ignored)
