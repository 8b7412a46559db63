"""What every node of a Kubernetes, SkyPilot or dstack job runs: lock-step ``torchscale``.

``python -m torchscale.launch.pod_entry --env-from k8s --config-file F [--hold-results DIR] --
benchmark ...`` maps the platform's variables to the ones lock-step mode reads (``PET_NNODES``,
``PET_NODE_RANK``, ``MASTER_ADDR``/``MASTER_PORT``; Kubernetes controllers set those
themselves), writes the config the manifest carries (``TORCHSCALE_CONFIG``) to ``F``, and runs
``python -m torchscale`` with the arguments after ``--``. Its arguments arrive as a list, never
through a shell, so a name holding ``$(...)`` or quotes is only a name.

With ``--hold-results DIR`` node 0 keeps its pod (and so ``DIR``, on the pod's own volume) after
the run until ``DIR/.torchscale-copied`` appears, which ``--submit`` creates once ``kubectl cp``
has copied the folder out; then it exits with the run's exit code.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence

READY_LINE = "torchscale-pod: results ready in "
COPIED_MARK = ".torchscale-copied"
DEFAULT_PORT = "29400"


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0].strip() if text.strip() else ""


def skypilot_env(environ: Mapping[str, str]) -> Dict[str, str]:
    """SkyPilot: ``SKYPILOT_NUM_NODES``, ``SKYPILOT_NODE_RANK``, ``SKYPILOT_NODE_IPS`` (one per
    line, node 0 first)."""
    return {
        "PET_NNODES": environ.get("SKYPILOT_NUM_NODES", ""),
        "PET_NODE_RANK": environ.get("SKYPILOT_NODE_RANK", ""),
        "MASTER_ADDR": _first_line(environ.get("SKYPILOT_NODE_IPS", "")),
        "MASTER_PORT": DEFAULT_PORT,
    }


def dstack_env(environ: Mapping[str, str]) -> Dict[str, str]:
    """dstack: ``DSTACK_NODES_NUM``, ``DSTACK_NODE_RANK``, ``DSTACK_MASTER_NODE_IP``."""
    return {
        "PET_NNODES": environ.get("DSTACK_NODES_NUM", ""),
        "PET_NODE_RANK": environ.get("DSTACK_NODE_RANK", ""),
        "MASTER_ADDR": environ.get("DSTACK_MASTER_NODE_IP", ""),
        "MASTER_PORT": DEFAULT_PORT,
    }


def lockstep_env(platform: str, environ: Mapping[str, str]) -> Dict[str, str]:
    """``environ`` with the platform's variables mapped to lock-step mode's."""
    mapped = {"skypilot": skypilot_env, "dstack": dstack_env}.get(platform)
    extra = {k: v for k, v in mapped(environ).items() if v} if mapped else {}
    return {**environ, **extra}


def node_rank(environ: Mapping[str, str]) -> int:
    raw = environ.get("PET_NODE_RANK", "0").strip() or "0"
    return int(raw) if raw.isdigit() else 0


def _hold(folder: Path, timeout_s: float) -> None:
    """Keep this pod (node 0's) alive until its results have been copied out, or timeout."""
    print(f"{READY_LINE}{folder}", flush=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not (folder / COPIED_MARK).exists():
        time.sleep(1.0)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torchscale.launch.pod_entry")
    parser.add_argument("--env-from", choices=("k8s", "skypilot", "dstack"), default="k8s")
    parser.add_argument("--config-file", type=Path)
    parser.add_argument("--hold-results", type=Path)
    parser.add_argument("--hold-timeout", type=float, default=3600.0)
    parser.add_argument("torchscale_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    rest: List[str] = list(args.torchscale_args)
    if rest[:1] == ["--"]:
        rest = rest[1:]
    env = lockstep_env(args.env_from, os.environ)
    text = env.get("TORCHSCALE_CONFIG")
    if args.config_file is not None and text:
        args.config_file.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(args.config_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
    proc = subprocess.Popen([sys.executable, "-m", "torchscale", *rest], env=env)

    def forward(signum: int, _frame: object) -> None:
        proc.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    code = proc.wait()
    if args.hold_results is not None and node_rank(env) == 0:
        _hold(args.hold_results, args.hold_timeout)
    return code


if __name__ == "__main__":
    sys.exit(main())
