"""Paddle's MultiSlot text format, parsed straight from bytes by a numba kernel.

A line holds, for every declared slot in order, ``size v1 .. v_size`` separated by spaces or
tabs; e.g. with slots ``click`` (int64), ``dense`` (13 float32) and ``C1..C26`` (int64)::

    1 0 13 0.05 0.0066 ... 0.04 1 715353 1 817085 ... 1 787527

:func:`MultiSlotFormat.parse` turns a :class:`~aps.trainer.reader.Chunk` into one CSR pair per
slot (``values``, ``offsets`` with ``offsets[i]:offsets[i+1]`` the values of line ``i``). The
kernel walks the bytes once: no Python per line, no ``str.split``, no intermediate strings. It
writes values line-major into two flat scratch arrays (ints, floats) sized by an upper bound on
the token count (every value needs at least one byte and one separator), then a second kernel
scatters them slot-major — a copy is much cheaper than tokenising the text twice.

Every malformed line is reported with its file and line number and the slot where parsing broke
(or, with ``skip_bad_lines``, dropped and counted): a wrong value count, a token that is not a
number, a negative size, a missing slot or tokens after the last slot. Only plain decimal numbers
are accepted (no ``nan``/``inf``); int slots take ``[+-]digits`` within int64, float slots take
ints too and ``1.``, ``.5``, ``-3e-5``. Float values are computed in float64 from up to 18
significant digits and rounded to float32 (exact for every float32 written by ``repr``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numba import njit

from ..errors import ConfigError, DataError
from .reader import Chunk

# error codes returned by the kernel
_OK = 0
_BAD_SIZE = 1
_NEG_SIZE = 2
_MISSING_SLOT = 3
_TOO_FEW = 4
_BAD_INT = 5
_BAD_FLOAT = 6
_EXTRA = 7

_MESSAGES = {
    _BAD_SIZE: "size is not a non-negative integer",
    _NEG_SIZE: "size is negative",
    _MISSING_SLOT: "slot missing (line ended before its size)",
    _TOO_FEW: "fewer values than its size says",
    _BAD_INT: "value is not an int64 integer",
    _BAD_FLOAT: "value is not a number",
    _EXTRA: "extra tokens after the last slot",
}

_NL = 10
_SPACE = 32
_TAB = 9
_CR = 13
_INT64_MAX = np.int64(0x7FFFFFFFFFFFFFFF)
_MANT_LIMIT = 10**17  # below this one more digit still fits: 18 significant digits
_POW10 = np.array([10.0**k for k in range(23)], dtype=np.float64)  # exact in float64


@njit(cache=True, nogil=True, inline="always")
def _is_sep(c: np.uint8) -> bool:
    return c == _SPACE or c == _TAB or c == _CR


@njit(cache=True, nogil=True, inline="always")
def _ends_token(buf: np.ndarray, pos: int, n: int) -> bool:
    return pos >= n or buf[pos] == _NL or _is_sep(buf[pos])


@njit(cache=True, nogil=True, inline="always")
def _parse_int(buf: np.ndarray, pos: int, n: int) -> tuple[int, int, bool]:
    """``[+-]digits`` at ``pos`` → (value, position after it, ok). Overflow is not ok."""
    neg = False
    c = buf[pos]
    if c == 45 or c == 43:  # '-' '+'
        neg = c == 45
        pos += 1
    start = pos
    value = np.int64(0)
    digits = 0
    while pos < n:
        d = np.int64(buf[pos]) - 48
        if d < 0 or d > 9:
            break
        if digits >= 18 and value > (_INT64_MAX - d) // 10:  # only long tokens can overflow
            return 0, pos, False
        value = value * 10 + d
        if value != 0:  # leading zeros do not count towards the overflow check
            digits += 1
        pos += 1
    if pos == start or not _ends_token(buf, pos, n):
        return 0, pos, False
    return (-value if neg else value), pos, True


@njit(cache=True, nogil=True, inline="always")
def _parse_float(buf: np.ndarray, pos: int, n: int, pow10: np.ndarray) -> tuple[float, int, bool]:
    """``[+-](digits[.digits]|.digits)[(e|E)[+-]digits]`` at ``pos`` → (value, next pos, ok)."""
    neg = False
    c = buf[pos]
    if c == 45 or c == 43:
        neg = c == 45
        pos += 1
    mant = np.int64(0)
    exp10 = 0
    digits = 0
    while pos < n:
        d = np.int64(buf[pos]) - 48
        if d < 0 or d > 9:
            break
        if mant < _MANT_LIMIT:
            mant = mant * 10 + d
        else:
            exp10 += 1  # digit beyond our precision: only its magnitude counts
        digits += 1
        pos += 1
    if pos < n and buf[pos] == 46:  # '.'
        pos += 1
        while pos < n:
            d = np.int64(buf[pos]) - 48
            if d < 0 or d > 9:
                break
            if mant < _MANT_LIMIT:
                mant = mant * 10 + d
                exp10 -= 1
            digits += 1
            pos += 1
    if digits == 0:
        return 0.0, pos, False
    if pos < n and (buf[pos] == 101 or buf[pos] == 69):  # 'e' 'E'
        pos += 1
        eneg = False
        if pos < n and (buf[pos] == 45 or buf[pos] == 43):
            eneg = buf[pos] == 45
            pos += 1
        e = 0
        edigits = 0
        while pos < n:
            d = np.int64(buf[pos]) - 48
            if d < 0 or d > 9:
                break
            if e < 100000:
                e = e * 10 + d
            edigits += 1
            pos += 1
        if edigits == 0:
            return 0.0, pos, False
        exp10 += -e if eneg else e
    if not _ends_token(buf, pos, n):
        return 0.0, pos, False
    value = float(mant)
    if mant != 0 and exp10 != 0:
        if 0 < exp10 <= 22:
            value *= pow10[exp10]
        elif -22 <= exp10 < 0:
            value /= pow10[-exp10]  # exact divisor: one rounding, like the multiply above
        elif exp10 > 400:
            value = np.inf
        elif exp10 < -400:
            value = 0.0
        elif exp10 < 0:
            value = value / pow10[22] * 10.0 ** (exp10 + 22)
        else:
            value = value * 10.0**exp10
    return (-value if neg else value), pos, True


@njit(cache=True, nogil=True)
def _tokenize(buf, is_float, skip_bad, ivals, fvals, counts, pow10):
    """Parse every line of ``buf`` into ``ivals``/``fvals`` (line-major) and ``counts[line, slot]``.

    Returns (good lines, bad lines, error code, physical line index of the error, slot index of
    the error, byte offset of the offending token). Bad lines are rolled back and counted when
    ``skip_bad``; otherwise the first one stops the parse with its error code.
    """
    n = buf.shape[0]
    n_slots = is_float.shape[0]
    pos = 0
    line = 0
    good = 0
    bad = 0
    ip = 0
    fp = 0
    while pos < n:
        ip0 = ip
        fp0 = fp
        err = _OK
        err_slot = -1
        err_pos = pos
        for s in range(n_slots):
            while pos < n and _is_sep(buf[pos]):
                pos += 1
            err_pos = pos
            if pos >= n or buf[pos] == _NL:
                err = _MISSING_SLOT
            else:
                size, pos, ok = _parse_int(buf, pos, n)
                if not ok:
                    err = _BAD_SIZE
                elif size < 0:
                    err = _NEG_SIZE
                else:
                    floats = is_float[s] != 0
                    for _ in range(size):
                        while pos < n and _is_sep(buf[pos]):
                            pos += 1
                        err_pos = pos
                        if pos >= n or buf[pos] == _NL:
                            err = _TOO_FEW
                            break
                        if floats:
                            fv, pos, ok = _parse_float(buf, pos, n, pow10)
                            if not ok:
                                err = _BAD_FLOAT
                                break
                            fvals[fp] = fv
                            fp += 1
                        else:
                            iv, pos, ok = _parse_int(buf, pos, n)
                            if not ok:
                                err = _BAD_INT
                                break
                            ivals[ip] = iv
                            ip += 1
                    if err == _OK:
                        counts[good, s] = size
            if err != _OK:
                err_slot = s
                break
        if err == _OK:
            while pos < n and _is_sep(buf[pos]):
                pos += 1
            if pos < n and buf[pos] != _NL:
                err = _EXTRA
                err_slot = n_slots - 1
                err_pos = pos
        if err != _OK:
            if not skip_bad:
                return good, bad, err, line, err_slot, err_pos
            bad += 1
            ip = ip0
            fp = fp0
            while pos < n and buf[pos] != _NL:
                pos += 1
        else:
            good += 1
        pos += 1  # past the newline
        line += 1
    return good, bad, _OK, -1, -1, -1


@njit(cache=True, nogil=True)
def _scatter(counts, good, is_float, ivals, fvals):
    """Regroup line-major values slot-major: (int values, float values, offsets, slot bases)."""
    n_slots = is_float.shape[0]
    offsets = np.zeros((n_slots, good + 1), dtype=np.int64)
    for s in range(n_slots):
        acc = 0
        for i in range(good):
            acc += counts[i, s]
            offsets[s, i + 1] = acc
    base = np.zeros(n_slots, dtype=np.int64)
    itotal = 0
    ftotal = 0
    for s in range(n_slots):
        if is_float[s] != 0:
            base[s] = ftotal
            ftotal += offsets[s, good]
        else:
            base[s] = itotal
            itotal += offsets[s, good]
    iout = np.empty(itotal, dtype=np.int64)
    fout = np.empty(ftotal, dtype=np.float32)
    ip = 0
    fp = 0
    for i in range(good):
        for s in range(n_slots):
            c = counts[i, s]
            dst = base[s] + offsets[s, i]
            if is_float[s] != 0:
                for k in range(c):
                    fout[dst + k] = fvals[fp + k]
                fp += c
            else:
                for k in range(c):
                    iout[dst + k] = ivals[ip + k]
                ip += c
    return iout, fout, offsets, base


@dataclass(frozen=True, slots=True)
class Slot:
    """One MultiSlot column: its name and the dtype its values are parsed into."""

    name: str
    dtype: Literal["int64", "float32"]


@dataclass(slots=True)
class SlotBatch:
    """The parsed lines of one chunk: per slot a CSR pair ``(values, offsets)``.

    ``offsets`` has ``num_lines + 1`` int64 entries; line ``i``'s values are
    ``values[offsets[i]:offsets[i + 1]]``. Skipped bad lines are not in ``num_lines`` (so row
    ``i`` is line ``first_line + i`` only when ``bad_lines == 0``).
    """

    num_lines: int
    slots: dict[str, tuple[np.ndarray, np.ndarray]]
    bad_lines: int
    first_line: int
    file: str


class MultiSlotFormat:
    """The declared slots of a MultiSlot file, and the parser for it."""

    def __init__(self, slots: Sequence[Slot]) -> None:
        if not slots:
            raise ConfigError("a MultiSlot format needs at least one slot")
        names = [s.name for s in slots]
        for s in slots:
            if not s.name:
                raise ConfigError("slot names must be non-empty")
            if s.dtype not in ("int64", "float32"):
                raise ConfigError(f"slot {s.name!r}: dtype must be 'int64' or 'float32', got {s.dtype!r}")
        if len(set(names)) != len(names):
            raise ConfigError(f"slot names must be unique, got {names}")
        self.slots: tuple[Slot, ...] = tuple(slots)
        self._is_float = np.array([s.dtype == "float32" for s in slots], dtype=np.uint8)

    def __repr__(self) -> str:
        return f"MultiSlotFormat({list(self.slots)!r})"

    def parse(self, chunk: Chunk, skip_bad_lines: bool = False) -> SlotBatch:
        """Parse ``chunk`` into a :class:`SlotBatch`.

        A malformed line raises :class:`DataError` with the chunk's file and the line's number,
        naming the slot — or, with ``skip_bad_lines``, is dropped and counted in ``bad_lines``.
        """
        buf = np.frombuffer(chunk.data, dtype=np.uint8)
        n = buf.shape[0]
        lines = chunk.data.count(b"\n") + (1 if n and chunk.data[-1] != _NL else 0)
        bound = n // 2 + 1  # every value token takes a byte and a separator (or the line end)
        has_float = bool(self._is_float.any())
        has_int = not bool(self._is_float.all())
        ivals = np.empty(bound if has_int else 0, dtype=np.int64)
        fvals = np.empty(bound if has_float else 0, dtype=np.float32)
        counts = np.empty((lines, len(self.slots)), dtype=np.int64)
        good, bad, err, err_line, err_slot, err_pos = _tokenize(
            buf, self._is_float, skip_bad_lines, ivals, fvals, counts, _POW10
        )
        if err != _OK:
            slot = self.slots[err_slot]
            token = _token_at(chunk.data, err_pos)
            raise DataError(
                f"slot {slot.name!r} ({slot.dtype}): {_MESSAGES[err]}{f' at {token!r}' if token else ''}",
                chunk.file,
                chunk.first_line + err_line,
            )
        iout, fout, offsets, base = _scatter(counts, good, self._is_float, ivals, fvals)
        out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for k, s in enumerate(self.slots):
            values = fout if self._is_float[k] else iout
            start = int(base[k])
            out[s.name] = (values[start : start + int(offsets[k, good])], offsets[k])
        return SlotBatch(good, out, bad, chunk.first_line, chunk.file)


def _token_at(data: bytes, pos: int, limit: int = 40) -> str:
    """The text of the token starting at ``pos`` (for error messages), cut to ``limit`` chars."""
    end = pos
    while end < len(data) and end - pos <= limit and data[end] not in b" \t\r\n":
        end += 1
    text = data[pos:end].decode("utf-8", "replace")
    return text if end - pos <= limit else text[:limit] + "..."


def _format_value(v: object) -> str:
    if isinstance(v, (bool, np.bool_)):
        return "1" if v else "0"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, np.floating):
        if not np.isfinite(v):
            raise DataError(f"value {v!r} is not finite; MultiSlot text carries finite numbers only")
        return str(v)  # numpy's shortest repr for the value's own precision
    if isinstance(v, float):
        if v != v or v in (float("inf"), float("-inf")):
            raise DataError(f"value {v!r} is not finite; MultiSlot text carries finite numbers only")
        return repr(v)
    raise DataError(f"value {v!r} of type {type(v).__name__} is not a number")


def format_multislot(sample: Sequence[tuple[str, Sequence[int | float]]]) -> str:
    """One MultiSlot text line (without the newline) for ``[(slot, values), ...]``.

    Slot names only label the values — the line is positional, so the order of ``sample`` is
    the order the reader's :class:`MultiSlotFormat` must declare.
    """
    parts: list[str] = []
    for item in sample:
        try:
            name, values = item
        except (TypeError, ValueError):
            raise DataError(f"sample items must be (slot_name, values) pairs, got {item!r}") from None
        if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
            raise DataError(f"slot {name!r}: values must be a list of numbers, got {type(values).__name__}")
        parts.append(str(len(values)))
        parts.extend(_format_value(v) for v in values)
    return " ".join(parts)
