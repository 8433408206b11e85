"""The layout planner: every parallel layout Megatron accepts for a model on N GPUs, the ones
that fit the budget, best first (``api.plan`` is the entry point).

space (what is searched) -> validity (what the rules accept) -> memory (``model/stage.py``'s
stage parts, cached) -> cost (the throughput proxy) -> search (the loop and the ranking) ->
candidates (``results.plan`` records, verified on the normal path).
"""
