"""The script cell kind: a user's own DDP training script, run unmodified under torchrun.

``script_config`` is its ``script:`` section and cell settings, ``script_kind`` the kind the
registry names, ``wrap`` the rank entry (``python -m torchscale.script.wrap``) that runs the
script with the bootstrap (``step_hooks``, ``script_window``) installed. Its records are the
training kind's (``TrainingResult``), so report, compare, project and tune read them unchanged.
See docs/own-job.md.
"""
