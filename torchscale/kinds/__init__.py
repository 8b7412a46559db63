"""The registry of cell kinds (``kind_registry``): kinds are plugins, found by module.

See docs/architecture.md, "Adding a cell kind".
"""
