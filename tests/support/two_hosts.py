"""Two "hosts" on one machine: network namespaces joined by a veth pair, each with its hostname.

Each host is ``ip netns exec NS unshare --uts``: its own network stack (one veth end with an
address of a private /24 that exists only inside these namespaces, plus loopback), its own
hostname, and an ``/etc/hosts`` bind-mounted in its mount namespace so both names resolve.
Processes started on a host are tracked, and :meth:`TwoHosts.down` kills them all and deletes the
namespaces (which removes the veth pair).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import psutil
import pytest

from tests.support.environ import repo_pythonpath

SUBNET = "10.213.77"


IFNAME = "tsnet0"
"""Both veth ends get this name inside their namespace, so one GLOO_SOCKET_IFNAME (which srun
exports to every node) fits both hosts."""


STOP = threading.Event()
"""Set when the session is interrupted while runs go on in other threads
(tests/support/session_runs.py): their waits end (:func:`check_stop`) and every host still up
is torn down (:func:`tear_down_all`), so Ctrl-C does not wait for the runs' minutes."""
LIVE: List[TwoHosts] = []
_LIVE_LOCK = threading.Lock()


def check_stop() -> None:
    """Called in a run's wait loops: end the wait once the session is interrupted."""
    if STOP.is_set():
        raise RuntimeError("the session was interrupted: this run's hosts are torn down")


def tear_down_all() -> None:
    """Every host still up: its processes killed, its namespaces removed (from any thread)."""
    STOP.set()
    with _LIVE_LOCK:
        live = list(LIVE)
    for hosts in live:
        hosts.down()


def torchscale_env(cpu_slots: int = 2) -> Dict[str, str]:
    """What a torchscale on a host runs with: this checkout importable, CPU slots, plain logs."""
    return {
        "TORCHSCALE_CPU_SLOTS": str(cpu_slots),
        "PYTHONPATH": repo_pythonpath(),
        "COLUMNS": "200",
        "NO_COLOR": "1",
    }


@dataclass(frozen=True)
class Host:
    name: str
    address: str
    netns: str
    veth: str  # the end's name while it is created in this namespace


class NamespacesUnavailable(Exception):
    """This machine (or user) cannot create the namespaces: the caller skips."""


@contextlib.contextmanager
def two_hosts(workdir: Path, what: str) -> Iterator[TwoHosts]:
    """The two hosts, torn down (processes, namespaces) whatever happens; skips ``what`` where
    they cannot be made."""
    hosts = TwoHosts(workdir)
    try:
        try:
            hosts.up()
        except NamespacesUnavailable as exc:
            pytest.skip(f"{what}: {exc}")
        yield hosts
    finally:
        hosts.down()


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise NamespacesUnavailable(f"'ip {' '.join(args)}' failed: {done.stderr.strip()}")


def kill_tree(pid: int) -> None:
    """SIGKILL a process and all its descendants at once: a node that dies."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.send_signal(signal.SIGKILL)
    psutil.wait_procs(procs, timeout=10)


class TwoHosts:
    """``head`` (10.213.77.2) and ``compute`` (10.213.77.1), joined by a veth pair."""

    made = itertools.count(1)  # namespace names stay unique within this process, in any thread

    def __init__(self, workdir: Path) -> None:
        tag = f"ts{os.getpid() % 100000}n{next(TwoHosts.made)}"  # n: no two read alike
        self.head = Host("head", f"{SUBNET}.2", f"{tag}head", f"{tag}h")
        self.compute = Host("compute", f"{SUBNET}.1", f"{tag}comp", f"{tag}c")
        self.hosts_file = workdir / "hosts"
        self.procs: List[subprocess.Popen] = []
        self.created: List[str] = []

    def up(self) -> None:
        with _LIVE_LOCK:
            LIVE.append(self)
        if os.geteuid() != 0:
            raise NamespacesUnavailable("needs root to create network namespaces (ip netns)")
        for tool in ("ip", "unshare", "mount", "hostname"):
            if shutil.which(tool) is None:
                raise NamespacesUnavailable(f"'{tool}' is not installed (iproute2, util-linux)")
        for host in (self.head, self.compute):
            _ip("netns", "add", host.netns)
            self.created.append(host.netns)
        _ip("link", "add", self.head.veth, "type", "veth", "peer", "name", self.compute.veth)
        for host in (self.head, self.compute):
            _ip("link", "set", host.veth, "netns", host.netns)
            _ip("-n", host.netns, "link", "set", host.veth, "name", IFNAME)
            _ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", IFNAME)
            _ip("-n", host.netns, "link", "set", IFNAME, "up")
            _ip("-n", host.netns, "link", "set", "lo", "up")
        self.hosts_file.write_text(
            f"127.0.0.1 localhost\n{self.head.address} head\n{self.compute.address} compute\n"
        )

    def alias(self, host: Host, name: str) -> None:
        """Resolve ``name`` to ``host`` on both hosts (processes started from now on)."""
        with open(self.hosts_file, "a") as handle:
            handle.write(f"{host.address} {name}\n")

    def start(
        self, host: Host, argv: Sequence[str], log: Path, env: Optional[Dict[str, str]] = None
    ) -> subprocess.Popen:
        """Run ``argv`` on ``host``: its network, its hostname, both names resolvable."""
        script = 'mount --bind "$1" /etc/hosts && hostname "$2" && shift 2 && exec "$@"'
        cmd = ["ip", "netns", "exec", host.netns, "unshare", "--uts", "sh", "-c", script, "sh"]
        cmd += [str(self.hosts_file), host.name, *argv]
        full_env = {**os.environ, "GLOO_SOCKET_IFNAME": IFNAME, **(env or {})}
        with open(log, "wb") as handle:
            proc = subprocess.Popen(
                cmd, stdout=handle, stderr=subprocess.STDOUT, env=full_env, start_new_session=True
            )
        self.procs.append(proc)
        return proc

    def torchscale(
        self, host: Host, args: Sequence[str], log: Path, env: Optional[Dict[str, str]] = None
    ) -> subprocess.Popen:
        return self.start(host, [sys.executable, "-m", "torchscale", *args], log, env)

    def lockstep(
        self,
        config: str,
        workdir: Path,
        env: Dict[str, str],
        port: int,
        head_args: Sequence[str] = (),
    ) -> Tuple[subprocess.Popen, subprocess.Popen]:
        """``torchscale benchmark`` of the ``config`` text on both hosts as one 2-node launch
        meeting at head, results in ``workdir/out``, logs in ``workdir/{head,compute}.log``.
        compute starts first: it waits for head's store, so head never waits for compute's
        start-up. Returns (head, compute)."""
        path = workdir / "config.yaml"
        path.write_text(config)
        common = ["benchmark", "-c", str(path), "-o", str(workdir / "out"), "--nnodes", "2"]
        common += ["--rdzv-endpoint", f"{self.head.address}:{port}"]
        compute = self.torchscale(
            self.compute, [*common, "--node-rank", "1"], workdir / "compute.log", env
        )
        head = self.torchscale(
            self.head, [*common, "--node-rank", "0", *head_args], workdir / "head.log", env
        )
        return head, compute

    def down(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                kill_tree(proc.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        for netns in self.created:
            # Whatever still runs in the namespace was started here (e.g. a daemon's
            # double-forked child, outside the tracked trees).
            pids = subprocess.run(
                ["ip", "netns", "pids", netns], capture_output=True, text=True, timeout=30
            ).stdout.split()
            for pid in pids:
                kill_tree(int(pid))
            subprocess.run(["ip", "netns", "del", netns], capture_output=True, timeout=30)
        # A veth end left in this namespace (setup failed half-way) would outlive them.
        subprocess.run(["ip", "link", "del", self.head.veth], capture_output=True, timeout=30)
        with _LIVE_LOCK:
            if self in LIVE:
                LIVE.remove(self)
