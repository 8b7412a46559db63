"""Build Nsight Systems SQLite exports (one per rank) for tests and benchmarks.

The tables follow the published ``nsys export --type sqlite`` schema (Nsight Systems 2026.4,
export schema 3.28.1: column names, order and types as documented, for the tables created here).
The timeline is that of a DDP step: an NVTX ``step N`` range with ``forward`` / ``backward`` /
``optimizer`` ranges inside (registered strings, as torch's NVTX ranges are), a host-to-device
copy, compute kernels on stream 7, ``ncclDevKernel_AllReduce_*`` buckets on stream 20 overlapping
the backward pass, a memset, and one CUDA runtime call per GPU activity (joined by correlationId).

Ranks share one clock: each file's timestamps count from its own session start, stored in
TARGET_INFO_SESSION_START_TIME, as nsys does. One rank can be made late: its backward pass takes
``late_us`` longer, so in every all-reduce the other ranks wait for it.

A whole node in one export (``nsys profile torchrun ...``: every rank's process, one clock) comes
from :func:`write_node`, in the column sets of two export versions; tests generate those files
on the fly (they are small and fast to build).

Run ``python tests/data/make_nsys_fixture.py`` to rewrite ``tests/data/nsys_2rank/``.
"""

from __future__ import annotations

import random
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

SCHEMA = """
CREATE TABLE StringIds (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE META_DATA_EXPORT (name TEXT NOT NULL, value TEXT);
CREATE TABLE TARGET_INFO_SESSION_START_TIME (utcEpochNs INTEGER, utcTime TEXT, localTime TEXT,
    systemClockNs INTEGER, sessionStartCntVctNs INTEGER);
CREATE TABLE TARGET_INFO_GPU (vmId INTEGER NOT NULL, id INTEGER NOT NULL, name TEXT,
    busLocation TEXT, isDiscrete INTEGER, l2CacheSize INTEGER, totalMemory INTEGER,
    memoryBandwidth INTEGER, clockRate INTEGER, smCount INTEGER, pwGpuId INTEGER, uuid TEXT,
    luid INTEGER, chipName TEXT, cuDevice INTEGER, ctxswDevPath TEXT, ctrlDevPath TEXT,
    revision INTEGER, nodeMask INTEGER, constantMemory INTEGER, maxIPC INTEGER,
    maxRegistersPerBlock INTEGER, maxShmemPerBlock INTEGER, maxShmemPerBlockOptin INTEGER,
    maxShmemPerSm INTEGER, maxRegistersPerSm INTEGER, threadsPerWarp INTEGER,
    asyncEngines INTEGER, maxWarpsPerSm INTEGER, maxBlocksPerSm INTEGER,
    maxThreadsPerBlock INTEGER, maxBlockDimX INTEGER, maxBlockDimY INTEGER, maxBlockDimZ INTEGER,
    maxGridDimX INTEGER, maxGridDimY INTEGER, maxGridDimZ INTEGER, computeMajor INTEGER,
    computeMinor INTEGER, smMajor INTEGER, smMinor INTEGER, numaNodeId INTEGER);
CREATE TABLE ENUM_NSYS_EVENT_TYPE (id INTEGER NOT NULL PRIMARY KEY, name TEXT, label TEXT);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INTEGER NOT NULL, end INTEGER NOT NULL,
    deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, greenContextId INTEGER,
    streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER, bytes INTEGER NOT NULL,
    copyKind INTEGER NOT NULL, deprecatedSrcId INTEGER, srcKind INTEGER, dstKind INTEGER,
    srcDeviceId INTEGER, srcContextId INTEGER, dstDeviceId INTEGER, dstContextId INTEGER,
    migrationCause INTEGER, graphNodeId INTEGER, virtualAddress INTEGER, copyCount INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMSET (start INTEGER NOT NULL, end INTEGER NOT NULL,
    deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, greenContextId INTEGER,
    streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER, value INTEGER NOT NULL,
    bytes INTEGER NOT NULL, graphNodeId INTEGER, memKind INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL,
    deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, greenContextId INTEGER,
    streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER,
    demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL, mangledName INTEGER,
    launchType INTEGER, cacheConfig INTEGER, registersPerThread INTEGER NOT NULL,
    gridX INTEGER NOT NULL, gridY INTEGER NOT NULL, gridZ INTEGER NOT NULL,
    blockX INTEGER NOT NULL, blockY INTEGER NOT NULL, blockZ INTEGER NOT NULL,
    staticSharedMemory INTEGER NOT NULL, dynamicSharedMemory INTEGER NOT NULL,
    localMemoryPerThread INTEGER NOT NULL, localMemoryTotal INTEGER NOT NULL,
    gridId INTEGER NOT NULL, sharedMemoryExecuted INTEGER, graphNodeId INTEGER,
    sharedMemoryLimitConfig INTEGER, qmdBulkReleaseDone INTEGER, qmdPreexitDone INTEGER,
    qmdLastCtaDone INTEGER, graphId INTEGER, clusterX INTEGER, clusterY INTEGER,
    clusterZ INTEGER, clusterSchedulingPolicy INTEGER, maxPotentialClusterSize INTEGER,
    maxActiveClusters INTEGER, sharedMemoryRequestedPercentage INTEGER,
    tensorSizeMinusOneElements TEXT NOT NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, end INTEGER NOT NULL,
    eventClass INTEGER NOT NULL, globalTid INTEGER, correlationId INTEGER,
    nameId INTEGER NOT NULL, returnValue INTEGER NOT NULL, callchainId INTEGER);
CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL,
    rangeId INTEGER, category INTEGER, color INTEGER, text TEXT, globalTid INTEGER,
    endGlobalTid INTEGER, textId INTEGER, domainId INTEGER, uint64Value INTEGER,
    int64Value INTEGER, doubleValue REAL, uint32Value INTEGER, int32Value INTEGER,
    floatValue REAL, jsonTextId INTEGER, jsonText TEXT, binaryData TEXT,
    eventId INTEGER NOT NULL PRIMARY KEY);
"""
EVENT_TYPES = [
    (33, "NvtxCategory", "NVTX Category"),
    (34, "NvtxMark", "NVTX Mark"),
    (39, "NvtxThread", "NVTX Thread"),
    (59, "NvtxPushPopRange", "NVTX PushPop Range"),
    (60, "NvtxStartEndRange", "NVTX StartEnd Range"),
    (75, "NvtxDomainCreate", "NVTX Domain Create"),
]
COMPUTE_KERNELS = [
    ("ampere_sgemm_128x64_tn", "ampere_sgemm_128x64_tn"),
    (
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
        "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, "
        "at::detail::Array<char*, 3>)",
        "vectorized_elementwise_kernel",
    ),
    (
        "void cudnn::bn_bw_1C11_kernel_new<float, float, float2, 32, true, 1>(float, float, float, "
        "float, cudnnTensorStruct, float const*, cudnnTensorStruct, float const*, cudnnTensorStruct, "
        "float*, float const*, float*, float*, float const*, float const*, float)",
        "bn_bw_1C11_kernel_new",
    ),
]
ALLREDUCE = (
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
)
BROADCAST = (
    "ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
    "ncclKernel_Broadcast_RING_LL_Sum_int8_t",
)
API = {
    "launch": "cudaLaunchKernel_v7000",
    "memcpy": "cudaMemcpyAsync_v3020",
    "memset": "cudaMemsetAsync_v3020",
}
PHASES = ("forward", "backward", "optimizer")
EPOCH_NS = 1_763_000_000_000_000_000
PID = 41_000
COMPUTE_STREAM, COMM_STREAM = 7, 20


class _Strings:
    def __init__(self) -> None:
        self.ids: Dict[str, int] = {}

    def __call__(self, value: str) -> int:
        return self.ids.setdefault(value, len(self.ids) + 1)


def _kernel_row(
    start: int,
    end: int,
    stream: int,
    corr: int,
    pid: int,
    names: tuple,
    strings: _Strings,
    grid: int,
    device: int = 0,
) -> tuple:
    return (
        start,
        end,
        device,
        1,
        None,
        stream,
        corr,
        pid,
        strings(names[0]),
        strings(names[1]),
        None,
        0,
        0,
        40,
        grid,
        1,
        1,
        256,
        1,
        1,
        0,
        0,
        0,
        0,
        corr,
        0,
        None,
        0,
        None,
        None,
        None,
        None,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        "[]",
    )


def _insert(con: sqlite3.Connection, *tables: list) -> None:
    """Insert, then clear, the rows collected so far: one step at a time keeps memory flat."""
    kernels, runtime, memcpy, memset, nvtx = tables
    con.executemany(
        f"INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES ({','.join('?' * 40)})", kernels
    )
    con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?,?,?,?,?,?,?,?)", runtime)
    con.executemany(f"INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES ({','.join('?' * 21)})", memcpy)
    con.executemany(f"INSERT INTO CUPTI_ACTIVITY_KIND_MEMSET VALUES ({','.join('?' * 12)})", memset)
    con.executemany(
        "INSERT INTO NVTX_EVENTS (start, end, eventType, rangeId, category, color, text, "
        "globalTid, endGlobalTid, textId, domainId) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
        nvtx,
    )
    for rows in tables:
        rows.clear()


@dataclass
class Rows:
    """The rows of one export, collected table by table."""

    kernels: List[tuple] = field(default_factory=list)
    runtime: List[tuple] = field(default_factory=list)
    memcpy: List[tuple] = field(default_factory=list)
    memset: List[tuple] = field(default_factory=list)
    nvtx: List[tuple] = field(default_factory=list)

    def tables(self) -> tuple:
        return self.kernels, self.runtime, self.memcpy, self.memset, self.nvtx


@dataclass(frozen=True)
class Timeline:
    """What every rank's DDP steps look like (one rank may be late)."""

    steps: int = 4
    kernels_per_step: int = 30
    allreduce_every: int = 5
    late_rank: int = -1
    late_us: float = 0.0
    seed: int = 3
    # NCCL kernels on the compute stream (no overlap possible on a GPU), as when a user's
    # collectives run on the current stream: per GPU, overlap is 0.
    shared_stream: bool = False


def _rank_steps(
    con: sqlite3.Connection,
    rows: Rows,
    tl: Timeline,
    rank: int,
    t: int,
    pid: int,
    tid: int,
    device: int,
    strings: _Strings,
) -> None:
    """Write one rank's steps, starting at session time ``t`` (ns), into ``con``: a step at a
    time, so a million-kernel file (benchmarks/trace_analysis_speed.py) keeps memory flat."""
    rng = random.Random(tl.seed)
    durations = [rng.randint(2_000, 40_000) for _ in range(tl.kernels_per_step)]
    comm_stream = COMPUTE_STREAM if tl.shared_stream else COMM_STREAM
    corr = 0
    for step in range(tl.steps):
        step_start = t
        gpu = t + 20_000
        corr += 1
        rows.runtime.append((t + 5_000, t + 9_000, 0, tid, corr, strings(API["memcpy"]), 0, None))
        rows.memcpy.append(
            (gpu, gpu + 30_000, device, 1, None, COMPUTE_STREAM, corr, pid, 6_422_528, 1, None,
             1, 0, 0, 1, 0, 1, None, None, None, 1)
        )  # fmt: skip
        gpu += 31_000
        corr += 1
        rows.runtime.append((t + 10_000, t + 12_000, 0, tid, corr, strings(API["launch"]), 0, None))
        rows.kernels.append(
            _kernel_row(gpu, gpu + 8_000, comm_stream, corr, pid, BROADCAST, strings, 8, device)
        )
        gpu += 9_000
        phase_start = {"forward": gpu}
        bwd_at, opt_at = tl.kernels_per_step // 3, tl.kernels_per_step - tl.kernels_per_step // 6
        comm_free = 0
        late_ns = int(tl.late_us * 1000) if tl.late_rank >= 0 else 0
        shift = 0  # how far this rank's own timeline is behind the others'
        for k in range(tl.kernels_per_step):
            if k == bwd_at:
                phase_start["backward"] = gpu
                if rank == tl.late_rank:
                    gpu += late_ns  # this rank's backward runs late
                    shift = late_ns
            if k == opt_at:
                # the optimizer needs the reduced gradients: every rank resumes together
                gpu, shift = max(gpu, comm_free), 0
                phase_start["optimizer"] = gpu
            corr += 1
            launch = max(t + 15_000 + k * 6_000, gpu - 200_000)
            rows.runtime.append(
                (launch, launch + 4_000, 0, tid, corr, strings(API["launch"]), 0, None)
            )
            names = COMPUTE_KERNELS[k % len(COMPUTE_KERNELS)]
            rows.kernels.append(
                _kernel_row(
                    gpu, gpu + durations[k], COMPUTE_STREAM, corr, pid, names, strings, 512, device
                )
            )
            gpu += durations[k] + 1_500
            bucket = (k - bwd_at) % tl.allreduce_every == tl.allreduce_every - 1
            if bwd_at <= k < opt_at and bucket:
                corr += 1
                # A blocking all-reduce: each rank enters when ready (and its comm stream is
                # free); all leave together once the late rank has entered.
                start = max(gpu, comm_free)
                last_in = max(gpu - shift + late_ns, comm_free)
                end = last_in + 60_000
                rows.runtime.append(
                    (launch + 5_000, launch + 9_000, 0, tid, corr, strings(API["launch"]), 0, None)
                )
                rows.kernels.append(
                    _kernel_row(start, end, comm_stream, corr, pid, ALLREDUCE, strings, 24, device)
                )
                comm_free = end
                if tl.shared_stream:  # the next compute kernel queues behind the all-reduce
                    gpu = end + 1_500
        corr += 1
        rows.runtime.append(
            (gpu - 50_000, gpu - 48_000, 0, tid, corr, strings(API["memset"]), 0, None)
        )
        rows.memset.append(
            (gpu, gpu + 3_000, device, 1, None, COMPUTE_STREAM, corr, pid, 0, 4096, None, 1)
        )
        gpu = max(gpu + 3_000, comm_free)
        step_end = gpu + 50_000
        rows.nvtx.append(
            (step_start, step_end, 59, None, None, None, f"step {step}", tid, None, None, 0)
        )
        bounds = [phase_start["forward"], phase_start["backward"], phase_start["optimizer"], gpu]
        for phase, lo, hi in zip(PHASES, bounds, bounds[1:]):
            rows.nvtx.append(
                (lo - 10_000, hi - 10_000, 59, None, None, None, None, tid, None,
                 strings(phase), 0)
            )  # fmt: skip
        t = step_end + 100_000
        _insert(con, *rows.tables())


def _finish(
    con: sqlite3.Connection,
    strings: _Strings,
    session_start: int,
    gpus: List[int],
    schema_version: str = "3.28.1",
    with_gpu_table: bool = True,
    bus_base: int = 0,
) -> None:
    con.executemany("INSERT INTO StringIds VALUES (?, ?)", [(i, v) for v, i in strings.ids.items()])
    con.execute(
        "INSERT INTO META_DATA_EXPORT VALUES ('EXPORT_SCHEMA_VERSION', ?)", (schema_version,)
    )
    con.execute(
        "INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (?, NULL, NULL, ?, NULL)",
        (session_start, session_start),
    )
    if with_gpu_table:
        for device in gpus:
            con.execute(
                "INSERT INTO TARGET_INFO_GPU (vmId, id, name, busLocation, totalMemory, smCount,"
                " computeMajor, computeMinor) VALUES (0, ?, 'NVIDIA H100 80GB HBM3', ?, "
                "85520809984, 132, 9, 0)",
                (device, f"0000:{0x18 + bus_base + device:02x}:00.0"),
            )
    con.executemany("INSERT INTO ENUM_NSYS_EVENT_TYPE VALUES (?, ?, ?)", EVENT_TYPES)
    con.commit()
    con.close()


def write_ranks(
    folder: Path,
    *,
    ranks: int = 2,
    steps: int = 4,
    kernels_per_step: int = 30,
    allreduce_every: int = 5,
    late_rank: int = -1,
    late_us: float = 0.0,
    seed: int = 3,
) -> List[Path]:
    """Write ``rank{r}.sqlite`` for each rank into ``folder`` (one GPU, device 0, per file)."""
    folder.mkdir(parents=True, exist_ok=True)
    tl = Timeline(steps, kernels_per_step, allreduce_every, late_rank, late_us, seed)
    paths = []
    for rank in range(ranks):
        session_start = EPOCH_NS + rank * 1_000_000  # each rank's session starts a bit later
        pid = (rank << 48) | (PID + rank) << 24
        strings = _Strings()
        path = folder / f"rank{rank}.sqlite"
        path.unlink(missing_ok=True)
        con = sqlite3.connect(path)
        con.executescript(SCHEMA)
        rows = Rows()
        start = 50_000_000 - rank * 1_000_000  # same absolute moment on every rank
        _rank_steps(con, rows, tl, rank, start, pid, pid | (PID + rank), 0, strings)
        _finish(con, strings, session_start, [0], bus_base=rank)
        paths.append(path)
    return paths


NODE_VARIANTS = ("2026.4", "older", "2022.4.2")


def _rebuild(con: sqlite3.Connection, table: str, columns: str) -> None:
    """Recreate ``table`` with exactly ``columns`` (a CREATE TABLE column list), keeping the
    rows' values of the columns both have."""
    names = [c.split()[0] for c in columns.split(",")]
    con.execute(f"ALTER TABLE {table} RENAME TO old_{table}")
    con.execute(f"CREATE TABLE {table} ({columns})")
    con.execute(
        f"INSERT INTO {table} ({', '.join(names)}) SELECT {', '.join(names)} FROM old_{table}"
    )
    con.execute(f"DROP TABLE old_{table}")


def write_node(
    path: Path,
    *,
    gpus: int = 2,
    timeline: Timeline = Timeline(),
    variant: str = "2026.4",
    rank_marks: Optional[List[int]] = None,
) -> Path:
    """One export of a whole node, as ``nsys profile torchrun ...`` writes it: every rank's
    process (pid ``PID + 10 * device``) driving CUDA device ``device``, one session clock, and a
    torchrun launcher process with no GPU work. CUDA correlation ids restart in every process,
    as CUPTI numbers them per process.

    ``variant``: ``2026.4`` (export schema 3.28.1, as ``SCHEMA``) or ``older``: StringIds and
    CUPTI_ACTIVITY_KIND_RUNTIME as documented for a 2020 release (``OLDER_DOCUMENTED_TABLES``,
    ``OLDER_SCHEMA_SOURCE``); the other tables reconstructed, without the columns of features
    added later (``OLDER_EXPORT_DROPS``), and no TARGET_INFO_GPU.
    ``rank_marks``: the rank each device's process marks in NVTX (torchscale's worker emits
    ``torchscale rank=R world_size=W``); None: no marks.
    """
    if variant not in NODE_VARIANTS:
        raise ValueError(f"variant {variant!r} is not one of {NODE_VARIANTS}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    con = sqlite3.connect(path)
    con.executescript(SCHEMA)
    strings = _Strings()
    launcher = (PID - 1) << 24
    rows = Rows()
    rows.nvtx.append((1_000, 2_000, 34, None, None, None, "torchrun start", launcher | PID - 1,
                      None, None, 0))  # fmt: skip
    for device in range(gpus):
        pid = (PID + 10 * device) << 24
        tid = pid | (PID + 10 * device)
        if rank_marks is not None:
            mark = f"torchscale rank={rank_marks[device]} world_size={gpus}"
            rows.nvtx.append((40_000_000, None, 34, None, None, None, mark, tid, None, None, 0))
        _rank_steps(con, rows, timeline, device, 50_000_000, pid, tid, device, strings)
    _insert(con, *rows.tables())
    if variant == "older":
        for table, columns in OLDER_EXPORT_DROPS.items():
            for column in columns:
                con.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
        for table, columns in OLDER_DOCUMENTED_TABLES.items():
            _rebuild(con, table, columns)
    older = variant == "older"
    _finish(con, strings, EPOCH_NS, list(range(gpus)), "older" if older else "3.28.1",
            with_gpu_table=not older)  # fmt: skip
    if variant == "2022.4.2":
        _as_recorded_schema(path, RECORDED_2022_SCHEMA)
    return path


# The CREATE TABLE statements of a real Nsight Systems 2022.4.2 export (export schema 3.0.0),
# recorded from that nsys (see nsys_2022.4.2/README.md): the "2022.4.2" variant is the same
# node rebuilt table by table in exactly that schema.
RECORDED_2022_SCHEMA = Path(__file__).parent / "nsys_2022.4.2" / "schema.sql"
# 2022.4 names the export metadata table EXPORT_META_DATA; later releases META_DATA_EXPORT.
RENAMED_2022_TABLES = {"META_DATA_EXPORT": "EXPORT_META_DATA"}


def _as_recorded_schema(path: Path, schema: Path) -> None:
    """Rebuild each table of the export at ``path`` as the recorded ``schema`` creates it,
    keeping the values of the columns both have (a recorded NOT NULL column the newer export
    lacks gets 0)."""
    con = sqlite3.connect(path)
    statements = [s.strip() for s in schema.read_text().split(";") if "CREATE TABLE" in s]
    for statement in statements:
        statement = "\n".join(
            line for line in statement.splitlines() if not line.lstrip().startswith("--")
        )
        table = statement.split("CREATE TABLE", 1)[1].split("(", 1)[0].strip()
        source = next((old for old, new in RENAMED_2022_TABLES.items() if new == table), table)
        have = {row[1] for row in con.execute(f"PRAGMA table_info({source})")}
        con.execute(f"ALTER TABLE {source} RENAME TO recorded_old")
        con.execute(statement)
        wanted = con.execute(f"PRAGMA table_info({table})").fetchall()
        columns = [row[1] for row in wanted]
        values = [
            name if name in have else ("0" if notnull else "NULL")
            for _, name, _, notnull, _, _ in wanted
        ]
        con.execute(
            f"INSERT INTO {table} ({', '.join(columns)}) "
            f"SELECT {', '.join(values)} FROM recorded_old"
        )
        con.execute("DROP TABLE recorded_old")
    con.execute("UPDATE EXPORT_META_DATA SET value = '3.0.0' WHERE name = 'EXPORT_SCHEMA_VERSION'")
    con.commit()
    con.close()


# Where the "older" variant comes from, table by table.
#
# Documented (column names, order and types as NVIDIA's pages list them):
#   StringIds and CUPTI_ACTIVITY_KIND_RUNTIME, from
OLDER_SCHEMA_SOURCE = (
    "NVIDIA Nsight Systems export documentation, 'SQLite Export Schema Reference' "
    "(DRIVE OS 5.2.3.0L, (c) 2020): "
    "https://docs.nvidia.com/drive/drive-os-5.2.3.0L/nsight-systems/nsys-exporter/exported_data.html"
)
#   The page prints no version number in what could be read of it; it is a 2020 release: its
#   runtime table has no eventClass column (the 2021.5 page of the same reference lists one,
#   https://docs.nvidia.com/nsight-systems/2021.5/nsys-exporter/exported_data.html) and its
#   text differs from the 2020.1.1 package's copy. Read from it: StringIds' CREATE TABLE, and
#   the runtime table's start, end (INT NOT NULL), globalTid, correlationId (INT). The stored
#   copy at hand stops there; the runtime table's remaining columns, nameId and returnValue
#   (INT NOT NULL, nothing after them), are those of the same reference as shipped in NVIDIA's
#   nsight-systems 10.1.168 package (Nsight Systems 2019.3, CUDA 10.1).
OLDER_DOCUMENTED_TABLES: Dict[str, str] = {
    "StringIds": "id INTEGER PRIMARY KEY, value TEXT NOT NULL",
    "CUPTI_ACTIVITY_KIND_RUNTIME": (
        "start INT NOT NULL, end INT NOT NULL, globalTid INT, correlationId INT, "
        "nameId INT NOT NULL, returnValue INT NOT NULL"
    ),
}
# NOT documented here (reconstructed): CUPTI_ACTIVITY_KIND_KERNEL / MEMCPY / MEMSET and
# NVTX_EVENTS keep the 2026.4 columns less those describing features CUDA/nsys gained later
# (green contexts, CUDA graph ids, thread-block clusters, QMD completion, NVTX JSON/binary
# payloads); TARGET_INFO_GPU is left out. The column lists of these tables in the page above
# could not be read with the tools at hand, so the exact release each column appeared in is
# not claimed.
OLDER_EXPORT_DROPS: Dict[str, List[str]] = {
    "CUPTI_ACTIVITY_KIND_KERNEL": [
        "greenContextId", "graphId", "clusterX", "clusterY", "clusterZ",
        "clusterSchedulingPolicy", "maxPotentialClusterSize", "maxActiveClusters",
        "sharedMemoryRequestedPercentage", "tensorSizeMinusOneElements", "qmdBulkReleaseDone",
        "qmdPreexitDone", "qmdLastCtaDone",
    ],
    "CUPTI_ACTIVITY_KIND_MEMCPY": ["greenContextId", "virtualAddress", "copyCount"],
    "CUPTI_ACTIVITY_KIND_MEMSET": ["greenContextId", "memKind"],
    "NVTX_EVENTS": ["jsonTextId", "jsonText", "binaryData"],
}  # fmt: skip


# CUDA's memory events (``nsys profile --cuda-memory-usage=true``). No export at hand has them
# (nsys_2rank is generated without; the real 2022.4.2 export traced no GPU), so the table is
# built here exactly as NVIDIA's Nsight Systems User Guide, "SQLite Schema Reference", lists it
# (https://docs.nvidia.com/nsight-systems/UserGuide/index.html#sqlite-schema-reference: column
# names, order, types and NOT NULLs; its comments left out); the two enum tables as the real
# 2022.4.2 export holds them (tests/data/nsys_2022.4.2/cpu_only_sleep.sqlite: same columns and
# values). Which Nsight Systems release that page described when read is not claimed.
MEMORY_SCHEMA = """
CREATE TABLE CUDA_GPU_MEMORY_USAGE_EVENTS (start INTEGER NOT NULL, globalPid INTEGER NOT NULL,
    deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, address INTEGER NOT NULL,
    pc INTEGER NOT NULL, bytes INTEGER NOT NULL, memKind INTEGER NOT NULL,
    memoryOperationType INTEGER NOT NULL, name TEXT, correlationId INTEGER,
    localMemoryPoolAddress INTEGER, localMemoryPoolReleaseThreshold INTEGER,
    localMemoryPoolSize INTEGER, localMemoryPoolUtilizedSize INTEGER,
    importedMemoryPoolAddress INTEGER, importedMemoryPoolProcessId INTEGER);
CREATE TABLE ENUM_CUDA_DEV_MEM_EVENT_OPER (id INTEGER NOT NULL PRIMARY KEY, name TEXT,
    label TEXT);
CREATE TABLE ENUM_CUDA_MEM_KIND (id INTEGER NOT NULL PRIMARY KEY, name TEXT, label TEXT);
"""
MEM_EVENT_OPERATIONS = [
    (0, "CUDA_DEV_MEM_EVENT_OPR_ALLOCATION", "Allocation"),
    (1, "CUDA_DEV_MEM_EVENT_OPR_DEALLOCATION", "Deallocation"),
]
MEM_KINDS = [
    (0, "CUDA_MEMOPR_MEMORY_KIND_PAGEABLE", "Pageable"),
    (1, "CUDA_MEMOPR_MEMORY_KIND_PINNED", "Pinned"),
    (2, "CUDA_MEMOPR_MEMORY_KIND_DEVICE", "Device"),
    (3, "CUDA_MEMOPR_MEMORY_KIND_ARRAY", "Array"),
    (4, "CUDA_MEMOPR_MEMORY_KIND_MANAGED", "Managed"),
    (5, "CUDA_MEMOPR_MEMORY_KIND_DEVICE_STATIC", "Device Static"),
    (6, "CUDA_MEMOPR_MEMORY_KIND_MANAGED_STATIC", "Managed Static"),
    (7, "CUDA_MEMOPR_MEMORY_KIND_UNKNOWN", "Unknown"),
]


@dataclass(frozen=True)
class MemoryEvent:
    """One allocation (operation 0) or free (1) of ``size`` bytes at session time ``start`` (ns)
    by the process of ``device`` in a :func:`write_node` export (its pid: ``PID + 10 * device``);
    ``kind``: ``ENUM_CUDA_MEM_KIND`` (2 device, 1 pinned host)."""

    start: int
    device: int
    size: int
    operation: int
    address: int
    kind: int = 2


def add_memory_events(path: Path, events: List[MemoryEvent]) -> None:
    """Add CUDA's memory events table (``MEMORY_SCHEMA``) holding ``events`` to an export."""
    con = sqlite3.connect(path)
    con.executescript(MEMORY_SCHEMA)
    con.executemany(
        "INSERT INTO ENUM_CUDA_DEV_MEM_EVENT_OPER VALUES (?, ?, ?)", MEM_EVENT_OPERATIONS
    )
    con.executemany("INSERT INTO ENUM_CUDA_MEM_KIND VALUES (?, ?, ?)", MEM_KINDS)
    con.executemany(
        "INSERT INTO CUDA_GPU_MEMORY_USAGE_EVENTS (start, globalPid, deviceId, contextId, address,"
        " pc, bytes, memKind, memoryOperationType, correlationId) VALUES (?,?,?,?,?,?,?,?,?,?)",
        [
            (e.start, (PID + 10 * e.device) << 24, e.device, 1, e.address, 0x7F0000001000,
             e.size, e.kind, e.operation, k + 1)
            for k, e in enumerate(events)
        ],
    )  # fmt: skip
    con.commit()
    con.close()


if __name__ == "__main__":
    out = Path(__file__).parent / "nsys_2rank"
    for written in write_ranks(out, ranks=2, steps=4, late_rank=1, late_us=300.0):
        print(written, written.stat().st_size)
