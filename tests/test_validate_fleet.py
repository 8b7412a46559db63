"""``validate --fleet``: the outlier rules, the pairs to measure, where the nodes come from
(Slurm, --nnodes), the HTML page; and one real fleet of three network-namespace hosts, one of
them given less CPU and one link shaped slower, that must name exactly that host and that link."""

from __future__ import annotations

import json
import os
import socket
import stat
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest
from typer.testing import CliRunner

from tests.support.mesh_hosts import mesh_hosts
from tests.support.two_hosts import torchscale_env
from torchscale.analysis.host_attribution import RankPlace, health_quote
from torchscale.cli.app import app
from torchscale.config.validate_section import FleetBar, ValidateSection
from torchscale.errors import TorchscaleError
from torchscale.results.host_records import load_host_records
from torchscale.results.layout import FLEET_PAGE, FLEET_REPORT, VALIDATE_DIR
from torchscale.validate.fleet import FleetMember
from torchscale.validate.fleet_document import fleet_document
from torchscale.validate.fleet_launch import FLEET_ENDPOINT_ENV, SlurmFleet, resolve_fleet
from torchscale.validate.fleet_page import fleet_html
from torchscale.validate.fleet_rules import (
    MAD_SCALE,
    Link,
    analyse,
    judge_links,
    ring_rounds,
    robust_status,
    suspect_pairs,
)
from torchscale.validate.result import Status

pytestmark = pytest.mark.timed  # a throttled host measured against its peers


def test_robust_rule_fraction_of_the_median_and_scaled_mads() -> None:
    bar = FleetBar()
    scores = [100.0, 98.0, 102.0, 99.0, 59.0]
    status, share = robust_status(59.0, scores, bar)
    assert share == pytest.approx(59.0 / statistics.median(scores)) and status is Status.FAIL
    assert robust_status(75.0, [*scores[:4], 75.0], bar)[0] is Status.WARN  # below 0.8
    # 93 is 7 below a median of 100 whose MAD is 0: the floor (5% of the median) counts
    tight = [100.0, 101.0, 99.0, 100.0, 100.0, 100.0, 93.0]
    assert robust_status(93.0, tight, bar)[0] is Status.PASS  # 7 < 4 x 5
    assert robust_status(93.0, tight, FleetBar(mads=1.0))[0] is Status.WARN  # 7 > 1 x 5
    spread = [100.0, 90.0, 110.0, 95.0, 105.0, 70.0]
    mad = statistics.median(abs(s - statistics.median(spread)) for s in spread) * MAD_SCALE
    assert (statistics.median(spread) - 70.0) > 2 * mad
    assert robust_status(70.0, spread, FleetBar(warn=0.5, fail=0.4, mads=2.0))[0] is Status.WARN
    assert robust_status(120.0, spread, bar)[0] is Status.PASS  # only the slow side counts


def links(speeds: Dict[tuple, float]) -> List[Link]:
    return [Link(a, b, gbps) for (a, b), gbps in speeds.items()]


def test_a_slow_link_between_fast_nodes_is_the_link() -> None:
    verdict = judge_links(
        links({(0, 1): 1.0, (1, 2): 10.0, (2, 3): 10.0, (0, 3): 10.0, (0, 2): 9.5}),
        ValidateSection(),
    )
    assert verdict.slow_links == [(0, 1)]
    [slow] = [v for v in verdict.links if v.link.pair == (0, 1)]
    assert slow.expected_gbps == 10.0 and slow.ratio == pytest.approx(0.1)
    assert slow.status is Status.FAIL  # below validation.links.fail (0.25)
    assert {s for s, _ in verdict.reach_status.values()} == {Status.PASS}


def test_a_node_slow_on_every_link_is_the_node_not_its_links() -> None:
    speeds = {(0, 1): 10.0, (1, 2): 10.0, (2, 3): 2.0, (0, 3): 2.0, (0, 2): 10.0, (1, 3): 2.1}
    reports = [{"host": f"n{i}", "probes": []} for i in range(4)]
    verdict = analyse(reports, links(speeds), ValidateSection())
    assert verdict.slow_links == []
    assert verdict.slow_nodes == [3]
    assert verdict.reach[3] == 2.1
    assert verdict.reasons[3] == ["its best link reaches 0.21 of the fleet's median"]
    assert verdict.node_status[3] is Status.FAIL


def probe_report(host: str, gemm: float, copy: float) -> Dict[str, Any]:
    def figure(probe: str, device: str, value: float) -> Dict[str, Any]:
        return {"probe": probe, "device": device, "value": value}

    return {
        "host": host,
        "level": 2,
        "summary": {"pass": 20, "warn": 1, "fail": 0, "skip": 3},
        "probes": [figure("gemm_bf16", f"GPU {i}", gemm) for i in range(2)]
        + [figure("memory_copy", "GPU 0", copy), figure("launch_latency", "GPU 0", 5.0)],
    }


def test_device_outliers_across_the_fleet_and_the_document() -> None:
    reports = [probe_report(f"node-{i}", 740.0, 2900.0) for i in range(5)]
    reports[3]["probes"][1]["value"] = 520.0  # node-3 GPU 1
    reports[4]["probes"][3]["value"] = 9.0  # node-4 launches take 9 us instead of 5
    fleet_links = links({(i, (i + 1) % 5): 40.0 for i in range(5)})
    verdict = analyse(reports, fleet_links, ValidateSection())
    assert verdict.slow_nodes == [3, 4]
    assert verdict.reasons[3] == ["GPU 1 GEMM bf16 at 0.70 of the fleet median"]
    assert verdict.reasons[4] == ["GPU 0 Kernel launch at 0.56 of the fleet median"]
    document = fleet_document(reports, fleet_links, verdict, ValidateSection())
    assert document["summary"]["slow_nodes"] == ["node-3", "node-4"]
    assert document["summary"]["status"] == "FAIL" and not document["summary"]["ok"]
    [cell] = [c for c in document["cells"] if c["host"] == "node-3" and c["device"] == "GPU 1"]
    assert cell["vs_fleet"] == pytest.approx(520.0 / 740.0) and cell["status"] == "WARN"


def test_pairs_to_measure() -> None:
    assert ring_rounds(2) == [[(0, 1)]]
    assert ring_rounds(3) == [[(0, 1)], [(1, 2)], [(2, 0)]]
    assert ring_rounds(4) == [[(0, 1), (2, 3)], [(1, 2), (3, 0)]]
    reports = [probe_report(f"n{i}", 740.0, 2900.0) for i in range(5)]
    reports[2]["probes"][0]["value"] = 300.0
    ring = links({(0, 1): 40.0, (1, 2): 40.0, (2, 3): 40.0, (3, 4): 40.0, (0, 4): 40.0})
    cells = analyse(reports, ring, ValidateSection()).cells
    # node 2 is the suspect; it has met 1 and 3 in the ring: now 0 and 4, healthy
    assert suspect_pairs(cells, [r["host"] for r in reports], ring) == [(0, 2), (2, 4)]


def test_the_page_escapes_host_names_and_draws_a_heatmap_per_probe() -> None:
    hostile = "<script>alert(1)</script>"
    reports = [probe_report(hostile, 740.0, 2900.0), probe_report("node-1", 500.0, 2900.0)]
    fleet_links = links({(0, 1): 40.0})
    document = fleet_document(
        reports, fleet_links, analyse(reports, fleet_links, ValidateSection()), ValidateSection()
    )
    page = fleet_html(document)
    assert hostile not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    for heading in ("GEMM bf16 (TFLOP/s)", "Memory copy (GB/s)", "Kernel launch (us)"):
        assert f"<h2>{heading}</h2>" in page
    assert page.count("<td style=") == 2 * 4 + 2 * 2  # 2 nodes x (2+1+1 devices), 2 x 2 links


def test_where_the_nodes_come_from() -> None:
    srun_task = {FLEET_ENDPOINT_ENV: "batch01:29400", "SLURM_NNODES": "3", "SLURM_NODEID": "2"}
    assert resolve_fleet(
        nnodes=None, node_rank=None, endpoint=None, join_timeout_s=60, environ=srun_task
    ) == FleetMember(3, 2, "batch01:29400", 60)
    # a task of the user's own srun (variables as Slurm 22.05 sets them in a step, recorded)
    step = {"SLURM_JOB_NODELIST": "gpu[01-02]", "SLURM_NNODES": "2", "SLURM_NODEID": "1",
            "SLURM_PROCID": "1", "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "gpu[01-02]",
            "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "2",
            "SLURM_STEP_TASKS_PER_NODE": "1(x2)"}  # fmt: skip
    assert resolve_fleet(
        nnodes=None, node_rank=None, endpoint=None, join_timeout_s=60, environ=step
    ) == FleetMember(2, 1, "gpu01:29400", 60)
    with pytest.raises(TorchscaleError, match="one task per node"):
        resolve_fleet(nnodes=None, node_rank=None, endpoint=None, join_timeout_s=60,
                      environ={**step, "SLURM_STEP_NUM_TASKS": "4"})  # fmt: skip
    by_hand = resolve_fleet(
        nnodes=4, node_rank=1, endpoint="node0:29511", join_timeout_s=60, environ={}
    )
    assert by_hand == FleetMember(4, 1, "node0:29511", 60)
    batch = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "gpu[01-03]"}
    outer = resolve_fleet(
        nnodes=None, node_rank=None, endpoint="any:29600", join_timeout_s=60, environ=batch
    )
    assert isinstance(outer, SlurmFleet)
    assert outer.endpoint == f"{socket.gethostname()}:29600"
    command = outer.command(["--level", "2", "--fleet"])
    assert command[:5] == ["srun", "--nodes=3", "--ntasks=3", "--ntasks-per-node=1",
                           "--job-name=torchscale-validate"]  # fmt: skip
    assert command[5] == sys.executable
    assert command[6:] == ["-m", "torchscale", "validate", "--level", "2", "--fleet"]
    with pytest.raises(TorchscaleError, match="--fleet needs its nodes"):
        resolve_fleet(nnodes=None, node_rank=None, endpoint=None, join_timeout_s=60, environ={})
    with pytest.raises(TorchscaleError, match="give --nnodes 2 or more"):
        resolve_fleet(nnodes=1, node_rank=0, endpoint=None, join_timeout_s=60, environ={})


def test_in_a_slurm_batch_script_the_fleet_starts_with_srun(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """srun here is a stand-in that records how it was called and exits 3 (as srun exits with
    its worst task's code): the command passes every option on and returns srun's code."""
    record = tmp_path / "srun.json"
    srun = tmp_path / "srun"
    srun.write_text(
        "#!/bin/sh\n"
        f'python3 -c \'import json, os, sys; json.dump({{"argv": sys.argv[1:], '
        f'"endpoint": os.environ.get("{FLEET_ENDPOINT_ENV}")}}, open("{record}", "w"))\' "$@"\n'
        "exit 3\n"
    )
    srun.chmod(srun.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[1-2]")
    out = tmp_path / "results"
    args = ["validate", "--fleet", "--level", "2", "-o", str(out), "--json",
            "--set", "validation.window_s=0.1"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 3, result.output
    called = json.loads(record.read_text())
    argv = called["argv"]
    assert argv[:4] == ["--nodes=2", "--ntasks=2", "--ntasks-per-node=1",
                        "--job-name=torchscale-validate"]  # fmt: skip
    assert argv[5:8] == ["-m", "torchscale", "validate"]
    assert argv[argv.index("--output-dir") + 1] == str(out.resolve())
    assert argv[argv.index("--set") + 1] == "validation.window_s=0.1"
    assert "--json" in argv and "--fleet" in argv and argv[argv.index("--level") + 1] == "2"
    assert called["endpoint"] == f"{socket.gethostname()}:29400"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--level", "4"], "--level 4: choose 1, 2 or 3"),
        (["--fleet"], "--fleet needs its nodes"),
        (["--fleet", "--nnodes", "3"], "--nnodes 3 needs --rdzv-endpoint"),
        (["--set", "validation.fleet.warn=2"], "validation.fleet.warn"),
    ],
)
def test_bad_fleet_usage_is_one_line_and_exit_code_2(
    args: List[str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("SLURM_JOB_ID", "SLURM_JOB_NODELIST", "PET_NNODES", FLEET_ENDPOINT_ENV):
        monkeypatch.delenv(name, raising=False)
    result = CliRunner().invoke(app, ["validate", *args])
    assert result.exit_code == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert result.stdout == ""


SLOW_HOST, SLOW_LINK = 2, (0, 2)
NAMES = ["alpha", "bravo", "charlie"]


@pytest.mark.slow
def test_a_fleet_of_three_hosts_names_the_throttled_host_and_the_shaped_link(
    tmp_path: Path,
) -> None:
    """Three hosts (network namespaces, a link of their own between each pair): charlie's CPU
    quota cut to 5% of a CPU once it is ready to probe (its start-up runs at a whole CPU, more
    than its share of the cores beside two other hosts, so the test does not wait for it), and
    the alpha <-> charlie link shaped to 16 Mbit/s with tc. Both of charlie's links are slow, so
    only what bravo <-> charlie reaches tells that alpha <-> charlie is slower than charlie alone
    explains: a slow link beside a slow node."""
    config = tmp_path / "validate.yaml"
    config.write_text(
        "validation:\n  window_s: 0.15\n  link_s: 0.3\n  link_mib: 0.5\n  max_cpu_devices: 1\n"
    )
    env = torchscale_env(cpu_slots=2)  # one thread per probe, as on a 2-core node per slot
    with mesh_hosts(tmp_path, NAMES, "the fleet check") as hosts:
        hosts.shape(*SLOW_LINK, "16mbit")
        hosts.limit_cpu(SLOW_HOST, 1.0)
        procs = {}
        for node in (1, 2, 0):  # node 0 last: the others wait for its store
            args = ["validate", "--fleet", "--level", "2", "--skip-smoke", "-c", str(config),
                    "--nnodes", "3", "--node-rank", str(node), "--rdzv-endpoint", "alpha:29561",
                    "-o", str(tmp_path / f"out{node}"), "--json", "--join-timeout", "120"]  # fmt: skip
            procs[node] = hosts.torchscale(node, args, tmp_path / f"node{node}.log", env)
        log = tmp_path / f"node{SLOW_HOST}.log"
        deadline = time.monotonic() + 150
        while "ready; probes start" not in log.read_text() and time.monotonic() < deadline:
            assert procs[SLOW_HOST].poll() is None, log.read_text()[-2000:]
            time.sleep(0.05)
        hosts.limit_cpu(SLOW_HOST, 0.05)
        report = tmp_path / "out0" / VALIDATE_DIR / FLEET_REPORT
        deadline = time.monotonic() + 180
        while not report.exists() and procs[0].poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        # Measured: charlie's quota is lifted so that its exit (torch's teardown, seconds of
        # CPU at 5% of one) does not hold the test; nothing it does now is in the report.
        hosts.limit_cpu(SLOW_HOST, 2.0)
        for proc in procs.values():
            proc.wait(timeout=180)
        logs = {n: (tmp_path / f"node{n}.log").read_text() for n in procs}
    folder = tmp_path / "out0" / VALIDATE_DIR
    document = json.loads((folder / FLEET_REPORT).read_text())
    assert procs[0].returncode == (0 if document["summary"]["ok"] else 1), logs[0][-3000:]
    summary = document["summary"]
    assert summary["slow_nodes"] == ["charlie"], (summary, logs[0][-3000:])
    assert summary["slow_links"] == [["alpha", "charlie"]], document["links"]
    nodes = {n["host"]: n for n in document["nodes"]}
    assert nodes["alpha"]["status"] == nodes["bravo"]["status"] == "PASS"
    links_by = {(link["a"], link["b"]): link for link in document["links"]}
    assert links_by[("alpha", "bravo")]["status"] == links_by[("bravo", "charlie")]["status"]
    assert links_by[("alpha", "bravo")]["status"] == "PASS"
    # the shaped link against what both its ends reach on their other links, computed here
    reach = {h: max(x["gbps"] for x in document["links"] if h in (x["a"], x["b"])) for h in NAMES}
    slow = links_by[("alpha", "charlie")]
    assert slow["ratio"] == pytest.approx(slow["gbps"] / min(reach["alpha"], reach["charlie"]))
    assert reach["charlie"] == links_by[("bravo", "charlie")]["gbps"]  # its other link
    assert slow["ratio"] < ValidateSection().links.warn
    assert slow["gbps"] < 16e6 / 8 / 1e9 * 1.1  # the token bucket's rate, in GB/s
    # charlie's GEMM against the fleet median, computed from the three figures
    gemm = {c["host"]: c for c in document["cells"] if c["probe"] == "gemm_fp32"}
    median = statistics.median(c["value"] for c in gemm.values())
    assert gemm["charlie"]["vs_fleet"] == pytest.approx(gemm["charlie"]["value"] / median)
    assert gemm["charlie"]["status"] != "PASS"
    assert (
        f"CPU 0 GEMM fp32 at {gemm['charlie']['vs_fleet']:.2f} of the fleet median"
        in (nodes["charlie"]["reasons"])
    )
    # what node 0 printed on stdout is the fleet report it wrote; the page shows the heatmaps
    stdout = logs[0][logs[0].index("{\n") :]
    assert json.loads(stdout[: stdout.rindex("}") + 1]) == document
    page = (folder / FLEET_PAGE).read_text()
    assert "<h2>GEMM fp32 (TFLOP/s)</h2>" in page and "charlie" in page
    assert "> Node 1: reported to node 0 (alpha:29561)" in logs[1]
    # a straggler on charlie is explained by this fleet report (analysis/host_attribution.py)
    records = load_host_records(tmp_path / "out0")
    quote = health_quote(RankPlace(3, "charlie", 0, gpu=False), records["charlie"])
    worst = min(
        (c for c in document["cells"] if c["host"] == "charlie"), key=lambda c: c["vs_fleet"]
    )
    assert quote.startswith(
        f"whose {worst['label']} on CPU 0 ran at {worst['vs_fleet']:.2f} of the fleet median "
        "at level 2"
    )


def test_the_fleet_tables_read_whole_at_80_columns() -> None:
    import io

    from rich.console import Console

    from torchscale.validate.fleet_view import render_fleet

    reports = [probe_report(f"gpu-node-{i}", 740.0, 2900.0) for i in range(5)]
    reports[3]["probes"][1]["value"] = 520.0
    fleet_links = links({(i, (i + 1) % 5): 40.0 + i for i in range(5)})
    verdict = analyse(reports, fleet_links, ValidateSection())
    document = fleet_document(reports, fleet_links, verdict, ValidateSection())
    console = Console(file=io.StringIO(), width=80, color_system=None)
    render_fleet(document, console)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert all(len(line) <= 80 for line in text.splitlines()) and "…" not in text, text
    flowing = " ".join(text.split())
    for node in document["nodes"]:
        assert node["host"] in text
        assert f"{node['local']['pass']}/{node['local']['warn']}/{node['local']['fail']}" in text
    for link in document["links"]:
        assert f"{link['ratio']:.2f}" in text
    assert "GPU 1 GEMM bf16 at 0.70 of the fleet median" in flowing
