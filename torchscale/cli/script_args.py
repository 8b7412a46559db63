"""``--script train.py ... -- ARGS``: the script's own arguments, exactly as given after ``--``.

Click drops the ``--`` and hands what follows to the command with its other extra arguments
(``benchmark``'s seed-style ``--key=value`` overrides), and to a group as a subcommand name. So
the commands that take ``--script`` parse with these classes, which take everything after the
first ``--`` aside before Click parses, when ``--script`` comes before it; the command reads it
with :func:`script_args`. (Typer's commands take the Click context of its own vendored Click:
``Any`` here.)
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Any, List, Optional

import typer
from typer.core import TyperCommand, TyperGroup
from typing_extensions import Annotated

from torchscale.errors import TorchscaleError

if TYPE_CHECKING:
    from torchscale.app.own_script import ScriptOptions

SCRIPT_OPTION = "--script"
_KEY = "torchscale.script_args"
SCRIPT_PANEL = "Your own training script"


class StepAt(str, Enum):
    """What ends a step of the script (``script.step_at``)."""

    optimizer = "optimizer"
    forward = "forward"


# The script options benchmark, profile and tune share: one definition, one help text.
SamplesPerStepOption = Annotated[
    Optional[int],
    typer.Option(
        "--samples-per-step",
        min=1,
        help="With --script: samples one rank trains on per step (default: counted from the DDP "
        "forward's input; needed without DDP).",
        rich_help_panel=SCRIPT_PANEL,
    ),
]
StepAtOption = Annotated[
    Optional[StepAt],
    typer.Option(
        "--step-at",
        help="With --script: what ends a step, each optimizer step (default) or each DDP forward "
        "(a script without a torch.optim optimizer).",
        rich_help_panel=SCRIPT_PANEL,
    ),
]

ThreadsOption = Annotated[
    Optional[int],
    typer.Option(
        "--threads",
        min=1,
        help="With --script: intra-op threads of every rank (torch.set_num_threads; default: "
        "what plain torchrun gives, OMP_NUM_THREADS=1 with several processes per node).",
        rich_help_panel=SCRIPT_PANEL,
    ),
]


def step_at_value(step_at: Optional[StepAt]) -> Optional[str]:
    return step_at.value if step_at is not None else None


def script_options_alone(why: str = "your own training script", **given: object) -> None:
    """Refuse a script option without ``--script`` (one line): it would be ignored."""
    for name, value in given.items():
        if value:
            option = "--" + name.replace("_", "-")
            raise TorchscaleError(f"{option} goes with --script ({why})")


def script_options(
    ctx: Any,
    script: Optional[str],
    samples_per_step: Optional[int],
    step_at: Optional[StepAt],
    threads: Optional[int] = None,
) -> Optional[ScriptOptions]:
    """``profile``'s and ``tune``'s script options: the script run as written (its arguments
    after ``--``), or None without ``--script``, where a script option alone is refused."""
    if script is None:
        script_options_alone(samples_per_step=samples_per_step, step_at=step_at, threads=threads)
        return None
    from torchscale.app.own_script import ScriptOptions

    return ScriptOptions(
        script, script_args(ctx), samples_per_step=samples_per_step,
        step_at=step_at_value(step_at), threads=threads,
    )  # fmt: skip


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
