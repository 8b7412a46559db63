"""``--script train.py ... -- ARGS``: the script's own arguments, exactly as given after ``--``.

Click drops the ``--`` and hands what follows to the command with its other extra arguments
(``benchmark``'s seed-style ``--key=value`` overrides), and to a group as a subcommand name. So
the commands that take ``--script`` parse with these classes, which take everything after the
first ``--`` aside before Click parses, when ``--script`` comes before it; the command reads it
with :func:`script_args`. (Typer's commands take the Click context of its own vendored Click:
``Any`` here.)
"""

from __future__ import annotations

from typing import Any, List

from typer.core import TyperCommand, TyperGroup

SCRIPT_OPTION = "--script"
_KEY = "torchscale.script_args"


def _split(ctx: Any, args: List[str]) -> List[str]:
    if "--" in args:
        cut = args.index("--")
        before = args[:cut]
        if any(a == SCRIPT_OPTION or a.startswith(f"{SCRIPT_OPTION}=") for a in before):
            ctx.meta[_KEY] = args[cut + 1 :]
            return before
    return args


class ScriptArgsCommand(TyperCommand):
    def parse_args(self, ctx: Any, args: List[str]) -> List[str]:
        return super().parse_args(ctx, _split(ctx, args))


class ScriptArgsGroup(TyperGroup):
    def parse_args(self, ctx: Any, args: List[str]) -> List[str]:
        return super().parse_args(ctx, _split(ctx, args))


def script_args(ctx: Any) -> List[str]:
    """The arguments after ``--``, when ``--script`` came before it (else none)."""
    return list(ctx.meta.get(_KEY, []))
