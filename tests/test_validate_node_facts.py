"""Level 2's node facts, read from real-format fixtures: XID lines of the kernel log (dmesg,
dmesg -T, journalctl, the pre-R450 form), InfiniBand / RoCE ports and CPU governors in sysfs."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import List, Optional

import pytest

from torchscale.hardware import kernel_log
from torchscale.hardware.kernel_log import KernelLog, parse_xids, read_kernel_log
from torchscale.hardware.node_sysfs import cpu_governors, ib_ports
from torchscale.hardware.topology import normalize_bus_id
from torchscale.validate.node_health import check_governor, check_ib_ports, check_xid
from torchscale.validate.result import Status

DATA = Path(__file__).parent / "data"
LOGS = DATA / "kernel_log"
SYSFS = DATA / "sysfs"


def h100_bus_ids() -> List[Optional[str]]:
    """The bus ids NVML reports on the recorded HGX H100 (what validate maps XIDs with)."""
    fixture = json.loads((DATA / "nvml" / "h100_healthy.json").read_text())
    return [normalize_bus_id(d["nvmlDeviceGetPciInfo"]["busId"]) for d in fixture["devices"]]


def lines(name: str) -> List[str]:
    return (LOGS / name).read_text().splitlines()


def test_xid_lines_of_every_printer_are_read_with_code_bus_and_text() -> None:
    dmesg = parse_xids(lines("dmesg_h100.log"))
    assert [(e.bus_id, e.code) for e in dmesg] == [("0000:3a:00", 13)] * 2 + [("0000:9a:00", 79)]
    assert dmesg[2].text == "pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    dated = parse_xids(lines("dmesg_t_gsp.log"))
    assert [e.code for e in dated] == [119, 119, 119]
    assert dated[0].text.startswith("pid=2024380, name=nvidia-smi, Timeout after 6s")
    journal = parse_xids(lines("journalctl_ecc.log"))
    assert [(e.bus_id, e.code) for e in journal] == [("0000:5d:00", 63), ("0000:5d:00", 94)]
    legacy = parse_xids(lines("dmesg_legacy.log"))
    assert [(e.bus_id, e.code) for e in legacy] == [("0000:18:00", 31), ("0000:18:00", 62)]
    assert parse_xids(lines("dmesg_clean.log")) == []


def test_a_hardware_xid_fails_and_names_the_gpu_by_its_nvml_index() -> None:
    buses = h100_bus_ids()
    log = KernelLog(lines("dmesg_h100.log"), "dmesg")
    check = check_xid(log, parse_xids(log.lines or []), buses)
    assert check.status is Status.FAIL
    # 9a is the fifth GPU NVML lists, 3a the third: the text says so, with what each code means
    assert "GPU 4: Xid 79 (GPU has fallen off the bus)" in check.value
    assert "GPU 2: Xid 13 (graphics engine exception (usually the application)) x2" in check.value
    assert check.fix and "Xid 79 call for a GPU reset" in check.fix and "13" not in check.fix
    assert isinstance(check.details["events"], list)
    assert [e["gpu"] for e in check.details["events"]] == ["GPU 2", "GPU 2", "GPU 4"]


def test_a_recorded_row_remap_fails_and_application_xids_alone_warn() -> None:
    """Xid 63 needs a GPU reset to apply the remap (as level 1's pending-remap row, FAIL); the
    contained ECC error beside it (94) asks only for the application's restart."""
    buses = h100_bus_ids()
    log = KernelLog(lines("journalctl_ecc.log"), "journalctl -k -b")
    events = parse_xids(log.lines or [])
    check = check_xid(log, events, buses)
    assert check.status is Status.FAIL
    assert check.value.startswith("GPU 3: Xid 63 (row remap / page retirement recorded")
    assert check.fix and check.fix.startswith("Xid 63 call for a GPU reset")  # 94 is not named
    contained = check_xid(log, [e for e in events if e.code == 94], buses)
    assert contained.status is Status.WARN
    assert contained.value == "GPU 3: Xid 94 (contained ECC error (the application must restart))"
    assert contained.fix and "application" in contained.fix
    clean = KernelLog(lines("dmesg_clean.log"), "dmesg")
    assert check_xid(clean, [], buses).status is Status.PASS
    # a bus no GPU has (the GPU fell off and NVML lost it) is named by its bus id
    gsp = KernelLog(lines("dmesg_t_gsp.log"), "dmesg")
    alone = check_xid(gsp, parse_xids(gsp.lines or []), buses[:2])
    assert (
        alone.status is Status.FAIL
        and alone.value == "PCI 0000:ab:00: Xid 119 (GSP RPC timeout) x3"
    )


def test_the_docs_list_the_codes_as_the_table_classes_them() -> None:
    """docs/validate.md's XID row names every code of the table under the verdict it gets."""
    import re

    doc = (Path(__file__).parent.parent / "docs" / "validate.md").read_text()
    [row] = [line for line in doc.splitlines() if line.startswith("| XID errors (kernel log)")]
    failing = re.search(r"FAIL on [^(]*\(([\d, ]+), and any code not in the table\)", row)
    warning = re.search(r"ascribed to an application \(([\d, ]+)\)", row)
    assert failing and warning, row
    codes = kernel_log.XID_CODES
    assert [int(c) for c in failing.group(1).split(",")] == sorted(
        c for c, (_, hardware) in codes.items() if hardware
    )
    assert [int(c) for c in warning.group(1).split(",")] == sorted(
        c for c, (_, hardware) in codes.items() if not hardware
    )


def test_an_unknown_code_counts_as_hardware() -> None:
    [event] = parse_xids(["[  1.0] NVRM: Xid (PCI:0000:18:00): 999, pid=1, something new"])
    assert event.hardware and "NVIDIA's catalog" in event.meaning


def _tool(folder: Path, name: str, script: str) -> None:
    path = folder / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_the_log_is_read_from_dmesg_else_journalctl_and_unreadable_is_skip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # dmesg refused as on a node with kernel.dmesg_restrict=1, the journal readable
    _tool(
        tmp_path,
        "dmesg",
        'echo "dmesg: read kernel buffer failed: Operation not permitted" >&2\nexit 1\n',
    )
    _tool(tmp_path, "journalctl", f'cat "{LOGS / "journalctl_ecc.log"}"\n')
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    log = read_kernel_log()
    assert log.source.startswith("journalctl") and len(parse_xids(log.lines or [])) == 2
    # neither readable: the reasons of both, and the check says so instead of "no errors"
    _tool(
        tmp_path, "journalctl", 'echo "No journal files were found." >&2\necho "-- No entries --"\n'
    )
    log = read_kernel_log()
    assert log.lines is None
    assert "Operation not permitted" in (log.error or "") and "journalctl" in (log.error or "")
    check = check_xid(log, [], [])
    assert check.status is Status.SKIP and "not readable" in check.value
    assert kernel_log.LOG_COMMANDS[0][0] == "dmesg"


def test_ib_ports_and_their_verdicts() -> None:
    healthy = ib_ports(SYSFS / "hgx_healthy")
    assert [p.name for p in healthy] == [f"mlx5_{i}/1" for i in range(8)]
    assert {(p.state, p.phys_state, p.rate_gbps, p.link_layer) for p in healthy} == {
        ("ACTIVE", "LinkUp", 400.0, "InfiniBand")
    }
    assert check_ib_ports(healthy).value == "8 of 8 ports ACTIVE at 400 Gb/sec (4X NDR)"
    rail_down = ib_ports(SYSFS / "hgx_rail_down")
    check = check_ib_ports(rail_down)
    assert check.status is Status.FAIL
    assert check.value.startswith("mlx5_5/1 DOWN (Polling); 7 of 8 ports ACTIVE")
    roce = check_ib_ports(ib_ports(SYSFS / "roce_slow"))
    assert roce.status is Status.WARN
    assert roce.value == "mlx5_1/1: 50 Gb/sec (2X EDR) (others 100 Gb/sec)"
    vm = check_ib_ports(ib_ports(SYSFS / "vm"))
    assert vm.status is Status.SKIP and "no InfiniBand" in vm.value


def test_a_slow_rail_among_active_ones_warns_once_the_down_one_is_fixed(tmp_path: Path) -> None:
    ports = [p for p in ib_ports(SYSFS / "hgx_rail_down") if p.active]
    check = check_ib_ports(ports)
    assert check.status is Status.WARN
    assert check.value == "mlx5_2/1: 200 Gb/sec (4X HDR) (others 400 Gb/sec)"


def test_cpu_governors() -> None:
    assert cpu_governors(SYSFS / "hgx_healthy") == {i: "performance" for i in range(4)}
    mixed = cpu_governors(SYSFS / "hgx_rail_down")
    check = check_governor(mixed)
    assert check.status is Status.WARN
    assert check.value == "2 CPUs performance, 2 CPUs powersave"
    assert check_governor(cpu_governors(SYSFS / "hgx_healthy")).status is Status.PASS
    assert check_governor(cpu_governors(SYSFS / "roce_slow")).status is Status.WARN
    assert check_governor(cpu_governors(SYSFS / "vm")).status is Status.SKIP
