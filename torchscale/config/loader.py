"""Load a benchmark YAML, apply command-line overrides, and explain every error in one line."""

from __future__ import annotations

from difflib import get_close_matches
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Type, get_args

import yaml
from pydantic import BaseModel, ValidationError

from torchscale.config.schema import BenchmarkConfig
from torchscale.errors import ConfigError

Override = Tuple[List[str], Any]


def parse_overrides(sets: Sequence[str], extra_args: Sequence[str] = ()) -> List[Override]:
    """``--set a.b=v`` values and seed-style ``--a.b=v`` / ``--a.b v`` extra arguments.

    Values are parsed as YAML, so ``50`` is a number, ``true`` a bool and ``[1, 2]`` a sweep.
    """
    pairs: List[str] = list(sets)
    args = list(extra_args)
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or len(arg) <= 2:
            raise ConfigError(
                f"unexpected argument '{arg}': overrides look like --set key=value or --key=value"
            )
        if "=" in arg:
            pairs.append(arg[2:])
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            pairs.append(f"{arg[2:]}={args[i + 1]}")
            i += 1
        else:
            raise ConfigError(f"override '{arg}' has no value: write {arg}=VALUE")
        i += 1
    overrides = []
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override '{pair}' is not key=value (e.g. ddp.bucket_cap_mb=50)")
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            value = raw
        overrides.append(([part.replace("-", "_") for part in key.strip().split(".")], value))
    return overrides


def apply_overrides(raw: Dict[str, Any], overrides: Sequence[Override]) -> Dict[str, Any]:
    for path, value in overrides:
        node = raw
        for part in path[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = node[part] = {}
            node = child
        node[path[-1]] = value
    return raw


def read_yaml(path: Path) -> Dict[str, Any]:
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist; pass --config PATH to a YAML file")
    if not path.is_file():
        raise ConfigError(f"config path {path} is not a file; pass --config PATH to a YAML file")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path} is not valid YAML{where}: {problem}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config {path}: {exc}") from None
    if data is None:
        raise ConfigError(f"{path} is empty; see benchmark_config.yaml for an example")
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must be a YAML mapping of keys to values, not a list or scalar")
    return data


def load_config(
    path: Optional[Path],
    overrides: Sequence[Override] = (),
    *,
    base: Optional[Dict[str, Any]] = None,
) -> BenchmarkConfig:
    """Read, override and validate a config; ``base`` replaces the file (used by ``profile``)."""
    raw = read_yaml(path) if path is not None else dict(base or {})
    apply_overrides(raw, overrides)
    if path is not None:
        raw.setdefault("experiment_name", path.stem)
    source = str(path) if path is not None else "the options given"
    try:
        return BenchmarkConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"invalid config in {source}: {explain(exc, raw)}") from None


def _field_names(model: Type[BaseModel], loc: Sequence[Any]) -> List[str]:
    """The keys allowed at ``loc`` (a path of section names) in ``model``."""
    for part in loc:
        field = model.model_fields.get(str(part))
        section = _section_model(field.annotation) if field else None
        if section is None:
            return []
        model = section
    return list(model.model_fields)


def _section_model(annotation: Any) -> Optional[Type[BaseModel]]:
    """The section model of a field typed ``Section`` or ``Optional[Section]``."""
    for candidate in (annotation, *get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _format_loc(loc: Sequence[Any], raw: Dict[str, Any]) -> str:
    text, node = "", raw
    for part in loc:
        if isinstance(part, int):
            # Only show the index when the user wrote a list (scalars are wrapped internally).
            text += f"[{part}]" if isinstance(node, list) else ""
            node = node[part] if isinstance(node, list) and part < len(node) else None
        else:
            text += f".{part}" if text else str(part)
            node = node.get(part) if isinstance(node, dict) else None
    return text


def explain(exc: ValidationError, raw: Dict[str, Any]) -> str:
    """All of pydantic's errors as one line, with did-you-mean for unknown keys."""
    messages = []
    for error in exc.errors():
        loc = [part for part in error["loc"] if part not in ("function-after",)]
        where = _format_loc(loc, raw)
        if error["type"] == "extra_forbidden":
            allowed = _field_names(BenchmarkConfig, loc[:-1])
            close = get_close_matches(str(loc[-1]), allowed, n=1, cutoff=0.6)
            hint = (
                f" (did you mean '{'.'.join(map(str, [*loc[:-1], close[0]]))}'?)" if close else ""
            )
            messages.append(f"unknown key '{where}'{hint}")
            continue
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "missing":
            messages.append(f"'{where}' is required")
        elif where and isinstance(error.get("input"), dict):
            messages.append(f"{where}: {message}")  # a section-wide rule: the section is no clue
        elif where:
            messages.append(f"{where}: {message} (got {error.get('input')!r})")
        else:
            messages.append(message)
    return "; ".join(messages)
