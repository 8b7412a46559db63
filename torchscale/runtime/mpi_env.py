"""Ranks started by ``mpirun`` instead of torchrun: read who we are from the MPI launcher's
variables and set the ones torch's ``env://`` rendezvous reads (RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE). MASTER_ADDR and MASTER_PORT come from torchscale's launcher (``-x``).

No torch here: it runs before anything else in the worker.
"""

from __future__ import annotations

import os
from typing import Dict, MutableMapping, Optional, Sequence

MPI_VARIABLES: Dict[str, Sequence[str]] = {
    # torch's name: Open MPI, PMIx, MPICH/Hydra (PMI), Intel MPI / MVAPICH
    "RANK": ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "MV2_COMM_WORLD_RANK"),
    "WORLD_SIZE": ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE"),
    "LOCAL_RANK": ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK"),
    "LOCAL_WORLD_SIZE": (
        "OMPI_COMM_WORLD_LOCAL_SIZE",
        "MPI_LOCALNRANKS",
        "MV2_COMM_WORLD_LOCAL_SIZE",
    ),
}


def _first(environ: MutableMapping[str, str], names: Sequence[str]) -> Optional[str]:
    for name in names:
        value = environ.get(name, "").strip()
        if value.isdigit():
            return value
    return None


def adopt_mpi_environment(environ: Optional[MutableMapping[str, str]] = None) -> bool:
    """Fill RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE from MPI's variables when torchrun did
    not set them. Returns whether this process was started by MPI."""
    env = os.environ if environ is None else environ
    if "RANK" in env and "WORLD_SIZE" in env:
        return False  # torchrun (or the user) said it already
    found = {name: _first(env, sources) for name, sources in MPI_VARIABLES.items()}
    if found["RANK"] is None or found["WORLD_SIZE"] is None:
        return False
    env["RANK"] = found["RANK"]
    env["WORLD_SIZE"] = found["WORLD_SIZE"]
    env["LOCAL_RANK"] = found["LOCAL_RANK"] or "0"
    env["LOCAL_WORLD_SIZE"] = found["LOCAL_WORLD_SIZE"] or "1"
    return True
