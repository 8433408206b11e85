"""What each Megatron flag does to GPU memory, and what the estimate does about it.

The estimate is the peak GPU memory of one training iteration (forward, backward and
optimizer step, with the pipeline schedule's microbatches in flight).  Every dest in
Megatron's flag table (``data/megatron_flags.tsv``, all flags including the ones that exist
only with nvidia-modelopt or kitchen installed) has one row in ``data/flag_effects.tsv``
(``dest``, ``effect``, ``why``); this module reads it into three tables:

``MODELLED``
    Dests the estimate reads (``config/``, ``model/``): giving one changes the estimate.
``NOT_MODELLED``
    Dests that do change GPU memory in a training run but that the estimate does not model,
    each mapped to the assumption the report states when the flag is given (``why``), e.g.
    ``--moe-enable-deepep: DeepEP's persistent communication buffers are not modelled``
    (``memory_assumptions``, in the file's row order).
``NO_MEMORY_EFFECT``
    Dests that do not change the GPU memory of a training iteration, each with one of the
    ``CATEGORIES`` (``data/flag_effect_categories.tsv``) saying why.

Scope: flags that act only outside the training iteration (checkpoint save and load,
evaluation, inference and RL runs, host memory) have no memory effect under those
categories, except where that phase needs GPU memory a training step does not have (a fully
reshardable checkpoint save gathers optimizer buffers on the GPU; evaluation runs its own
micro batch; RL runs the inference engine beside training): those are not modelled.  A
resumed run's fully parallel load keeps exchange buffers into its first training step; the
options that decide them (``--load``, ``--ckpt-fully-parallel-load``, ...) are modelled
(model/checkpoint.py).  Routing rules are ``numerics``: the estimate's own assumption about
how tokens spread over the experts holds whatever rule picks them.  Facts come from
Megatron-LM's ``megatron/training/arguments.py`` and the modules that read each argument
(``megatron/core/transformer/transformer_config.py``, ``megatron/core/model_parallel_config.py``,
``megatron/training/training.py``, ...).

Maintenance: when the flag table is refreshed (``scripts/import_flags``),
``tests/test_flag_effects.py`` names every dest that has no row, is in two tables, or is no
longer in Megatron; read how Megatron uses a new dest before choosing its effect, and never
give a flag that changes memory ``no memory effect``.  When the estimate starts reading a
dest, make its row ``modelled``; the test checks that every modelled dest is named as a
string in the estimate's own source.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Iterable, Mapping

from megatron_estimator.core.resources import read_data_text
from megatron_estimator.megatron.releases import NEWEST

EFFECTS_FILE = "flag_effects.tsv"
CATEGORIES_FILE = "flag_effect_categories.tsv"

MODELLED_KIND = "modelled"
NOT_MODELLED_KIND = "not modelled"
NO_MEMORY_EFFECT_KIND = "no memory effect"

# Names of the categories of NO_MEMORY_EFFECT (their meanings are in CATEGORIES_FILE).
LOGGING, PROFILING, DEBUGGING, CHECKPOINTING = "logging", "profiling", "debugging", "checkpointing"
DATA_LOADING, TOKENIZER, LR_SCHEDULE = "data loading", "tokenizer", "learning-rate schedule"
OPTIMIZER_HYPERPARAMETER, INITIALIZATION, NUMERICS = "optimizer hyperparameter", "initialization", "numerics"
KERNEL_CHOICE, COMMUNICATION_SCHEDULING = "kernel choice", "communication scheduling"
DISTRIBUTED_SETUP, HOST_MEMORY, EVALUATION = "distributed setup", "host memory only", "evaluation"
RUN_CONTROL, FAULT_TOLERANCE, CONFIGURATION_SOURCE = "run control", "fault tolerance", "configuration source"
SET_BY_MEGATRON, INFERENCE_ONLY, RL_ONLY = "set by Megatron", "inference only", "RL only"
POST_TRAINING_EXPORT, OTHER_MODELS, DEPRECATED = "post-training export", "other model types", "deprecated or unused"


def _rows(name: str, columns: tuple[str, ...]) -> Iterable[tuple[int, list[str]]]:
    """(line number, fields) of a data file's rows; ``#`` lines are comments, the first other
    line names the columns.  A malformed file is a bug of the package: ValueError."""
    lines = read_data_text(name).splitlines()
    body = [(number, line) for number, line in enumerate(lines, 1) if line and not line.startswith("#")]
    if not body or tuple(body[0][1].split("\t")) != columns:
        raise ValueError(f"{name}: the first row must name the columns {', '.join(columns)}")
    for number, line in body[1:]:
        fields = line.split("\t")
        if len(fields) != len(columns):
            raise ValueError(f"{name}:{number}: {len(fields)} fields, not {len(columns)}")
        yield number, fields


def _load() -> tuple[Mapping[str, str], frozenset[str], Mapping[str, str], Mapping[str, str]]:
    categories = {category: meaning for _, (category, meaning) in _rows(CATEGORIES_FILE, ("category", "meaning"))}
    tables: dict[str, dict[str, str]] = {MODELLED_KIND: {}, NOT_MODELLED_KIND: {}, NO_MEMORY_EFFECT_KIND: {}}
    seen: set[str] = set()
    for number, (dest, effect, why) in _rows(EFFECTS_FILE, ("dest", "effect", "why")):
        if effect not in tables or dest in seen:
            raise ValueError(f"{EFFECTS_FILE}:{number}: "
                             + (f"{dest} has a second row" if dest in seen else f"unknown effect {effect!r}"))
        seen.add(dest)
        tables[effect][dest] = why
    return (MappingProxyType(categories), frozenset(tables[MODELLED_KIND]),
            MappingProxyType(tables[NOT_MODELLED_KIND]), MappingProxyType(tables[NO_MEMORY_EFFECT_KIND]))


# CATEGORIES: category -> what flags in it do.  MODELLED: the dests the estimate reads.
# NOT_MODELLED: dest -> the assumption to state.  NO_MEMORY_EFFECT: dest -> its category.
CATEGORIES, MODELLED, NOT_MODELLED, NO_MEMORY_EFFECT = _load()
_NOT_MODELLED_ORDER = {dest: i for i, dest in enumerate(NOT_MODELLED)}   # the file's order


def classify(dest: str) -> str:
    """``MODELLED_KIND``, ``NOT_MODELLED_KIND`` or ``NO_MEMORY_EFFECT_KIND`` for a Megatron
    dest; KeyError for a dest in no table (not a Megatron flag)."""
    if dest in MODELLED:
        return MODELLED_KIND
    if dest in NOT_MODELLED:
        return NOT_MODELLED_KIND
    if dest in NO_MEMORY_EFFECT:
        return NO_MEMORY_EFFECT_KIND
    raise KeyError(f"{dest!r} is not a Megatron argument dest")


def _spelling(dest: str, release: str) -> str:
    from megatron_estimator.megatron.flags import flag_table

    spec = flag_table(release).by_dest(dest)
    return spec.flag if spec is not None else "--" + dest.replace("_", "-")


def memory_assumptions(given_dests: Iterable[str], values: Mapping[str, Any] | None = None, *,
                       release: str = NEWEST) -> list[tuple[str, str]]:
    """(flag, assumption) for each given dest that changes memory but is not modelled, spelled
    and defaulted as release ``release`` (a label) has them.

    The order is the file's rows (Megatron's registration order), whatever the order of
    ``given_dests``; each flag appears once.  The flag is Megatron's first option string for
    the dest (``--no-clone-scatter-output-in-embedding``).  With ``values`` (dest -> value
    given), a dest given at Megatron's default value is left out: ``--cuda-graph-impl none``
    changes nothing.
    """
    given = {d for d in given_dests if d in NOT_MODELLED}     # the only dests that can be said
    if values is not None:
        from megatron_estimator.megatron.flags import flag_table

        table = flag_table(release)
        given = {d for d in given
                 if d not in values or table.by_dest(d) is None or values[d] != table.default(d)}
    return [(_spelling(dest, release), NOT_MODELLED[dest]) for dest in sorted(given, key=_NOT_MODELLED_ORDER.__getitem__)]

