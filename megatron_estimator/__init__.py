"""megatron-estimator: will this Megatron-LM configuration fit in GPU memory on every stage?"""

__version__ = "0.1.0"
