"""Cell kinds as plugins: one protocol (``protocol.CellKind``), one registry (``kind_registry``).

See docs/architecture.md, "Adding a cell kind".
"""
