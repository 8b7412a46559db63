"""``--launcher k8s|skypilot|dstack`` (benchmark, validate --fleet, profile): one multi-node job.

A job is what every node runs (:class:`JobShape`: torchscale's arguments, node count, GPUs per
node, the config text) plus where and how (:class:`JobSettings`: image, API, namespace, queue,
results volume, overlay). This writes the job's manifest (or task file) and, with ``--submit``,
runs it with the user's ``kubectl`` (``launch/kubectl.py``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Sequence

from torchscale.errors import TorchscaleError
from torchscale.escaping import for_terminal, yaml_document

if TYPE_CHECKING:
    from torchscale.app.benchmark import BenchmarkRequest

CONFIG_PATH = "/tmp/torchscale/config.yaml"  # inside the pod, written by pod_entry


@dataclass(frozen=True)
class JobSettings:
    """Where the job runs and what its pods get (the ``--image``, ``--k8s-*`` options)."""

    launcher: str  # k8s, skypilot, dstack
    image: str
    output_dir: Path  # where the results end up on this machine
    api: str = "trainjob"
    namespace: Optional[str] = None
    queue: Optional[str] = None
    service_account: Optional[str] = None
    results_pvc: Optional[str] = None
    overlay_path: Optional[Path] = None
    accelerator: str = "H100"
    emit: Optional[Path] = None
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))


@dataclass(frozen=True)
class JobShape:
    """What every node runs: ``torchscale <head> --output-dir OUT <tail>``."""

    name: str  # names the resource (an experiment name, ``validate``, ...)
    folder: str  # the results folder under the output dir ("" for all of it)
    nodes: int
    gpus_per_node: int
    head: Sequence[str]
    tail: Sequence[str]
    config_text: str = ""  # the pods' config file, where the command reads one


@dataclass(frozen=True)
class JobOutcome:
    text: str
    path: Path
    name: str
    nodes: int
    gpus_per_node: int


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


def pod_argv(launcher: str, shape: JobShape, output_dir: str, hold: Optional[str]) -> List[str]:
    argv = ["python", "-m", "torchscale.launch.pod_entry", "--env-from", launcher]
    if shape.config_text:
        argv += ["--config-file", CONFIG_PATH]
    if hold:
        argv += ["--hold-results", hold]
    return [*argv, "--", *shape.head, "--output-dir", output_dir, *shape.tail]


def benchmark_shape(
    request: BenchmarkRequest, config_path: Optional[Path], forwarded: Sequence[str], launcher: str
) -> JobShape:
    """The matrix as a job: sized from the plan (nodes x GPUs per node of the largest cell)."""
    from torchscale.launch.k8s_manifests import size
    from torchscale.plan.matrix import DEFAULT_MAX_CELLS, expand
    from torchscale.results.layout import experiment_dirname

    config = request.config
    if config.gpus_per_node is None and config.nodes is None:
        raise TorchscaleError(
            f"--launcher {launcher} sizes the job from the config: set gpus_per_node "
            "(the GPUs of one node, e.g. --set gpus_per_node=8) or nodes"
        )
    cap = DEFAULT_MAX_CELLS if request.max_cells is None else request.max_cells
    plan = expand(config, request.benchmark, max_cells=cap)
    if not plan.cells:
        raise TorchscaleError("the matrix has no cells: nothing to run in a job")
    nodes, per_node = size([(c.settings.nnodes, c.settings.nproc_per_node) for c in plan.cells])
    head = ["benchmark", *(["--config", CONFIG_PATH] if config_path else [])]
    join = request.launch.join_timeout
    return JobShape(
        name=config.experiment_name,
        folder=experiment_dirname(config.experiment_name),
        nodes=nodes,
        gpus_per_node=per_node,
        head=head,
        tail=["--resume", f"--join-timeout={join:g}", *forwarded],
        config_text=config_path.read_text(encoding="utf-8") if config_path else "",
    )


def _cpu_slots(environ: Mapping[str, str]) -> Optional[int]:
    from torchscale.hardware.environment import CPU_SLOTS_ENV

    slots = environ.get(CPU_SLOTS_ENV, "")
    return int(slots) if slots.isdigit() and int(slots) > 0 else None


def _default_path(settings: JobSettings, shape: JobShape) -> Path:
    folder = settings.output_dir / shape.folder if shape.folder else settings.output_dir
    if settings.launcher == "k8s":
        return folder / f"{settings.api}.yaml"
    return folder / ("task.sky.yaml" if settings.launcher == "skypilot" else "task.dstack.yml")


def build_job(settings: JobSettings, shape: JobShape) -> JobOutcome:
    """The manifest (or task file) text, its path, name and size; nothing written."""
    from torchscale.launch import cloud_tasks, k8s_manifests

    if not settings.image:
        raise TorchscaleError(
            f"--launcher {settings.launcher} needs --image: the container image with torchscale "
            "installed (and your models or script), e.g. --image ghcr.io/me/bench:1"
        )
    slots = _cpu_slots(settings.environ)
    passed = k8s_manifests.passed_env(settings.environ)
    name = k8s_manifests.resource_name(shape.name)
    if settings.launcher == "k8s":
        mount = k8s_manifests.RESULTS_MOUNT
        hold = None if settings.results_pvc else f"{mount}/{shape.folder}".rstrip("/")
        pod = k8s_manifests.PodSettings(
            name=name,
            experiment=shape.name,
            image=settings.image,
            argv=pod_argv("k8s", shape, mount, hold),
            nodes=shape.nodes,
            gpus_per_node=shape.gpus_per_node,
            config_text=shape.config_text,
            namespace=settings.namespace,
            queue=settings.queue,
            service_account=settings.service_account,
            results_pvc=settings.results_pvc,
            env=passed,
            overlay=_overlay(settings.overlay_path),
            cpu_slots=slots,
        )
        text = yaml_document(k8s_manifests.APIS[settings.api].write(pod))
    else:
        env = {k8s_manifests.CONFIG_ENV: shape.config_text} if shape.config_text else {}
        env.update(passed)
        if slots:
            env["TORCHSCALE_CPU_SLOTS"] = str(slots)
        writer = (
            cloud_tasks.skypilot_task
            if settings.launcher == "skypilot"
            else cloud_tasks.dstack_task
        )
        argv = pod_argv(settings.launcher, shape, str(settings.output_dir), None)
        task = writer(
            shape.name, argv, shape.nodes, shape.gpus_per_node, settings.accelerator,
            settings.image, env,
        )  # fmt: skip
        text = yaml_document(task)
    path = settings.emit or _default_path(settings, shape)
    return JobOutcome(text, path, name, shape.nodes, shape.gpus_per_node)


def submit_job(
    settings: JobSettings, shape: JobShape, manifest: Path, log: Callable[[str], None]
) -> Path:
    """Apply the manifest with the user's kubectl, follow node 0 (its lines to ``log``) and copy
    its results out (unless they are on ``--k8s-results-pvc``); returns the local folder."""
    from torchscale.launch import k8s_manifests, kubectl

    api = k8s_manifests.APIS[settings.api]
    local = settings.output_dir / shape.folder if shape.folder else settings.output_dir
    pod_folder = f"{k8s_manifests.RESULTS_MOUNT}/{shape.folder}".rstrip("/")
    kubectl.run_manifest(
        manifest,
        namespace=settings.namespace,
        selector=api.node0_selector(k8s_manifests.resource_name(shape.name)),
        container=api.container,
        pod_folder=None if settings.results_pvc else pod_folder,
        local=local,
        log=log,
    )
    return local


def validate_shape(
    nodes: Optional[int], gpus_per_node: Optional[int], config_path: Optional[Path],
    args: Sequence[str],
) -> JobShape:  # fmt: skip
    """``validate --fleet`` on ``nodes`` pods: node 0 writes ``validate/fleet.json``."""
    if nodes is None or nodes < 2 or gpus_per_node is None:
        raise TorchscaleError(
            "validate --fleet as a job needs its size: --nnodes N (2 or more) and --gpus-per-node G"
        )
    return JobShape(
        name="validate",
        folder="",
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        head=["validate", *(["--config", CONFIG_PATH] if config_path else [])],
        tail=args,
        config_text=config_path.read_text(encoding="utf-8") if config_path else "",
    )


def profile_shape(
    gpus: Optional[int], config_path: Optional[Path], args: Sequence[str]
) -> JobShape:
    """``profile`` in one pod of ``gpus`` GPUs."""
    if gpus is None:
        raise TorchscaleError("profile as a job needs --gpus N: the GPUs of its one pod")
    return JobShape(
        name="profile",
        folder="",
        nodes=1,
        gpus_per_node=gpus,
        head=["profile", *(["--config", CONFIG_PATH] if config_path else [])],
        tail=[f"--gpus={gpus}", *args],
        config_text=config_path.read_text(encoding="utf-8") if config_path else "",
    )


@dataclass(frozen=True)
class JobRequest:
    """A command run as a job for a cluster: where and how (``settings``), and ``--submit``."""

    settings: JobSettings
    submit: bool = False
    dry_run: bool = False


@dataclass(frozen=True)
class LaunchedJob:
    built: JobOutcome
    written: bool
    """The manifest was written (not a dry run)."""
    copied_to: Optional[Path] = None
    """With ``--submit``: the local folder node 0's results were copied to."""


def launch_job(job: JobRequest, shape: JobShape, notify: Callable[[str], None]) -> LaunchedJob:
    """Write the job's manifest (task file); with ``--submit`` (Kubernetes), run it; a dry run
    writes nothing. ``notify`` gets where it was written and what the job's node 0 says."""
    from torchscale.results.files import atomic_write_text

    settings = job.settings
    if job.submit and settings.launcher != "k8s":
        tool = "sky launch" if settings.launcher == "skypilot" else "dstack apply -f"
        raise TorchscaleError(f"--submit runs Kubernetes jobs; submit the task file with {tool}")
    built = build_job(settings, shape)
    if job.dry_run:
        return LaunchedJob(built, written=False)
    built.path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(built.path, built.text)
    what = {"k8s": settings.api, "skypilot": "SkyPilot task", "dstack": "dstack task"}
    notify(
        f"{what[settings.launcher]}: {built.nodes} node(s) x {built.gpus_per_node} GPU(s), "
        f"written to {built.path}"
    )
    if not job.submit:
        return LaunchedJob(built, written=True)
    return LaunchedJob(
        built, written=True, copied_to=submit_job(settings, shape, built.path, notify)
    )
