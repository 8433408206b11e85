"""megatron-estimator: will this Megatron-LM configuration fit in GPU memory on every stage?

The Python API (imported lazily, so ``import megatron_estimator`` stays cheap)::

    import megatron_estimator as me
    result = me.estimate(["--num-layers", "32", ...], world_size=8, budget="80GiB")
    result.fits, result.peak_stage, result.stages, result.assumptions

``estimate`` raises ``InvalidInput`` carrying every problem found.
"""

__version__ = "0.1.0"

__all__ = ["estimate", "InvalidInput", "Problem", "Estimate", "StageEstimate", "__version__"]


def __getattr__(name):
    if name in ("estimate", "InvalidInput", "Problem", "Estimate", "StageEstimate", "Verdict", "Assumption"):
        from megatron_estimator import api

        return getattr(api, name)
    raise AttributeError(f"module 'megatron_estimator' has no attribute {name!r}")
