"""Cell kinds as plugins: one protocol (``protocol.CellKind``), one registry (``registry``).

See docs/architecture.md, "Adding a cell kind".
"""
