"""The ``communication:`` section of a benchmark config, and what one communication cell runs.

Like nccl-tests: ``collectives`` over message sizes ``min_bytes`` .. ``max_bytes`` growing by
``factor`` (``-b -e -f``), ``warmup`` then ``iterations`` per size (``-w -n``), correctness checked
(``-c``), plus send/recv between every ordered pair of ranks (``p2p``) and the seed's DDLB
tensor-parallel GEMM (``tp_gemm:``). One cell (one torchrun launch) per GPU count runs all of it.

No torch here: config errors must be reported without importing it.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, List, Literal, Optional

from annotated_types import Len
from pydantic import (
    BeforeValidator,
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationInfo,
    field_validator,
    model_validator,
)
from typing_extensions import Annotated

from torchscale.comm.busbw import COLLECTIVES, size_sweep
from torchscale.comm.ddlb_layout import DDLB_LAYOUT
from torchscale.comm.scopes import SCOPES, distinct_scopes
from torchscale.config.base import StrictModel, as_list
from torchscale.config.kind_sections import ConfigSection
from torchscale.config.settings import Backend, BenchmarkConfig
from torchscale.config.sizes import parse_size
from torchscale.hardware.links import parse_link
from torchscale.plan.kind_base import LaunchSettings

Collective = Literal["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"]
assert set(Collective.__args__) == set(COLLECTIVES)  # type: ignore[attr-defined]
Scope = Literal["world", "intra_node", "inter_node"]
assert set(Scope.__args__) == set(SCOPES)  # type: ignore[attr-defined]

ELEMENT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int32": 4, "int64": 8}
DTYPE_ALIASES = {
    "float": "float32",
    "fp32": "float32",
    "half": "float16",
    "fp16": "float16",
    "bf16": "bfloat16",
    "double": "float64",
    "fp64": "float64",
    "int": "int32",
}
GEMM_DTYPES = ("float32", "float16", "bfloat16", "float64")


def _dtype_alias(value: Any) -> Any:
    return DTYPE_ALIASES.get(value, value) if isinstance(value, str) else value


def _size(value: object) -> object:
    return parse_size(value) if isinstance(value, (int, float, str)) else value


CommDtype = Annotated[
    Literal["float32", "float16", "bfloat16", "float64", "int32", "int64"],
    BeforeValidator(_dtype_alias),
]
GemmDtype = Annotated[
    Literal["float32", "float16", "bfloat16", "float64"], BeforeValidator(_dtype_alias)
]
GemmOrder = Literal["AG_before", "AG_after"]
ComputeOnlySize = Literal["unsharded", "sharded"]
ByteSize = Annotated[PositiveInt, BeforeValidator(_size)]


def _default(*values: object) -> Callable[[], List[Any]]:
    return lambda: list(values)


# A value or a list of values (a scalar is a list of one), spelled out per item type so that
# the type checker sees each alias as a type.
PositiveInts = Annotated[List[PositiveInt], BeforeValidator(as_list), Len(min_length=1)]
GemmDtypes = Annotated[List[GemmDtype], BeforeValidator(as_list), Len(min_length=1)]
GemmOrders = Annotated[List[GemmOrder], BeforeValidator(as_list), Len(min_length=1)]
ComputeOnlySizes = Annotated[List[ComputeOnlySize], BeforeValidator(as_list), Len(min_length=0)]
Collectives = Annotated[List[Collective], BeforeValidator(as_list), Len(min_length=0)]
CommDtypes = Annotated[List[CommDtype], BeforeValidator(as_list), Len(min_length=1)]
Scopes = Annotated[List[Scope], BeforeValidator(as_list), Len(min_length=1)]


class TpGemmCase(StrictModel):
    """One tensor-parallel GEMM: C[m, n] = A[m, k] @ B[k, n], A sharded by rows."""

    m: PositiveInt
    n: PositiveInt
    k: PositiveInt
    dtype: GemmDtype
    order: GemmOrder


class TpGemmSection(StrictModel):
    """``communication.tp_gemm:`` every combination of the lists is one case (DDLB's
    TPColumnwise primitive)."""

    m: PositiveInts = Field(
        default_factory=_default(8192),
        description="Rows of A and C, sharded across the ranks (a multiple of every GPU count).",
    )
    n: PositiveInts = Field(default_factory=_default(1024), description="Columns of B and C.")
    k: PositiveInts = Field(default_factory=_default(1024), description="Columns of A, rows of B.")
    dtype: GemmDtypes = Field(
        default_factory=_default("bfloat16"), description="Element type of A, B and C."
    )
    orders: GemmOrders = Field(
        default_factory=_default("AG_before", "AG_after"),
        description="AG_before: all-gather A, then the full GEMM; "
        "AG_after: GEMM on the shard, then all-gather C.",
    )
    compute_only: ComputeOnlySizes = Field(
        default_factory=_default("unsharded"),
        description="Compute-only references timed beside each case (DDLB's compute_only "
        "sizes): unsharded (the whole GEMM on one device: reference_time_us), sharded (the GEMM "
        "each rank does alone on its m / ranks rows: sharded_time_us); [] for none.",
    )

    def cases(self) -> List[TpGemmCase]:
        return [
            TpGemmCase(m=m, n=n, k=k, dtype=dtype, order=order)
            for m, n, k, dtype, order in itertools.product(
                self.m, self.n, self.k, self.dtype, self.orders
            )
        ]


class CommunicationSection(StrictModel):
    """``communication:`` in the benchmark YAML."""

    collectives: Collectives = Field(
        default_factory=_default(*COLLECTIVES), description="Collectives to sweep ([] for none)."
    )
    scope: Scopes = Field(
        default_factory=_default("world"),
        description="Which ranks the collectives run over: world (all), intra_node (each node's "
        "ranks, all nodes at once), inter_node (one rank per node: the network alone). "
        "Multi-node cells only for the last two.",
    )
    p2p: bool = Field(True, description="Send/recv between every ordered pair of ranks.")
    min_bytes: ByteSize = Field(1024, description="Smallest message, e.g. 8, 1K, 64M (nccl -b).")
    max_bytes: ByteSize = Field(64 * 1024**2, description="Largest message, e.g. 1G (nccl -e).")
    factor: int = Field(2, ge=2, description="Each size is the previous times this (nccl -f).")
    dtype: CommDtypes = Field(
        default_factory=_default("float32"), description="Element types (each one is swept)."
    )
    warmup: NonNegativeInt = Field(5, description="Untimed ops before each size (nccl -w).")
    iterations: PositiveInt = Field(20, description="Timed ops per size, averaged (nccl -n).")
    check: bool = Field(True, description="Check every result and count wrong elements (nccl -c).")
    after_compute: bool = Field(
        False,
        description="Also time each collective issued right after 10 ms of compute that rewrites "
        "its buffer, as DDP issues a gradient bucket; torchscale project fits to these times.",
    )
    through_ddp: bool = Field(
        False,
        description="Also time all_reduce through DDP's own reducer: one gradient bucket of each "
        "size, all-reduced as a ~10 ms backward pass ends; torchscale project fits to these "
        "times first (they include what DDP's hook and finalisation cost).",
    )
    link: Optional[str] = Field(
        None,
        description="The GPUs' link, to report busbw as a fraction of its peak: nvlink4x18 "
        "(NVLink 4, 18 links; nvlink4 alone takes the generation's usual count) or pcie4x16.",
    )
    tp_gemm: Optional[TpGemmSection] = Field(
        None, description="Tensor-parallel GEMM cases (section; absent: none)."
    )
    cell_timeout_s: PositiveFloat = Field(
        1800.0, description="Kill a communication cell after this many seconds."
    )
    backend: Annotated[List[Backend], BeforeValidator(as_list), Len(min_length=1)] = Field(
        default_factory=_default("auto"),
        description="Process-group backends, one cell each: auto (nccl on GPUs, gloo on CPU), "
        "nccl, gloo, ucc, ucc/tl/nccl, ucc/tl/cuda, ucc/tl/ucp (UCC with that transport "
        "layer), mpi. One this torch or node lacks makes its cell skipped.",
    )

    @field_validator("link")
    @classmethod
    def _known_link(cls, value: Optional[str]) -> Optional[str]:
        return None if value is None else str(parse_link(value))

    @field_validator("max_bytes")
    @classmethod
    def _not_below_min(cls, value: int, info: ValidationInfo) -> int:
        smallest = info.data.get("min_bytes")
        if smallest is not None and value < smallest:
            raise ValueError(
                f"{value} B is smaller than min_bytes ({smallest} B): raise max_bytes or lower "
                "min_bytes"
            )
        return value

    @model_validator(mode="after")
    def _something_to_run(self) -> CommunicationSection:
        if not self.collectives and not self.p2p and self.tp_gemm is None:
            raise ValueError(
                "nothing to run: list collectives, set p2p: true or add a tp_gemm: section"
            )
        return self

    def sizes(self) -> List[int]:
        return size_sweep(self.min_bytes, self.max_bytes, self.factor)


SECTION = ConfigSection(
    "communication",
    CommunicationSection,
    "Collective, P2P and tensor-parallel GEMM benchmarks (section).",
    notes={
        "": "not swept: one launch per GPU count; see docs/communication.md",
        "tp_gemm": "lists expand to every combination",
    },
    layouts=(DDLB_LAYOUT,),
)
"""The ``communication:`` section, registered by the kind (``comm.kind``)."""


def comm_section(config: BenchmarkConfig) -> Optional[CommunicationSection]:
    """The config's ``communication:`` section, or None."""
    section = config.kind_section(SECTION.key)
    assert section is None or isinstance(section, CommunicationSection), type(section)
    return section


class CommCellSettings(LaunchSettings):
    """Everything one communication cell (one torchrun launch) runs with: the worker's input."""

    collectives: List[Collective]
    scopes: List[Scope] = Field(
        default_factory=_default("world"), description="The scopes this cell's nodes split into."
    )
    p2p: bool
    sizes: List[PositiveInt] = Field(description="Requested message sizes in bytes.")
    dtypes: List[CommDtype]
    warmup: NonNegativeInt
    iterations: PositiveInt
    check: bool
    after_compute: bool = False
    through_ddp: bool = False
    link: Optional[str] = None
    tp_gemm: List[TpGemmCase] = Field(default_factory=list)
    compute_only: List[ComputeOnlySize] = Field(default_factory=_default("unsharded"))
    backend: Backend = "auto"

    @classmethod
    def from_section(
        cls,
        section: CommunicationSection,
        gpus: int,
        nnodes: int,
        repeat: int,
        backend: Backend = "auto",
    ) -> CommCellSettings:
        return cls(
            collectives=section.collectives,
            scopes=distinct_scopes(section.scope, nnodes, gpus // nnodes),
            p2p=section.p2p,
            sizes=section.sizes(),
            dtypes=section.dtype,
            warmup=section.warmup,
            iterations=section.iterations,
            check=section.check,
            after_compute=section.after_compute,
            through_ddp=section.through_ddp,
            link=section.link,
            tp_gemm=section.tp_gemm.cases() if section.tp_gemm else [],
            compute_only=section.tp_gemm.compute_only if section.tp_gemm else ["unsharded"],
            cell_timeout_s=section.cell_timeout_s,
            gpus=gpus,
            nnodes=nnodes,
            repeat=repeat,
            backend=backend,
        )
