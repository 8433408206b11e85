"""The estimator's own bounds on sizes it is given (README.md, "Limits").

Not Megatron's rules: sizes past these describe no machine that exists, and would only make
the estimator's arithmetic and searches (divisors of the world size, layouts) run unbounded.
The file size caps are in ``core.resources`` (with the reader), the YAML bounds in
``inputs.yamlpos``, the shell reader's in ``inputs.bash.state``, the planner's in
``planner.space``.
"""

MAX_WORLD_SIZE = 1 << 24        # GPUs in one job (16,777,216); every parallel size is bounded by it
MAX_BATCH_SIZE = 1 << 32        # sequences in a micro or global batch


def world_size_problem(value: int) -> str | None:
    """Why ``value`` cannot be a world size, or None."""
    if value < 1:
        return f"a world size of {value} GPUs is not positive"
    if value > MAX_WORLD_SIZE:
        return f"a world size of {shown_count(value, 'GPUs')} is more than {MAX_WORLD_SIZE:,} (2^24), the estimator's bound"
    return None


def shown_count(value: int, unit: str) -> str:
    """``1,024 GPUs``, or for a huge number ``a 31-digit number of GPUs`` (never converted whole)."""
    if value.bit_length() < 64:
        return f"{value:,} {unit}"
    return f"a {int(value.bit_length() * 0.30103) + 1}-digit number of {unit}"


def bounded_world_size(value, source, problems):
    """``api.world_size_for``'s answer, refused past the bound before any search (a world size
    below 1 is left to ``config.resolve``, which says why)."""
    from megatron_estimator.core.problems import Problem

    wrong = world_size_problem(value) if isinstance(value, int) and value > 0 and not problems else None
    if wrong is None:
        return value, source, problems
    where = (source or "world size").split(" (", 1)[0]
    said = f" ({source})" if source != where else ""
    return None, None, (Problem("world-size-out-of-range", where, wrong + said),)
