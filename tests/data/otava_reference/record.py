"""Records Apache Otava 0.8's change points for the history's simulated series, once, as the
reference tests/test_history.py compares with (Otava is not a dependency of torchscale).

    # 1. the series, from the project's virtualenv
    PYTHONPATH=. python tests/data/otava_reference/record.py series > /tmp/series.json
    # 2. Otava in a throwaway virtualenv (pip install 'apache-otava==0.8.*')
    /tmp/otava/bin/python tests/data/otava_reference/record.py otava < /tmp/series.json \
        > tests/data/otava_reference/reference.json
"""

from __future__ import annotations

import json
import sys


def series() -> None:
    import numpy as np

    from tests.test_history import _measured_spread, nightly_series

    planted = {}
    for run in nightly_series(seed=1):
        for point in run.points:
            planted.setdefault(point.series.name + f" x{point.series.gpus}", []).append(point.value)
    rng = np.random.default_rng(21)
    sigma = _measured_spread()
    unchanged = {
        f"unchanged {i}": np.exp(sigma * rng.standard_normal(60)).tolist() for i in range(40)
    }
    json.dump({**planted, **unchanged}, sys.stdout)


def otava() -> None:
    from importlib.metadata import version

    from otava.analysis import compute_change_points

    values = json.load(sys.stdin)
    found = {}
    for name, series in values.items():
        points, _ = compute_change_points(series, window_len=50, max_pvalue=0.001)
        found[name] = [int(point.index) for point in points]
    json.dump(
        {"otava": version("apache-otava"), "window_len": 50, "max_pvalue": 0.001,
         "series": values, "change_points": found},
        sys.stdout, indent=1,
    )  # fmt: skip


if __name__ == "__main__":
    {"series": series, "otava": otava}[sys.argv[1]]()
