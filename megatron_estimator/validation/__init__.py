"""Validation: JSON Schema for types, ranges and choices; small functions for Megatron's cross-field rules."""
