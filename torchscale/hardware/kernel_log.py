"""XID errors in the kernel log: how the NVIDIA driver reports a GPU fault, since boot.

The driver writes one line per event, ``NVRM: Xid (PCI:0000:3b:00): 79, pid=..., <text>``, to the
kernel ring buffer. ``dmesg`` prints it as ``[  123.456] NVRM: Xid ...`` (or with ``-T`` a date),
``journalctl -k -b`` as ``Mar 05 12:00:01 node kernel: NVRM: Xid ...``; drivers before R450 wrote
the bus id without ``PCI:``. Reading the log needs root where ``kernel.dmesg_restrict`` is 1:
an unreadable log is reported as such (SKIP), never as "no errors".

What each code means and what to do: NVIDIA's XID catalog
(https://docs.nvidia.com/deploy/xid-errors/index.html, the "Resolution Bucket (Immediate
Action)" column). Codes whose action is a GPU reset, a node reboot or the vendor are
``hardware``; codes NVIDIA ascribes to the application (restart it) are ``application``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

XID_LINE = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<bus>[0-9a-fA-F:.]+)\): (?P<code>\d+),\s*(?P<text>.*)$"
)

# code -> (what it is, hardware: True when the fix is a GPU reset, a reboot or an RMA)
XID_CODES: Dict[int, Tuple[str, bool]] = {
    8: ("GPU stopped processing", False),
    13: ("graphics engine exception (usually the application)", False),
    31: ("GPU memory page fault (usually the application)", False),
    32: ("invalid or corrupted push buffer stream", False),
    43: ("GPU stopped processing (the application was stopped)", False),
    45: ("preemptive cleanup after a stopped application", False),
    48: ("double-bit ECC error", True),
    56: ("display engine error", True),
    57: ("error programming video memory interface", True),
    61: ("internal micro-controller breakpoint/warning", True),
    62: ("internal micro-controller halt", True),
    # Recorded, not yet applied: the GPU must be reset (before Ampere: the driver reloaded)
    # for it to take effect, as level 1's pending remap row says. NVIDIA lets other jobs finish
    # first, but a node with a remap pending is not one to benchmark: FAIL, as that row is.
    63: ("row remap / page retirement recorded (reset the GPU to apply it)", True),
    64: ("row remap / page retirement failed", True),
    68: ("video decoder (NVDEC) exception", False),
    69: ("graphics engine class error", False),
    74: ("NVLink error", True),
    79: ("GPU has fallen off the bus", True),
    92: ("high single-bit ECC error rate", False),
    94: ("contained ECC error (the application must restart)", False),
    95: ("uncontained ECC error", True),
    109: ("context switch timeout", False),
    119: ("GSP RPC timeout", True),
    120: ("GSP error", True),
    121: ("C2C link corrected error", False),
    140: ("unrecovered ECC error", True),
    143: ("GPU initialization failure", True),
    154: ("GPU recovery action changed: the GPU needs a reset or the node a reboot", True),
}
CATALOG = "https://docs.nvidia.com/deploy/xid-errors/index.html"


@dataclass(frozen=True)
class XidEvent:
    """One XID line: which GPU (PCI bus id as the driver prints it), which code, the text."""

    bus_id: str
    code: int
    text: str

    @property
    def meaning(self) -> str:
        known = XID_CODES.get(self.code)
        return known[0] if known else "not in torchscale's table: look it up in NVIDIA's catalog"

    @property
    def hardware(self) -> bool:
        """Whether the fix is outside the application (reset, reboot, RMA). Unknown codes count
        as hardware: a code nobody explained is not to be ignored."""
        known = XID_CODES.get(self.code)
        return known[1] if known else True


def parse_xids(lines: Sequence[str]) -> List[XidEvent]:
    """Every XID event in kernel-log lines of any of the formats above, in order."""
    events = []
    for line in lines:
        match = XID_LINE.search(line.rstrip("\n"))
        if match:
            bus = match.group("bus").lower()
            events.append(XidEvent(bus, int(match.group("code")), match.group("text").strip()))
    return events


@dataclass(frozen=True)
class KernelLog:
    """The kernel log since boot, or why it could not be read."""

    lines: Optional[List[str]]
    source: str  # the command that produced it
    error: Optional[str] = None


LOG_COMMANDS: Tuple[Tuple[str, ...], ...] = (
    ("dmesg",),  # the ring buffer: everything since boot unless it wrapped
    ("journalctl", "-k", "-b", "--no-pager", "-o", "short"),  # survives a wrapped ring buffer
)


def read_kernel_log(timeout_s: float = 10.0) -> KernelLog:
    """The first of ``dmesg`` / ``journalctl -k -b`` that answers with lines."""
    errors = []
    for command in LOG_COMMANDS:
        if shutil.which(command[0]) is None:
            errors.append(f"{command[0]}: not installed")
            continue
        try:
            done = subprocess.run(
                list(command), capture_output=True, text=True, errors="replace", timeout=timeout_s
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            errors.append(f"{command[0]}: {type(exc).__name__}")
            continue
        lines = done.stdout.splitlines()
        journal_empty = command[0] == "journalctl" and all(ln.startswith("--") for ln in lines)
        if done.returncode == 0 and lines and not journal_empty:
            return KernelLog(lines, " ".join(command))
        reason = (done.stderr.strip().splitlines() or ["no lines"])[-1]
        errors.append(f"{command[0]}: {reason[:160]}")
    return KernelLog(None, "dmesg, journalctl -k -b", "; ".join(errors))
