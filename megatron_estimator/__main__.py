"""``python -m megatron_estimator``: the same command line as ``megatron-estimator``."""

from megatron_estimator.cli import entry_point

entry_point()
