"""The options of ``--launcher k8s|skypilot|dstack`` and what the command does with them."""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional, Sequence

import typer
from typing_extensions import Annotated

from torchscale.cli.console import err_console, say

if TYPE_CHECKING:
    from torchscale.app.benchmark import BenchmarkRequest

JOB_PANEL = "Kubernetes, SkyPilot, dstack"
JOB_LAUNCHERS = ("k8s", "skypilot", "dstack")


class K8sApi(str, Enum):
    trainjob = "trainjob"
    jobset = "jobset"
    pytorchjob = "pytorchjob"


K8sApiOption = Annotated[
    K8sApi,
    typer.Option(
        "--k8s-api",
        help="The cluster's training API: trainjob (Kubeflow Trainer v2), jobset, pytorchjob.",
        rich_help_panel=JOB_PANEL,
    ),
]
ImageOption = Annotated[
    Optional[str],
    typer.Option(
        "--image", help="Container image with torchscale installed.", rich_help_panel=JOB_PANEL
    ),
]
NamespaceOption = Annotated[
    Optional[str],
    typer.Option("--namespace", help="Kubernetes namespace.", rich_help_panel=JOB_PANEL),
]
QueueOption = Annotated[
    Optional[str],
    typer.Option(
        "--k8s-queue",
        help="Kueue LocalQueue: labels the job and creates it suspended.",
        rich_help_panel=JOB_PANEL,
    ),
]
ServiceAccountOption = Annotated[
    Optional[str],
    typer.Option(
        "--k8s-service-account", help="The pods' service account.", rich_help_panel=JOB_PANEL
    ),
]
ResultsPvcOption = Annotated[
    Optional[str],
    typer.Option(
        "--k8s-results-pvc",
        help="A ReadWriteMany PersistentVolumeClaim for the results (default: node 0's pod keeps "
        "them until --submit copies them out).",
        rich_help_panel=JOB_PANEL,
    ),
]
OverlayOption = Annotated[
    Optional[Path],
    typer.Option(
        "--k8s-overlay",
        help="A pod-spec YAML merged into the pods: tolerations, nodeSelector, affinity, ...",
        dir_okay=False,
        rich_help_panel=JOB_PANEL,
    ),
]
EmitOption = Annotated[
    Optional[Path],
    typer.Option(
        "--emit",
        help="Write the manifest (task file) here (default: in the experiment folder).",
        dir_okay=False,
        rich_help_panel=JOB_PANEL,
    ),
]
AcceleratorOption = Annotated[
    str,
    typer.Option(
        "--accelerator",
        help="SkyPilot/dstack GPU name (H100, A100, ...).",
        rich_help_panel=JOB_PANEL,
    ),
]


def script_words(
    script: str,
    gpus: Optional[Sequence[int]],
    steps: Optional[int],
    samples_per_step: Optional[int],
    step_at: Optional[Enum],
    args: Sequence[str],
) -> List[str]:
    """``--script`` and its options as the pods' torchscale repeats them (the script's own
    arguments last, after ``--``)."""
    words = ["--script", script, *(f"--gpus={count}" for count in gpus or [])]
    words += [f"--steps={steps}"] if steps is not None else []
    words += [f"--samples-per-step={samples_per_step}"] if samples_per_step is not None else []
    words += [f"--step-at={step_at.value}"] if step_at is not None else []
    return [*words, "--", *args]


def run_job(
    request: BenchmarkRequest,
    config_path: Optional[Path],
    forwarded: Sequence[str],
    launcher: str,
    *,
    api: K8sApi,
    image: Optional[str],
    namespace: Optional[str],
    queue: Optional[str],
    service_account: Optional[str],
    results_pvc: Optional[str],
    overlay: Optional[Path],
    emit: Optional[Path],
    accelerator: str,
    submit: bool,
) -> None:
    """Write the job's manifest (task file); with ``--submit`` (Kubernetes), run it."""
    from torchscale.app.k8s_submit import JobRequest, build_job, submit_job
    from torchscale.errors import TorchscaleError
    from torchscale.results.store import atomic_write_text

    job = JobRequest(
        request, config_path, forwarded, launcher, image or "", api.value, namespace, queue,
        service_account, results_pvc, overlay, accelerator, emit, submit,
    )  # fmt: skip
    if submit and launcher != "k8s":
        raise TorchscaleError(
            f"--submit runs Kubernetes jobs; submit the task file with "
            f"{'sky launch' if launcher == 'skypilot' else 'dstack apply -f'} yourself"
        )
    built = build_job(job)
    built.path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(built.path, built.text)
    what = {"k8s": api.value, "skypilot": "SkyPilot task", "dstack": "dstack task"}[launcher]
    say(f"{what}: {built.nodes} node(s) x {built.gpus_per_node} GPU(s), written to {built.path}")
    if not submit:
        return
    local = submit_job(job, built.path, built.name, say)
    err_console.print(f"results copied to {local}", markup=False)
    sys.stderr.flush()
