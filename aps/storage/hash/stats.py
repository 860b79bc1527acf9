"""A hash table's per-key statistics: the two record layouts, what a push writes in them, and
how checkpoints carry them from one layout to the other.

Why two. The full record (24 bytes, the default) keeps everything a shard's rules read: show,
click and delta score (float32), and the day (int32) and step (int64) of the key's last push.
The CTR accessor (Paddle's CtrCommonAccessor) needs show, click, delta score and unseen days;
the last step serves only a shrink's TTL in steps. ``HashTable(stats="compact")`` keeps those
in 16 bytes: show, click and delta score as before, the last day in 16 bits, and no last step
(its field stays, two bytes of zeros, as the disk tier reads records by field), so a shrink
given a TTL in steps is refused.

Why not narrower floats. Show and click are counts that shrinks decay: float16 stops counting
at 2,048 (2,048 + 1 rounds back to 2,048), and a popular key decayed from 2,048 rather than from
its true count is deleted sooner after it goes quiet. The delta score decides which keys a delta
save writes: rounded to float16, two shows' 0.1 each sum to 0.19995, under a threshold of 0.2
that float32's sum reaches. Those decisions would move; 8 bytes of days and steps need not.

Days in 16 bits. A compact record keeps its last day modulo 2^16, and a key is unseen for
``(day - last_day) mod 2^16`` days. The day moves only at shrinks, and each shrink walks every
row (:func:`~.evict.decay_and_judge`; the disk tier's cold rows too) and pins an age past
:data:`PIN_DAYS` (2^15) to it. With a shrink's ``days`` and the table's ``ttl_days`` at most
2^15 - 1 (the spec's MAX_COMPACT_DAYS), an age never reaches 2^16 between two shrinks, and a
pinned key is unseen for more than any ``ttl_days``: every shrink deletes the keys it deletes
with int32 days. What is lost is how long past 2^15 days (90 years of daily shrinks) a key went
unseen: a checkpoint saves it as last seen 2^15 days before the save.

Checkpoints. Files written from RAM hold the full layout's dtypes whatever the table keeps
(:func:`as_full`: int32 days, int64 steps; a compact table's keys as pushed at the save's step),
so any table loads them; a load converts to the table's layout (:func:`as_layout`), and reads
files of either layout (the disk tier writes its rows as they are).
"""

from __future__ import annotations

import numpy as np

from ...specs import HashTable

#: the default record: everything (24 bytes, unpadded; a push writes all five fields at once)
STATS = np.dtype([("show", np.float32), ("click", np.float32), ("delta_score", np.float32),
                  ("last_day", np.int32), ("last_step", np.int64)])
#: ``stats="compact"``: what the CTR accessor needs (16 bytes): days modulo 2^16, no last step
COMPACT_STATS = np.dtype([("show", np.float32), ("click", np.float32), ("delta_score", np.float32),
                          ("last_day", np.uint16), ("last_step", np.uint16)])
#: a compact record's unseen days are pinned here when a shrink finds more (the module's note)
PIN_DAYS = 1 << 15
_DAYS_MOD = 1 << 16


def stats_dtype(spec: HashTable) -> np.dtype:
    """The record a table's keys keep (``spec.stats``)."""
    return COMPACT_STATS if spec.stats == "compact" else STATS


def compact(dtype: np.dtype) -> bool:
    """True for the compact layout (days modulo 2^16, no last step)."""
    return dtype["last_day"] == np.uint16


def stamp(dtype: np.dtype, step: int, day: int) -> tuple[int, int]:
    """What a push writes as a key's (last step, last day): the shard's step and day, or for
    the compact layout no step and the day modulo 2^16."""
    return (0, day % _DAYS_MOD) if compact(dtype) else (step, day)


def as_full(last_day: np.ndarray, last_step: np.ndarray, day: int, step: int) -> tuple[np.ndarray, np.ndarray]:
    """Last days and steps of either layout as the full layout's int32 days and int64 steps,
    for keys saved at ``day`` and ``step``: 16-bit days are read modulo 2^16 back from ``day``,
    and a compact record's (absent) last step is ``step``, as if pushed at the save. Arrays of
    other dtypes come back as they are (a reader refuses them)."""
    if last_day.dtype == np.uint16:
        last_day = (day - ((day - last_day.astype(np.int64)) % _DAYS_MOD)).astype(np.int32)
    if last_step.dtype == np.uint16:
        last_step = np.full(last_step.shape, step, np.int64)
    return last_day, last_step


def as_layout(dtype: np.dtype, last_day: np.ndarray, last_step: np.ndarray, day: int) -> tuple[np.ndarray, np.ndarray]:
    """The full layout's last days and steps as ``dtype`` keeps them, for a shard at ``day``:
    for the compact layout, days unseen past :data:`PIN_DAYS` pinned to it, modulo 2^16, and
    no step."""
    if not compact(dtype):
        return last_day, last_step
    days = np.maximum(last_day.astype(np.int64), day - PIN_DAYS) % _DAYS_MOD
    return days.astype(np.uint16), np.zeros(last_step.shape, np.uint16)
