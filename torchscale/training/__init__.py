"""The training cell kind (``training_kind.KIND``): DDP training launches of a model.

The core kind: its pieces are the stages' own, the planner in ``plan/training_cells.py``, the
worker in ``worker/``, the tables in ``analysis/training_tables.py``. This package binds them
into the kind the registry names (``torchscale.kinds.kind_registry``).
"""
