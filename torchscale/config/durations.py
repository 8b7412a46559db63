"""Durations a user types: the one parser behind the duration options (``tune --budget``,
``profile --duration``, ``benchmark --join-timeout``).

A bare number is seconds (``90``, ``2.5``); otherwise one or more parts, each a number and a
unit: ``s``/``sec``/``secs``/``second(s)``, ``m``/``min``/``mins``/``minute(s)``,
``h``/``hr``/``hrs``/``hour(s)``, so ``90s``, ``2min``, ``20m``, ``1h30m``, ``1.5h`` and
``5 minutes`` all parse. Anything else, zero, or more than a year, is one line (exit 2) that
names the option and shows the form.
"""

from __future__ import annotations

import re

from torchscale.errors import ConfigError

UNIT_SECONDS = {
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1.0),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60.0),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), 3600.0),
}
LONGEST_S = 366 * 24 * 3600.0
_NUMBER = r"(\d+(?:\.\d+)?|\.\d+)"
_BARE = re.compile(rf"^\s*{_NUMBER}\s*$")
_PART = re.compile(rf"\s*{_NUMBER}\s*([a-z]+)\s*")


def parse_duration(text: str, option: str, example: str = "90s, 2min or 1h30m") -> float:
    """``text`` in seconds; a ConfigError naming ``option`` when it is not a duration."""
    cleaned = str(text).strip().lower()
    bare = _BARE.match(cleaned)
    if bare:
        seconds = float(bare.group(1))
    else:
        seconds, position = 0.0, 0
        for part in _PART.finditer(cleaned):
            if part.start() != position or part.group(2) not in UNIT_SECONDS:
                break
            seconds += float(part.group(1)) * UNIT_SECONDS[part.group(2)]
            position = part.end()
        if position != len(cleaned) or not cleaned:
            raise ConfigError(
                f"{option} {text!r} is not a duration: write it like {example} "
                "(a bare number is seconds)"
            )
    if not 0 < seconds <= LONGEST_S:
        raise ConfigError(
            f"{option} {text!r} must be more than zero and at most a year, e.g. {example}"
        )
    return seconds
