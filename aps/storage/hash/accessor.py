"""Paddle's CTR accessor rules (``ctr_accessor.h``'s CtrCommonAccessor), all in one place.

A hash table's keys carry shows and clicks (storage/hash/store.py); these rules say what they
mean: a key's score ``nonclk_coeff * (show - click) + click_coeff * click``, the delta score a
push adds (the same formula over what it pushed), which keys a ``base`` save writes (score at
least ``base_threshold``) and a ``delta`` save (delta score at least ``delta_threshold``, reset
for the keys it wrote once the save is in place), and what a shrink does by default (decay shows
and clicks by ``show_click_decay``, delete keys scoring under ``delete_threshold``). The numba
kernels take the coefficients as arguments (:func:`~aps.storage.hash.evict.row_score`); nothing
else states them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...errors import ConfigError
from ...specs import HashTable

#: the save modes: every key, the keys scoring at least base_threshold, the keys whose delta
#: score reached delta_threshold since a base or delta save last wrote them
SAVE_MODES = ("full", "base", "delta")
#: what a base or delta save (an export) writes a hash table's rows as: "stored" (as the table
#: stores its values, with optimizer state and statistics: loadable by a pserver) or "int8"
#: (int8 codes and a float32 scale a row, values only: for serving)
EXPORT_ROWS = ("stored", "int8")


def check_export_rows(rows: str, what: str = "export rows") -> str:
    """``rows`` when it is one of :data:`EXPORT_ROWS`, else a ConfigError naming ``what``."""
    if rows not in EXPORT_ROWS:
        raise ConfigError(f"{what} must be one of {', '.join(EXPORT_ROWS)}, got {rows!r}")
    return rows


@dataclass(frozen=True)
class CtrAccessor:
    """The rules of one hash table (Paddle's defaults; the thresholds are the spec's)."""

    nonclk_coeff: float = 0.1
    click_coeff: float = 1.0
    #: a shrink's default decay of shows and clicks, and the score under which it deletes a key
    show_click_decay: float = 0.98
    delete_threshold: float = 0.8
    base_threshold: float = 1.5
    delta_threshold: float = 0.25

    @classmethod
    def of(cls, spec: HashTable) -> CtrAccessor:
        return cls(base_threshold=spec.base_threshold, delta_threshold=spec.delta_threshold)

    def score(self, show: np.ndarray, click: np.ndarray) -> np.ndarray:
        """Each key's ``(show - click) * nonclk_coeff + click * click_coeff``, in float64."""
        show = show.astype(np.float64)
        click = click.astype(np.float64)
        return self.nonclk_coeff * (show - click) + self.click_coeff * click

    def saved(self, show: np.ndarray, click: np.ndarray, delta_score: np.ndarray, mode: str) -> np.ndarray:
        """Which keys (their shows, clicks and delta scores) a save in ``mode`` writes: a mask."""
        if mode == "full":
            return np.ones(show.shape[0], np.bool_)
        if mode == "base":
            return self.score(show, click) >= self.base_threshold
        if mode == "delta":
            return delta_score >= np.float32(self.delta_threshold)
        raise ConfigError(f"save mode must be one of {', '.join(SAVE_MODES)}, got {mode!r}")

    @staticmethod
    def after_save(delta_score: np.ndarray, rows: np.ndarray) -> None:
        """A base or delta save is in place: what it wrote starts a new delta."""
        delta_score[rows] = 0.0


#: the rules of a table whose spec says nothing else (Paddle's CtrCommonAccessor defaults)
DEFAULT_ACCESSOR = CtrAccessor()


def show_click_score(show: np.ndarray, click: np.ndarray) -> np.ndarray:
    """:meth:`CtrAccessor.score` with Paddle's default coefficients."""
    return DEFAULT_ACCESSOR.score(show, click)
