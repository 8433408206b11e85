"""Readers of frameworks whose configurations are trees (OmegaConf / Hydra YAML), not flags:
Megatron-Bridge (``bridge.py``), NeMo-RL (``nemo_rl.py``) and verl (``verl.py``), read with the
libraries those frameworks use (the ``frameworks`` extra).  ``common.py`` holds what they share."""
