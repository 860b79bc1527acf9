"""Built-in models and the lookup of a model by name or import path."""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError

if TYPE_CHECKING:  # the runtime import would load the whole trainer package with aps.models
    from ..trainer.model import Model

#: built-in model names -> "module:Class"
BUILTIN = {
    "word2vec": "aps.models.word2vec.model:Word2Vec",
    "ctr_dnn": "aps.models.ctr_dnn.model:CtrDnn",
    "wide_deep": "aps.models.wide_deep.model:WideDeep",
    # aps.torch's zoo (needs the torch extra)
    "deepfm": "aps.torch.zoo.deepfm:build",
    "dcn_v2": "aps.torch.zoo.dcn_v2:build",
    "torch_ctr_dnn": "aps.torch.zoo.ctr_dnn:build",
    "torch_wide_deep": "aps.torch.zoo.wide_deep:build",
    "din": "aps.torch.zoo.din:build",
    "mmoe": "aps.torch.zoo.mmoe:build",
}


def model_module(name: str) -> tuple[str, str]:
    """(module, attribute) of ``word2vec``, ``package.module:Class`` or ``path/to/file.py:Class``,
    without importing anything: what the workers' fork server can start importing while the
    trainer builds the model (aps-trainer starts it first thing).

    A file's directory is put on ``sys.path`` so that the fork server, which imports the model's
    module, finds it too.
    """
    target = BUILTIN.get(name, name)
    module_name, sep, class_name = target.partition(":")
    if not sep or not class_name:
        raise ConfigError(f"unknown model {name!r}: use one of {sorted(BUILTIN)} or module:Class or file.py:Class")
    if module_name.endswith(".py"):
        path = Path(module_name).resolve()
        if not path.exists():
            raise ConfigError(f"model file {path} does not exist")
        if str(path.parent) not in sys.path:
            sys.path.insert(0, str(path.parent))
        module_name = path.stem
    return module_name, class_name


def load_model_class(name: str) -> type:
    """The class or factory ``name`` names (:func:`model_module`), imported."""
    module_name, class_name = model_module(name)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import model module {module_name!r}: {exc}") from exc
    cls = getattr(module, class_name, None)
    if cls is None:
        raise ConfigError(f"module {module_name!r} has no class {class_name!r}")
    return cls  # type: ignore[no-any-return]


def parse_model_args(pairs: Sequence[str]) -> dict[str, Any]:
    """``key=value`` strings to keyword arguments; values read as int, float, bool or text.

    A key given twice keeps its last value, so a wrapper (examples/word2vec/demo.py) can pass
    defaults first and let the user's own ``--model-arg`` override them.
    """
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise ConfigError(f"model argument must be key=value, got {pair!r}")
        out[key] = _value(raw)
    return out


def build_model(model: str | Callable[..., Model], pairs: Sequence[str] = ()) -> Model:
    """The model named by ``--model`` built from ``--model-arg key=value`` strings.

    Checks the arguments against the constructor's signature *before* calling it, so that a
    typo says which argument is unknown and which ones exist, instead of ending the program with
    Python's ``TypeError: __init__() got an unexpected keyword argument``. A missing required
    argument is reported the same way. A ``TypeError``/``ValueError`` the constructor raises
    about a value (a model that simply does ``int(x)``) becomes a :class:`ConfigError` naming
    the argument when the message lets us tell which, and so does an ``OSError`` (a file the model
    opens); a model's own :class:`ConfigError` passes through untouched. Everything is a
    :class:`ConfigError`, so CLIs print one line and exit 2.
    """
    factory = load_model_class(model) if isinstance(model, str) else model
    label = model if isinstance(model, str) else str(getattr(model, "name", None) or getattr(model, "__name__", model))
    if not callable(factory):
        raise ConfigError(f"model {label!r} is not a class (got {type(factory).__name__})")
    kwargs = parse_model_args(pairs)
    _check_signature(factory, label, kwargs)
    try:
        return factory(**kwargs)  # type: ignore[no-any-return]
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        if not kwargs:  # nothing of the user's to blame: a bug in the model, keep the traceback
            raise
        blamed = _blame(str(exc), kwargs)
        what = ", ".join(f"{k}={kwargs[k]!r}" for k in blamed) if blamed else "its arguments"
        raise ConfigError(f"model {label} rejected {what}: {type(exc).__name__}: {exc}") from exc
    except OSError as exc:  # a file the model opens (a path argument, or its default) is missing or unreadable
        raise ConfigError(f"model {label}: {exc}") from exc


def _check_signature(factory: Callable[..., Any], label: str, kwargs: dict[str, Any]) -> None:
    """Unknown or missing keyword arguments of ``factory`` as one ConfigError line."""
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):  # no introspectable signature (C extension): let the call decide
        return
    params = sig.parameters.values()
    named = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    valid = [p.name for p in named]
    listing = ", ".join(valid) if valid else "none"
    if not any(p.kind is p.VAR_KEYWORD for p in params):
        unknown = [k for k in kwargs if k not in valid]
        if unknown:
            hints = [m for k in unknown for m in difflib.get_close_matches(k, valid, n=1)]
            hint = f" (did you mean {', '.join(map(repr, hints))}?)" if hints else ""
            noun = "argument" if len(unknown) == 1 else "arguments"
            raise ConfigError(
                f"unknown model {noun} {', '.join(map(repr, unknown))} for {label}{hint}; valid: {listing}"
            )
    missing = [p.name for p in named if p.default is p.empty and p.name not in kwargs]
    if missing:
        raise ConfigError(
            f"model {label} needs --model-arg {' '.join(m + '=...' for m in missing)}; valid: {listing}"
        )
    positional_only = [p.name for p in params if p.kind is p.POSITIONAL_ONLY and p.default is p.empty]
    if positional_only:
        raise ConfigError(f"model {label} takes positional-only {', '.join(positional_only)}: cannot be set by --model-arg")


def _blame(message: str, kwargs: dict[str, Any]) -> list[str]:
    """The arguments a constructor's error message is about: those it names, else those whose value it quotes."""
    words = set(message.replace("'", " ").replace('"', " ").replace(":", " ").replace(",", " ").split())
    by_name = [k for k in kwargs if k in words]
    if by_name:
        return by_name
    return [k for k, v in kwargs.items() if str(v) and (repr(v) in message or f"'{v}'" in message)]


def _value(raw: str) -> Any:
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    for convert in (int, float):
        try:
            return convert(raw)
        except ValueError:
            pass
    return raw
