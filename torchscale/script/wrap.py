"""Rank entry of a script cell: ``torchrun ... -m torchscale.script.wrap --cell cell.json --out
result.json``.

Runs the user's training script unmodified, in this process, as ``python train.py ARGS`` would
(``__name__ == "__main__"``, ``sys.argv``, the script's folder first on ``sys.path`` where
``python -m`` put the working directory), with the bootstrap installed around it
(``step_hooks``: the DDP model, forwards and optimizer steps; ``script_window``: the windows).
Before the script starts, the cell's process-level settings apply: communication environment,
intra-op threads, cuDNN autotuning (again when the script builds DDP, in case it set them
itself). The script's own output goes where torchrun sends each rank's output: the cell's log.

A script that raises, or exits with a non-zero code, on any rank is a failure: this rank's error
file names what it raised (``runtime.entry.reporting_failures``), and torchrun stops the other
ranks. A script that cannot be measured (``run_state.NotMeasurable``: ended before the windows,
never built DDP, built two) fails the same way with the reason.
"""

from __future__ import annotations

import functools
import os
import runpy
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

from torch.distributed.elastic.multiprocessing.errors import record

from torchscale.plan.profile_request import ProfileRequest
from torchscale.runtime.entry import (
    exit_now,
    parse_cell_args,
    rank_reporter,
    read_cell,
    reporting_failures,
)
from torchscale.script import output_cap
from torchscale.script.run_state import NotMeasurable
from torchscale.script.script_config import ScriptCellSettings
from torchscale.script.script_finish import end_children
from torchscale.script.script_strategy import become_strategy_module
from torchscale.script.script_window import ScriptWindows
from torchscale.script.step_hooks import Instead, installed


class ScriptExited(Exception):
    """The script called ``sys.exit`` with a failure code."""


def apply_process_settings(settings: ScriptCellSettings) -> Dict[str, Any]:
    """The cell's environment, threads and cuDNN autotuning, before the script starts."""
    import torch

    os.environ.update(settings.env)
    if settings.threads is not None:
        torch.set_num_threads(settings.threads)
    if settings.cudnn_benchmark is not None:
        torch.backends.cudnn.benchmark = settings.cudnn_benchmark
    return {"threads": settings.threads, "cudnn_benchmark": settings.cudnn_benchmark}


class _Reapplied(ScriptWindows):
    """The windows, with the process-level settings applied again when DDP is built."""

    def ddp_built(self, ddp: Any, applied: Dict[str, Any]) -> None:
        applied.update({k: v for k, v in apply_process_settings(self.s).items() if v is not None})
        super().ddp_built(ddp, applied)


def script_search_path(path: str, search: List[str], cwd: str, safe_path: bool) -> List[str]:
    """``sys.path`` as ``python path`` has it: the script's folder (symlinks resolved) first, in
    place of the working directory that ``python -m`` put there (none under ``-P``), which
    ``python path`` does not add: a module beside the working directory is not the script's."""
    rest = search[1:] if search and not safe_path and search[0] == cwd else search
    return [str(Path(path).resolve().parent), *rest]


def run_script(path: str, args: List[str]) -> None:
    """``python path args`` in this process; a non-zero ``sys.exit`` raises ScriptExited."""
    sys.argv = [path, *args]
    safe_path = bool(getattr(sys.flags, "safe_path", False))  # -P, Python 3.11+
    sys.path[:] = script_search_path(path, sys.path, os.getcwd(), safe_path)
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise ScriptExited(f"the script exited with code {exc.code!r}") from None


def strategy_instead(settings: ScriptCellSettings) -> Optional[Instead]:
    """What the script's DDP call builds under the cell's strategy (None: DDP itself)."""
    if settings.strategy == "ddp":
        return None
    return functools.partial(become_strategy_module, settings=settings)


def run_cell(cell_path: Path, out_path: Path) -> None:
    cell = read_cell(cell_path)
    settings = ScriptCellSettings.model_validate(cell["settings"])
    request = ProfileRequest.from_json(cell.get("profile"))
    reporter = rank_reporter(out_path)
    with reporting_failures(reporter):
        reporter.phase("init")
        output_cap.start()  # the script's output, capped per rank (head and tail kept)
        apply_process_settings(settings)
        windows = _Reapplied(settings, request, reporter, out_path)
        reporter.phase("build")  # the script's own start: imports, data, model
        with installed(windows, settings.ddp_overrides(), strategy_instead(settings)):
            run_script(settings.script, settings.args)
            windows.script_ended()


@record
def main(argv: Optional[List[str]] = None) -> None:
    args = parse_cell_args("torchscale.script.wrap", __doc__ or "", argv)
    try:
        run_cell(args.cell, args.out)
    except NotMeasurable:
        end_children()
        raise  # the capper is released at exit, after Python printed the traceback
    end_children()
    output_cap.release()
    exit_now()


if __name__ == "__main__":
    main()
