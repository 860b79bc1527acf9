"""Lines with several labels and list columns: the Criteo layout widened for a user's own network.

A line is tab-separated: ``labels`` label fields (``0`` or ``1``), ``dense`` integer fields, ``slots``
categorical fields (one value each), then one field per *list column*: zero or more values joined
by the column's separator (a user's genres, a behaviour sequence of item ids). With one label and
no list columns this is exactly the Criteo layout of :mod:`aps.models.criteo`, hashed the same way.

``meta.json`` says which: the Criteo fields (``dense``, ``slots``, ``cont_min``, ``cont_diff``,
``buckets``) and

* ``labels`` (default 1): label fields at the start of each line (several tasks);
* ``lists`` (default none): ``[{"name": "hist_items", "max_len": 50, "shares": 3, "separator": ","}]``
  in the order of their fields; ``max_len`` bounds a line's values (a longer list is a bad line, not
  truncated silently); ``shares`` (optional) is the index of a slot whose values the list holds:
  they are hashed as that slot's, so a history of items and the candidate item find the same
  embedding row (DIN's attention needs it); ``separator`` one ASCII byte (default ``,``).

:meth:`TabularFormat.parse` walks a chunk's bytes once in a numba kernel (no Python per line) and
raises :class:`~aps.errors.DataError` with the file, the line and the field for a bad line, or skips
and counts it with ``skip_bad_lines``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numba import njit

from ..errors import ConfigError, DataError
from ..trainer.reader import Chunk
from .criteo import _U64_PRIME, CriteoFormat, _shorten, fnv1a64

_NL, _TAB, _CR = 10, 9, 13
_INT64_MAX = np.int64(0x7FFFFFFFFFFFFFFF)

_OK, _BAD_LABEL, _BAD_DENSE, _DENSE_RANGE, _FIELD_COUNT, _EMPTY_LINE, _TOO_MANY_LINES, _LIST_TOO_LONG, _EMPTY_VALUE = range(9)

#: the largest max_len a list column may declare
MAX_LIST_LEN = 1 << 16


@njit(cache=True, nogil=True)
def _hash(buf, s, e, h, buckets):
    for p in range(s, e):
        h = (h ^ np.uint64(buf[p])) * _U64_PRIME
    return np.int64(h) if buckets == 0 else np.int64(h % buckets)


@njit(cache=True, nogil=True)
def _parse(buf, n_labels, n_dense, n_slots, cont_min, cont_diff, prefix, list_prefix, list_max, list_sep, buckets,
           skip_bad, labels, dense, ids, values, counts):
    """Every line of ``buf`` into ``labels[i, :]``, ``dense[i, :]``, ``ids[i, :]``, its list
    values appended to ``values`` and their number per column in ``counts[i, :]``.

    Returns (good lines, bad lines, values written, error code, line index of the error, field
    of the error (or the line's field count), byte offset of the line)."""
    n = buf.shape[0]
    cap = labels.shape[0]
    n_lists = list_max.shape[0]
    n_fields = n_labels + n_dense + n_slots + n_lists
    starts = np.empty(n_fields + 1, np.int64)
    ends = np.empty(n_fields + 1, np.int64)
    pos = 0
    line = 0
    good = 0
    bad = 0
    nv = 0
    while pos < n:
        start = pos
        if good >= cap:
            return good, bad, nv, _TOO_MANY_LINES, line, -1, start
        # the fields' byte ranges, tab-separated, up to the newline (a '\r' before it dropped)
        eol = pos
        while eol < n and buf[eol] != _NL:
            eol += 1
        end = eol - 1 if eol > start and buf[eol - 1] == _CR else eol
        k = 0
        s = start
        for p in range(start, end):
            if buf[p] == _TAB:
                if k < n_fields:
                    starts[k] = s
                    ends[k] = p
                k += 1
                s = p + 1
        if k < n_fields:
            starts[k] = s
            ends[k] = end
        k += 1
        err = _OK
        err_field = 0
        line_nv = nv
        if end == start:
            err = _EMPTY_LINE
        elif k != n_fields:
            err = _FIELD_COUNT
            err_field = k
        f = 0
        for j in range(n_labels):
            if err != _OK:
                break
            s, e = starts[f], ends[f]
            if e - s != 1 or (buf[s] != 48 and buf[s] != 49):
                err = _BAD_LABEL
                err_field = f
            else:
                labels[good, j] = float(buf[s] - 48)
            f += 1
        for i in range(n_dense):
            if err != _OK:
                break
            s, e = starts[f], ends[f]
            if s == e:
                dense[good, i] = 0.0
                f += 1
                continue
            neg = buf[s] == 45
            if buf[s] == 45 or buf[s] == 43:
                s += 1
            if s == e:
                err = _BAD_DENSE
                err_field = f
                break
            value = np.int64(0)
            for p in range(s, e):
                d = np.int64(buf[p]) - 48
                if d < 0 or d > 9:
                    err = _BAD_DENSE
                    break
                if value > (_INT64_MAX - d) // 10:
                    err = _DENSE_RANGE
                    break
                value = value * 10 + d
            if err != _OK:
                err_field = f
                break
            x = float(-value if neg else value)
            dense[good, i] = np.float32((x - cont_min[i]) / cont_diff[i])
            f += 1
        for j in range(n_slots):
            if err != _OK:
                break
            ids[good, j] = _hash(buf, starts[f], ends[f], prefix[j], buckets)
            f += 1
        for j in range(n_lists):
            if err != _OK:
                break
            s, e = starts[f], ends[f]
            c = 0
            if e > s:
                v = s
                for p in range(s, e + 1):
                    if p == e or buf[p] == list_sep[j]:
                        if p == v:
                            err = _EMPTY_VALUE
                            break
                        if c == list_max[j]:
                            err = _LIST_TOO_LONG
                            break
                        if nv >= values.shape[0]:
                            return good, bad, nv, _TOO_MANY_LINES, line, -1, start
                        values[nv] = _hash(buf, v, p, list_prefix[j], buckets)
                        nv += 1
                        c += 1
                        v = p + 1
            if err != _OK:
                err_field = f
                break
            counts[good, j] = c
            f += 1
        if err != _OK:
            if not skip_bad:
                return good, bad, nv, err, line, err_field, start
            bad += 1
            nv = line_nv
        else:
            good += 1
        pos = eol + 1
        line += 1
    return good, bad, nv, _OK, -1, -1, -1


@dataclass(frozen=True)
class ListColumn:
    """One list column of a :class:`TabularFormat` (see the module docstring)."""

    name: str
    max_len: int
    shares: int | None = None
    separator: str = ","


@dataclass
class TabularRecords:
    """The good lines of one chunk: ``labels`` float32 [n, labels], ``dense`` float32 [n, dense],
    ``ids`` int64 [n, slots], and per list column ``j`` line ``i``'s values
    ``values[offsets[i, j] : offsets[i, j] + counts[i, j]]`` (a line's lists are stored in column order)."""

    labels: np.ndarray
    dense: np.ndarray
    ids: np.ndarray
    values: np.ndarray
    counts: np.ndarray
    bad_lines: int

    @property
    def n(self) -> int:
        return int(self.labels.shape[0])

    @property
    def offsets(self) -> np.ndarray:
        """int64 [n, lists]: where each line's list ``j`` starts in ``values``."""
        flat = np.zeros(self.counts.size + 1, np.int64)
        np.cumsum(self.counts.reshape(-1), out=flat[1:])
        return flat[:-1].reshape(self.counts.shape)


class TabularFormat:
    """Columns of a tabular file (labels, dense, slots, lists) and their hashing; :meth:`parse` reads a chunk."""

    def __init__(self, base: CriteoFormat, labels: int = 1, lists: tuple[ListColumn, ...] = ()) -> None:
        if isinstance(labels, bool) or not isinstance(labels, int) or not 1 <= labels <= 64:
            raise ConfigError(f"labels must be an integer in 1..64, got {labels!r}")
        names = [c.name for c in lists]
        if len(set(names)) != len(names):
            raise ConfigError(f"lists: two list columns share a name ({', '.join(names)})")
        self.base = base
        self.labels = labels
        self.lists = tuple(lists)
        first_list = labels + base.dense + base.slots
        self._prefix = np.array([fnv1a64(str(labels + base.dense + k).encode()) for k in range(base.slots)], np.uint64)
        # a list sharing slot k is hashed as that slot's field; any other as its own field
        self._list_prefix = np.array(
            [self._prefix[c.shares] if c.shares is not None else fnv1a64(str(first_list + j).encode())
             for j, c in enumerate(lists)], np.uint64)
        self._list_max = np.array([c.max_len for c in lists], np.int64)
        self._list_sep = np.array([ord(c.separator) for c in lists], np.uint8)

    @property
    def dense(self) -> int:
        return self.base.dense

    @property
    def slots(self) -> int:
        return self.base.slots

    @property
    def buckets(self) -> int:
        return self.base.buckets

    @property
    def fields(self) -> int:
        return self.labels + self.dense + self.slots + len(self.lists)

    @property
    def is_criteo(self) -> bool:
        """One label and no lists: the Criteo layout, read by its own (faster) reader."""
        return self.labels == 1 and not self.lists

    @classmethod
    def from_meta(cls, path: str | Path) -> TabularFormat:
        """The Criteo fields of ``meta.json`` (:meth:`CriteoFormat.from_meta`) plus ``labels`` and ``lists``."""
        base = CriteoFormat.from_meta(path)
        meta = json.loads(Path(path).read_text(encoding="utf-8"))
        where = str(path)
        try:
            return cls(base, meta.get("labels", 1), tuple(_list_column(c, base.slots) for c in meta.get("lists", [])))
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None

    def parse(self, chunk: Chunk, skip_bad_lines: bool = False, full_keys: bool = False) -> TabularRecords:
        """Parse ``chunk`` (``full_keys``: keys are the full 64-bit hashes, for hash tables)."""
        buf = np.frombuffer(chunk.data, dtype=np.uint8)
        lines = chunk.lines
        labels = np.empty((lines, self.labels), np.float32)
        dense = np.empty((lines, self.dense), np.float32)
        ids = np.empty((lines, self.slots), np.int64)
        counts = np.zeros((lines, len(self.lists)), np.int64)
        values = np.empty(len(chunk.data) // 2 + 1 if self.lists else 0, np.int64)
        good, bad, nv, err, err_line, err_field, err_pos = _parse(
            buf, self.labels, self.dense, self.slots, self.base._min, self.base._diff, self._prefix, self._list_prefix,
            self._list_max, self._list_sep, np.uint64(0 if full_keys else self.buckets), bool(skip_bad_lines),
            labels, dense, ids, values, counts,
        )
        if err != _OK:
            raise DataError(self._message(chunk, err, err_field, err_pos), chunk.file, chunk.first_line + err_line)
        return TabularRecords(labels[:good], dense[:good], ids[:good], values[:nv], counts[:good], bad)

    def _message(self, chunk: Chunk, err: int, field_index: int, pos: int) -> str:
        """Describe the bad line at byte ``pos`` (built here, off the hot path)."""
        if err == _TOO_MANY_LINES:
            return f"chunk holds more lines than its line count ({chunk.lines}) says"
        layout = (f"{self.fields} tab-separated fields ({self.labels} label, {self.dense} dense, {self.slots} categorical, "
                  f"{len(self.lists)} list)")
        if err == _EMPTY_LINE:
            return f"empty line, expected {layout}"
        if err == _FIELD_COUNT:
            return f"line has {field_index} fields, expected {layout}"
        end = chunk.data.find(b"\n", pos)
        raw = chunk.data[pos : len(chunk.data) if end < 0 else end].rstrip(b"\r")
        token = _shorten(raw.split(b"\t")[field_index])
        if err == _BAD_LABEL:
            return f"label is not 0 or 1: {token!r} (field {field_index})"
        if err in (_BAD_DENSE, _DENSE_RANGE):
            what = "is out of the int64 range" if err == _DENSE_RANGE else "is not an integer"
            return f"dense field {field_index - self.labels} {what}: {token!r} (field {field_index})"
        column = self.lists[field_index - self.labels - self.dense - self.slots]
        if err == _LIST_TOO_LONG:
            return f"list {column.name!r} holds more than its max_len {column.max_len} values: {token!r} (field {field_index})"
        return f"list {column.name!r} has an empty value between separators: {token!r} (field {field_index})"


def _list_column(raw: Any, slots: int) -> ListColumn:
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str) or not raw["name"]:
        raise ConfigError(f"each entry of lists needs a name, got {raw!r}")
    unknown = sorted(set(raw) - {"name", "max_len", "shares", "separator"})
    if unknown:
        raise ConfigError(f"list {raw['name']!r}: unknown field(s) {', '.join(unknown)} (name, max_len, shares, separator)")
    max_len, shares, sep = raw.get("max_len"), raw.get("shares"), raw.get("separator", ",")
    if isinstance(max_len, bool) or not isinstance(max_len, int) or not 1 <= max_len <= MAX_LIST_LEN:
        raise ConfigError(f"list {raw['name']!r}: max_len must be an integer in 1..{MAX_LIST_LEN}, got {max_len!r}")
    if shares is not None and (isinstance(shares, bool) or not isinstance(shares, int) or not 0 <= shares < slots):
        raise ConfigError(f"list {raw['name']!r}: shares must be a slot index in 0..{slots - 1}, got {shares!r}")
    if not isinstance(sep, str) or len(sep) != 1 or not sep.isascii() or sep in "\t\n\r":
        raise ConfigError(f"list {raw['name']!r}: separator must be one ASCII character other than tab or newline, got {sep!r}")
    return ListColumn(raw["name"], max_len, shares, sep)
