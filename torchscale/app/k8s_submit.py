"""``benchmark --launcher k8s|skypilot|dstack``: the matrix as one multi-node job.

Writes the job's manifest (or task file) and, with ``--submit``, runs it with the user's
``kubectl``: ``apply --dry-run=server``, ``apply``, ``logs -f`` on node 0, ``cp`` of the results.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from torchscale.app.benchmark import BenchmarkRequest
from torchscale.errors import TorchscaleError
from torchscale.escaping import for_terminal, yaml_document

CONFIG_PATH = "/tmp/torchscale/config.yaml"


@dataclass(frozen=True)
class JobRequest:
    benchmark: BenchmarkRequest
    config_path: Optional[Path]  # None: --script without a config
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
    if request.config_path is not None:
        argv += ["--config-file", CONFIG_PATH]
    if hold:
        argv += ["--hold-results", hold]
    join = request.benchmark.launch.join_timeout
    argv += ["--", "benchmark"]
    argv += ["--config", CONFIG_PATH] if request.config_path is not None else []
    argv += ["--output-dir", output_dir]
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
    config_text = request.config_path.read_text(encoding="utf-8") if request.config_path else ""
    env = {k8s_manifests.CONFIG_ENV: config_text} if config_text else {}
    env.update(k8s_manifests.passed_env(request.environ))
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


def submit_job(request: JobRequest, manifest: Path, name: str, log: Callable[[str], None]) -> Path:
    """Apply the manifest with the user's kubectl, follow node 0 (its lines to ``log``) and copy
    its results out (unless they are on ``--k8s-results-pvc``); returns the local folder."""
    from torchscale.launch import k8s_manifests, kubectl
    from torchscale.results.layout import experiment_dirname

    api = k8s_manifests.APIS[request.api]
    dirname = experiment_dirname(request.benchmark.config.experiment_name)
    local = request.benchmark.output_dir / dirname
    kubectl.run_manifest(
        manifest,
        namespace=request.namespace,
        selector=api.node0_selector(name),
        container=api.container,
        pod_folder=None if request.results_pvc else f"{k8s_manifests.RESULTS_MOUNT}/{dirname}",
        local=local,
        log=log,
    )
    return local
