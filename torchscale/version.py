"""torchscale's version, in a module of its own so that any module can name it without importing
the package's lazy API (``torchscale.__init__``)."""

__version__ = "0.1.0"
