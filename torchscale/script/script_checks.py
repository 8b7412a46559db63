"""A training script checked before anything runs: it exists, is a file, and is Python.

Compiling the source (never running it) is the check: a shell script, a binary or a file with a
syntax error is refused with one line naming the line at fault, before any folder is written.
No torch here.
"""

from __future__ import annotations

from pathlib import Path

from torchscale.config.base import clip
from torchscale.errors import ConfigError

MAX_SCRIPT_BYTES = 16 << 20
"""A training script is kilobytes; a file past this is not one."""


def check_script(path: str) -> Path:
    """``path`` as a Path, or a ConfigError saying what is wrong with it and what to pass."""
    script = Path(path)
    shown = clip(path)
    if not script.exists():
        raise ConfigError(
            f"script {shown} does not exist (paths are relative to {Path.cwd()}): pass the "
            "path of your training script"
        )
    if not script.is_file():
        raise ConfigError(f"script {shown} is not a file: pass the path of your training script")
    try:
        size = script.stat().st_size
        if size > MAX_SCRIPT_BYTES:
            raise ConfigError(
                f"script {shown} is {size:,} bytes, not a training script: pass a Python file"
            )
        source = script.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read script {shown}: {clip(exc)}") from None
    try:
        compile(source, str(script), "exec", dont_inherit=True)
    except SyntaxError as exc:
        where = f" (line {exc.lineno}: {clip(exc.msg, 80)})" if exc.lineno else ""
        raise ConfigError(
            f"script {shown} is not Python{where}: --script runs a Python training script "
            "(for anything else, wrap it in one)"
        ) from None
    except ValueError as exc:  # NUL bytes: a binary
        raise ConfigError(
            f"script {shown} is not Python ({clip(exc, 80)}): --script runs a Python training "
            "script"
        ) from None
    return script
