"""``torchscale tune``: search DDP's settings for one model on one node, and prove the gain.

``config`` (the ``tune:`` YAML section, torch-free), ``space`` (which knobs, which values),
``study`` (the Optuna study and its SQLite storage), ``trials`` (trials as benchmark cells, run in
batches through the sweep), ``verdict`` (interleaved re-measure and bootstrap interval),
``outputs`` (best.yaml, the DDP snippet, tune.json) and ``runner`` (the whole run).
"""
