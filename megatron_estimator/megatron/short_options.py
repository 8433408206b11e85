"""Short names of Megatron's flags that other tools use.

megatron-memory-estimator's ``estimate_from_hf.py`` (the seed tool) takes ``--tp 4 --pp 2 ...``
for Megatron's ``--tensor-model-parallel-size 4 --pipeline-model-parallel-size 2 ...``.  The
estimator accepts these before ``--`` on ``estimate`` and ``check`` (``inputs/seed_options.py``),
and a did-you-mean for one met among Megatron's own flags names the Megatron flag
(``flags.closest_flags``: Megatron's argparse rejects ``--tp``).
"""

from __future__ import annotations

# The seed tool's option -> the Megatron flag whose dest it sets.  Its --vpp is "virtual
# pipeline parallel size": the number of model chunks per pipeline rank, Megatron's
# --num-virtual-stages-per-pipeline-rank.  Its --recompute-modules takes one comma-separated
# value (Megatron's takes several values).
ALIASES: dict[str, str] = {
    "--tp": "--tensor-model-parallel-size",
    "--pp": "--pipeline-model-parallel-size",
    "--ep": "--expert-model-parallel-size",
    "--cp": "--context-parallel-size",
    "--etp": "--expert-tensor-parallel-size",
    "--vpp": "--num-virtual-stages-per-pipeline-rank",
    "--num-layers-in-first-pipeline-stage": "--decoder-first-pipeline-num-layers",
    "--num-layers-in-last-pipeline-stage": "--decoder-last-pipeline-num-layers",
    "--micro-batch-size": "--micro-batch-size",
    "--seq-length": "--seq-length",
    "--recompute-granularity": "--recompute-granularity",
    "--recompute-method": "--recompute-method",
    "--recompute-num-layers": "--recompute-num-layers",
    "--recompute-modules": "--recompute-modules",
}

# Switches: the option -> (the Megatron flag whose dest it sets, the value it sets).
SWITCHES: dict[str, tuple[str, bool]] = {
    "--no-distributed-optimizer": ("--use-distributed-optimizer", False),
}

# Options whose one value is a comma-separated list of the Megatron flag's values.
COMMA_LISTS = frozenset({"--recompute-modules"})


def megatron_flag_for(option: str) -> str | None:
    """The Megatron flag a short name stands for (``--tp`` -> ``--tensor-model-parallel-size``),
    or None when ``option`` is none of them or is spelled as Megatron spells it."""
    flag = ALIASES.get(option)
    return flag if flag is not None and flag != option else None
