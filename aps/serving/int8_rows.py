"""A served hash table that holds its rows as int8 codes with one float32 scale a row
(``aps-serve --rows int8``): dim + 4 bytes a row instead of 4 x dim.

Rows are quantized as a base or a delta is loaded (int8_kernels.quantize_rows, off the event
loop like the rest of a build; an export written with int8 rows is held as written) and read back as float32 on lookup (dequantize_rows), so clients
see float32 rows as from any aps-serve, each coordinate within half its row's scale of the row
exported. Everything else is :class:`ServedHash`'s: the index, deltas (a delta's rows replace
the held ones, quantized on arrival; its deleted keys go), and unknown keys, which read their
initial row exactly as a pserver computes it (it is not held, so it is not quantized).

The scale of each row sits beside its codes as the slab's one per-row array besides the values
(RowSlab's ``state``, which on a pserver holds optimizer state), so the slab grows, copies and
counts both together.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import structlog

from ..specs import HashTable
from ..storage.hash.compact import decode
from ..storage.hash.slab import RowSlab
from ..storage.int8_kernels import dequantize_rows, quantize_rows
from .model import ExportFiles, Served, ServedHash

log = structlog.get_logger("aps.serving")

#: the name of the slab's per-row array of scales
SCALE = "scale"


class ServedInt8Hash(ServedHash):
    """A hash table's exported keys and their rows as int8 codes and a float32 scale a row."""

    #: rows written since the last read that held a NaN or an infinity (served as NaN rows)
    _nonfinite = 0

    @classmethod
    def read(cls, files: ExportFiles, name: str, spec: HashTable, entry: dict[str, Any], old: Served | None) -> ServedHash:
        """As :meth:`ServedHash.read`; rows holding a NaN or an infinity are logged once a table
        and an export (they have no finite scale: each reads back as NaN in every coordinate)."""
        store = super().read(files, name, spec, entry, old)
        assert isinstance(store, ServedInt8Hash)
        count, store._nonfinite = store._nonfinite, 0
        if count:
            log.warning("rows holding a NaN or an infinity are served as NaN", export=str(files.directory), table=name, rows=count)
        return store

    def _new_slab(self) -> RowSlab:
        """int8 codes as the values, and a float32 scale a row beside them."""
        return RowSlab(self.index, self.spec.dim, {SCALE: np.zeros(1, np.float32)}, name=self.spec.name, value_dtype=np.int8)

    @property
    def scales(self) -> np.ndarray:
        """Each slab row's scale (its codes are :attr:`values`)."""
        return self.slab.state[SCALE]

    @property
    def held_dtype(self) -> str:
        return "int8"

    def _write(self, rows: np.ndarray, values: np.ndarray, scales: np.ndarray | None) -> None:
        """Quantize ``values`` (as exported: float32, float16, bfloat16's bits) into slab
        ``rows``; int8 codes and their ``scales`` (an export written with int8 rows) are held
        as they are, not quantized again."""
        if scales is None:
            self._nonfinite += quantize_rows(np.ascontiguousarray(decode(values)), rows, self.slab.values, self.scales)
        else:
            self.slab.values[rows] = values
            self.scales[rows] = scales
            self._nonfinite += int(np.isnan(scales).sum())

    def pull(self, keys: np.ndarray) -> np.ndarray:
        """Rows of ``keys`` as float32: held rows dequantized, an unknown key's initial row as a
        pserver computes it."""
        out = np.empty((keys.shape[0], self.spec.dim), np.float32)
        rows = self.index.lookup(keys)
        if dequantize_rows(self.slab.values, self.scales, rows, out):
            self._initial_rows(keys, rows, out)
        return out
