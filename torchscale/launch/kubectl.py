"""Running a manifest with the user's ``kubectl`` (and kubeconfig): check the cluster answers,
``apply --dry-run=server``, ``apply``, wait for node 0's pod, follow its log, and copy its
results folder out before telling the pod it may finish (:mod:`torchscale.launch.pod_entry`)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Callable, List, Optional, Sequence

from torchscale.errors import TorchscaleError
from torchscale.escaping import for_terminal
from torchscale.launch.pod_entry import COPIED_MARK, READY_LINE

POD_START_TIMEOUT = "24h"  # a queued job (Kueue) may wait long for its GPUs


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
    wait = [kubectl, "wait", "--for=condition=Ready", "pod", f"--selector={selector}"]
    waited = _run([*wait, f"--timeout={POD_START_TIMEOUT}", *ns])
    if waited.returncode != 0:
        raise TorchscaleError(f"node 0's pod did not start: {_last_line(waited)}")
    jsonpath = "--output=jsonpath={.items[0].metadata.name}"
    pod = _run([kubectl, "get", "pod", f"--selector={selector}", jsonpath, *ns]).stdout.strip()
    follow = [kubectl, "logs", "--follow", pod, f"--container={container}", *ns]
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
        proc.wait()
