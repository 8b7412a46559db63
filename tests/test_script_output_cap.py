"""A user's script's output is capped per rank (``script/output_cap.py``): the head as it comes,
the tail at the end, and a note between them saying how much was left out. Run in a plain Python
process (the capper is what a script cell's rank starts first; no torch needed)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from torchscale.script.output_cap import LIMIT_ENV, limits

REPO = Path(__file__).resolve().parents[1]
CHATTY = """
import sys
from torchscale.script import output_cap
output_cap.start()
for i in range(2000):
    print(f"line {i:04d} " + "x" * 40)
print("a warning on stderr", file=sys.stderr)
raise RuntimeError("the script failed")
"""


def test_a_chatty_failing_script_keeps_its_head_its_tail_and_its_traceback() -> None:
    env = {**os.environ, LIMIT_ENV: "1000:500", "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", CHATTY], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 1
    out = done.stdout
    assert out.startswith("line 0000 ") and len(out) < 1000 + 500 + 300
    note = re.search(
        r"\n\[torchscale: (\d+) bytes of this rank's stdout left out here: the first 1000 and "
        r"the last (\d+) are kept \(TORCHSCALE_SCRIPT_OUTPUT_LIMIT\)\]\n",
        out,
    )
    assert note is not None, out
    total = 2000 * len("line 0000 " + "x" * 40 + "\n")
    assert 1000 + int(note[1]) + int(note[2]) == total  # every byte kept or counted
    tail = out[note.end() :]
    assert tail.startswith("line 1") and tail.endswith("line 1999 " + "x" * 40 + "\n")
    # stderr under its own cap: the failure's traceback, printed at exit, is all there
    assert done.stderr.startswith("a warning on stderr\n")
    assert "RuntimeError: the script failed" in done.stderr and "left out" not in done.stderr


def test_the_limit_reads_head_and_tail() -> None:
    assert limits(None) == (4 << 20, 1 << 20)
    assert limits("1000:500") == (1000, 500)
    assert limits("1000") == (1000, 1 << 20)
    assert limits("lots") == (4 << 20, 1 << 20)
