"""A cap on what a user's script prints, per rank: the head and the tail kept, with a note.

A rank's stdout and stderr go where torchrun sends them (its per-rank log files, copied into the
cell's ``launch.log``): a script that prints without end would fill the disk twice over. So the
rank entry (``script.wrap``) sends both streams through pipes to a small process of its own
(``python -m torchscale.script.output_cap``, no torch) that writes the first ``HEAD_BYTES`` of
each stream as they come, keeps the last ``TAIL_BYTES`` in memory, and at the end writes a note
saying how much was left out, then that tail (from its first whole line). What a script prints
reaches the log at once until its head is full.

The rank ends the capper itself before it exits (``release``: its streams closed, the capper
waited for), at the end torchscale gives it and, through ``atexit``, when the script fails (after
Python printed the traceback). A rank killed by a signal closes its pipes all the same: the
capper writes its tail and exits.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import select
import signal
import subprocess
import sys
from typing import Dict, List, Optional

HEAD_BYTES = 4 << 20
TAIL_BYTES = 1 << 20
LIMIT_ENV = "TORCHSCALE_SCRIPT_OUTPUT_LIMIT"
"""Bytes of the head and of the tail kept, each (default: 4 MiB and 1 MiB): ``HEAD[:TAIL]``."""
STREAMS = ("stdout", "stderr")
_capper: Optional[subprocess.Popen] = None  # type: ignore[type-arg]


def limits(text: Optional[str]) -> tuple[int, int]:
    """(head, tail) bytes from ``HEAD[:TAIL]`` (the defaults where unset or unreadable)."""
    if not text:
        return HEAD_BYTES, TAIL_BYTES
    head, _, tail = text.partition(":")
    try:
        return max(0, int(head)), max(0, int(tail)) if tail else TAIL_BYTES
    except ValueError:
        return HEAD_BYTES, TAIL_BYTES


class Capped:
    """One stream: its head written as it comes, its tail kept for the end."""

    def __init__(self, name: str, fd: int, head: int, tail: int) -> None:
        self.name, self.fd, self.head, self.tail = name, fd, head, tail
        self.written = 0
        self.kept = bytearray()
        self.left_out = 0

    def feed(self, data: bytes) -> None:
        if self.written < self.head:
            now = data[: self.head - self.written]
            _write_all(self.fd, now)
            self.written += len(now)
            data = data[len(now) :]
        if data:
            self.kept += data
            over = len(self.kept) - self.tail
            if over > 0:
                del self.kept[:over]
                self.left_out += over

    def close(self) -> None:
        tail = bytes(self.kept)
        if self.left_out:
            cut = tail.find(b"\n")
            if 0 <= cut < len(tail) - 1:  # from the first whole line
                self.left_out += cut + 1
                tail = tail[cut + 1 :]
            note = (
                f"\n[torchscale: {self.left_out} bytes of this rank's {self.name} left out here: "
                f"the first {self.written} and the last {len(tail)} are kept ({LIMIT_ENV})]\n"
            )
            _write_all(self.fd, note.encode())
        _write_all(self.fd, tail)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except OSError:  # the log is gone (a full disk): the rank must not block on its pipe
            return


def copy(pipes: Dict[int, Capped]) -> None:
    """Copy each pipe to its stream, capped, until every pipe is closed."""
    poller = select.poll()
    for fd in pipes:
        poller.register(fd, select.POLLIN | select.POLLHUP)
    open_fds = set(pipes)
    while open_fds:
        for fd, _ in poller.poll():
            data = os.read(fd, 1 << 16)
            if data:
                pipes[fd].feed(data)
            else:
                poller.unregister(fd)
                open_fds.discard(fd)
                pipes[fd].close()


def main(argv: Optional[List[str]] = None) -> None:
    """``python -m torchscale.script.output_cap READ_OUT READ_ERR``: fd 1 and 2 are the rank's
    own streams (torchrun's files)."""
    args = sys.argv[1:] if argv is None else argv
    # The launch's end (SIGTERM to what is left) must not cost the tail: the capper ends with
    # its pipes, a moment after its rank.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    head, tail = limits(os.environ.get(LIMIT_ENV))
    pipes = {int(fd): Capped(name, out, head, tail) for fd, name, out in zip(args, STREAMS, (1, 2))}
    copy(pipes)


def start() -> None:
    """Send this process's stdout and stderr through a capper (once)."""
    global _capper
    if _capper is not None:
        return
    reads, writes = zip(os.pipe(), os.pipe())  # (read_out, read_err), (write_out, write_err)
    sys.stdout.flush()
    sys.stderr.flush()
    _capper = subprocess.Popen(
        [sys.executable, "-m", "torchscale.script.output_cap", *map(str, reads)],
        pass_fds=reads,
        stdin=subprocess.DEVNULL,
    )
    for fd in reads:
        os.close(fd)
    for write, stream in zip(writes, (1, 2)):
        os.dup2(write, stream)
        os.close(write)
    atexit.register(release)


def capper_pid() -> Optional[int]:
    return _capper.pid if _capper is not None else None


def release(timeout_s: float = 5.0) -> None:
    """Close this process's streams (the capper sees their end) and wait for the capper to
    write the tail. Output after this goes nowhere: call it last."""
    global _capper
    if _capper is None:
        return
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    null = os.open(os.devnull, os.O_WRONLY)
    for stream in (1, 2):
        os.dup2(null, stream)
    os.close(null)
    with contextlib.suppress(subprocess.TimeoutExpired):
        _capper.wait(timeout=timeout_s)
    _capper = None


if __name__ == "__main__":
    main()
