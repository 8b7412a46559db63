"""Model names -> factories. Listing and checking names never imports torch.

A model is either a built-in name (``resnet50``, ``gpt2``, ...), a user model given as
``"package.module:function"`` (``function(**options)`` returns a :class:`ModelSpec`), or, when
the package is installed, an image classifier from torchvision or timm as ``"torchvision/<arch>"``
or ``"timm/<arch>"`` (random init). Options a factory does not accept (``seq_len`` for an image
model) are not passed to it.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import inspect
import os
import re
import sys
import typing
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, cast

from torchscale.errors import ConfigError
from torchscale.models.spec import ModelSpec

_CUSTOM_MODEL = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_HUB_MODEL = re.compile(r"^(torchvision|timm)/[\w.\-]+$")


@dataclass(frozen=True)
class ModelEntry:
    """A built-in model, described without building it."""

    name: str
    factory: str  # "module:function"
    family: str  # "vision", "masked-lm" or "causal-lm"
    unit: str
    params: int  # parameter count of the built model
    description: str
    uses_seq_len: bool = False


BUILTIN_MODELS: Dict[str, ModelEntry] = {
    entry.name: entry
    for entry in (
        ModelEntry(
            "resnet50",
            "torchscale.models.resnet:resnet50",
            "vision",
            "images",
            25_557_032,
            "ResNet-50 v1.5, 224x224 ImageNet shapes, 1000 classes",
        ),
        ModelEntry(
            "resnet-tiny",
            "torchscale.models.resnet:resnet_tiny",
            "vision",
            "images",
            511_514,
            "Tiny ResNet: 4 bottlenecks, width 16, 32x32, 10 classes (CPU runs, tests)",
        ),
        ModelEntry(
            "bert-large",
            "torchscale.models.bert:bert_large",
            "masked-lm",
            "sequences",
            335_174_458,
            "BERT-Large, 24 layers, hidden 1024, 16 heads, masked-LM",
            uses_seq_len=True,
        ),
        ModelEntry(
            "bert-tiny",
            "torchscale.models.bert:bert_tiny",
            "masked-lm",
            "sequences",
            59_936,
            "Tiny BERT: 2 layers, hidden 32, vocab 512, seq_len 128 (CPU runs, tests)",
            uses_seq_len=True,
        ),
        ModelEntry(
            "gpt2",
            "torchscale.models.gpt2:gpt2",
            "causal-lm",
            "tokens",
            124_439_808,
            "GPT-2 small, 12 layers, hidden 768, causal LM",
            uses_seq_len=True,
        ),
        ModelEntry(
            "gpt2-medium",
            "torchscale.models.gpt2:gpt2_medium",
            "causal-lm",
            "tokens",
            354_823_168,
            "GPT-2 medium, 24 layers, hidden 1024",
            uses_seq_len=True,
        ),
        ModelEntry(
            "gpt2-large",
            "torchscale.models.gpt2:gpt2_large",
            "causal-lm",
            "tokens",
            774_030_080,
            "GPT-2 large, 36 layers, hidden 1280",
            uses_seq_len=True,
        ),
        ModelEntry(
            "gpt2-xl",
            "torchscale.models.gpt2:gpt2_xl",
            "causal-lm",
            "tokens",
            1_557_611_200,
            "GPT-2 XL, 48 layers, hidden 1600",
            uses_seq_len=True,
        ),
        ModelEntry(
            "gpt2-tiny",
            "torchscale.models.gpt2:gpt2_tiny",
            "causal-lm",
            "tokens",
            165_632,
            "Tiny GPT-2: 2 layers, hidden 64, vocab 512, seq_len 64 (CPU runs, tests)",
            uses_seq_len=True,
        ),
    )
}


def is_custom(name: str) -> bool:
    return bool(_CUSTOM_MODEL.match(name))


def is_hub(name: str) -> bool:
    return bool(_HUB_MODEL.match(name))


def check_model_name(name: str) -> None:
    """Raise ConfigError unless ``name`` is a built-in model, a ``module:function`` path, or a
    ``torchvision/<arch>`` / ``timm/<arch>`` name whose package is installed (checked without
    importing it: the architecture itself is checked when the model loads)."""
    if name in BUILTIN_MODELS or is_custom(name):
        return
    if is_hub(name):
        package = name.partition("/")[0]
        if importlib.util.find_spec(package) is None:
            raise ConfigError(
                f"model '{name}' needs {package}, which is not installed: "
                f"run 'pip install {package}' or pick a built-in model"
            )
        return
    from difflib import get_close_matches

    close = get_close_matches(name, list(BUILTIN_MODELS), n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    raise ConfigError(
        f"unknown model '{name}': {hint}run 'torchscale benchmark --list-models' for the built-in "
        "models, or give your own as 'package.module:function'"
    )


def uses_seq_len(name: str) -> bool:
    """Whether a sequence-length knob changes this model (unknown for custom models: assume yes)."""
    entry = BUILTIN_MODELS.get(name)
    return entry.uses_seq_len if entry else not is_hub(name)


def _import_factory(path: str) -> Callable[..., ModelSpec]:
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # a user module may fail with anything, e.g. a SyntaxError
        raise ConfigError(
            f"model '{path}': cannot import model module '{module_name}' "
            f"({type(exc).__name__}: {exc}): make it importable by the worker processes, e.g. "
            "put its folder on PYTHONPATH"
        ) from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ConfigError(f"model '{path}': module '{module_name}' has no function '{attr}'")
    return cast(Callable[..., ModelSpec], factory)  # the user's factory, as documented


def _factory(name: str) -> Callable[..., ModelSpec]:
    entry = BUILTIN_MODELS.get(name)
    if entry:
        return _import_factory(entry.factory)
    if is_hub(name):
        from torchscale.models.hub import hub_model

        return functools.partial(hub_model, name)
    return _import_factory(name)


def load_model(name: str, **options: Any) -> ModelSpec:
    """Build the ``ModelSpec`` for ``name``, passing only the options its factory accepts."""
    check_model_name(name)
    factory = _factory(name)
    spec = factory(**_call_options(factory, options))
    if not isinstance(spec, ModelSpec):
        raise ConfigError(
            f"model '{name}': factory returned {type(spec).__name__}, "
            "expected a torchscale.models.ModelSpec"
        )
    return spec


def _names_model_spec(annotation: Any) -> bool:
    """Whether a return annotation (a type, a typing form or a string) is a ModelSpec."""
    if isinstance(annotation, str):
        return re.search(r"\bModelSpec\b", annotation) is not None
    if isinstance(annotation, type):
        return issubclass(annotation, ModelSpec)
    return any(_names_model_spec(arg) for arg in typing.get_args(annotation))


def _return_annotation(function: Callable[..., Any]) -> Any:
    """The declared return type: resolved where possible, else as written (a string); None when
    the function declares none."""
    try:
        hints = typing.get_type_hints(function)
    except Exception:  # names imported only for type checking, or a typo in an annotation
        hints = dict(getattr(function, "__annotations__", None) or {})
    return hints.get("return")


def _call_options(factory: Callable[..., Any], options: Dict[str, object]) -> Dict[str, object]:
    """The options ``factory`` accepts (all of them when it takes ``**kwargs``), None left out."""
    params = inspect.signature(factory).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    return {k: v for k, v in options.items() if v is not None and (takes_any or k in params)}


@contextlib.contextmanager
def _worker_import_path() -> Iterator[None]:
    """Import as the workers do: ``python -m torchscale.worker`` has the working folder on
    ``sys.path`` (the ``torchscale`` script does not)."""
    cwd = os.getcwd()
    added = cwd not in sys.path and "" not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        yield
    finally:
        if added and cwd in sys.path:
            sys.path.remove(cwd)


def check_model_factory(name: str, **options: Any) -> None:
    """Check a ``module:function`` model before anything launches: the module imports and the
    function returns a :class:`ModelSpec`, judged by its return annotation, else by calling it
    with ``options`` (a ModelSpec only describes the model: nothing is built until the worker
    calls ``build``). Raises ConfigError with one line naming the entry otherwise."""
    with _worker_import_path():
        factory = _import_factory(name)
    module_name, _, attr = name.partition(":")
    usage = "a function returning a torchscale ModelSpec (see examples/custom_model.py)"
    if inspect.isclass(factory):
        if issubclass(factory, ModelSpec):
            return
        raise ConfigError(f"model '{name}': '{attr}' is a class, not {usage}")
    target = inspect.unwrap(factory.func if isinstance(factory, functools.partial) else factory)
    if not (inspect.isfunction(target) or inspect.ismethod(target)):
        kind = "a built-in function" if inspect.isbuiltin(target) else type(target).__name__
        raise ConfigError(f"model '{name}': '{attr}' in '{module_name}' is {kind}, not {usage}")
    returns = _return_annotation(target)
    if returns is not None:
        if _names_model_spec(returns):
            return
        shown = returns if isinstance(returns, str) else getattr(returns, "__name__", returns)
        raise ConfigError(f"model '{name}': '{attr}' is declared to return {shown}, not {usage}")
    try:
        spec = factory(**_call_options(factory, options))
    except Exception as exc:
        raise ConfigError(
            f"model '{name}': calling {attr}() raised {type(exc).__name__}: {exc}; it must be "
            f"{usage}"
        ) from None
    if not isinstance(spec, ModelSpec):
        raise ConfigError(f"model '{name}': {attr}() returned {type(spec).__name__}, not {usage}")


def check_model_factories(models: Sequence[str], **options: Any) -> None:
    """:func:`check_model_factory` for every ``module:function`` entry of ``models``."""
    for name in dict.fromkeys(models):
        if is_custom(name):
            check_model_factory(name, **options)


def list_models() -> List[ModelEntry]:
    return list(BUILTIN_MODELS.values())


def describe(name: str) -> Optional[ModelEntry]:
    return BUILTIN_MODELS.get(name)
