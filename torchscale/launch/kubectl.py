"""Running a manifest with the user's ``kubectl`` (and kubeconfig): check the cluster answers,
``apply --dry-run=server``, ``apply``, wait for node 0's pod, follow its log, and copy its
results folder out before telling the pod it may finish (:mod:`torchscale.launch.pod_entry`)."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Callable, List, Optional, Sequence

from torchscale.errors import TorchscaleError
from torchscale.escaping import for_terminal
from torchscale.launch.pod_entry import COPIED_MARK, READY_LINE

POD_START_S = 24 * 3600  # a queued job (Kueue) may wait long for its GPUs
POLL_S = 5.0


def _node0_pod(kubectl: str, selector: str, ns: List[str]) -> str:
    """Node 0's pod name, once the controller has made it (``kubectl wait`` on a selector fails
    at once while no pod matches: a suspended or just-applied job has none yet)."""
    jsonpath = "--output=jsonpath={.items[*].metadata.name}"
    deadline = time.monotonic() + POD_START_S
    while True:
        found = _run([kubectl, "get", "pod", f"--selector={selector}", jsonpath, *ns])
        names = found.stdout.split() if found.returncode == 0 else []
        if names:
            return names[0]
        if time.monotonic() > deadline:
            raise TorchscaleError(f"no pod of node 0 ({selector}) appeared: {_last_line(found)}")
        time.sleep(POLL_S)


def _run(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, check=False)


def _last_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in (done.stderr or done.stdout or "").splitlines() if line.strip()]
    return for_terminal(lines[-1].strip()) if lines else f"exit code {done.returncode}"


def run_manifest(
    manifest: Path,
    *,
    namespace: Optional[str],
    selector: str,
    container: str,
    pod_folder: Optional[str],
    local: Path,
    log: Callable[[str], None],
) -> None:
    """Apply ``manifest``; follow node 0's pod (``selector``); with ``pod_folder`` (results on
    the pod's own volume) copy it to ``local`` once the pod says it is ready."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise TorchscaleError(
            f"--submit needs kubectl on PATH; the manifest is written: {manifest} "
            "(kubectl apply -f it yourself)"
        )
    ns: List[str] = [f"--namespace={namespace}"] if namespace else []
    probe = _run([kubectl, "version", "--output=json", "--request-timeout=10s"])
    if probe.returncode != 0 or '"serverVersion"' not in probe.stdout:
        raise TorchscaleError(
            f"no Kubernetes cluster reachable with this kubeconfig ({_last_line(probe)}); the "
            f"manifest is written: {manifest}"
        )
    dry = _run([kubectl, "apply", "--dry-run=server", f"--filename={manifest}", *ns])
    if dry.returncode != 0:
        raise TorchscaleError(f"the cluster refused the manifest: {_last_line(dry)} ({manifest})")
    applied = _run([kubectl, "apply", f"--filename={manifest}", *ns])
    if applied.returncode != 0:
        raise TorchscaleError(f"kubectl apply failed: {_last_line(applied)} ({manifest})")
    log(for_terminal(applied.stdout.strip()))
    pod = _node0_pod(kubectl, selector, ns)
    waited = _run(
        [kubectl, "wait", "--for=condition=Ready", f"pod/{pod}", f"--timeout={POD_START_S}s", *ns]
    )
    if waited.returncode != 0:
        raise TorchscaleError(f"node 0's pod {pod} did not start: {_last_line(waited)}")
    follow = [kubectl, "logs", "--follow", pod, f"--container={container}", *ns]
    copied_out = False
    with subprocess.Popen(follow, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            log(for_terminal(line.rstrip("\n")))
            if pod_folder is None or not line.startswith(READY_LINE):
                continue
            source = f"{namespace + '/' if namespace else ''}{pod}:{pod_folder}"
            copied = _run([kubectl, "cp", source, str(local), f"--container={container}"])
            if copied.returncode != 0:
                raise TorchscaleError(f"kubectl cp failed: {_last_line(copied)}")
            touch = ["touch", f"{pod_folder}/{COPIED_MARK}"]
            _run([kubectl, "exec", pod, f"--container={container}", *ns, "--", *touch])
            copied_out = True
        proc.wait()
    if pod_folder is not None and not copied_out:
        raise TorchscaleError(
            f"node 0's pod {pod} ended before its results were ready (its log above; "
            f"kubectl describe pod {pod} says why)"
        )
