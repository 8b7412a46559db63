"""Run a snippet in a fresh interpreter: what a command imports can only be seen from outside."""

from __future__ import annotations

import subprocess
import sys


def python_prints(code: str) -> str:
    """The stripped stdout of ``python -c code`` (fails the test if the snippet fails)."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip()
