"""Configurations that are trees, not flags: NeMo-RL (``nemo_rl``) and verl (``verl``) jobs read
with the libraries those frameworks use (OmegaConf, Hydra; the ``frameworks`` extra)."""
