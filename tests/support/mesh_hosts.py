"""Several "hosts" on one machine, every pair joined by a link of its own: network namespaces in
a full mesh of veth pairs, so one link can be shaped slower (``tc``) and one host given less CPU
(a cgroup CPU quota), as a fleet has a bad cable or a throttled node.

Each host's address is a /32 on its loopback, routed to each peer over that pair's veth: all
traffic between two hosts crosses their own link, whichever process binds which address. The
host names resolve through an ``/etc/hosts`` bind-mounted in each host's mount namespace (as
:mod:`tests.support.two_hosts` does), so gloo, resolving the host name, binds to the /32.
:meth:`MeshHosts.down` kills every process started on a host, deletes the namespaces (and with
them the links) and removes the cgroups.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import pytest

from tests.support.two_hosts import NamespacesUnavailable, _ip, kill_tree

SUBNET = "10.213.91"
CPU_CGROUP = Path("/sys/fs/cgroup/cpu")
CFS_PERIOD_US = 100_000


@dataclass(frozen=True)
class MeshHost:
    name: str
    address: str
    netns: str


class MeshHosts:
    """``names[i]`` at ``10.213.91.<i+1>``; link ``(i, j)`` is a veth pair of its own."""

    made = 0

    def __init__(self, workdir: Path, names: Sequence[str]) -> None:
        MeshHosts.made += 1
        self.tag = f"tm{os.getpid() % 100000}{MeshHosts.made}"
        self.hosts = [
            MeshHost(name, f"{SUBNET}.{i + 1}", f"{self.tag}{i}") for i, name in enumerate(names)
        ]
        self.hosts_file = workdir / "hosts"
        self.procs: List[subprocess.Popen] = []
        self.created: List[str] = []
        self.cgroups: Dict[str, Path] = {}

    def veth(self, i: int, j: int) -> str:
        """Host i's end of link (i, j), as named inside host i's namespace."""
        return f"m{i}to{j}"

    def up(self) -> None:
        if os.geteuid() != 0:
            raise NamespacesUnavailable("needs root to create network namespaces (ip netns)")
        for tool in ("ip", "tc", "unshare", "mount", "hostname"):
            if shutil.which(tool) is None:
                raise NamespacesUnavailable(f"'{tool}' is not installed (iproute2, util-linux)")
        for host in self.hosts:
            _ip("netns", "add", host.netns)
            self.created.append(host.netns)
            _ip("-n", host.netns, "link", "set", "lo", "up")
            _ip("-n", host.netns, "addr", "add", f"{host.address}/32", "dev", "lo")
        for i, a in enumerate(self.hosts):
            for j, b in enumerate(self.hosts):
                if j <= i:
                    continue
                left, right = f"{self.tag}{i}x{j}", f"{self.tag}{j}x{i}"
                _ip("link", "add", left, "type", "veth", "peer", "name", right)
                for end, host, name, peer in (
                    (left, a, self.veth(i, j), b),
                    (right, b, self.veth(j, i), a),
                ):
                    _ip("link", "set", end, "netns", host.netns)
                    _ip("-n", host.netns, "link", "set", end, "name", name)
                    _ip("-n", host.netns, "link", "set", name, "up")
                    _ip("-n", host.netns, "route", "add", f"{peer.address}/32", "dev", name,
                        "src", host.address)  # fmt: skip
        lines = ["127.0.0.1 localhost"] + [f"{h.address} {h.name}" for h in self.hosts]
        self.hosts_file.write_text("\n".join(lines) + "\n")

    def shape(self, i: int, j: int, rate: str) -> None:
        """Both directions of link (i, j) limited to ``rate`` (a token bucket, e.g. ``40mbit``)."""
        for a, b in ((i, j), (j, i)):
            done = subprocess.run(
                ["tc", "-n", self.hosts[a].netns, "qdisc", "add", "dev", self.veth(a, b), "root",
                 "tbf", "rate", rate, "burst", "32kbit", "latency", "400ms"],
                capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            if done.returncode != 0:
                raise NamespacesUnavailable(f"tc tbf failed: {done.stderr.strip()}")

    def limit_cpu(self, i: int, cpus: float) -> None:
        """Host i's processes share ``cpus`` CPUs' worth of time (CFS quota, cgroup v1), from
        now on: a host already limited gets its new quota at once."""
        if not (CPU_CGROUP / "cpu.cfs_quota_us").exists():
            raise NamespacesUnavailable("no cgroup v1 cpu controller at /sys/fs/cgroup/cpu")
        group = CPU_CGROUP / f"{self.tag}{i}"
        if self.hosts[i].name not in self.cgroups:
            group.mkdir()
            self.cgroups[self.hosts[i].name] = group
            (group / "cpu.cfs_period_us").write_text(str(CFS_PERIOD_US))
        (group / "cpu.cfs_quota_us").write_text(str(int(cpus * CFS_PERIOD_US)))

    def start(
        self, i: int, argv: Sequence[str], log: Path, env: Optional[Dict[str, str]] = None
    ) -> subprocess.Popen:
        """Run ``argv`` on host i: in its cgroup (if limited), its network, its host name."""
        host = self.hosts[i]
        group = self.cgroups.get(host.name)
        join = f'echo $$ > "{group}/cgroup.procs" && ' if group else ""
        inner = 'mount --bind "$1" /etc/hosts && hostname "$2" && shift 2 && exec "$@"'
        script = f'{join}exec ip netns exec "$0" unshare --uts sh -c \'{inner}\' sh "$@"'
        cmd = ["sh", "-c", script, host.netns, str(self.hosts_file), host.name, *argv]
        full_env = {k: v for k, v in os.environ.items() if k != "GLOO_SOCKET_IFNAME"}
        with open(log, "wb") as handle:
            proc = subprocess.Popen(
                cmd, stdout=handle, stderr=subprocess.STDOUT, env={**full_env, **(env or {})},
                start_new_session=True,
            )  # fmt: skip
        self.procs.append(proc)
        return proc

    def torchscale(
        self, i: int, args: Sequence[str], log: Path, env: Optional[Dict[str, str]] = None
    ) -> subprocess.Popen:
        return self.start(i, [sys.executable, "-m", "torchscale", *args], log, env)

    def down(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                kill_tree(proc.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        for netns in self.created:
            pids = subprocess.run(
                ["ip", "netns", "pids", netns], capture_output=True, text=True, timeout=30
            ).stdout.split()
            for pid in pids:
                kill_tree(int(pid))
            subprocess.run(["ip", "netns", "del", netns], capture_output=True, timeout=30)
        for group in self.cgroups.values():
            with contextlib.suppress(OSError):
                group.rmdir()


@contextlib.contextmanager
def mesh_hosts(workdir: Path, names: Sequence[str], what: str) -> Iterator[MeshHosts]:
    """The hosts, torn down whatever happens; skips ``what`` where they cannot be made."""
    hosts = MeshHosts(workdir, names)
    try:
        try:
            hosts.up()
        except NamespacesUnavailable as exc:
            pytest.skip(f"{what}: {exc}")
        yield hosts
    finally:
        hosts.down()


def link_name(hosts: MeshHosts, pair: Tuple[int, int]) -> Tuple[str, str]:
    return hosts.hosts[pair[0]].name, hosts.hosts[pair[1]].name
