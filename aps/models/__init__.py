"""Built-in models and the lookup of a model by name or import path."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from ..errors import ConfigError

#: built-in model names -> "module:Class"
BUILTIN = {
    "word2vec": "aps.models.word2vec.model:Word2Vec",
    "ctr_dnn": "aps.models.ctr_dnn.model:CtrDnn",
    "wide_deep": "aps.models.wide_deep.model:WideDeep",
}


def load_model_class(name: str) -> type:
    """``word2vec``, ``package.module:Class`` or ``path/to/file.py:Class``.

    A file's directory is put on ``sys.path`` so that spawned worker processes can import the
    model's module too.
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
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import model module {module_name!r}: {exc}") from exc
    cls = getattr(module, class_name, None)
    if cls is None:
        raise ConfigError(f"module {module_name!r} has no class {class_name!r}")
    return cls  # type: ignore[no-any-return]


def parse_model_args(pairs: list[str]) -> dict[str, Any]:
    """``key=value`` strings to keyword arguments; values read as int, float, bool or text."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.isidentifier():
            raise ConfigError(f"model argument must be key=value, got {pair!r}")
        out[key] = _value(raw)
    return out


def _value(raw: str) -> Any:
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    for convert in (int, float):
        try:
            return convert(raw)
        except ValueError:
            pass
    return raw
