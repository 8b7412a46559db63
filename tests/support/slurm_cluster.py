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
from typing import Any, Dict, List

from tests.support.two_hosts import NamespacesUnavailable, TwoHosts, check_stop

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
            check_stop()
            if self.run(["sinfo", "-h", "-o", "%T %D"]).strip() == "idle 2":
                return
            time.sleep(0.25)
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
            check_stop()
            if not self.run(["squeue", "-h"]).strip():
                return
            time.sleep(0.25)  # squeue answers in ms: the job is seen gone within a quarter s
        raise AssertionError(f"Slurm jobs still queued after {timeout:g} s: {self.run(['squeue'])}")


REAL_NAME = "slurm two-nodes 'q' #1"
"""A name with a blank, quotes and a '#', in an output folder with a blank and a '%x' (sbatch's
job-name pattern): the sbatch script must keep each a value (tests/test_hostile_sinks.py)."""
REAL = f"""\
experiment_name: "{REAL_NAME}"
models: [gpt2-tiny]
batch_sizes: [2]
gpu_counts: [2]
gpus_per_node: 1
warmup_steps: 1
measure_steps: 4
sync_probe_steps: 1
cell_timeout_s: 120
"""


def run_slurm_job(tmp: Path) -> Dict[str, Any]:
    """tests/test_slurm.py's real job: the matrix submitted with ``--launcher slurm --submit`` to
    the two-node cluster, run to its end (the cluster torn down before this returns)."""
    import re

    import pytest

    from tests.support.two_hosts import torchscale_env, two_hosts
    from torchscale.results.layout import experiment_dir
    from torchscale.results.store import ExperimentStore

    with two_hosts(tmp, "real Slurm job") as hosts:
        cluster = SlurmCluster(hosts, tmp)
        try:
            cluster.up()
        except SlurmUnavailable as exc:
            pytest.skip(f"real Slurm job: {exc}")
        config = tmp / "real.yaml"
        config.write_text(REAL)
        out = tmp / "out %x dir"
        env = {**cluster.env, **torchscale_env(cpu_slots=1)}
        argv = ["benchmark", "-c", str(config), "-o", str(out), "--launcher", "slurm", "--submit"]
        argv.append("--sbatch-arg=--comment=a 'b' #c")
        submitted = hosts.torchscale(hosts.head, argv, tmp / "submit.log", env)
        assert submitted.wait(timeout=120) == 0, (tmp / "submit.log").read_text()
        submit_log = (tmp / "submit.log").read_text()
        found = re.search(r"submitted Slurm job (\d+)", submit_log)
        assert found is not None, submit_log
        job_id = found.group(1)
        cluster.wait_idle(timeout=240)
        job = cluster.run(["scontrol", "show", "job", job_id])
        store = ExperimentStore(experiment_dir(out, REAL_NAME))
        return {"store": store, "records": store.records(), "job_id": job_id, "job": job}
