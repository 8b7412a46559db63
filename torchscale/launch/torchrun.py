"""Build torchrun command lines (torch.distributed.run's agent, through ``torchrun_agent``).

torchscale never reimplements process launch or rendezvous: every distributed run is a torchrun of a
Python module, single node (``--standalone``) or multi-node through c10d rendezvous.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence

from torchscale.escaping import shown_command


@dataclass(frozen=True)
class Rendezvous:
    """Where the ranks of one launch meet. The default is one node, a free local port."""

    nnodes: int = 1
    node_rank: Optional[int] = 0  # None: left out (c10d assigns node ranks itself)
    endpoint: Optional[str] = None  # "host:port" of the c10d store, for multi-node
    run_id: Optional[str] = None
    join_timeout_s: Optional[float] = None  # how long the nodes wait for each other
    is_host: Optional[bool] = None  # False: the store is hosted elsewhere (not by this torchrun)

    @property
    def standalone(self) -> bool:
        return self.nnodes == 1 and self.endpoint is None

    def conf(self) -> str:
        """torchrun's ``--rdzv-conf``: the join timeout also bounds connecting to the store."""
        parts = []
        if self.is_host is not None:
            parts.append(f"is_host={str(self.is_host).lower()}")
        if self.join_timeout_s is not None:
            seconds = max(1, int(self.join_timeout_s))
            parts += [f"join_timeout={seconds}", f"read_timeout={seconds}"]
        return ",".join(parts)


SINGLE_NODE = Rendezvous()

AGENT_MODULE = "torchscale.launch.torchrun_agent"
"""torchrun's own ``main`` (``torch.distributed.run``), which skips the agent's interpreter
teardown (~0.6 s a launch); its arguments and behaviour are torchrun's."""


def torchrun_command(
    module: str,
    module_args: Sequence[str],
    *,
    nproc_per_node: int,
    rendezvous: Rendezvous = SINGLE_NODE,
    log_dir: Optional[Path] = None,
    python: str = sys.executable,
    wrapper: Sequence[str] = (),
) -> List[str]:
    """The torchrun command that runs ``python -m module module_args`` on ``nproc_per_node`` ranks.

    With ``log_dir``, torchrun writes each rank's stdout/stderr (``--redirects 3``) and error file
    there, so a failed rank's traceback is kept beside the cell's results. ``wrapper`` (e.g.
    ``nsys profile ...``) runs each worker under another program (torchrun's ``--no-python``).
    """
    cmd = [python, "-m", AGENT_MODULE, f"--nproc-per-node={nproc_per_node}"]
    if rendezvous.standalone:
        # --nnodes too: torchrun would otherwise take PET_NNODES from a multi-node environment.
        cmd += ["--standalone", "--nnodes=1"]
    else:
        cmd.append(f"--nnodes={rendezvous.nnodes}")
        if rendezvous.node_rank is not None:
            cmd.append(f"--node-rank={rendezvous.node_rank}")
        cmd += ["--rdzv-backend=c10d", f"--rdzv-endpoint={rendezvous.endpoint}"]
        if rendezvous.run_id:
            cmd.append(f"--rdzv-id={rendezvous.run_id}")
        if rendezvous.conf():
            cmd.append(f"--rdzv-conf={rendezvous.conf()}")
    cmd += ["--max-restarts=0", "--monitor-interval=0.1"]
    if log_dir is not None:
        cmd += [f"--log-dir={log_dir}", "--redirects=3", "--tee=3"]
    if wrapper:
        cmd += ["--no-python", *wrapper, python, "-m", module, *module_args]
    else:
        cmd += ["-m", module, *module_args]
    return cmd


def format_command(cmd: Sequence[str]) -> str:
    """A copy-pasteable shell form of ``cmd``, on one line whatever its words hold."""
    return shown_command(cmd)
