"""How each rank of a launch ended, as its launcher saw it, and ending what the ranks left.

The torchrun agent (``launch/torchrun_agent.py``) appends each worker's start, end (exit code or
signal, and when) and torchrun's own stops to ``exits.<host>.jsonl`` in the launch's folder (the
cell's, or its warm group's). Where no such file was written (``--launcher mpirun``), torchrun's
or mpirun's own log lines say which rank ended how, without a time. Under ``--launcher slurm``
each srun task is one node's torchrun (its agent records its srun task with each worker), and
srun's own lines say how a task ended (``srun: error: gpu02: task 1: Killed``): what is known
of the ranks whose agent went with its torchrun. Once a launch is over, :func:`end_launch` ends
every process left in the sessions of its ranks and launcher.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import signal
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from torchscale.launch.process import end_sessions
from torchscale.launch.torchrun_agent import EXITS_ENV
from torchscale.results.files import open_for_read
from torchscale.results.layout import EXITS_FILE, EXITS_GLOB

log = logging.getLogger("torchscale")


def exits_env(folder: Path) -> Dict[str, str]:
    """The variable that makes the torchrun agent record its workers' ends in ``folder``."""
    return {EXITS_ENV: str(folder / EXITS_FILE)}


def clear_exits(folder: Path) -> None:
    for path in folder.glob(EXITS_GLOB):
        with contextlib.suppress(OSError):
            path.unlink()


def _lines(path: Path) -> List[Dict[str, Any]]:
    try:
        with open(open_for_read(path), encoding="utf-8", errors="replace") as handle:
            text = handle.read(1 << 20)
    except OSError:
        return []
    docs = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            doc = json.loads(line)
            if isinstance(doc, dict) and isinstance(doc.get("rank"), int):
                docs.append(doc)
    return docs


def read_exits(folder: Optional[Path]) -> Dict[int, Dict[str, Any]]:
    """By rank: ``pid``, ``time`` it ended, ``exitcode`` or ``signal`` (what is known), and
    ``stopped`` when torchrun signalled it first."""
    ends: Dict[int, Dict[str, Any]] = {}
    for path in sorted(folder.glob(EXITS_GLOB)) if folder is not None else []:
        for doc in _lines(path):
            end = ends.setdefault(doc["rank"], {"pid": doc.get("pid")})
            if doc.get("event") == "stop" and "time" not in end:
                end["stopped"] = True  # torchrun ended it, after another rank failed
            elif doc.get("event") == "end":
                end["time"] = doc.get("time")
                for key in ("exitcode", "signal"):
                    if isinstance(doc.get(key), int):
                        end[key] = doc[key]
            elif doc.get("event") == "reaped" and "exitcode" not in end and "signal" not in end:
                code = doc.get("returncode")
                if isinstance(code, int):
                    end.update({"signal": -code} if code < 0 else {"exitcode": code})
    return ends


def workers(folder: Optional[Path]) -> List[Tuple[int, Optional[int]]]:
    """(pid, start ticks) of every worker the agent(s) started in ``folder``'s launch."""
    found = []
    for path in sorted(folder.glob(EXITS_GLOB)) if folder is not None else []:
        for doc in _lines(path):
            if doc.get("event") == "start" and isinstance(doc.get("pid"), int):
                ticks = doc.get("ticks")
                found.append((doc["pid"], ticks if isinstance(ticks, int) else None))
    return found


def srun_tasks(folder: Optional[Path]) -> Dict[Tuple[int, int], int]:
    """(srun task, local rank) -> rank, for the workers the agents of an srun launch started
    (``srun_task`` in their start lines: ``SLURM_PROCID``)."""
    placed: Dict[Tuple[int, int], int] = {}
    for path in sorted(folder.glob(EXITS_GLOB)) if folder is not None else []:
        for doc in _lines(path):
            task, local = doc.get("srun_task"), doc.get("local_rank")
            if doc.get("event") == "start" and isinstance(task, int) and isinstance(local, int):
                placed[(task, local)] = doc["rank"]
    return placed


TORCHRUN_FAILED = re.compile(
    r"^(?:(\d+): )?.*?failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\)", re.M
)
"""torchrun's agent on a worker that failed; under srun's ``--label`` the line starts with the
srun task (``1: ``)."""
MPIRUN_SIGNAL = re.compile(r"process rank (\d+) with PID \d+ on node \S+ exited on signal (\d+)")
MPIRUN_EXIT = re.compile(r"Process name: \[\[\d+,\d+\],(\d+)\]\s+Exit code:\s+(\d+)")


def launcher_log_exits(
    text: str, placed: Optional[Dict[Tuple[int, int], int]] = None
) -> Dict[int, Dict[str, Any]]:
    """Ends that torchrun's or mpirun's own log lines report, without times: what is left where
    no exits file was written. A torchrun line's local rank is the rank on a single node; under
    srun (labelled with its task) only through ``placed`` (:func:`srun_tasks`)."""
    ends: Dict[int, Dict[str, Any]] = {}
    for match in TORCHRUN_FAILED.finditer(text):
        task, code, local = match.group(1), int(match.group(2)), int(match.group(3))
        rank = local if task is None else (placed or {}).get((int(task), local))
        if rank is not None:
            ends.setdefault(rank, {"signal": -code} if code < 0 else {"exitcode": code})
    for match in MPIRUN_SIGNAL.finditer(text):
        ends.setdefault(int(match.group(1)), {"signal": int(match.group(2))})
    for match in MPIRUN_EXIT.finditer(text):
        ends.setdefault(int(match.group(1)), {"exitcode": int(match.group(2))})
    return ends


SRUN_TASK_END = re.compile(r"^srun: error: (\S+): tasks? ([\d,-]+): (.+?)\s*$", re.M)
"""srun's line on tasks that ended badly (Slurm's ``_task_finish``, src/srun/launch.c):
``srun: error: <hosts>: task 1: Killed``, ``... tasks 0-1: Exited with exit code 3``, the
signal as ``strsignal`` words it, `` (core dumped)`` after it, or ``Out Of Memory``."""
SRUN_EXITED = re.compile(r"Exited with exit code (\d+)")
SRUN_OOM = "Out Of Memory"
SIGNAL_WORDS = {
    words: int(number) for number in signal.Signals if (words := signal.strsignal(number))
}
"""``Killed`` -> 9: the C library's words for each signal, which srun prints."""


def _task_ids(text: str) -> List[int]:
    """``0-2,5`` -> [0, 1, 2, 5] (Slurm's ``bit_fmt`` ranges)."""
    ids: List[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        if low.isdigit() and (not high or high.isdigit()):
            ids += range(int(low), int(high or low) + 1)
    return ids


def srun_task_ends(text: str) -> Dict[int, Dict[str, Any]]:
    """By srun task: how srun saw it end (``exitcode``, or ``signal``, with ``oom`` for Slurm's
    memory limit), its ``host``, srun's words (``said``) and ``order``: srun writes a line as
    each end reaches it, so the first line is the first task to leave."""
    ends: Dict[int, Dict[str, Any]] = {}
    for order, match in enumerate(SRUN_TASK_END.finditer(text)):
        host, tasks, said = match.groups()
        words = said.removesuffix(" (core dumped)")
        exited = SRUN_EXITED.fullmatch(words)
        if exited:
            end: Dict[str, Any] = {"exitcode": int(exited.group(1))}
        elif words == SRUN_OOM:
            end = {"signal": int(signal.SIGKILL), "oom": True}
        elif words in SIGNAL_WORDS:
            end = {"signal": SIGNAL_WORDS[words]}
        else:
            continue
        for task in _task_ids(tasks):
            ends.setdefault(task, {**end, "host": host, "said": said, "order": order})
    return ends


def log_text(path: Path) -> str:
    """The launcher's log (its first 8 MiB)."""
    try:
        with open(open_for_read(path), "rb") as handle:
            return handle.read(8 << 20).decode("utf-8", "replace")
    except OSError:
        return ""


def end_launch(launcher: Sequence[Tuple[int, Optional[int]]], exits: Path) -> None:
    """Once a launch is over: every process left in its launcher's and its ranks' sessions
    (a rank's own children outlive it otherwise: they are not in torchrun's tree)."""
    left = end_sessions([*launcher, *workers(exits)])
    if left:
        log.debug("ended %d process(es) the launch left behind: %s", len(left), left)
