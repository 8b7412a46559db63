"""Errors that reach the user as one line and exit code 2 (bad input), never a traceback."""

from __future__ import annotations


class TorchscaleError(Exception):
    """A problem the user can fix: bad config, bad flag, unusable path.

    The message must name the problem and how to fix it, in one line.
    """

    exit_code = 2


class ConfigError(TorchscaleError):
    """The benchmark configuration (YAML or overrides) is invalid."""
