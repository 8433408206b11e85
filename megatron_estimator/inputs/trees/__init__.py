"""Readers of frameworks whose configurations are trees (OmegaConf / Hydra YAML), not flags:
Megatron-Bridge (``bridge.py``), NeMo-RL and verl.  ``common.py`` holds what they share."""
