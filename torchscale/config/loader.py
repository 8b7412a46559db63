"""Load a benchmark YAML, apply command-line overrides, and explain every error in one line.

Loading is bounded, whatever the file holds: a document larger than ``MAX_CONFIG_BYTES`` is
refused before it is parsed; aliases are counted as they expand (``MAX_NODES`` nodes in all, so a
kilobyte of nested aliases cannot become a billion-element document); a key given twice in one
mapping is an error naming the key and its line; and no message echoes more than
``ECHO_CHARS`` characters of the input.
"""

from __future__ import annotations

import json
import logging
from difflib import get_close_matches
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Type, get_args

import yaml
from pydantic import BaseModel, ValidationError

from torchscale.config.base import ECHO_CHARS, clip
from torchscale.config.foreign_layouts import SeedFlags, adopt_layouts, drop_counterparts
from torchscale.config.kind_sections import config_model, foreign_layouts
from torchscale.config.settings import BenchmarkConfig
from torchscale.config.validate_section import ValidateSection
from torchscale.errors import ConfigError, TorchscaleError

Override = Tuple[List[str], Any]

MAX_CONFIG_BYTES = 1 << 20
"""A benchmark config is a few KB; anything past this is not one."""
MAX_NODES = 100_000
"""Scalars, lists and mappings in a document once every alias is expanded."""
MAX_ERRORS = 5
"""The most validation errors one message lists."""


class BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses duplicate keys and documents that expand too far."""

    def compose_document(self) -> Any:
        node = super().compose_document()
        _check_expansion(node)
        return node

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            seen: Dict[object, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # '<<: *base' then a key of one's own is an override, not a repeat
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:
                    continue  # an unhashable key: the constructor below reports it
                if first is not None:
                    raise yaml.constructor.ConstructorError(
                        None,
                        None,
                        f"duplicate key '{clip(key, 80)}' (first on line {first + 1}); "
                        "the second would silently replace the first: keep one",
                        key_node.start_mark,
                    )
                seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def _check_expansion(root: Any) -> None:
    """Count the nodes of the document as if every alias were copied out; stop at MAX_NODES.

    Sizes are memoised per node, so a shared (aliased) node is measured once: the check itself
    is linear in the size of the file, not of the expansion. A node reached again while it is
    being measured is an alias inside its own anchor: an infinite document.
    """
    if root is None:
        return
    sizes: Dict[int, int] = {}
    stack = [(root, False)]
    open_nodes = set()
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if key in sizes and not children_done:
            continue
        if isinstance(node, yaml.ScalarNode):
            sizes[key] = 1
            continue
        children = (
            [part for pair in node.value for part in pair]
            if isinstance(node, yaml.MappingNode)
            else list(node.value)
        )
        if not children_done:
            if key in open_nodes:
                raise ConfigError(
                    f"an alias refers to its own anchor (line {node.start_mark.line + 1}): "
                    "the document would be infinite"
                )
            open_nodes.add(key)
            stack.append((node, True))
            for child in children:
                if id(child) in open_nodes:
                    raise ConfigError(
                        f"an alias refers to its own anchor (line {child.start_mark.line + 1}): "
                        "the document would be infinite"
                    )
                if id(child) not in sizes:
                    stack.append((child, False))
            continue
        open_nodes.discard(key)
        total = 1 + sum(sizes[id(child)] for child in children)
        if total > MAX_NODES:
            raise ConfigError(
                f"the document expands to more than {MAX_NODES:,} values once its aliases "
                f"are expanded (at line {node.start_mark.line + 1}); a benchmark config needs "
                "far fewer: remove the nested aliases"
            )
        sizes[key] = total


def safe_yaml(text: str) -> Any:
    """``yaml.safe_load`` with :class:`BoundedLoader`'s limits."""
    loader = BoundedLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


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
                f"unexpected argument '{clip(arg)}': overrides look like --set key=value or "
                "--key=value"
            )
        if "=" in arg:
            pairs.append(arg[2:])
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            pairs.append(f"{arg[2:]}={args[i + 1]}")
            i += 1
        else:
            raise ConfigError(f"override '{clip(arg)}' has no value: write {clip(arg)}=VALUE")
        i += 1
    overrides = []
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(
                f"override '{clip(pair)}' is not key=value (e.g. ddp.bucket_cap_mb=50)"
            )
        try:
            value = safe_yaml(raw) if raw.strip() else None
        except yaml.YAMLError:
            value = raw
        overrides.append(([part.replace("-", "_") for part in key.strip().split(".")], value))
    return overrides


def apply_overrides(raw: Dict[str, object], overrides: Sequence[Override]) -> Dict[str, object]:
    for path, value in overrides:
        node = raw
        for part in path[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = node[part] = {}
            node = child
        node[path[-1]] = value
    return raw


def _unique_keys(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
    """A JSON object whose keys are all different (``json``'s ``object_pairs_hook``)."""
    found: Dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise ConfigError(
                f"duplicate key '{clip(key, 80)}': the second would silently replace the first: "
                "keep one"
            )
        found[key] = value
    return found


def _parse(path: Path, text: str) -> Any:
    """A ``.json`` file (DDLB's config.json) as JSON, anything else as YAML."""
    if path.suffix.lower() != ".json":
        return safe_yaml(text)
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{path} is not valid JSON at line {exc.lineno}, column {exc.colno}: {clip(exc.msg)}"
        ) from None


def read_yaml(path: Path) -> Dict[str, object]:
    from torchscale.results.files import read_limited

    if not path.exists():
        raise ConfigError(f"config file {path} does not exist; pass --config PATH to a YAML file")
    if not path.is_file():
        raise ConfigError(f"config path {path} is not a file; pass --config PATH to a YAML file")
    try:
        text = read_limited(path, MAX_CONFIG_BYTES, "benchmark config").decode("utf-8")
        data = _parse(path, text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path} is not valid YAML{where}: {clip(problem)}") from None
    except TorchscaleError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config {path}: {clip(exc)}") from None
    except RecursionError:
        raise ConfigError(f"{path} is nested too deeply to be a benchmark config") from None
    if data is None:
        raise ConfigError(f"{path} is empty; see benchmark_config.yaml for an example")
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must be a YAML mapping of keys to values, not a list or scalar")
    return data


def load_config(
    path: Optional[Path],
    overrides: Sequence[Override] = (),
    *,
    base: Optional[Dict[str, object]] = None,
    flags: Optional[SeedFlags] = None,
) -> BenchmarkConfig:
    """Read, override and validate a config; ``base`` replaces the file (used by ``profile``).

    Other tools' layouts (``config.foreign_layouts``) are read in torchscale's names, each key
    moved said in one line on the log; an override in either spelling replaces the file's value.
    """
    raw = read_yaml(path) if path is not None else dict(base or {})
    layouts = foreign_layouts()
    for keys, _ in overrides:
        drop_counterparts(raw, keys, layouts)
    apply_overrides(raw, overrides)
    notes = adopt_layouts(raw, layouts) + (flags.apply(raw) if flags else [])
    if path is not None:
        raw.setdefault("experiment_name", path.stem)
    source = str(path) if path is not None else "the options given"
    for note in notes:
        logging.getLogger("torchscale").info("%s", note)
    try:
        config: BenchmarkConfig = config_model().model_validate(raw)  # a derived model: Any
    except ValidationError as exc:
        raise ConfigError(f"invalid config in {source}: {explain(exc, raw)}") from None
    _say_aliases(raw, source)
    return config


def _say_aliases(raw: Dict[str, object], source: str) -> None:
    """``precision: fp16`` is read as ``amp`` (fp16 autocast with a gradient scaler, weights
    kept in fp32), not as pure fp16 training: say so, once, rather than silently."""
    values = raw.get("precision")
    given = values if isinstance(values, list) else [values]
    if "fp16" in given:
        logging.getLogger("torchscale").warning(
            "precision fp16 in %s runs as 'amp': fp16 autocast with a gradient scaler and fp32 "
            "weights (pure fp16 training is not offered); records and tables say amp",
            source,
        )


def _field_names(model: Type[BaseModel], loc: Sequence[Any]) -> List[str]:
    """The keys allowed at ``loc`` (a path of section names) in ``model``."""
    for part in loc:
        field = model.model_fields.get(str(part))
        section = _section_model(field.annotation) if field else None
        if section is None:
            return []
        model = section
    return list(model.model_fields)


def _section_model(annotation: object) -> Optional[Type[BaseModel]]:
    """The section model of a field typed ``Section`` or ``Optional[Section]``."""
    for candidate in (annotation, *get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _format_loc(loc: Sequence[Any], raw: Dict[str, object]) -> str:
    text = ""
    node: object = raw
    for part in loc:
        if isinstance(part, int):
            # Only show the index when the user wrote a list (scalars are wrapped internally).
            text += f"[{part}]" if isinstance(node, list) else ""
            node = node[part] if isinstance(node, list) and part < len(node) else None
        else:
            text += f".{part}" if text else str(part)
            node = node.get(part) if isinstance(node, dict) else None
    return text


def explain(exc: ValidationError, raw: Dict[str, object]) -> str:
    """All of pydantic's errors as one line, with did-you-mean for unknown keys; no part quotes
    more than ``ECHO_CHARS`` characters of the input, and at most ``MAX_ERRORS`` are listed."""
    messages = []
    errors = exc.errors()
    for error in errors[:MAX_ERRORS]:
        loc = [part for part in error["loc"] if part not in ("function-after",)]
        where = clip(_format_loc(loc, raw))
        if error["type"] == "extra_forbidden":
            allowed = _field_names(config_model(), loc[:-1])
            close = get_close_matches(str(loc[-1])[:ECHO_CHARS], allowed, n=1, cutoff=0.6)
            hint = (
                f" (did you mean '{'.'.join(map(str, [*loc[:-1], close[0]]))}'?)" if close else ""
            )
            messages.append(f"unknown key '{where}'{hint}")
            continue
        message = clip(error["msg"].removeprefix("Value error, "), 2 * ECHO_CHARS)
        if error["type"] == "missing":
            messages.append(f"'{where}' is required")
        elif where and isinstance(error.get("input"), dict):
            messages.append(f"{where}: {message}")  # a section-wide rule: the section is no clue
        elif where:
            messages.append(f"{where}: {message} (got {_echo(error.get('input'))})")
        else:
            messages.append(message)
    if len(errors) > MAX_ERRORS:
        messages.append(f"and {len(errors) - MAX_ERRORS} more error(s)")
    return "; ".join(messages)


def _echo(value: object) -> str:
    """``repr(value)``, cut to ``ECHO_CHARS`` without building the whole of a huge value."""
    import reprlib

    short = reprlib.Repr()
    short.maxstring = short.maxother = ECHO_CHARS
    short.maxlist = short.maxdict = short.maxtuple = short.maxset = 10
    short.maxlevel = 3
    return clip(short.repr(value))


class ValidationOnly(BaseModel):
    """The one section ``torchscale validate`` reads; everything else in the file is ignored."""

    validation: ValidateSection


def load_validation(path: Optional[Path], overrides: Sequence[Override] = ()) -> ValidateSection:
    """The ``validation:`` section of a config file (the rest of the file is not read as a
    benchmark: a file holding only this section is fine), with ``--set validation.x=...``."""
    raw = read_yaml(path) if path is not None else {}
    apply_overrides(raw, overrides)
    section = raw.get("validation")
    wrapped = {"validation": section if section is not None else {}}
    source = str(path) if path is not None else "the options given"
    try:
        return ValidationOnly.model_validate(wrapped).validation
    except ValidationError as exc:
        raise ConfigError(f"invalid config in {source}: {explain(exc, wrapped)}") from None
