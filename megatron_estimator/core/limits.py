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
