"""Which processes belong to a cell, whether they still live, and ending them with torchscale.

A pid alone says nothing once the process is gone: pids are reused. A process is named here by
its host, the kernel's boot id, its pid and its start time in clock ticks since boot (field 22
of ``/proc/<pid>/stat``): the same four values can only be the same process.

Three mechanisms keep a cell's processes from outliving torchscale:

* the launcher (torchrun, srun) gets ``PR_SET_PDEATHSIG`` = SIGKILL (:func:`die_with_parent`):
  the kernel kills it the moment torchscale dies, SIGKILL included;
* every worker runs :func:`watch_parent`: a thread that waits (``pidfd``, no polling) on its
  parent and on torchscale itself (named in ``TORCHSCALE_ORCHESTRATOR``) and kills the worker
  when either is gone. torchrun starts workers in sessions of their own, so nothing else would;
* while a cell runs, ``cells/<id>/owner.json`` names its launcher: a later torchscale that finds
  that process alive (:func:`live_owner`) refuses to start the cell again beside it.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import select
import signal
import socket
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Optional

from torchscale.results.json_input import parse_json
from torchscale.results.layout import OWNER_FILE

log = logging.getLogger("torchscale")

ORCHESTRATOR_ENV = "TORCHSCALE_ORCHESTRATOR"
"""The torchscale process that launched this cell, as :meth:`ProcessIdentity.encode` writes it."""

PR_SET_PDEATHSIG = 1
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def _boot_id() -> str:
    try:
        return _BOOT_ID.read_text().strip()
    except OSError:
        return ""


def start_ticks(pid: int) -> Optional[int]:
    """When ``pid`` started, in clock ticks since boot; None when no such (live) process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            text = handle.read()
    except OSError:
        return _psutil_start(pid)
    fields = text[text.rfind(b")") + 2 :].split()
    if not fields or fields[0] in (b"Z", b"X"):  # a zombie has ended: it owns nothing
        return None
    return int(fields[19])


def _psutil_start(pid: int) -> Optional[int]:
    if Path("/proc/self/stat").exists():
        return None  # /proc works: the process is gone
    try:
        import psutil

        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return int(proc.create_time() * 100)
    except Exception:
        return None


@dataclass(frozen=True)
class ProcessIdentity:
    host: str
    boot_id: str
    pid: int
    start_ticks: int

    @classmethod
    def of(cls, pid: int) -> Optional[ProcessIdentity]:
        ticks = start_ticks(pid)
        if ticks is None:
            return None
        return cls(socket.gethostname(), _boot_id(), pid, ticks)

    def is_local(self) -> bool:
        return self.host == socket.gethostname()

    def alive(self) -> Optional[bool]:
        """True or False on this host; None when it ran on another host (cannot be told)."""
        if not self.is_local():
            return None
        if self.boot_id != _boot_id():
            return False  # the host rebooted since
        return start_ticks(self.pid) == self.start_ticks

    def encode(self) -> str:
        return f"{self.host}|{self.boot_id}|{self.pid}|{self.start_ticks}"

    @classmethod
    def decode(cls, text: str) -> Optional[ProcessIdentity]:
        try:
            host, boot_id, pid, ticks = text.split("|")
            return cls(host, boot_id, int(pid), int(ticks))
        except ValueError:
            return None

    @classmethod
    def from_json(cls, doc: Dict[str, Any]) -> Optional[ProcessIdentity]:
        try:
            return cls(str(doc["host"]), str(doc["boot_id"]), int(doc["pid"]), int(doc["start"]))
        except (KeyError, TypeError, ValueError):
            return None


def orchestrator_env() -> Dict[str, str]:
    """``TORCHSCALE_ORCHESTRATOR`` for the processes this torchscale launches."""
    me = ProcessIdentity.of(os.getpid())
    return {ORCHESTRATOR_ENV: me.encode()} if me else {}


# --- the launcher: killed by the kernel when torchscale dies -----------------------------------


def die_with_parent() -> Optional[Callable[[], None]]:
    """A ``preexec_fn`` that makes the child get SIGKILL when this process dies (Linux), or None.

    ``prctl`` is looked up here, before the fork: the child only calls it. If this process died
    between the fork and the ``prctl``, the child's parent is already another: it exits.
    """
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return preexec


# --- the workers: a watchdog on their parent and on torchscale -----------------------------------


def _pidfd(pid: int) -> Optional[int]:
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is None:
        return None
    try:
        fd: int = pidfd_open(pid)
        return fd
    except OSError:
        return None


def _kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def watch_parent(poll_s: float = 0.5, on_orphaned: Callable[[], None] = _kill_self) -> None:
    """End this process (SIGKILL) as soon as its parent or the torchscale that launched it dies.

    A daemon thread blocks on pidfds (no wake-ups while both live); without pidfd support it
    checks every ``poll_s``. The torchscale named in ``TORCHSCALE_ORCHESTRATOR`` is watched only
    where it runs on this host (an ``srun`` launch runs workers elsewhere).
    """
    parent = os.getppid()
    if parent <= 1:
        on_orphaned()
        return
    mother = ProcessIdentity.of(parent)
    if mother is None:
        on_orphaned()
        return
    watched = [mother]
    boss = ProcessIdentity.decode(os.environ.get(ORCHESTRATOR_ENV, ""))
    if boss is not None and boss.is_local():
        if not boss.alive():
            on_orphaned()
            return
        watched.append(boss)
    identities = watched
    fds = []
    for identity in identities:
        fd = _pidfd(identity.pid)
        if fd is not None and start_ticks(identity.pid) != identity.start_ticks:
            os.close(fd)  # gone (its pid reused) between reading it and opening it
            on_orphaned()
            return
        fds.append(fd)
    if os.getppid() != parent:
        on_orphaned()
        return

    def gone() -> bool:
        return os.getppid() != parent or any(i.alive() is False for i in identities)

    def wait() -> None:
        pidfds = [fd for fd in fds if fd is not None]
        if len(pidfds) == len(fds):
            poller = select.poll()
            for fd in pidfds:
                poller.register(fd, select.POLLIN)
            while not poller.poll():
                pass
        else:
            while not gone():
                time.sleep(poll_s)
        on_orphaned()

    threading.Thread(target=wait, name="torchscale-watchdog", daemon=True).start()


# --- the cell's owner file ---------------------------------------------------------------------


def write_owner(cell_dir: Path, pid: int, what: str) -> None:
    """Record in ``cell_dir`` that process ``pid`` (``what``: torchrun, srun...) runs the cell."""
    from torchscale.results.files import atomic_write_json

    identity = ProcessIdentity.of(pid)
    if identity is None:
        return
    doc = asdict(identity)
    doc["start"] = doc.pop("start_ticks")
    doc.update(what=what, torchscale_pid=os.getpid(), since=time.time())
    atomic_write_json(cell_dir / OWNER_FILE, doc, make_parents=False)


def clear_owner(cell_dir: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(cell_dir / OWNER_FILE)


def live_owner(cell_dir: Path) -> Optional[str]:
    """What still runs the cell in ``cell_dir`` (``torchrun pid 123 on node1``), or None.

    A process on another host cannot be checked from here: it is logged, not assumed alive (a
    Slurm job that moved to another node after a crash must be able to go on).
    """
    from torchscale.errors import TorchscaleError
    from torchscale.results.files import read_limited

    try:
        doc = parse_json(read_limited(cell_dir / OWNER_FILE, 1 << 16, "owner file"))
    except (OSError, ValueError, TorchscaleError):
        return None
    identity = ProcessIdentity.from_json(doc) if isinstance(doc, dict) else None
    if identity is None:
        return None
    what = f"{doc.get('what') or 'process'} pid {identity.pid} on {identity.host}"
    alive = identity.alive()
    if alive is None:
        log.warning(
            "%s was run by %s, which this host cannot check; assuming it has ended",
            cell_dir.name,
            what,
        )
        return None
    return what if alive else None
