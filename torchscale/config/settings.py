"""The benchmark configuration: what one cell runs, and the YAML matrix that expands into cells.

Each knob is declared once, on the scalar models (``TrainingSettings``, ``DDPSettings``,
``DataSettings``) that describe ONE cell. The YAML-facing ``BenchmarkConfig`` is derived from them
by :func:`sweepable`: every knob also accepts a list, and lists expand into the cartesian product,
like the seed's ``models x batch_sizes x gpu_counts``.

No torch here: config errors must be reported without importing it.
"""

from __future__ import annotations

from typing import Any, Dict, List, Literal, Optional, Type, Union

from annotated_types import Len
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    create_model,
    model_validator,
)
from typing_extensions import Annotated

from torchscale.config.base import StrictModel, as_list
from torchscale.config.dataset_paths import DEFAULT_DATA_PATH
from torchscale.config.tune_section import TuneSection
from torchscale.config.validate_section import ValidateSection
from torchscale.results.layout import METRICS_EPOCH

PRECISION_ALIASES = {"fp16": "amp", "float32": "fp32", "bfloat16": "bf16"}

Backend = Literal["auto", "nccl", "gloo", "ucc", "ucc/tl/nccl", "ucc/tl/cuda", "ucc/tl/ucp", "mpi"]
"""Process-group backends (``torchscale.launch.backends``): ``ucc/tl/<tl>`` is UCC with its
transport layer chosen, as DDLB names it."""
FINITE_SOURCES = ("image_folder", "tensor_file", "cifar100", "imagenet")
"""Data sources with a length: an epoch is a whole pass over them."""


def _precision_alias(value: Any) -> Any:
    return PRECISION_ALIASES.get(value, value) if isinstance(value, str) else value


Precision = Annotated[Literal["fp32", "amp", "bf16"], BeforeValidator(_precision_alias)]


def _compile_alias(value: Any) -> Any:
    """``compile: true`` is Dynamo's DDP graph splitting (what torch.compile does around DDP),
    ``off`` is false: so ``if settings.compile`` reads as it always did."""
    if value is True:
        return "ddp_optimizer"
    return False if value == "off" else value


CompileMode = Annotated[
    Union[Literal[False], Literal["ddp_optimizer", "compiled_autograd"]],
    BeforeValidator(_compile_alias),
]
"""``compile``: off (false), ddp_optimizer (true) or compiled_autograd (``worker/training.py``)."""
Strategy = Literal["ddp", "replicate", "fsdp2", "fsdp2_hybrid"]
"""Data-parallel strategies (``worker/strategies.py``; docs/strategies.md)."""


class DDPSettings(StrictModel):
    """DistributedDataParallel constructor knobs and the gradient communication hook."""

    bucket_cap_mb: PositiveFloat = Field(25.0, description="Gradient bucket size in MiB.")
    gradient_as_bucket_view: bool = Field(False, description="Gradients alias bucket memory.")
    static_graph: bool = Field(False, description="Tell DDP the graph never changes.")
    find_unused_parameters: bool = Field(False, description="Search for unused parameters.")
    broadcast_buffers: bool = Field(True, description="Broadcast buffers every forward.")
    comm_hook: Literal["none", "fp16", "bf16", "powersgd"] = Field(
        "none", description="Gradient compression hook."
    )
    powersgd_rank: PositiveInt = Field(1, description="PowerSGD matrix approximation rank.")


class DataSettings(StrictModel):
    """Where batches come from. Synthetic data isolates compute from I/O."""

    source: Literal["synthetic", "image_folder", "tensor_file", "cifar100", "imagenet"] = Field(
        "synthetic",
        description="synthetic; image_folder (class sub-folders of images); "
        "tensor_file (a torch.save'd dict with 'inputs' and 'targets'); cifar100 (CIFAR-100's "
        "python version under path, downloaded there when missing); imagenet "
        "(path/train/<wnid>/ images, never downloaded).",
    )
    path: Optional[str] = Field(
        None,
        description="Folder or file for non-synthetic sources (cifar100: default data/, where a "
        "missing CIFAR-100 is downloaded, checksum verified).",
    )
    num_workers: NonNegativeInt = Field(2, description="DataLoader worker processes per rank.")
    pin_memory: bool = Field(True, description="Pin host memory (GPU only).")

    @model_validator(mode="after")
    def _path_needed(self) -> DataSettings:
        if self.source == "cifar100" and not self.path:
            self.path = (
                DEFAULT_DATA_PATH  # as the GPU Training Benchmark Suite: CIFAR-100 goes to data/
            )
        if self.source != "synthetic" and not self.path:
            raise ValueError(f"data.source '{self.source}' needs data.path")
        return self


class TrainingSettings(StrictModel):
    """The knobs of one cell besides model, batch size and GPU count."""

    backend: Backend = Field(
        "auto",
        description="Process-group backend: auto (nccl on GPUs, gloo on CPU), nccl, gloo, ucc, "
        "ucc/tl/nccl, ucc/tl/cuda or ucc/tl/ucp (UCC with that transport layer: UCC_TLS and "
        "UCC_CL_BASIC_TLS set for the cell), or mpi (with --launcher mpirun). One this torch or "
        "node lacks makes the cell skipped.",
    )
    strategy: Strategy = Field(
        "ddp",
        description="Data-parallel strategy: ddp (DistributedDataParallel), replicate (torch's "
        "FSDP-based replicate: parameters replicated, gradients all-reduced per block), fsdp2 "
        "(fully_shard per block: parameters, gradients and optimizer state sharded) or "
        "fsdp2_hybrid (sharded within a node, replicated across nodes; multi-node cells). One "
        "this torch or cell cannot run makes the cell skipped.",
    )
    reshard_after_forward: bool = Field(
        True,
        description="fsdp2, fsdp2_hybrid: free each block's gathered parameters after its "
        "forward (gathered again for backward: less memory, more all-gathers).",
    )
    precision: Precision = Field("fp32", description="fp32, amp (fp16 + GradScaler) or bf16.")
    channels_last: bool = Field(False, description="NHWC memory format for conv models.")
    cudnn_benchmark: bool = Field(
        True,
        description="CUDA cells: torch.backends.cudnn.benchmark (cuDNN tries its algorithms once "
        "per input shape, in the warm-up, and keeps the fastest, as most training loops do).",
    )
    tf32: Optional[bool] = Field(
        None,
        description="TF32 math for fp32 matmuls and cuDNN convolutions: true, false, or unset "
        "for PyTorch's defaults (convolutions TF32, matmuls not). MFU is scored against the peak "
        "of the math actually used.",
    )
    compile: CompileMode = Field(
        False,
        description="torch.compile around the wrapped model: off (false); ddp_optimizer (true: "
        "Dynamo splits the graph at DDP's bucket boundaries so the all-reduces still overlap "
        "backward); compiled_autograd (the backward traced too; DDP's gradients then go through "
        "its Python reducer). One this torch lacks makes the cell skipped.",
    )
    compile_backend: str = Field(
        "inductor",
        description="torch.compile backend: inductor, or aot_eager to check graph capture "
        "without code generation.",
    )
    compile_mode: Optional[Literal["default", "reduce-overhead", "max-autotune"]] = Field(
        None, description="torch.compile mode (inductor)."
    )
    grad_accum_steps: PositiveInt = Field(1, description="Micro-batches per optimizer step.")
    seq_len: Optional[PositiveInt] = Field(
        None, description="Sequence length for language models (model default when unset)."
    )
    optimizer: Literal["auto", "sgd", "adamw"] = Field(
        "auto", description="auto: the model's usual optimizer (SGD for CNNs, AdamW for LMs)."
    )
    optimizer_impl: Literal["auto", "foreach", "fused", "forloop"] = Field(
        "auto",
        description="How the optimizer step runs: auto (fused AdamW on CUDA, else PyTorch's "
        "choice), foreach (one kernel per op over all tensors), fused (one kernel for the whole "
        "step) or forloop (tensor by tensor). The same math up to rounding.",
    )
    warmup_steps: NonNegativeInt = Field(10, description="Steps run before timing, discarded.")
    measure_steps: Optional[PositiveInt] = Field(
        None, description="Timed steps (default 50 unless measure_seconds is set)."
    )
    measure_seconds: Optional[PositiveFloat] = Field(
        None, description="Time the window instead of counting steps."
    )
    epochs: Optional[PositiveInt] = Field(
        None,
        description="Measure this many full passes over the dataset after the warm-up, each "
        f"timed on its own (the cell's {METRICS_EPOCH}); measure_steps or measure_seconds, if "
        "given too, cap each pass. Synthetic data has no length: there an epoch is "
        "measure_steps steps (default 50) or measure_seconds.",
    )
    sync_cuda: bool = Field(
        False,
        description="Strict timing: synchronise the device after every measured step (slower; "
        "the record's runtime.sync_cuda says so). Off: steps are timed by CUDA events without "
        "stopping the host running ahead.",
    )
    sync_probe_steps: NonNegativeInt = Field(
        10,
        description="Steps run under DDP no_sync() and with DDP's logging at every step, "
        "to split compute from gradient sync (0 disables).",
    )
    seed: int = Field(0, description="Seed for weights and synthetic data.")
    cell_timeout_s: PositiveFloat = Field(
        1800.0, description="Kill a cell after this many seconds and record it as timeout."
    )
    stall_timeout_s: Optional[PositiveFloat] = Field(
        600.0,
        description="Kill a training cell as hung (timeout) once every rank is in its warmup, "
        "measured or sync-probe window and none has moved to another step or step phase for this "
        "many seconds (null: only cell_timeout_s). Raise it for a first compiled step that takes "
        "longer.",
    )
    ddp: DDPSettings = Field(default_factory=DDPSettings)
    data: DataSettings = Field(default_factory=DataSettings)

    @model_validator(mode="after")
    def _compile_buckets(self) -> TrainingSettings:
        # torch.compile's DDPOptimizer asserts the first bucket (1 MiB) is no larger than the rest.
        if self.compile == "ddp_optimizer" and self.ddp.bucket_cap_mb < 1.0:
            raise ValueError(
                f"compile: true needs ddp.bucket_cap_mb >= 1 (got {self.ddp.bucket_cap_mb:g}): "
                "torch.compile's DDP optimizer cannot use buckets smaller than DDP's first, 1 MiB"
            )
        return self

    @model_validator(mode="after")
    def _one_window(self) -> TrainingSettings:
        if self.measure_steps is not None and self.measure_seconds is not None:
            raise ValueError("give measure_steps or measure_seconds, not both")
        passes = self.epochs is not None and self.data.source in FINITE_SOURCES
        if self.measure_steps is None and self.measure_seconds is None and not passes:
            self.measure_steps = 50  # also an epoch's length on synthetic data, which has none
        return self


class CellSettings(TrainingSettings):
    """Everything one cell (one torchrun launch) runs with: the worker's input."""

    model: str
    batch_size: PositiveInt = Field(description="Per-GPU micro-batch size.")
    gpus: PositiveInt = Field(description="Total ranks: nnodes x nproc_per_node.")
    nnodes: PositiveInt = 1
    repeat: NonNegativeInt = 0

    @property
    def nproc_per_node(self) -> int:
        return self.gpus // self.nnodes


class ProfilingSettings(StrictModel):
    """When benchmark cells are also profiled (see ``torchscale profile``)."""

    enabled: bool = Field(False, description="Profile benchmark cells.")
    tool: Literal["auto", "nsys", "torch"] = Field(
        "auto", description="auto: nsys when on PATH with GPUs, else torch.profiler."
    )
    trigger: Literal["always", "sync_stall_detection"] = Field(
        "always",
        description="always: every cell; sync_stall_detection: only cells whose sync overhead "
        "or cross-rank variance passes the thresholds.",
    )
    target: Literal["sync_stalls", "communication", "compute", "memory", "all"] = "sync_stalls"
    sync_stall_threshold: float = Field(
        0.10, ge=0, le=1, description="Exposed sync share of the step that triggers profiling."
    )
    variance_threshold: float = Field(
        0.25, ge=0, description="Coefficient of variation of sync wait that triggers profiling."
    )
    steps: PositiveInt = Field(10, description="Steps recorded in the trace.")
    duration_s: Optional[PositiveFloat] = Field(
        None, description="Trace for this long instead of a number of steps."
    )


def sweepable(model: Type[BaseModel], name: str) -> Type[BaseModel]:
    """Derive the YAML form of ``model``: every field also accepts a list of values.

    Nested sections (``ddp:``, ``data:``) become sweepable sections; constraints on each value
    (positive, literal choices) are kept, so ``batch_sizes: [64, -1]`` still fails on ``-1``.
    Cross-field rules (e.g. measure_steps vs measure_seconds) are checked per expanded cell.
    """
    fields: Dict[str, Any] = {}
    for field_name, info in model.model_fields.items():
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            section = sweepable(annotation, f"{annotation.__name__}Sweep")
            fields[field_name] = (
                section,
                Field(default_factory=section, description=info.description),
            )
            continue
        value_type = Annotated[(annotation, *info.metadata)] if info.metadata else annotation
        default = info.get_default(call_default_factory=True)
        fields[field_name] = (
            # list[...] of a type built at run time: spelled as the call it is for the checker
            Annotated[
                list.__class_getitem__(value_type), BeforeValidator(as_list), Len(min_length=1)
            ],
            Field(default=[default], description=info.description),
        )
    return create_model(name, __config__=ConfigDict(extra="forbid", allow_inf_nan=False), **fields)


TrainingSweep = sweepable(TrainingSettings, "TrainingSweep")


class BenchmarkConfig(TrainingSweep):  # type: ignore[misc,valid-type]
    """The YAML file: the seed's keys plus every ``TrainingSettings`` knob, value or list. The
    kinds' sections (``communication:``) are fields of ``config.kind_sections.config_model()``,
    the model a loaded config is."""

    experiment_name: str = Field(
        min_length=1, description="Names the results folder (default: the config file's name)."
    )
    models: Annotated[List[str], BeforeValidator(as_list)] = Field(
        default_factory=list,
        description="Built-in names (--list-models) or 'package.module:function'.",
    )
    batch_sizes: Annotated[List[PositiveInt], BeforeValidator(as_list), Len(min_length=1)] = Field(
        default_factory=lambda: [32], description="Per-GPU micro-batch sizes."
    )
    gpu_counts: Annotated[List[PositiveInt], BeforeValidator(as_list), Len(min_length=1)] = Field(
        default_factory=lambda: [1],
        description="Ranks per cell: GPUs, or CPU processes on a node without GPUs.",
    )
    gpus_per_node: Optional[PositiveInt] = Field(
        None,
        description="Ranks per node: a GPU count above it runs on gpu_count / gpus_per_node nodes "
        "(default: the node's GPU count, in a multi-node launch).",
    )
    nodes: Optional[Annotated[List[PositiveInt], BeforeValidator(as_list), Len(min_length=1)]] = (
        Field(
            None,
            description="Node counts to spread every GPU count over, e.g. [1, 2] runs 4 GPUs as "
            "1 x 4 and 2 x 2; counts that do not divide a GPU count are left out.",
        )
    )
    repeats: PositiveInt = Field(1, description="Run every cell this many times.")
    launch: Literal["per_group", "per_cell"] = Field(
        "per_group",
        description="per_group: cells of the same launch layout run back to back in one torchrun "
        "launch (a warm process group; fresh model, DDP and optimizer per cell); per_cell: a "
        "torchrun launch per cell. Cells that need a process of their own run per cell anyway.",
    )
    profiling: ProfilingSettings = Field(default_factory=ProfilingSettings)
    history: Optional[str] = Field(
        None,
        description="Record every run in this history at its end: a file path or sqlite:///PATH "
        "(SQLite), or postgresql://... (a server); --history and TORCHSCALE_HISTORY come first "
        "(docs/history.md).",
    )
    tune: Optional[TuneSection] = Field(
        None, description="What `torchscale tune` searches (section; ignored by benchmark)."
    )
    validation: Optional[ValidateSection] = Field(
        None,
        description="How `torchscale validate --level 2|3` measures and judges (section; "
        "ignored by benchmark).",
    )

    def kind_section(self, key: str) -> Optional[BaseModel]:
        """A kind's section (``communication``); None when the config has none."""
        value = getattr(self, key, None)
        return value if isinstance(value, BaseModel) else None

    @model_validator(mode="after")
    def _something_to_run(self) -> BenchmarkConfig:
        core = BenchmarkConfig.model_fields
        sections = [key for key in type(self).model_fields if key not in core]
        if not self.models and all(self.kind_section(key) is None for key in sections):
            if not sections:
                raise ValueError("'models' is empty: list at least one model to benchmark")
            quoted = " or ".join(f"'{key}:'" for key in sections)
            keys = " or ".join(f"{key}:" for key in sections)
            raise ValueError(
                f"'models' is empty and there is no {quoted} section: list at least one "
                f"model to benchmark or add a {keys} section"
            )
        if self.nodes is not None and self.gpus_per_node is not None:
            raise ValueError("give 'nodes' or 'gpus_per_node', not both")
        return self


SWEEP_AXES = {"models": "model", "batch_sizes": "batch_size", "gpu_counts": "gpus"}
"""The seed's plural matrix keys and the cell field each one fills."""
