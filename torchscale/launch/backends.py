"""The ``backend:`` knob: which process-group backend a cell uses, and whether this torch (and
this node, and this launcher) can run it at all.

A backend the installed torch lacks makes the cell ``skipped`` with the reason, decided here before
any launch (seed 002: "remove backends that are not supported"; torchscale does it for the user).
"""

from __future__ import annotations

from typing import Optional

BACKENDS = ("auto", "nccl", "gloo", "ucc", "mpi")
"""``auto``: NCCL on GPUs, gloo on CPU processes."""

_HOW_TO_GET = {
    "nccl": "it needs CUDA GPUs and a torch built with NCCL (the CUDA wheels)",
    "ucc": "install a torch built with UCC (USE_UCC=1, e.g. NVIDIA's PyTorch containers)",
    "mpi": "build torch from source against an MPI library (USE_MPI=1)",
    "gloo": "install a torch built with gloo",
}


def resolve_backend(backend: str, cuda: bool) -> str:
    """The backend a rank initialises: ``auto`` -> nccl on a GPU, gloo on a CPU process."""
    if backend == "auto":
        return "nccl" if cuda else "gloo"
    return backend


def available(backend: str) -> bool:
    """Whether this torch was built with ``backend`` (``torch.distributed.is_<name>_available``)."""
    import torch.distributed as dist

    check = getattr(dist, f"is_{backend}_available", None)
    return bool(check and check())


def backend_skip_reason(backend: str, device_kind: str, launcher: str) -> Optional[str]:
    """Why a cell with ``backend`` cannot run here, or None.

    ``device_kind`` is ``cuda`` or ``cpu`` (the node's devices); ``launcher`` torchrun, slurm or
    mpirun.
    """
    if backend == "auto":
        return None
    if not available(backend):
        return f"backend {backend} is not available in this torch; {_HOW_TO_GET[backend]}"
    if backend == "nccl" and device_kind != "cuda":
        return "backend nccl needs CUDA GPUs; this node has none (use gloo or auto)"
    if backend == "mpi" and launcher != "mpirun":
        return "backend mpi needs the ranks started by MPI: run with --launcher mpirun"
    return None
