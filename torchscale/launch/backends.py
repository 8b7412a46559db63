"""The ``backend:`` knob: which process-group backend a cell uses, and whether this torch (and
this node, and this launcher) can run it at all.

A backend the installed torch lacks makes the cell ``skipped`` with the reason, decided here before
any launch (DDLB: "remove backends that are not supported"; torchscale does it for the user).

``ucc/tl/<tl>`` (DDLB's names: ``ucc/tl/nccl``, ``ucc/tl/cuda``, ``ucc/tl/ucp``) is the UCC
backend with its transport layer chosen: each rank of the cell sets ``UCC_CL_BASIC_TLS=<tl>`` (the
layer UCC's basic collective layer uses, as DDLB sets it) and ``UCC_TLS=<tl>,ucp`` (the layers UCC
loads: the chosen one, and UCP for UCC's own service collectives) before it joins the group.
"""

from __future__ import annotations

from typing import Dict, Optional, get_args

from torchscale.config.settings import Backend

BACKENDS = get_args(Backend)
"""``auto``: NCCL on GPUs, gloo on CPU processes."""
UCC_TL_PREFIX = "ucc/tl/"
CUDA_ONLY_TLS = ("nccl", "cuda")
"""UCC transport layers that move GPU memory only."""

_HOW_TO_GET = {
    "nccl": "it needs CUDA GPUs and a torch built with NCCL (the CUDA wheels)",
    "ucc": "install a torch built with UCC (USE_UCC=1, e.g. NVIDIA's PyTorch containers)",
    "mpi": "build torch from source against an MPI library (USE_MPI=1)",
    "gloo": "install a torch built with gloo",
}


def ucc_transport(backend: str) -> Optional[str]:
    """The UCC transport layer ``ucc/tl/<tl>`` names (``nccl``), else None."""
    return backend[len(UCC_TL_PREFIX) :] if backend.startswith(UCC_TL_PREFIX) else None


def resolve_backend(backend: str, cuda: bool) -> str:
    """The backend a rank runs, as records name it: ``auto`` -> nccl on a GPU, gloo on a CPU
    process; any other name as given (``ucc/tl/nccl``)."""
    if backend == "auto":
        return "nccl" if cuda else "gloo"
    return backend


def process_group_backend(backend: str) -> str:
    """What ``torch.distributed.init_process_group`` is given: ``ucc`` for ``ucc/tl/<tl>``."""
    return "ucc" if ucc_transport(backend) else backend


def backend_env(backend: str) -> Dict[str, str]:
    """The environment a rank sets before joining the group (UCC's transport selection)."""
    layer = ucc_transport(backend)
    if layer is None:
        return {}
    loaded = layer if layer == "ucp" else f"{layer},ucp"
    return {"UCC_CL_BASIC_TLS": layer, "UCC_TLS": loaded}


def available(backend: str) -> bool:
    """Whether this torch was built with ``backend`` (``torch.distributed.is_<name>_available``)."""
    import torch.distributed as dist

    check = getattr(dist, f"is_{process_group_backend(backend)}_available", None)
    return bool(check and check())


def backend_skip_reason(backend: str, device_kind: str, launcher: str) -> Optional[str]:
    """Why a cell with ``backend`` cannot run here, or None.

    ``device_kind`` is ``cuda`` or ``cpu`` (the node's devices); ``launcher`` torchrun, slurm or
    mpirun.
    """
    if backend == "auto":
        return None
    base = process_group_backend(backend)
    if not available(backend):
        return f"backend {backend} is not available in this torch; {_HOW_TO_GET[base]}"
    if backend == "nccl" and device_kind != "cuda":
        return "backend nccl needs CUDA GPUs; this node has none (use gloo or auto)"
    if ucc_transport(backend) in CUDA_ONLY_TLS and device_kind != "cuda":
        return (
            f"backend {backend} moves GPU memory only; this node has no CUDA GPUs (use "
            "ucc/tl/ucp, gloo or auto)"
        )
    if backend == "mpi" and launcher != "mpirun":
        return "backend mpi needs the ranks started by MPI: run with --launcher mpirun"
    return None
