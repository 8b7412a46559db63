"""Node checks outside the GPU: /dev/shm, open files, hostname, rendezvous and NCCL environment,
free disk in the output directory."""

from __future__ import annotations

import errno
import ipaddress
import os
import resource
import shutil
import socket
import time
from pathlib import Path
from typing import Dict, List, Mapping, NamedTuple, Optional, Sequence, Set, Tuple

import psutil

from torchscale.validate.result import CheckResult, Status, fail, gib, join, passed, warn, worst

SHM_MIN_BYTES = (
    1 << 30
)  # Docker's 64 MiB default breaks DataLoader workers and NCCL's SHM transport
NOFILE_MIN = 4096
DISK_WARN_BYTES = 10 << 30  # traces are hundreds of MB per cell
DISK_FAIL_BYTES = 1 << 30


def human(n_bytes: float) -> str:
    return gib(n_bytes) if n_bytes >= 1 << 30 else f"{n_bytes / 2**20:.0f} MiB"


def check_shm(path: str = "/dev/shm") -> CheckResult:
    name = "/dev/shm"
    try:
        st = os.statvfs(path)
    except OSError as exc:
        return fail(
            name,
            f"missing ({exc.strerror})",
            "Mount a tmpfs at /dev/shm; in Docker use `--shm-size=16g` or `--ipc=host`.",
        )
    total, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    shown = f"{human(total)} ({human(free)} free)"
    if total < SHM_MIN_BYTES:
        return warn(
            name,
            shown,
            "Too small for DataLoader workers and NCCL's shared-memory transport: run the "
            "container with `docker run --shm-size=16g` or `--ipc=host` (Kubernetes: an emptyDir "
            "with `medium: Memory` mounted at /dev/shm).",
            total_bytes=total,
            free_bytes=free,
        )
    return passed(name, shown, total_bytes=total, free_bytes=free)


def check_open_files(limits: Optional[Tuple[int, int]] = None) -> CheckResult:
    name = "Open files limit"
    soft, hard = limits or resource.getrlimit(resource.RLIMIT_NOFILE)
    shown_hard = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
    shown = f"{soft} (hard {shown_hard})"
    if soft < NOFILE_MIN:
        if hard == resource.RLIM_INFINITY or hard >= 65536:
            fix = "Raise it in the job script: `ulimit -n 65536`."
        else:
            fix = (
                "Raise the hard limit: `* hard nofile 65536` and `* soft nofile 65536` in "
                "/etc/security/limits.conf (Docker: `--ulimit nofile=65536:65536`)."
            )
        return warn(name, shown + f": below {NOFILE_MIN}, DataLoader workers run out", fix)
    return passed(name, shown)


def _resolve(host: str) -> List[str]:
    return sorted({str(info[4][0]) for info in socket.getaddrinfo(host, None)})


def check_hostname(env: Mapping[str, str] = os.environ) -> CheckResult:
    name = "Hostname resolution"
    host = socket.gethostname()
    try:
        addresses = _resolve(host)
    except OSError as exc:
        return fail(
            name,
            f"{host}: does not resolve ({exc})",
            "Add the hostname to /etc/hosts or DNS: torchrun's rendezvous and gloo resolve it.",
        )
    shown = f"{host} -> {', '.join(addresses)}"
    loopback = all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses)
    if loopback and not env.get("GLOO_SOCKET_IFNAME"):
        return warn(
            name,
            shown + " (loopback only: fine on one node)",
            "For multi-node runs map the hostname to the node's routable address in /etc/hosts "
            "or DNS, or set GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME to the cluster interface.",
        )
    return passed(name, shown)


def _port_taken(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("", port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def check_master_env(env: Mapping[str, str] = os.environ) -> CheckResult:
    name = "MASTER_ADDR/MASTER_PORT"
    addr, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
    if not addr and not port:
        return passed(name, "unset (torchrun --standalone picks a free local port)")
    shown = f"MASTER_ADDR={addr or '(unset)'} MASTER_PORT={port or '(unset)'}"
    if port and not (port.isdigit() and 0 < int(port) < 65536):
        return fail(name, shown, "MASTER_PORT must be a TCP port number (1-65535), e.g. 29500.")
    if addr:
        try:
            resolved = _resolve(addr)
        except OSError:
            return fail(
                name,
                shown + ": address does not resolve",
                "Set MASTER_ADDR to the rank-0 node's hostname or IP, resolvable from every node.",
            )
        local = {a.address for addrs in psutil.net_if_addrs().values() for a in addrs}
        if port and set(resolved) & (local | {"127.0.0.1", "::1"}) and _port_taken(int(port)):
            return warn(
                name,
                shown + ": port already in use on this node",
                "Pick a free MASTER_PORT (or stop the process holding it: `ss -ltnp`).",
            )
    if not (addr and port):
        return warn(
            name,
            shown,
            "Set both MASTER_ADDR and MASTER_PORT, or neither (torchrun --standalone).",
        )
    return passed(name, shown)


class EnvRule(NamedTuple):
    """An environment variable worth knowing about when it has one of ``values`` (``*``: any)."""

    var: str
    values: Tuple[str, ...]
    status: Status
    why: str
    fix: str = ""


BLOCKING_FIX = "Unset it; use TORCH_NCCL_ASYNC_ERROR_HANDLING=1 for error detection."
ENV_RULES: Tuple[EnvRule, ...] = (
    EnvRule(
        "NCCL_P2P_DISABLE",
        ("1",),
        Status.WARN,
        "no NVLink/PCIe peer-to-peer: all-reduce goes through host memory",
        "Unset NCCL_P2P_DISABLE unless you are debugging a P2P hang.",
    ),
    EnvRule(
        "NCCL_SHM_DISABLE",
        ("1",),
        Status.WARN,
        "no shared-memory transport",
        "Unset NCCL_SHM_DISABLE (give the container a larger /dev/shm instead).",
    ),
    EnvRule(
        "NCCL_IB_DISABLE",
        ("1",),
        Status.WARN,
        "multi-node traffic over TCP sockets, not InfiniBand",
        "Unset NCCL_IB_DISABLE on InfiniBand/RoCE clusters.",
    ),
    EnvRule(
        "NCCL_DEBUG",
        ("TRACE",),
        Status.WARN,
        "trace logging slows collectives",
        "Use NCCL_DEBUG=INFO or WARN for benchmarks.",
    ),
    EnvRule("NCCL_BLOCKING_WAIT", ("1",), Status.WARN, "collectives block the CPU", BLOCKING_FIX),
    EnvRule(
        "TORCH_NCCL_BLOCKING_WAIT", ("1",), Status.WARN, "collectives block the CPU", BLOCKING_FIX
    ),
    EnvRule(
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        ("0",),
        Status.WARN,
        "a hung collective never aborts",
        "Unset it (PyTorch's default aborts hung collectives after the timeout).",
    ),
    EnvRule(
        "CUDA_LAUNCH_BLOCKING",
        ("1",),
        Status.WARN,
        "every kernel launch is synchronous",
        "Unset CUDA_LAUNCH_BLOCKING outside debugging.",
    ),
    EnvRule(
        "TORCH_DISTRIBUTED_DEBUG",
        ("DETAIL",),
        Status.WARN,
        "extra consistency checks on every collective",
        "Unset it (or use INFO) for benchmarks.",
    ),
    EnvRule("NCCL_ALGO", ("*",), Status.PASS, "forces NCCL's algorithm"),
    EnvRule("NCCL_PROTO", ("*",), Status.PASS, "forces NCCL's protocol"),
)
INTERFACE_VARS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


def _interface_matches(spec: str, interfaces: Sequence[str]) -> bool:
    """NCCL's syntax: comma-separated prefixes, ``=`` for exact names, ``^`` to exclude."""
    if spec.startswith("^"):
        return True
    exact = spec.startswith("=")
    names = [s.strip() for s in spec.lstrip("=").split(",") if s.strip()]
    if exact:
        return any(n in interfaces for n in names)
    return any(i.startswith(n) for n in names for i in interfaces)


def check_nccl_env(
    env: Mapping[str, str] = os.environ, interfaces: Optional[Sequence[str]] = None
) -> CheckResult:
    """NCCL_*/TORCH_NCCL_* (and a few CUDA/gloo) variables that change speed or hang behaviour."""
    name = "NCCL environment"
    seen = {k: v for k, v in sorted(env.items()) if k.startswith(("NCCL_", "TORCH_NCCL_"))}
    flagged: Dict[str, str] = {}
    fixes: List[str] = []
    statuses: List[Status] = [Status.PASS]
    for rule in ENV_RULES:
        value = env.get(rule.var)
        if value is None or ("*" not in rule.values and value.upper() not in rule.values):
            continue
        flagged[rule.var] = f"{rule.var}={value} ({rule.why})"
        statuses.append(rule.status)
        if rule.fix and rule.fix not in fixes:
            fixes.append(rule.fix)
    names = interfaces if interfaces is not None else list(psutil.net_if_addrs())
    for var in INTERFACE_VARS:
        spec = env.get(var)
        if spec and not _interface_matches(spec, names):
            flagged[var] = f"{var}={spec} matches no interface (have {', '.join(sorted(names))})"
            statuses.append(Status.FAIL)
            fixes.append(f"Set {var} to an existing interface (see `ip -br addr`).")
    others = ", ".join(f"{k}={v}" for k, v in seen.items() if k not in flagged)
    value = join([*flagged.values(), others]) or "no NCCL_*/TORCH_NCCL_* variables set"
    return CheckResult(name, worst(statuses), value, " ".join(fixes) or None, dict(seen))


def check_disk(output_dir: Path) -> CheckResult:
    name = "Disk space (output dir)"
    target = output_dir.resolve()
    existing = next(p for p in [target, *target.parents] if p.exists())
    usage = shutil.disk_usage(existing)
    shown = f"{human(usage.free)} free of {human(usage.total)} at {existing}"
    if not os.access(existing, os.W_OK):
        return fail(
            name,
            f"{existing} is not writable",
            "Choose a writable --output-dir (or fix the directory's permissions).",
        )
    if usage.free < DISK_FAIL_BYTES:
        return fail(name, shown, "Free space or choose an --output-dir on a larger filesystem.")
    if usage.free < DISK_WARN_BYTES:
        return warn(
            name,
            shown,
            "Traces take hundreds of MB per cell: free space or use a larger --output-dir.",
        )
    return passed(name, shown, free_bytes=usage.free)


LOAD_SAMPLE_S = 1.0  # long enough to see a busy process, short next to the smoke test
TOP_CONSUMERS = 3  # named on the row; the details keep a few more
KEPT_CONSUMERS = 8


class Consumer(NamedTuple):
    pid: int
    name: str
    cores: float  # CPU time over the sample, in cores


def _cpu_seconds(proc: psutil.Process) -> Optional[float]:
    try:
        times = proc.cpu_times()
    except (psutil.Error, OSError):
        return None
    return float(times.user + times.system)


def _own_tree() -> Set[int]:
    """This process and its descendants (the smoke test's torchrun and its ranks)."""
    me = psutil.Process()
    try:
        return {me.pid, *(child.pid for child in me.children(recursive=True))}
    except psutil.Error:
        return {me.pid}


def other_processes(sample_s: float = LOAD_SAMPLE_S) -> Tuple[float, List[Consumer]]:
    """Cores kept busy by processes other than this one and its children over ``sample_s``,
    and those processes by CPU time, largest first."""
    before = {p.pid: (p, _cpu_seconds(p)) for p in psutil.process_iter(["name"])}
    time.sleep(sample_s)
    own = _own_tree()
    consumers: List[Consumer] = []
    for pid, (proc, start) in before.items():
        if pid in own or start is None:
            continue
        end = _cpu_seconds(proc)
        if end is None or end <= start:
            continue
        name = str(proc.info.get("name") or "?")
        consumers.append(Consumer(pid, name, (end - start) / sample_s))
    consumers.sort(key=lambda c: c.cores, reverse=True)
    return sum(c.cores for c in consumers), consumers


def check_host_load(
    busy_share: float, sample: Optional[Tuple[float, List[Consumer]]] = None
) -> CheckResult:
    """The node's load, and the processes other than torchscale's holding its cores: WARN when
    they keep more than ``busy_share`` of the cores busy (what a benchmark would then measure is
    a busy host, whose figures compare and tune do not judge)."""
    name = "Host load"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = cores or 1
    load1, load5, _ = os.getloadavg()
    others, consumers = sample if sample is not None else other_processes()
    top = consumers[:TOP_CONSUMERS]
    named = ", ".join(f"{c.name} (pid {c.pid}) {c.cores:.2f}" for c in top)
    shown = (
        f"load average {load1:.2f} (5 min {load5:.2f}) on {cores} cores; other processes "
        f"kept {others:.2f} cores busy ({others / cores:.0%})" + (f": {named}" if named else "")
    )
    details = {
        "load_average": [load1, load5],
        "cores": cores,
        "other_processes_cores": others,
        "top_consumers": [c._asdict() for c in consumers[:KEPT_CONSUMERS]],
    }
    if others > busy_share * cores:
        return warn(
            name,
            shown,
            f"Other processes hold more than {busy_share:.0%} of the cores: a benchmark here "
            "measures them as much as the job (its cells are marked 'busy host' and not "
            "judged). Run on a quiet node, or stop them (`top`).",
            **details,
        )
    return passed(name, shown, **details)
