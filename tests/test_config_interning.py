"""build_config hands back the configuration built before for an equal one (config/typed.py
``interned``), so the memory model's per-configuration caches hit by identity; a configuration
that differs in anything, ``given`` included (equality leaves it out), is its own object."""

from megatron_estimator.config.resolve import resolve_config
from megatron_estimator.inputs.argv import parse_megatron_argv

FLAGS = ("--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 128 "
         "--max-position-embeddings 128 --micro-batch-size 1 --vocab-size 1000").split()


def config_of(flags):
    raw, problems = parse_megatron_argv(list(flags))
    assert not problems
    return resolve_config(raw, world_size=1, environ={})


def test_an_equal_configuration_is_the_same_object():
    assert config_of(FLAGS) is config_of(FLAGS)


def test_a_different_configuration_is_not():
    assert config_of(FLAGS) is not config_of(FLAGS + ["--bf16"])


def test_given_keeps_configurations_apart_though_equality_ignores_it():
    # --tensor-model-parallel-size 1 is Megatron's default: saying it changes ``given`` only.
    plain = config_of(FLAGS)
    explicit = config_of(FLAGS + ["--tensor-model-parallel-size", "1"])
    assert explicit == plain and explicit.given != plain.given
    assert explicit is not plain
