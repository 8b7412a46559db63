"""Collective-communication definitions shared by validate's smoke test and the comm benchmarks."""
