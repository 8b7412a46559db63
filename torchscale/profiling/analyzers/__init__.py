"""Analyses: each is a function from per-rank traces to a pandas DataFrame (no plotting here)."""
