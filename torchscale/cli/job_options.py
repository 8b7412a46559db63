"""The options of ``--launcher k8s|skypilot|dstack`` and what the command does with them."""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional, Sequence

import typer
from typing_extensions import Annotated

from torchscale.cli.console import err_console

if TYPE_CHECKING:
    from torchscale.app.k8s_submit import JobSettings, LaunchedJob

JOB_PANEL = "Kubernetes, SkyPilot, dstack"
JOB_LAUNCHERS = ("k8s", "skypilot", "dstack")


class JobLauncher(str, Enum):
    """validate's and profile's --launcher: here (torchrun), or a job for a cluster."""

    torchrun = "torchrun"
    k8s = "k8s"
    skypilot = "skypilot"
    dstack = "dstack"


JobLauncherOption = Annotated[
    JobLauncher,
    typer.Option(
        "--launcher",
        help="torchrun: here; k8s, skypilot, dstack: write (and with --submit run) a job that "
        "does it on the cluster (docs/kubernetes.md).",
        rich_help_panel=JOB_PANEL,
    ),
]
SubmitOption = Annotated[
    bool,
    typer.Option(
        "--submit",
        help="With --launcher k8s: apply the manifest with kubectl, follow node 0, copy the "
        "results out.",
        rich_help_panel=JOB_PANEL,
    ),
]
GpusPerNodeOption = Annotated[
    Optional[int],
    typer.Option(
        "--gpus-per-node",
        min=1,
        help="With --launcher k8s/skypilot/dstack: the GPUs each pod requests.",
        rich_help_panel=JOB_PANEL,
    ),
]


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


def job_settings(
    launcher: str,
    output_dir: Path,
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
) -> JobSettings:
    from torchscale.app.k8s_submit import JobSettings

    return JobSettings(
        launcher, image or "", output_dir, api.value, namespace, queue, service_account,
        results_pvc, overlay, accelerator, emit,
    )  # fmt: skip


def show_job(launched: LaunchedJob) -> None:
    """What a job's launch printed: on a dry run the manifest (task file) on stdout; with
    ``--submit``, where node 0's results were copied."""
    if not launched.written:
        sys.stdout.write(launched.built.text)
        err_console.print("dry run: nothing was written or submitted")
    if launched.copied_to is not None:
        err_console.print(f"results copied to {launched.copied_to}", markup=False)
