"""``torchscale validate``: is this node ready for DDP?

Imports nothing heavy at module level: ``torchscale validate --help`` must not import torch.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional

import typer
from typing_extensions import Annotated

from torchscale.cli.console import (
    err_console,
    is_quiet,
    print_json,
    result_console,
    say,
    user_errors,
)
from torchscale.cli.history_command import RecordHistoryOption
from torchscale.cli.job_options import (
    AcceleratorOption,
    EmitOption,
    GpusPerNodeOption,
    ImageOption,
    JobLauncher,
    JobLauncherOption,
    K8sApi,
    K8sApiOption,
    NamespaceOption,
    OverlayOption,
    QueueOption,
    ResultsPvcOption,
    ServiceAccountOption,
    SubmitOption,
    job_settings,
    show_job,
)
from torchscale.errors import TorchscaleError

if TYPE_CHECKING:
    from rich.console import Console
    from rich.status import Status
    from rich.table import Table


@user_errors
def validate(
    json_output: Annotated[
        bool,
        typer.Option(
            "--json", help="Print the report as one JSON document on stdout (table on stderr)."
        ),
    ] = False,
    skip_smoke: Annotated[
        bool,
        typer.Option(
            "--skip-smoke", help="Skip the torchrun all-reduce smoke test (seconds faster)."
        ),
    ] = False,
    timeout: Annotated[
        str,
        typer.Option(
            "--timeout",
            help="How long before a hanging smoke test is killed and reported as FAIL "
            "(60, 90s, 2min; a bare number is seconds).",
        ),
    ] = "60",
    output_dir: Annotated[
        Path,
        typer.Option(
            "--output-dir",
            "-o",
            help="Where benchmark results will go: its free disk space is checked.",
        ),
    ] = Path("results"),
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose", "-v", help="Enable verbose logging (each check's details and timing)."
        ),
    ] = False,
    level: Annotated[
        int,
        typer.Option(
            "--level",
            help="1: configuration checks (seconds); 2: + measured probes per device (GEMM, "
            "memory, host and P2P copies, launches, node collectives), XID errors, CPU "
            "governor, InfiniBand ports; 3: + sustained load watching clocks, temperature, "
            "power and ECC.",
        ),
    ] = 1,
    config: Annotated[
        Optional[Path],
        typer.Option(
            "--config",
            "-c",
            help="YAML file whose validation: section sets probe sizes, durations and "
            "thresholds (the rest of the file is ignored).",
        ),
    ] = None,
    set_: Annotated[
        Optional[List[str]],
        typer.Option(
            "--set",
            help="Override a validation key, e.g. --set validation.window_s=0.5 (repeatable).",
        ),
    ] = None,
    fleet: Annotated[
        bool,
        typer.Option(
            "--fleet",
            help="Check every node of a Slurm allocation (srun) or of --nnodes launches: "
            "outlier devices, slow nodes and slow links; node 0 writes the fleet report.",
        ),
    ] = False,
    nnodes: Annotated[
        Optional[int],
        typer.Option("--nnodes", help="--fleet without Slurm: nodes taking part."),
    ] = None,
    node_rank: Annotated[
        Optional[int],
        typer.Option("--node-rank", help="--fleet without Slurm: this node (0 reports)."),
    ] = None,
    rdzv_endpoint: Annotated[
        Optional[str],
        typer.Option(
            "--rdzv-endpoint",
            help="--fleet: node 0's HOST:PORT (under Slurm only the port is used).",
        ),
    ] = None,
    join_timeout: Annotated[
        str,
        typer.Option(
            "--join-timeout",
            help="--fleet: how long to wait for the other nodes (600, 10min).",
        ),
    ] = "600",
    launcher: JobLauncherOption = JobLauncher.torchrun,
    submit: SubmitOption = False,
    gpus_per_node: GpusPerNodeOption = None,
    k8s_api: K8sApiOption = K8sApi.trainjob,
    image: ImageOption = None,
    namespace: NamespaceOption = None,
    k8s_queue: QueueOption = None,
    k8s_service_account: ServiceAccountOption = None,
    k8s_results_pvc: ResultsPvcOption = None,
    k8s_overlay: OverlayOption = None,
    emit: EmitOption = None,
    accelerator: AcceleratorOption = "H100",
    history: RecordHistoryOption = None,
) -> None:
    """Check if current node meets DDP requirements (NCCL, Drivers)."""
    if verbose:
        logging.getLogger("torchscale").setLevel(logging.DEBUG)
    from torchscale.app.k8s_submit import JobRequest
    from torchscale.app.validate import ValidateRequest
    from torchscale.app.validate import validate as validate_node
    from torchscale.config.durations import parse_duration

    timeout_s = parse_duration(timeout, "--timeout", "60, 90s or 2min")
    join_timeout_s = parse_duration(join_timeout, "--join-timeout", "600, 90s or 10min")
    if level not in (1, 2, 3):
        raise TorchscaleError(f"--level {level}: choose 1, 2 or 3")
    if output_dir.exists() and not output_dir.is_dir():
        raise TorchscaleError(f"--output-dir {output_dir} is a file: give a directory")
    job = None
    if launcher is not JobLauncher.torchrun:
        job = JobRequest(submit=submit, settings=job_settings(
            launcher.value, output_dir, api=k8s_api, image=image, namespace=namespace,
            queue=k8s_queue, service_account=k8s_service_account, results_pvc=k8s_results_pvc,
            overlay=k8s_overlay, emit=emit, accelerator=accelerator,
        ))  # fmt: skip
    flags = [("--json", json_output), ("--skip-smoke", skip_smoke), ("--verbose", verbose)]
    request = ValidateRequest(
        timeout_s=timeout_s,
        join_timeout_s=join_timeout_s,
        skip_smoke=skip_smoke,
        output_dir=output_dir,
        level=level,
        config=config,
        overrides=set_ or [],
        fleet=fleet,
        nnodes=nnodes,
        node_rank=node_rank,
        rdzv_endpoint=rdzv_endpoint,
        history=history,
        flags=[flag for flag, on in flags if on],
        job=job,
        gpus_per_node=gpus_per_node,
    )
    outcome = validate_node(request, ConsoleView())
    if outcome.job is not None:
        show_job(outcome.job)
        return
    if json_output and outcome.document is not None:
        print_json(outcome.document)
    raise typer.Exit(outcome.exit_code)


class ConsoleView:
    """validate's progress on stderr: the step under way, the checks' table (the WARN and
    FAIL rows with --quiet), the fleet's."""

    @contextlib.contextmanager
    def checking(self, what: str) -> Iterator[Callable[[str], None]]:
        with err_console.status(what) as status:
            yield _progress(status)

    def node_checked(self, report: Dict[str, Any]) -> None:
        if is_quiet():
            _render_quiet(report)
        else:
            render(report, err_console)
        _log_details(report)

    def fleet_checked(self, document: Dict[str, Any]) -> None:
        from torchscale.validate.fleet_view import render_fleet

        render_fleet(document, err_console)

    def say(self, line: str) -> None:
        err_console.print(line)

    def notify(self, line: str) -> None:
        err_console.print(line, markup=False, highlight=False)

    def tell(self, line: str) -> None:
        say(line)


def checks_table(report: Dict[str, Any], console: Console) -> Table:
    """Check, status, value and fix, through the shared console renderer; on a console narrower
    than ``WIDE`` (a CI log, a file: 80 columns) the fix goes under the value, so that neither is
    squeezed into a narrow column. A fix several checks share is a note under the table."""
    from torchscale.console_tables import Col, fitted_table
    from torchscale.validate.display import STYLES, WIDE, fix_text, shared_fixes

    checks = report["checks"]
    notes = shared_fixes(report)
    fixes = [fix_text(check["fix"], notes) for check in checks]
    names = [str(check["name"]) for check in checks]
    statuses = [str(check["status"]) for check in checks]
    styles = [STYLES.get(status, "") for status in statuses]
    values = [str(check["value"]) for check in checks]
    title = f"torchscale validate: {report['host']}"
    if console.width >= WIDE:
        cols = [
            Col("Check", names, numeric=False),
            Col("Status", statuses, numeric=False, styles=styles),
            Col("Value", values, numeric=False, fill=True),
            Col("Fix", fixes, numeric=False, fill=True),
        ]
    else:
        stacked = [f"{v}\nfix: {f}" if f else v for v, f in zip(values, fixes)]
        cols = [
            Col("Status", statuses, numeric=False, styles=styles),
            Col("Check", names, numeric=False),
            Col("Value (and how to fix it)", stacked, numeric=False, fill=True),
        ]
    return fitted_table(console, title, cols)


def _render_quiet(report: Dict[str, Any]) -> None:
    """``--quiet``: the WARN and FAIL rows (the warnings and errors) and the verdict line."""
    from torchscale.validate.display import summary_line

    flagged = [c for c in report["checks"] if c["status"] in ("WARN", "FAIL")]
    if flagged:
        result_console.print(checks_table({**report, "checks": flagged}, result_console))
    result_console.print(summary_line(report))


def render(report: Dict[str, Any], console: Console) -> None:
    """The checks, the shared fixes once each, the GPU topology matrix, the verdict."""
    from torchscale.validate.display import (
        note_lines,
        shared_fixes,
        summary_line,
        topology_table,
    )

    console.print(checks_table(report, console))
    for line in note_lines(report, shared_fixes(report)):
        console.print(line, markup=False, highlight=False, soft_wrap=False)
    topology = topology_table(report)
    if topology is not None:
        console.print(topology)
        legend = next(c for c in report["checks"] if c["name"] == "GPU topology")["details"]
        console.print(
            "Legend: " + "; ".join(f"{k} = {v}" for k, v in legend["legend"].items()),
            markup=False,
        )
    console.print(summary_line(report))


def _progress(status: Status) -> Callable[[str], None]:
    """Show the step under way; with --verbose, log how long each step took."""
    log = logging.getLogger("torchscale")
    current, start = "", time.monotonic()

    def step(name: str) -> None:
        nonlocal current, start
        now = time.monotonic()
        if current:
            log.debug("validate: %s took %.2f s", current, now - start)
        current, start = name, now
        status.update(f"Checking: {name}...")

    return step


def _log_details(report: Dict[str, Any]) -> None:
    """With --verbose: what each check measured beyond its one-line value."""
    log = logging.getLogger("torchscale")
    for check in report["checks"]:
        if check.get("details"):
            details = json.dumps(check["details"], sort_keys=True, default=str)
            log.debug("%s: %s", check["name"], details)
