"""The use case of ``torchscale validate``: this node's checks at a level, alone or as one
node of a fleet (Slurm's srun, or ``--nnodes/--node-rank``), or the fleet as a job for a
cluster; the level-2+ records kept and added to the history when one is given.

What is shown while it works (the step under way, the checks' table, the fleet's) goes through
a :class:`ValidateView`, which the CLI points at stderr; the outcome says the exit code and
what ``--json`` prints."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    ContextManager,
    Dict,
    List,
    Optional,
    Protocol,
    Union,
)

from torchscale.errors import TorchscaleError

if TYPE_CHECKING:
    from torchscale.app.k8s_submit import JobRequest, LaunchedJob
    from torchscale.validate.fleet import Fleet, FleetMember
    from torchscale.validate.runner import ValidateOptions


class ValidateView(Protocol):
    def checking(self, what: str) -> ContextManager[Callable[[str], None]]:
        """Shown while ``what`` runs; the callback is told each step."""

    def node_checked(self, report: Dict[str, Any]) -> None:
        """This node's checks, done."""

    def fleet_checked(self, document: Dict[str, Any]) -> None:
        """Node 0: the fleet's report."""

    def say(self, line: str) -> None:
        """A progress line."""

    def notify(self, line: str) -> None:
        """A line of text (no markup): where the run was recorded."""

    def tell(self, line: str) -> None:
        """A line of text, wrapped by the terminal: where a job was written, its node 0."""


@dataclass(frozen=True)
class ValidateRequest:
    timeout_s: float
    join_timeout_s: float
    skip_smoke: bool
    output_dir: Path
    level: int
    config: Optional[Path] = None
    overrides: List[str] = field(default_factory=list)
    fleet: bool = False
    nnodes: Optional[int] = None
    node_rank: Optional[int] = None
    rdzv_endpoint: Optional[str] = None
    history: Optional[str] = None
    flags: List[str] = field(default_factory=list)
    """``--json``, ``--skip-smoke``, ``--verbose`` as given: each node of a fleet repeats them."""
    job: Optional[JobRequest] = None
    """``--launcher k8s|skypilot|dstack``: the fleet as a job, with its size."""
    gpus_per_node: Optional[int] = None


@dataclass(frozen=True)
class ValidateOutcome:
    exit_code: int
    document: Optional[Dict[str, Any]] = None
    """What ``--json`` prints: this node's report, or node 0's fleet document."""
    job: Optional[LaunchedJob] = None


def validate(request: ValidateRequest, view: ValidateView) -> ValidateOutcome:
    """Check this node (or the fleet it is part of, or write the fleet's job)."""
    from torchscale.config.loader import load_validation, parse_overrides
    from torchscale.validate.runner import ValidateOptions

    settings = load_validation(request.config, parse_overrides(request.overrides))
    if request.job is not None:
        return _job(request, request.job, view)
    member: Optional[FleetMember] = None
    if request.fleet:
        role = _fleet_member(request, view)
        if isinstance(role, int):  # srun ran the fleet: its exit code
            return ValidateOutcome(role)
        member = role
    options = ValidateOptions(
        timeout_s=request.timeout_s,
        skip_smoke=request.skip_smoke,
        output_dir=request.output_dir,
        level=request.level,
        settings=settings,
    )
    if member is None:
        report = _check_node(options, request.history, view)
        return ValidateOutcome(0 if report["summary"]["ok"] else 1, report)
    from torchscale.validate.fleet import joined

    with joined(member, settings, lambda step: view.say(f"> {step}")) as group:
        together = replace(
            options, before_probes=lambda: group.start_together(lambda s: view.say(f"> {s}"))
        )
        report = _check_node(together, request.history, view)
        return _fleet(group, report, request, view)


def _words(request: ValidateRequest) -> List[str]:
    return [word for value in request.overrides for word in ("--set", value)]


def _job(request: ValidateRequest, job: JobRequest, view: ValidateView) -> ValidateOutcome:
    from torchscale.app.k8s_submit import launch_job, validate_shape

    if not request.fleet:
        raise TorchscaleError(f"--launcher {job.settings.launcher} goes with --fleet")
    args = ["--level", str(request.level), "--timeout", f"{request.timeout_s:g}", "--fleet"]
    args += ["--join-timeout", f"{request.join_timeout_s:g}"]
    args += _words(request)
    args += [flag for flag in request.flags if flag != "--json"]
    shape = validate_shape(request.nnodes, request.gpus_per_node, request.config, args)
    return ValidateOutcome(0, job=launch_job(job, shape, view.tell))


def _fleet_member(request: ValidateRequest, view: ValidateView) -> Union[FleetMember, int]:
    """This node's place in the fleet; in a Slurm batch script, the fleet started with srun
    (the same validate on every node) and its exit code."""
    from torchscale.validate.fleet_launch import SlurmFleet, resolve_fleet, run_srun

    again = ["--level", str(request.level), "--timeout", f"{request.timeout_s:g}", "--fleet"]
    again += ["--output-dir", str(request.output_dir.resolve())]
    again += ["--join-timeout", f"{request.join_timeout_s:g}"]
    again += ["--config", str(request.config.resolve())] if request.config else []
    again += _words(request)
    again += request.flags
    again += ["--history", request.history] if request.history else []
    role = resolve_fleet(
        nnodes=request.nnodes,
        node_rank=request.node_rank,
        endpoint=request.rdzv_endpoint,
        join_timeout_s=request.join_timeout_s,
        environ=os.environ,
    )
    if isinstance(role, SlurmFleet):
        nodes = len(role.allocation.hosts)
        view.say(f"> srun on {nodes} nodes, node 0 at {role.endpoint}")
        return run_srun(role, again)
    return role


def _record(history: Optional[str], output_dir: Path, view: ValidateView) -> None:
    """Add the validate records of ``output_dir`` to the history, when one is given."""
    from torchscale.app.history import history_location, record_run
    from torchscale.results.layout import VALIDATE_DIR

    record_run(history_location(history), output_dir / VALIDATE_DIR, view.notify)


def _check_node(
    options: ValidateOptions, history: Optional[str], view: ValidateView
) -> Dict[str, Any]:
    """This node's checks at its level, shown; a level-2+ record kept (and added to the
    history, when one is given: a level-1 check measures no figure to keep)."""
    from torchscale.validate.runner import run_validation

    with view.checking("Checking this node...") as step:
        report = run_validation(options, on_check=step)
    view.node_checked(report)
    if options.level >= 2:
        from torchscale.validate.levels import save_record

        view.say(f"> Record: {save_record(report, options.output_dir)}")
        _record(history, options.output_dir, view)
    return report


def _fleet(
    group: Fleet, report: Dict[str, Any], request: ValidateRequest, view: ValidateView
) -> ValidateOutcome:
    """Node 0: the fleet report (shown, its files, every node's figures into the history);
    other nodes: their own verdict."""
    from torchscale.validate.fleet import fleet_check
    from torchscale.validate.fleet_document import fleet_exit_code, save_fleet

    with view.checking("Fleet check...") as step:
        document = fleet_check(group, report, step)
    if document is None:
        member = group.member
        view.say(f"> Node {member.node_rank}: reported to node 0 ({member.endpoint})")
        return ValidateOutcome(0 if report["summary"]["ok"] else 1)
    view.fleet_checked(document)
    json_path, page = save_fleet(document, request.output_dir)
    view.say(f"> Fleet report: {json_path} and {page}")
    _record(request.history, request.output_dir, view)
    return ValidateOutcome(fleet_exit_code(document), document)
