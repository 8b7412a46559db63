"""A real PostgreSQL server for the history's tests: initdb + pg_ctl from Debian's ``postgresql``
package into a temporary folder, run as an unprivileged user (the server refuses root), on
127.0.0.1 at a free port. Absent binaries skip the tests locally and fail them in CI."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest


@dataclass(frozen=True)
class Server:
    url: str  # postgresql://user@127.0.0.1:port/db


def _binaries() -> Optional[Path]:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _as_user(user: Optional[str], command: List[str]) -> List[str]:
    return ["runuser", "-u", user, "--", *command] if user else command


def postgres_server() -> Iterator[Server]:
    bindir = _binaries()
    if bindir is None:
        if os.environ.get("CI") == "true":
            pytest.fail("PostgreSQL binaries are missing in CI: .ci/run installs `postgresql`")
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql)")
    user = "postgres" if os.geteuid() == 0 else None
    # pytest's temporary folders are private to root: the server's user could not reach them
    tmp_root = Path(tempfile.mkdtemp(prefix="torchscale-pg-"))
    data = tmp_root / "pgdata"
    data.mkdir()
    if user:
        shutil.chown(tmp_root, user)
        shutil.chown(data, user)
    run: Dict[str, Any] = {"check": True, "capture_output": True, "timeout": 120}
    subprocess.run(
        _as_user(user, [str(bindir / "initdb"), "-D", str(data), "-U", "torchscale",
                        "-A", "trust", "--no-sync"]),
        **run,
    )  # fmt: skip
    port = _free_port()
    options = f"-h 127.0.0.1 -p {port} -k {data} -F -c fsync=off -c max_connections=30"
    subprocess.run(
        _as_user(user, [str(bindir / "pg_ctl"), "-D", str(data), "-o", options,
                        "-l", str(data / "server.log"), "-w", "start"]),
        **run,
    )  # fmt: skip
    try:
        subprocess.run(
            _as_user(user, [str(bindir / "createdb"), "-h", "127.0.0.1", "-p", str(port),
                            "-U", "torchscale", "history"]),
            **run,
        )  # fmt: skip
        yield Server(f"postgresql://torchscale@127.0.0.1:{port}/history")
    finally:
        subprocess.run(
            _as_user(user, [str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w",
                            "stop"]),
            capture_output=True, timeout=60, check=False,
        )  # fmt: skip
        shutil.rmtree(tmp_root, ignore_errors=True)
