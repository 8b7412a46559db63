"""``benchmark --launcher k8s|skypilot|dstack``: the matrix as one multi-node job.

Writes the job's manifest (or task file) and, with ``--submit``, runs it with the user's
``kubectl``: ``apply --dry-run=server``, ``apply``, ``logs -f`` on node 0, ``cp`` of the results.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from torchscale.app.benchmark import BenchmarkRequest
from torchscale.errors import TorchscaleError
from torchscale.escaping import for_terminal, yaml_document

CONFIG_PATH = "/tmp/torchscale/config.yaml"
EXIT_NO_CLUSTER = 2


@dataclass(frozen=True)
class JobRequest:
    benchmark: BenchmarkRequest
    config_path: Path
    forwarded: Sequence[str]
    launcher: str  # k8s, skypilot, dstack
    image: str
    api: str = "trainjob"
    namespace: Optional[str] = None
    queue: Optional[str] = None
    service_account: Optional[str] = None
    results_pvc: Optional[str] = None
    overlay_path: Optional[Path] = None
    accelerator: str = "H100"
    emit: Optional[Path] = None
    submit: bool = False
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))


@dataclass(frozen=True)
class JobOutcome:
    text: str
    path: Path
    name: str
    nodes: int
    gpus_per_node: int
    results: Optional[Path] = None  # where --submit copied the results to


def _overlay(path: Optional[Path]) -> Optional[Dict[str, Any]]:
    if path is None:
        return None
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        reason = for_terminal(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        raise TorchscaleError(f"--k8s-overlay {path}: cannot read it ({reason})") from None
    if not isinstance(data, dict):
        raise TorchscaleError(
            f"--k8s-overlay {path}: give a pod spec mapping (tolerations:, nodeSelector:, ...)"
        )
    return data


def pod_argv(request: JobRequest, output_dir: str, hold: Optional[str]) -> List[str]:
    env_from = "k8s" if request.launcher == "k8s" else request.launcher
    argv = ["python", "-m", "torchscale.launch.pod_entry", "--env-from", env_from]
    argv += ["--config-file", CONFIG_PATH]
    if hold:
        argv += ["--hold-results", hold]
    join = request.benchmark.launch.join_timeout
    argv += ["--", "benchmark", "--config", CONFIG_PATH, "--output-dir", output_dir]
    argv += ["--resume", f"--join-timeout={join:g}", *request.forwarded]
    return argv


def _size(request: JobRequest) -> tuple[int, int]:
    from torchscale.launch.k8s_manifests import size
    from torchscale.plan.matrix import DEFAULT_MAX_CELLS, expand

    bench = request.benchmark
    config = bench.config
    if config.gpus_per_node is None and config.nodes is None:
        raise TorchscaleError(
            f"--launcher {request.launcher} sizes the job from the config: set gpus_per_node "
            "(the GPUs of one node, e.g. --set gpus_per_node=8) or nodes"
        )
    cap = DEFAULT_MAX_CELLS if bench.max_cells is None else bench.max_cells
    plan = expand(config, bench.benchmark, max_cells=cap)
    if not plan.cells:
        raise TorchscaleError("the matrix has no cells: nothing to run in a job")
    return size([(c.settings.nnodes, c.settings.nproc_per_node) for c in plan.cells])


def _cpu_slots(environ: Mapping[str, str]) -> Optional[int]:
    from torchscale.hardware.environment import CPU_SLOTS_ENV

    slots = environ.get(CPU_SLOTS_ENV, "")
    return int(slots) if slots.isdigit() and int(slots) > 0 else None


def build_job(request: JobRequest) -> JobOutcome:
    """The manifest (or task file) text, its default path, name and size; nothing written."""
    from torchscale.launch import cloud_tasks, k8s_manifests
    from torchscale.results.layout import experiment_dir, experiment_dirname

    if not request.image:
        raise TorchscaleError(
            f"--launcher {request.launcher} needs --image: the container image with torchscale "
            "installed (and your models or script), e.g. --image ghcr.io/me/bench:1"
        )
    config = request.benchmark.config
    nodes, per_node = _size(request)
    config_text = request.config_path.read_text(encoding="utf-8")
    env = {
        k8s_manifests.CONFIG_ENV: config_text,
        **k8s_manifests.passed_env(request.environ),
    }
    slots = _cpu_slots(request.environ)
    name = k8s_manifests.resource_name(config.experiment_name)
    folder = experiment_dirname(config.experiment_name)
    store_root = experiment_dir(request.benchmark.output_dir, config.experiment_name)
    if request.launcher == "k8s":
        api = k8s_manifests.APIS[request.api]
        hold = None if request.results_pvc else f"{k8s_manifests.RESULTS_MOUNT}/{folder}"
        pod = k8s_manifests.PodSettings(
            name=name,
            experiment=config.experiment_name,
            image=request.image,
            argv=pod_argv(request, k8s_manifests.RESULTS_MOUNT, hold),
            nodes=nodes,
            gpus_per_node=per_node,
            config_text=config_text,
            namespace=request.namespace,
            queue=request.queue,
            service_account=request.service_account,
            results_pvc=request.results_pvc,
            env=k8s_manifests.passed_env(request.environ),
            overlay=_overlay(request.overlay_path),
            cpu_slots=slots,
        )
        text = yaml_document(api.write(pod))
        path = store_root / f"{request.api}.yaml"
    else:
        if slots:
            env["TORCHSCALE_CPU_SLOTS"] = str(slots)
        writer = (
            cloud_tasks.skypilot_task if request.launcher == "skypilot" else cloud_tasks.dstack_task
        )
        argv = pod_argv(request, str(request.benchmark.output_dir), None)
        task = writer(
            config.experiment_name, argv, nodes, per_node, request.accelerator, request.image, env
        )
        text = yaml_document(task)
        suffix = "sky.yaml" if request.launcher == "skypilot" else "dstack.yml"
        path = store_root / f"task.{suffix}"
    return JobOutcome(text, request.emit or path, name, nodes, per_node)


Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


def _run(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, check=False)


def _last_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in (done.stderr or done.stdout or "").splitlines() if line.strip()]
    return for_terminal(lines[-1].strip()) if lines else f"exit code {done.returncode}"


def _ns(namespace: Optional[str]) -> List[str]:
    return [f"--namespace={namespace}"] if namespace else []


def submit_job(request: JobRequest, manifest: Path, name: str, log: Callable[[str], None]) -> Path:
    """Apply the manifest with the user's kubectl, follow node 0 and copy its results out."""
    from torchscale.launch import k8s_manifests
    from torchscale.launch.pod_entry import COPIED_MARK, READY_LINE
    from torchscale.results.layout import experiment_dirname

    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise TorchscaleError(
            f"--submit needs kubectl on PATH; the manifest is written: {manifest} "
            "(kubectl apply -f it yourself)"
        )
    ns = _ns(request.namespace)
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
    log(applied.stdout.strip())
    api = k8s_manifests.APIS[request.api]
    selector = api.node0_selector(name)
    wait = [kubectl, "wait", "--for=condition=Ready", "pod", f"--selector={selector}"]
    waited = _run([*wait, "--timeout=24h", *ns])
    if waited.returncode != 0:
        raise TorchscaleError(f"node 0's pod did not start: {_last_line(waited)}")
    jsonpath = "--output=jsonpath={.items[0].metadata.name}"
    pod = _run([kubectl, "get", "pod", f"--selector={selector}", jsonpath, *ns]).stdout.strip()
    dirname = experiment_dirname(request.benchmark.config.experiment_name)
    folder = f"{k8s_manifests.RESULTS_MOUNT}/{dirname}"
    local = request.benchmark.output_dir / dirname
    follow = [kubectl, "logs", "--follow", pod, f"--container={api.container}", *ns]
    with subprocess.Popen(follow, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stderr.write(for_terminal(line.rstrip("\n")) + "\n")
            if line.startswith(READY_LINE) and not request.results_pvc:
                source = f"{request.namespace + '/' if request.namespace else ''}{pod}:{folder}"
                copied = _run([kubectl, "cp", source, str(local), f"--container={api.container}"])
                if copied.returncode != 0:
                    raise TorchscaleError(f"kubectl cp failed: {_last_line(copied)}")
                touch = ["touch", f"{folder}/{COPIED_MARK}"]
                _run([kubectl, "exec", pod, f"--container={api.container}", *ns, "--", *touch])
        proc.wait()
    return local
