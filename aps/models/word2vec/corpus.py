"""What the word2vec model reads from a prepared corpus, and how its settings are checked.

The dictionary (``word count`` lines, line N = id N) gives the vocabulary size and the counts the
negatives are drawn from; prepare_data.py's ``meta.json`` beside it gives the tokens of an epoch
(the linear schedule's clock). Settings arrive as text from ``--model-arg`` and are checked here
into one :class:`~aps.errors.ConfigError` line each.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import ConfigError, DataError


def read_counts(path: Path) -> np.ndarray:
    """The ``count`` column of a ``word count`` dictionary file (line N = id N)."""
    counts = []
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, 1):
            parts = line.split()
            if len(parts) != 2 or not parts[1].isdigit():
                text = line.rstrip().decode("utf-8", "replace")
                raise DataError(f"expected a 'word count' line (a word2vec dictionary), got {text[:60]!r}", str(path), lineno)
            counts.append(int(parts[1]))
    return np.asarray(counts, dtype=np.float64)


def negative_cdf(counts: np.ndarray, power: float = 0.75) -> np.ndarray:
    """Cumulative sampling distribution ``count^power / sum`` (the reference's ``cs``)."""
    weights = np.power(np.asarray(counts, dtype=np.float64), power)
    total = weights.sum()
    if not total > 0:
        raise ConfigError("every word count is zero: cannot sample negatives")
    return np.cumsum(weights / total)


def sample_negatives(cdf: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """Ids for uniforms in [0, 1) by inverse CDF (``cs.searchsorted(u)``), clipped to the vocab
    because the last cumulative value may round to just below 1."""
    ids = np.searchsorted(cdf, uniforms)
    np.minimum(ids, cdf.shape[0] - 1, out=ids)
    return ids.astype(np.int32)


def check_int(name: str, value: Any, low: int = 1) -> int:
    try:
        out = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"word2vec {name} must be an integer, got {value!r}") from None
    if out != float(value) or out < low:
        raise ConfigError(f"word2vec {name} must be an integer >= {low}, got {value!r}")
    return out


def check_float(name: str, value: Any) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"word2vec {name} must be a number, got {value!r}") from None
    if not out > 0 or out != out or out == float("inf"):
        raise ConfigError(f"word2vec {name} must be a positive number, got {value!r}")
    return out


def check_bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"word2vec {name} must be true or false, got {value!r}")


def check_fraction(name: str, value: Any) -> float:
    out = check_float(name, value)
    if out >= 1.0:
        raise ConfigError(f"word2vec {name} must be below 1, got {value!r}")
    return out


def epoch_tokens_of(dict_path: Path, counts: np.ndarray) -> tuple[int, str]:
    """Tokens one epoch trains on, and where that number comes from: prepare_data.py's
    ``meta.json`` beside the dictionary (tokens after its downsampling) when there is one, else
    the sum of the dictionary's ``counts`` (a corpus trained as counted)."""
    meta = dict_path.parent / "meta.json"
    if meta.is_file():
        try:
            tokens = int(json.loads(meta.read_text())["tokens_after_downsampling"])
        except (ValueError, KeyError, TypeError) as exc:
            raise DataError(f"no 'tokens_after_downsampling' number in it ({exc})", str(meta), 1) from None
        return tokens, str(meta)
    return int(counts.sum()), str(dict_path)
