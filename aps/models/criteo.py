"""Raw Criteo text (``label, I1..I13, C1..C26``, tab-separated) parsed straight from bytes by numba.

This is the reader of PaddlePaddle's CTR-DNN example (its ``CriteoDataset`` data generator) with
one deliberate difference, the hash. For a line with fields ``f[0..39]``:

- ``label = int(f[0])``, which must be exactly ``0`` or ``1``;
- dense feature ``i`` (field ``1 + i``) is ``0.0`` when empty, otherwise the integer ``x`` in it
  normalised as ``(x - cont_min[i]) / cont_diff[i]`` (computed in float64, stored as float32);
- categorical slot ``k`` (field ``c = 1 + dense + k``, i.e. 14..39) is the row
  ``hash(str(c) + f[c]) % buckets``.

The reference used Python's built-in ``hash``, which is salted per process (``PYTHONHASHSEED``):
two trainers, or the same trainer on two runs, put the same category in different embedding rows,
so a saved model cannot be reused and distributed workers disagree. Here the hash is 64-bit
FNV-1a (offset basis ``0xcbf29ce484222325``, prime ``0x100000001b3``) over the UTF-8 bytes of
``str(c) + value``, taken modulo ``buckets`` as an unsigned 64-bit number: the same value maps to
the same row in every process, run and machine. :func:`slot_id` is the pure-Python definition;
the kernel hashes the raw bytes in place and agrees with it bit for bit (bytes that are not valid
UTF-8 are hashed as they are).

:meth:`CriteoFormat.parse` takes a line-aligned :class:`~aps.trainer.reader.Chunk` and walks its
bytes once in a ``@njit(nogil=True)`` kernel writing into arrays sized by ``chunk.lines`` — no
Python per line, no ``str.split``. A trailing ``\\r`` before ``\\n`` is tolerated. A bad line (a
label that is not ``0``/``1``, a dense value that is not a plain ``[+-]digits`` integer, too few
or too many fields, an empty line) raises :class:`~aps.errors.DataError` with the chunk's file and
the line's number and names the field — or, with ``skip_bad_lines``, is dropped and counted.

The normalisation constants and the number of buckets are the reference's by default; a data set
with other columns describes itself in a small JSON file read by :meth:`CriteoFormat.from_meta`.
"""

from __future__ import annotations

import json
import math
import operator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from numba import njit

from ..errors import ConfigError, DataError
from ..trainer.reader import Chunk

#: the reference's per-column minimum of I1..I13 (``cont_min_``)
REFERENCE_CONT_MIN: tuple[float, ...] = (0, -3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
#: the reference's per-column range of I1..I13 (``cont_diff_``)
REFERENCE_CONT_DIFF: tuple[float, ...] = (20, 603, 100, 50, 64000, 500, 100, 50, 500, 10, 10, 10, 50)
#: the reference's number of rows of the sparse embedding table (``hash_dim_``)
HASH_BUCKETS = 1000001

FNV_OFFSET_BASIS = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
_MASK64 = (1 << 64) - 1

_U64_PRIME = np.uint64(FNV_PRIME)
_INT64_MAX = np.int64(0x7FFFFFFFFFFFFFFF)
_NL = 10
_TAB = 9
_CR = 13

# error codes returned by the kernel
_OK = 0
_BAD_LABEL = 1
_BAD_DENSE = 2
_DENSE_RANGE = 3
_FIELD_COUNT = 4
_EMPTY_LINE = 5
_TOO_MANY_LINES = 6


def fnv1a64(data: bytes) -> int:
    """64-bit FNV-1a of ``data`` (the pure-Python reference of the kernel's hash)."""
    h = FNV_OFFSET_BASIS
    for b in data:
        h = ((h ^ b) * FNV_PRIME) & _MASK64
    return h


def slot_id(column: int, value: str, buckets: int = HASH_BUCKETS) -> int:
    """The embedding row of ``value`` in field ``column`` (its index in the line, 14..39 for Criteo)."""
    return fnv1a64((str(column) + value).encode("utf-8")) % buckets


def slot_key(column: int, value: str) -> int:
    """The hash table key of ``value`` in field ``column``: the full FNV-1a 64 of the pair as a
    signed int64 (same bits), no modulo, so distinct features never share a row by design."""
    return int(np.uint64(fnv1a64((str(column) + value).encode("utf-8"))).astype(np.int64))


@njit(cache=True, nogil=True)
def _parse(buf, n_dense, n_slots, cont_min, cont_diff, prefix, buckets, skip_bad, labels, dense, ids):
    """Parse every line of ``buf`` into rows of ``labels``/``dense``/``ids``.

    ``prefix[k]`` is the FNV-1a state after hashing ``str(1 + n_dense + k)``. Returns (good lines,
    bad lines, error code, line index of the error, field index of the error or the line's field
    count, byte offset of the line). A bad line's row is overwritten by the next good line when
    ``skip_bad``; otherwise the first bad line stops the parse with its error code.
    """
    n = buf.shape[0]
    cap = labels.shape[0]
    n_fields = 1 + n_dense + n_slots
    pos = 0
    line = 0
    good = 0
    bad = 0
    while pos < n:
        start = pos
        if good >= cap:
            return good, bad, _TOO_MANY_LINES, line, -1, start
        err = _OK
        err_field = 0
        # label: exactly one byte, '0' or '1'
        while pos < n and buf[pos] != _TAB and buf[pos] != _NL:
            pos += 1
        end = pos
        if end > start and buf[end - 1] == _CR and (pos >= n or buf[pos] == _NL):
            end -= 1
        label = 0.0
        if end - start != 1 or (buf[start] != 48 and buf[start] != 49):
            err = _BAD_LABEL
        else:
            label = float(buf[start] - 48)
        # dense: empty, or [+-]digits within int64
        if err == _OK:
            for i in range(n_dense):
                if pos >= n or buf[pos] != _TAB:
                    err = _FIELD_COUNT
                    break
                pos += 1
                err_field = 1 + i
                c = buf[pos] if pos < n else _NL
                if c == _CR and (pos + 1 >= n or buf[pos + 1] == _NL):
                    pos += 1
                    c = _NL
                if c == _TAB or c == _NL:
                    dense[good, i] = 0.0
                    continue
                neg = False
                if c == 45 or c == 43:  # '-' '+'
                    neg = c == 45
                    pos += 1
                digits_start = pos
                value = np.int64(0)
                significant = 0
                while pos < n:
                    d = np.int64(buf[pos]) - 48
                    if d < 0 or d > 9:
                        break
                    if significant >= 18 and value > (_INT64_MAX - d) // 10:
                        err = _DENSE_RANGE
                        break
                    value = value * 10 + d
                    if value != 0:
                        significant += 1
                    pos += 1
                if err != _OK:
                    break
                if pos < n and buf[pos] == _CR and (pos + 1 >= n or buf[pos + 1] == _NL):
                    pos += 1
                if pos == digits_start or (pos < n and buf[pos] != _TAB and buf[pos] != _NL):
                    err = _BAD_DENSE
                    break
                x = float(-value if neg else value)
                dense[good, i] = np.float32((x - cont_min[i]) / cont_diff[i])
        # categorical: FNV-1a over str(column) + the raw bytes, modulo buckets (unsigned)
        if err == _OK:
            for k in range(n_slots):
                if pos >= n or buf[pos] != _TAB:
                    err = _FIELD_COUNT
                    break
                pos += 1
                h = prefix[k]
                before = h
                while pos < n:
                    c = buf[pos]
                    if c == _TAB or c == _NL:
                        break
                    before = h
                    h = (h ^ np.uint64(c)) * _U64_PRIME
                    pos += 1
                if buf[pos - 1] == _CR and (pos >= n or buf[pos] == _NL):
                    # the last byte hashed is a '\r' ending the line (an empty field would have
                    # the tab before it at pos - 1): the value ends before it
                    h = before
                # buckets 0: the full 64-bit hash as an int64 bit pattern (hash tables' keys)
                ids[good, k] = np.int64(h) if buckets == 0 else np.int64(h % buckets)
        if err == _OK and pos < n and buf[pos] != _NL:
            err = _FIELD_COUNT
        if err != _OK:
            # the field count decides first: a misaligned line's field errors are misleading
            p = start
            tabs = 0
            while p < n and buf[p] != _NL:
                if buf[p] == _TAB:
                    tabs += 1
                p += 1
            end = p
            if end > start and buf[end - 1] == _CR:
                end -= 1
            if end == start:
                err = _EMPTY_LINE
            elif tabs + 1 != n_fields:
                err = _FIELD_COUNT
                err_field = tabs + 1
            if not skip_bad:
                return good, bad, err, line, err_field, start
            bad += 1
            pos = p
        else:
            labels[good] = label
            good += 1
        pos += 1  # past the newline
        line += 1
    return good, bad, _OK, -1, -1, -1


@dataclass
class CriteoRecords:
    """The good lines of one chunk, in order (skipped bad lines are only counted)."""

    labels: np.ndarray  # float32 [n], 0.0 or 1.0
    dense: np.ndarray  # float32 [n, dense], normalised
    ids: np.ndarray  # int64 [n, slots], hashed and taken modulo buckets
    bad_lines: int  # lines skipped (only with skip_bad_lines)

    @property
    def n(self) -> int:
        """Number of good lines."""
        return int(self.labels.shape[0])


def _real(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ConfigError(f"{name} must be a number, got {value!r}")
    out = float(value)
    if not math.isfinite(out):
        raise ConfigError(f"{name} must be finite, got {value!r}")
    return out


def _integer(value: object, name: str) -> int:
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ConfigError(f"{name} must be an integer, got {value!r}") from None


_META_FIELDS = ("dense", "slots", "cont_min", "cont_diff", "buckets")


@dataclass(frozen=True)
class CriteoFormat:
    """The columns of a Criteo-style file and their normalisation; :meth:`parse` reads a chunk."""

    dense: int = 13
    slots: int = 26
    cont_min: tuple[float, ...] = REFERENCE_CONT_MIN
    cont_diff: tuple[float, ...] = REFERENCE_CONT_DIFF
    buckets: int = HASH_BUCKETS
    _min: np.ndarray = field(init=False, repr=False, compare=False)
    _diff: np.ndarray = field(init=False, repr=False, compare=False)
    _prefix: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        dense = _integer(self.dense, "dense")
        slots = _integer(self.slots, "slots")
        buckets = _integer(self.buckets, "buckets")
        if dense < 0:
            raise ConfigError(f"dense must be >= 0, got {dense}")
        if slots < 1:
            raise ConfigError(f"slots must be >= 1, got {slots}")
        if not 1 <= buckets <= 2**63 - 1:
            raise ConfigError(f"buckets must be in 1..2**63-1 (ids are int64), got {buckets}")
        values: dict[str, tuple[float, ...]] = {}
        for name in ("cont_min", "cont_diff"):
            raw = getattr(self, name)
            if isinstance(raw, (str, bytes)) or not hasattr(raw, "__len__"):
                raise ConfigError(f"{name} must be a sequence of {dense} numbers, got {raw!r}")
            if len(raw) != dense:
                raise ConfigError(f"{name} has {len(raw)} values, but dense is {dense}")
            values[name] = tuple(_real(v, f"{name}[{i}]") for i, v in enumerate(raw))
        for i, d in enumerate(values["cont_diff"]):
            if d <= 0:
                raise ConfigError(f"cont_diff[{i}] must be > 0, got {d}")
        first = 1 + dense
        prefix = np.array([fnv1a64(str(first + k).encode("ascii")) for k in range(slots)], dtype=np.uint64)
        setattr_ = object.__setattr__
        setattr_(self, "dense", dense)
        setattr_(self, "slots", slots)
        setattr_(self, "buckets", buckets)
        setattr_(self, "cont_min", values["cont_min"])
        setattr_(self, "cont_diff", values["cont_diff"])
        setattr_(self, "_min", np.array(values["cont_min"], dtype=np.float64))
        setattr_(self, "_diff", np.array(values["cont_diff"], dtype=np.float64))
        setattr_(self, "_prefix", prefix)

    @property
    def fields(self) -> int:
        """Tab-separated fields per line: the label, the dense columns and the slots."""
        return 1 + self.dense + self.slots

    @classmethod
    def from_meta(cls, path: str | Path) -> CriteoFormat:
        """Read ``{"dense", "slots", "cont_min", "cont_diff", "buckets" (optional)}`` from JSON
        (a data set's ``meta.json``; other keys are ignored)."""
        where = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"{where}: cannot read Criteo meta file: {exc.strerror or exc}") from exc
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{where}: Criteo meta file is not UTF-8 text: {exc}") from exc
        try:
            meta = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{where}: Criteo meta file is not valid JSON: {exc}") from exc
        if not isinstance(meta, dict):
            raise ConfigError(f"{where}: Criteo meta file must hold a JSON object, got {type(meta).__name__}")
        # other keys (column names, line counts, a generator's Bayes AUC) describe the data
        # for people and are left alone; only the format's own fields are read
        meta = {k: v for k, v in meta.items() if k in _META_FIELDS}
        for name in _META_FIELDS[:4]:
            if name not in meta:
                raise ConfigError(f"{where}: field {name!r} is missing")
        for name in ("cont_min", "cont_diff"):
            if not isinstance(meta[name], list):
                raise ConfigError(f"{where}: field {name!r} must be a list of numbers, got {meta[name]!r}")
        try:
            return cls(**meta)
        except ConfigError as exc:
            raise ConfigError(f"{where}: field {exc}") from None

    def parse(self, chunk: Chunk, skip_bad_lines: bool = False, full_keys: bool = False) -> CriteoRecords:
        """Parse ``chunk`` into :class:`CriteoRecords`; ``full_keys``: the ids are the full 64-bit
        hashes as int64 bit patterns (:func:`slot_key`, for hash tables), not taken modulo buckets.

        A bad line raises :class:`DataError` with the chunk's file and the line's number, naming
        the field — or, with ``skip_bad_lines``, is dropped and counted in ``bad_lines``.
        """
        buf = np.frombuffer(chunk.data, dtype=np.uint8)
        lines = chunk.lines
        labels = np.empty(lines, dtype=np.float32)
        dense = np.empty((lines, self.dense), dtype=np.float32)
        ids = np.empty((lines, self.slots), dtype=np.int64)
        good, bad, err, err_line, err_field, err_pos = _parse(
            buf, self.dense, self.slots, self._min, self._diff, self._prefix, np.uint64(0 if full_keys else self.buckets),
            bool(skip_bad_lines), labels, dense, ids,
        )
        if err != _OK:
            raise DataError(self._message(chunk, err, err_field, err_pos), chunk.file, chunk.first_line + err_line)
        if good < lines:
            labels, dense, ids = labels[:good], dense[:good], ids[:good]
        return CriteoRecords(labels, dense, ids, bad)

    def _message(self, chunk: Chunk, err: int, field_index: int, pos: int) -> str:
        """Describe the bad line starting at byte ``pos`` (built here, off the hot path)."""
        if err == _TOO_MANY_LINES:
            return f"chunk holds more lines than its line count ({chunk.lines}) says"
        layout = f"{self.fields} tab-separated fields (label, {self.dense} dense, {self.slots} categorical)"
        if err == _EMPTY_LINE:
            return f"empty line, expected {layout}"
        if err == _FIELD_COUNT:
            return f"line has {field_index} fields, expected {layout}"
        end = chunk.data.find(b"\n", pos)
        line = chunk.data[pos : len(chunk.data) if end < 0 else end]
        if line.endswith(b"\r"):
            line = line[:-1]
        token = _shorten(line.split(b"\t")[field_index])
        if err == _BAD_LABEL:
            return f"label is not 0 or 1: {token!r} (field 0)"
        name = f"I{field_index}"
        if err == _DENSE_RANGE:
            return f"dense field {name} is out of the int64 range: {token!r} (field {field_index})"
        return f"dense field {name} is not an integer: {token!r} (field {field_index})"


def _shorten(raw: bytes, limit: int = 40) -> str:
    text = raw.decode("utf-8", "replace")
    return text if len(text) <= limit else text[:limit] + "..."
