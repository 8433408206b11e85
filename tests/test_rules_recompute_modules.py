"""--recompute-modules is checked only with selective recompute (config/rules/recompute.py).

megatron/core/transformer/transformer_config.py __post_init__ (d98e8a64 lines 1943-1962;
core_v0.14.0 lines 867-882) asserts the module names inside ``if self.recompute_granularity ==
"selective"``: with full or no recompute any name is accepted (and unread).  The coverage harness
found Megatron accepting ``--recompute-modules x`` / ``1`` / ``none none`` without selective.
"""
import pytest

from conftest import problems_of

BASE = ("--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 512 "
        "--max-position-embeddings 512 --micro-batch-size 1 --global-batch-size 8 --train-iters 10 "
        "--lr 1e-4 --tokenizer-type NullTokenizer --vocab-size 32000 --mock-data --bf16")

CASES = [
    (" --recompute-modules x", None),                                             # no recompute
    (" --recompute-modules 1", None),
    (" --recompute-modules none none", None),
    (" --recompute-granularity full --recompute-method uniform --recompute-num-layers 1 --recompute-modules x", None),
    (" --recompute-granularity selective --recompute-modules mlp layernorm", None),
    (" --recompute-granularity selective --recompute-modules x", "invalid-choice"),   # line 1958-1962
    (" --recompute-granularity selective --recompute-modules none core_attn", "invalid-choice"),
]


@pytest.mark.parametrize("extra, code", CASES, ids=[c[0].strip() for c in CASES])
def test_module_names_are_checked_only_under_selective(extra, code):
    problems = problems_of(BASE + extra, world_size=8)
    if code is None:
        assert problems == [], problems
    else:
        assert [(p.code, p.location) for p in problems] == [(code, "--recompute-modules")], problems


def test_megatron_core_checks_module_names_only_under_selective():
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.transformer_config import TransformerConfig

    base = dict(num_layers=2, hidden_size=64, num_attention_heads=8, use_cpu_initialization=True)
    TransformerConfig(**base, recompute_modules=["x"])
    TransformerConfig(**base, recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1,
                      recompute_modules=["x"])
    with pytest.raises(AssertionError, match="Invalid choices for recompute_modules"):
        TransformerConfig(**base, recompute_granularity="selective", recompute_modules=["x"])
