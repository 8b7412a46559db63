"""Code, comments and docs say what they mean, not a number from our own tracker: an outside
contributor cannot know what an issue number or a seed number stands for. docs/seeds.md alone
maps each seed (the TorchScale README, distributed_benchmarks, DDLB, the Distributed Training
Profiler, the GPU Training Benchmark Suite) to its number. Other projects' issues
(``pytorch/pytorch#162338``) are links a reader can follow, and stay.

A static walk of the text files (no imports, no launches).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable, Iterator, List

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("torchscale", "tests", "benchmarks", "examples", "docs", "README.md", "CONTRIBUTING.md")
EXEMPT = {"docs/seeds.md"}  # the one map from seed numbers to seed names
RECORDED = "tests/data"  # other tools' outputs, kept byte for byte
SKIPPED_DIRS = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"}

ISSUE = re.compile(r"\b[Ii]ssues? ?#?[0-9]+|(?<![\w/])\(#[0-9]+\)")
SEED = re.compile(r"\bseeds?[ _-]?00[0-9]", re.IGNORECASE)


def _text_files(root: Path = ROOT) -> Iterator[Path]:
    for name in SCANNED:
        top = root / name
        paths = [top] if top.is_file() else sorted(top.rglob("*"))
        for path in paths:
            relative = path.relative_to(root)
            if not path.is_file() or relative.as_posix() in EXEMPT:
                continue
            if relative.as_posix().startswith(RECORDED + "/"):
                continue
            if SKIPPED_DIRS.intersection(relative.parts):
                continue
            yield path


def _violations(paths: Iterable[Path], root: Path = ROOT) -> List[str]:
    found = []
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # binary: a recorded SQLite file, an image
        if "\0" in text:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if ISSUE.search(line) or SEED.search(line):
                found.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    return found


def test_no_issue_or_seed_numbers_outside_docs_seeds_md() -> None:
    files = list(_text_files())
    names = {path.relative_to(ROOT).as_posix() for path in files}
    # the walk reaches every kind of file it guards, and leaves out the exempt ones
    assert {"README.md", "CONTRIBUTING.md", "docs/report.md", "tests/test_config.py"} <= names
    assert "torchscale/config/foreign_layouts.py" in names
    assert "docs/seeds.md" not in names and "docs/PERFORMANCE.md" in names
    assert _violations(files) == [], "say what is meant instead of the number (docs/seeds.md)"


def test_a_planted_number_is_found(tmp_path: Path) -> None:
    # assembled here so that this file itself holds no number the check would find
    issue, seed = "iss" + "ue", "se" + "ed"
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "seeds.md").write_text(f"## 004: {seed} {'0'}04 maps here\n")
    (tmp_path / "torchscale").mkdir()
    (tmp_path / "torchscale" / "planted.py").write_text(
        "x = 1\n"
        f"# bounded memory ({issue} 32: analysis memory)\n"
        f"# pytorch/pytorch#162338 and allenai/OLMo#762 stay\n"
        f'"""{seed.capitalize()} {"0"}03\'s PNG charts"""\n'
        f"CONFIG = '{seed.upper()}_{'0'}04'\n"
        f"# fixed in (#{12})\n"
        f"seed = 0  # {seed}s are drawn from --{seed}\n"
    )
    (tmp_path / "README.md").write_text(f"See {issue.capitalize()}s #24 for more.\n")
    (tmp_path / "tests" / "data").mkdir(parents=True)
    (tmp_path / "tests" / "data" / "recorded.txt").write_text(f"{issue} 7 from another tool\n")
    (tmp_path / "tests" / "blob.bin").write_bytes(b"\xff\xfe\x00 " + f"{issue} 9".encode())

    found = _violations(_text_files(tmp_path), tmp_path)
    assert [line.split(":", 2)[:2] for line in found] == [
        ["torchscale/planted.py", "2"],
        ["torchscale/planted.py", "4"],
        ["torchscale/planted.py", "5"],
        ["torchscale/planted.py", "6"],
        ["README.md", "1"],
    ]
