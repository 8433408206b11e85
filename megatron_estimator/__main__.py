"""``python -m megatron_estimator``: the same command line as ``megatron-estimator``."""

from .cli import entry_point

entry_point()
