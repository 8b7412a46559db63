"""A real two-node Slurm cluster on :class:`~tests.support.two_hosts.TwoHosts`.

``slurmctld`` and ``slurmd`` (node ``gpu01``) run on ``head``, a second ``slurmd`` (``gpu02``) on
``compute``: Slurm node names that are not the host names, as on many clusters. Debian's
``slurmctld``, ``slurmd`` and ``slurm-client`` packages; ``auth/none`` and ``cred/none``, so no
munge daemon; the daemons listen on the namespaces' addresses only. ``ip netns exec`` remounts
``/sys`` without the cgroup hierarchies slurmd requires, so each slurmd's private mount namespace
mounts them again (cgroup v1, like this machine).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Dict, List

from tests.support.two_hosts import NamespacesUnavailable, TwoHosts

BINARIES = ("slurmctld", "slurmd", "sbatch", "srun", "squeue", "sinfo")
NODES = {"gpu01": "head", "gpu02": "compute"}
CGROUPS = "cpu cpuacct cpuset memory devices freezer pids"
MOUNT_CGROUPS = (
    "mount -t tmpfs none /sys/fs/cgroup && "
    f"for c in {CGROUPS}; do mkdir -p /sys/fs/cgroup/$c && "
    "mount -t cgroup -o $c none /sys/fs/cgroup/$c || exit 1; done && "
    "mkdir -p /sys/fs/cgroup/systemd && mount -t cgroup -o none,name=systemd none "
    "/sys/fs/cgroup/systemd"
)


class SlurmUnavailable(NamespacesUnavailable):
    pass


class SlurmCluster:
    def __init__(self, hosts: TwoHosts, workdir: Path) -> None:
        self.hosts = hosts
        self.dir = workdir / "slurm"
        self.conf = self.dir / "slurm.conf"

    @property
    def env(self) -> Dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def _conf(self) -> str:
        d = self.dir
        addresses = {"head": self.hosts.head.address, "compute": self.hosts.compute.address}
        lines = [
            "ClusterName=torchscale-test",
            f"SlurmctldHost=head({addresses['head']})",
            "AuthType=auth/none",
            "CredType=cred/none",
            "SlurmUser=root",
            "SlurmdUser=root",
            "SlurmctldPort=6817",
            "SlurmdPort=6818",
            f"StateSaveLocation={d}/state",
            f"SlurmdSpoolDir={d}/spool-%n",
            f"SlurmctldPidFile={d}/slurmctld.pid",
            f"SlurmdPidFile={d}/slurmd-%n.pid",
            f"SlurmctldLogFile={d}/slurmctld.log",
            f"SlurmdLogFile={d}/slurmd-%n.log",
            "ProctrackType=proctrack/pgid",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "ReturnToService=2",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "JobCompType=jobcomp/none",
            "AccountingStorageType=accounting_storage/none",
            "MailProg=/bin/true",
        ]
        for node, host in NODES.items():
            lines.append(
                f"NodeName={node} NodeHostname={host} NodeAddr={addresses[host]} CPUs=2 "
                "State=UNKNOWN"
            )
        lines.append("PartitionName=batch Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        return "\n".join(lines) + "\n"

    def up(self, timeout: float = 60) -> None:
        missing = [tool for tool in BINARIES if shutil.which(tool) is None]
        if missing:
            raise SlurmUnavailable(
                f"Slurm is not installed ({', '.join(missing)} missing): "
                "apt-get install slurmctld slurmd slurm-client"
            )
        for folder in ("state", *(f"spool-{node}" for node in NODES)):
            (self.dir / folder).mkdir(parents=True, exist_ok=True)
        self.conf.write_text(self._conf())
        head, compute = self.hosts.head, self.hosts.compute
        self.hosts.start(
            head, ["slurmctld", "-D", "-i", "-f", str(self.conf)], self.dir / "ctld.out"
        )
        for node, host in (("gpu01", head), ("gpu02", compute)):
            script = f"{MOUNT_CGROUPS} && exec slurmd -D -f {self.conf} -N {node}"
            self.hosts.start(host, ["sh", "-c", script], self.dir / f"{node}.out")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.run(["sinfo", "-h", "-o", "%T %D"]).strip() == "idle 2":
                return
            time.sleep(0.5)
        logs = [(self.dir / f"{node}.out").read_text()[-300:] for node in NODES]
        raise SlurmUnavailable(f"the two slurmd nodes never became idle: {logs}")

    def run(self, argv: List[str], timeout: float = 30) -> str:
        """Run a Slurm client command on head; its output."""
        log = self.dir / "client.out"
        proc = self.hosts.start(self.hosts.head, argv, log, self.env)
        proc.wait(timeout=timeout)
        return log.read_text()

    def wait_idle(self, timeout: float) -> None:
        """Until no job is queued or running."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.run(["squeue", "-h"]).strip():
                return
            time.sleep(1)
        raise AssertionError(f"Slurm jobs still queued after {timeout:g} s: {self.run(['squeue'])}")
