"""The results folder: where an experiment lives and the name of every file in it.

This module is the only place that names a file or folder torchscale writes (a test greps the
package for it), so a reader, a writer and a message can never disagree on a name::

    <output-dir>/<experiment_dirname(name)>/
        manifest.json  results.jsonl  summary.csv  summary_comm.csv  summary_tp_gemm.csv
        benchmark_<N>gpu.json
        sbatch.sh  slurm-<job>.out  <experiment>-report.<format>  tensorboard/
        .lock  .lock-node<N>  .reserve
        cells/<cell_id>/[node<N>/]
            cell.json  result.json  owner.json  launch.log  exits.<host>.jsonl  torchrun/
            flight_recorder/  run_summary.json  metrics_epoch.jsonl
            ranks/rank<R>.progress.json  ranks/rank<R>.error.json  ranks/rank<R>.steps
            profile/  rank<R>.json.gz | rank<R>.nsys-rep (+ .sqlite)
                      findings.json  profile_ranks.csv  profile_steps.csv ...

Standard library only: ``torchscale --help`` and config errors import it without torch.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from pathlib import Path
from typing import Dict

# --- the experiment folder -------------------------------------------------------------------
MANIFEST = "manifest.json"
RESULTS = "results.jsonl"
SUMMARY = "summary.csv"
SUMMARY_COMM = "summary_comm.csv"
SUMMARY_TP_GEMM = "summary_tp_gemm.csv"
CELLS = "cells"
LOCK = ".lock"
RESERVE = ".reserve"
SBATCH_FILE = "sbatch.sh"
SLURM_LOG_PATTERN = "slurm-%j.out"
"""The sbatch job's log, as sbatch names it (``%j``: the job id)."""
TENSORBOARD_DIR = "tensorboard"
REPORT_EXPORT = "report.json"
"""The JSON document of an experiment as logged to MLflow."""
CHARTS_DIR = "{name}-charts"
"""``report --format png``'s default folder, beside the results (``report.png_charts``)."""
PNG_CHARTS: Dict[str, str] = {
    "latency-histogram": "latency_histogram.png",
    "steps": "step_time.png",
    "throughput": "throughput.png",
    "efficiency": "scaling_efficiency.png",
    "sync-share": "sync_overhead.png",
    "comm-compute": "comm_compute.png",
    "mfu": "utilisation.png",
    "memory": "memory.png",
    "bandwidth": "bandwidth.png",
    "tp-gemm": "tp_gemm.png",
}
"""Each key chart kind (the start of its chart id) -> its PNG file (the Distributed Training
Profiler's names)."""
GPU_DOCUMENT = "benchmark_{gpus}gpu.json"
"""The JSON document of one GPU count (distributed_benchmarks' format), written by the benchmark
(``report.document``)."""

# --- a cell's folder (cells/<cell_id>/) --------------------------------------------------------
CELL_FILE = "cell.json"
RESULT_FILE = "result.json"
OWNER_FILE = "owner.json"
LAUNCH_LOG = "launch.log"
TORCHRUN_LOGS = "torchrun"
EXITS_FILE = "exits.{host}.jsonl"
"""How each worker of a launch ended, by the agent on each host (``launch/torchrun_agent.py``):
in the cell's folder, or a warm group's."""
EXITS_GLOB = "exits.*.jsonl"
RUN_SUMMARY = (
    "run_summary.json"  # a training cell's summary, as the GPU Training Benchmark Suite names it
)
METRICS_EPOCH = (
    "metrics_epoch.jsonl"  # with epochs: one line per measured pass (GPU Training Benchmark Suite)
)
# torchscale tune (torchscale.tune): <experiment>/tune/ holds the trials like any experiment, and:
TUNE_DIR = "tune"
TUNE_SUMMARY = "tune.json"  # what the console, --json and the report's Tuning section read
TUNE_BEST_CONFIG = "best.yaml"  # a benchmark config reproducing the winner
TUNE_BASELINE_CONFIG = "baseline.yaml"
TUNE_DDP_SNIPPET = "ddp.py"  # the DDP constructor arguments to paste
TUNE_STUDY = "study.db"  # Optuna's SQLite storage: what a rerun resumes from
TUNE_LOCK = ".tune.lock"
TUNE_SCREEN_DIR = "screen"  # the short screening windows of successive halving
TUNE_VERDICT_DIR = "verdict"  # the interleaved re-measure rounds
# Warm process groups (launch.warm_groups): one folder per group launch, named by its first cell.
EXPERIMENT_FILES = (MANIFEST, RESULTS, SUMMARY, SUMMARY_COMM, SUMMARY_TP_GEMM, TUNE_SUMMARY, LOCK)
"""The files of an experiment folder that its readers use: never an output's place (nor is
anything under ``cells/``)."""

GROUPS_DIR = "groups"
GROUP_FILE = "group.json"  # the launcher's hand-off: the cells, in order
PROGRESS_FILE = "progress.jsonl"  # rank 0's start/end events, appended and fsynced
RANK_STDOUT_LOG = "stdout.log"  # a rank's own output in a warm group, per cell
RANK_STDERR_LOG = "stderr.log"
RANKS_DIR = "ranks"
FLIGHT_RECORDER_DIR = "flight_recorder"
PROFILE_DIR = "profile"

# --- a profile folder (cells/<cell_id>/profile/, or beside the traces analysed) ----------------
FINDINGS_FILE = "findings.json"


def profile_table_file(table: str) -> str:
    """The CSV of one trace-analysis table (``profiling/trace_tables.py`` declares them)."""
    return f"profile_{table}.csv"


PROFILE_DIFF_FILES: Dict[str, str] = {
    "ops": "profile_diff_ops.csv",
    "steps": "profile_diff_steps.csv",
}
KINETO_TRACE_SUFFIX = ".json.gz"
NSYS_REPORT_SUFFIX = ".nsys-rep"
NSYS_EXPORT_SUFFIX = ".sqlite"
NSYS_REPORT_GLOB = f"rank*{NSYS_REPORT_SUFFIX}"

# --- the validate smoke test's scratch folder ---------------------------------------------------
SMOKE_LOG = "smoke.log"

# --- validate's records in an output folder (<output-dir>/validate/) ------------------------------
VALIDATE_DIR = "validate"
VALIDATE_RECORD_GLOB = "host-*.json"  # one level-2+ report per host
FLEET_REPORT = "fleet.json"  # validate --fleet: every node's report, outliers, links
FLEET_PAGE = "fleet.html"  # validate --fleet: the node x device heatmaps


def slurm_log(job_id: str) -> str:
    return SLURM_LOG_PATTERN.replace("%j", job_id)


def node_lock(node_rank: int) -> str:
    return f"{LOCK}-node{node_rank}"


def node_dir(node_rank: int) -> str:
    """A node's own subfolder of a cell's folder, where a node other than 0 writes."""
    return f"node{node_rank}"


NODE_DIR_GLOB = "node*"


def rank_file(rank: int, kind: str) -> str:
    """A rank's file in ``ranks/``: ``rank<R>.<kind>.json`` (``kind``: progress, error)."""
    return f"rank{rank}.{kind}.json"


def rank_file_glob(kind: str) -> str:
    return f"rank*.{kind}.json"


def rank_steps_file(rank: int) -> str:
    return f"rank{rank}.steps"


def kineto_trace(rank: int) -> str:
    return f"rank{rank}{KINETO_TRACE_SUFFIX}"


def nsys_report(rank: int) -> str:
    return f"rank{rank}{NSYS_REPORT_SUFFIX}"


def report_file(experiment_or_folder: str, fmt: str) -> str:
    """``<experiment>-report.<fmt>``: a report's default name inside the results folder."""
    return f"{experiment_dirname(experiment_or_folder)}-report.{fmt}"


# --- a `torchscale profile` run: an experiment of its own, named for what it traced ------------
_PROFILE_RUN = re.compile(r"profile-.+-g\d+-\d{8}-\d{6}")


def profile_run_name(what: str, gpus: int, stamp: str) -> str:
    """``profile-<what>-g<gpus>-<YYYYmmdd-HHMMSS>``: the experiment a ``torchscale profile`` run
    writes (into ``--output-dir``, often beside the benchmark it profiles)."""
    return f"profile-{what}-g{gpus}-{stamp}"


def profile_subject(name: str) -> str:
    """What a profile run's name says it traced (``profile-<this>-g..``): an experiment's or a
    model's name as a safe folder name as it is (a model path has a colon)."""
    return re.sub(r"[^\w.-]+", "-", name).strip("-.") or "model"


def is_profile_run_of(profile_name: str, experiment_name: str) -> bool:
    """Whether ``profile_name`` is a ``torchscale profile`` run of the experiment
    ``experiment_name`` (``profile --script``, or with a config, names its run for the
    experiment that ``benchmark`` would write)."""
    subject = re.escape(profile_subject(experiment_name))
    return re.fullmatch(rf"profile-{subject}-g\d+-\d{{8}}-\d{{6}}", profile_name) is not None


def is_profile_run(experiment_name: str) -> bool:
    """Whether an experiment is a ``torchscale profile`` run (see :func:`profile_run_name`): a
    report shows it as the profile of the benchmark it sits beside, not as an experiment."""
    return _PROFILE_RUN.fullmatch(experiment_name) is not None


# --- the name-to-folder rule --------------------------------------------------------------------
SAFE_NAME_BYTES = 200
"""Longest experiment name (UTF-8 bytes) used as a folder name as it is; file systems allow 255."""


def _safe_char(char: str) -> bool:
    """Letters (with their combining marks) and digits of any script, ``-``, ``_`` and ``.``."""
    return char in "-_." or unicodedata.category(char)[0] in "LMN"


def is_safe_name(name: str) -> bool:
    """Whether ``name`` can be a folder name as it is, on any file system and in any shell."""
    return (
        bool(name)
        and name not in (".", "..")
        and not name.startswith(("-", "."))
        and len(name.encode("utf-8")) <= SAFE_NAME_BYTES
        and unicodedata.is_normalized("NFC", name)
        and all(_safe_char(c) for c in name)
    )


def experiment_dirname(name: str) -> str:
    """The folder of an experiment: its name when that is a safe file name (:func:`is_safe_name`,
    any script), else the name made safe plus ``+`` and a short hash of the original. A safe name
    never contains ``+``, so two different names never share a folder (the name itself is kept in
    the manifest and every record)."""
    if is_safe_name(name):
        return name
    safe = "".join(c if _safe_char(c) else "-" for c in unicodedata.normalize("NFC", name))
    safe = re.sub(r"-{2,}", "-", safe).strip("-.")[:48] or "experiment"
    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:10]
    return f"{safe}+{digest}"


def experiment_dir(output_dir: Path, experiment_name: str) -> Path:
    """``<output_dir>/<experiment folder>``: where an experiment's results go."""
    return Path(output_dir) / experiment_dirname(experiment_name)


def validate_record_path(output_dir: Path, host: str) -> Path:
    """``<output_dir>/validate/host-<host>.json``: the latest level-2+ report of ``host`` (a host
    name from another node is made a safe file name as an experiment name is)."""
    return Path(output_dir) / VALIDATE_DIR / f"host-{experiment_dirname(host)}.json"


def cell_dir(experiment: Path, cell_id: str) -> Path:
    return Path(experiment) / CELLS / cell_id


def cell_output_dir(cell_folder: Path) -> Path:
    """The output dir that :func:`cell_dir`'s folder lies in (``<output-dir>/<experiment>/
    cells/<cell_id>``): where validate keeps its host records beside the experiments."""
    return Path(cell_folder).parent.parent.parent


def gpu_document_file(gpus: int) -> str:
    """``benchmark_4gpu.json``: distributed_benchmarks' name for the document of one GPU count."""
    return GPU_DOCUMENT.format(gpus=int(gpus))


def charts_dir(name: str) -> str:
    """``<experiment>-charts``: where ``report --format png`` writes by default."""
    return CHARTS_DIR.format(name=experiment_dirname(name))


def png_chart_file(kind: str, part: int = 1) -> str:
    """A chart kind's PNG file: the Distributed Training Profiler's name for the first,
    ``latency_histogram_2.png`` and so on for the panels past the first file's
    (``report.png_charts``)."""
    name = PNG_CHARTS[kind]
    if part == 1:
        return name
    stem, _, suffix = name.rpartition(".")
    return f"{stem}_{int(part)}.{suffix}"
