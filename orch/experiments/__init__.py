"""Experiments: many runs at once. Sweeps (``sweep``) and the runs on disk (``catalog``)."""
