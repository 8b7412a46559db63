"""Read a PDF report back with poppler: text per page, PNG per page, and how much a page shows."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import List, Tuple

import numpy as np
import pytest
from PIL import Image

needs_poppler = pytest.mark.skipif(
    not (shutil.which("pdftoppm") and shutil.which("pdftotext")),
    reason="poppler-utils is not installed (Debian: apt-get install poppler-utils)",
)


def pages_text(pdf: Path) -> List[str]:
    text = subprocess.run(
        ["pdftotext", str(pdf), "-"], capture_output=True, text=True, check=True
    ).stdout
    return text.split("\f")[:-1]


def pages_png(pdf: Path) -> List[Path]:
    prefix = pdf.with_suffix("")
    subprocess.run(["pdftoppm", "-png", "-r", "50", str(pdf), str(prefix)], check=True)
    return sorted(pdf.parent.glob(f"{prefix.name}-*.png"))


def ink(png: Path) -> Tuple[float, float]:
    """(spread of grey levels, share of coloured pixels) of a page; a white page has (0, 0).
    Coloured means series colours, not black text."""
    image = Image.open(png)
    gray = np.asarray(image.convert("L"), dtype=float)
    hsv = np.asarray(image.convert("HSV"), dtype=float)
    coloured = (hsv[..., 1] > 80) & (hsv[..., 2] > 60)
    return float(gray.std()), float(coloured.mean())
