"""A pserver checkpoint read back whole, as arrays: for programs that use trained parameters
without a pserver (evaluation, export, inspection).

A checkpoint saved by any number of pservers reads back as one shard (:func:`load_shards` with
``num_shards=1``), so a sparse table's rows are in global id order and a dense table is whole.
Hash tables have no rows by position; they answer :meth:`Checkpoint.pull` as a pserver does
(a key the checkpoint lacks reads its initial row) and list their :meth:`~Checkpoint.keys`.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..specs import DenseTable, HashTable, SparseTable
from .kinds import DEFAULT_FORMATS, TableFormats
from .shards import Shard, load_shards


class Checkpoint:
    """The tables of one checkpoint, by name; see the module docstring."""

    def __init__(self, path: Path, shards: dict[str, Shard], extra: dict[str, Any], formats: TableFormats = DEFAULT_FORMATS) -> None:
        self.path = path
        self._formats = formats
        #: what the saving client passed as ``extra`` (e.g. a trainer's progress)
        self.extra = extra
        self._shards = shards

    @property
    def specs(self) -> dict[str, SparseTable | DenseTable | HashTable]:
        """Each table's spec as saved, by name."""
        return {name: shard.spec for name, shard in self._shards.items()}

    def spec(self, name: str) -> SparseTable | DenseTable | HashTable:
        """One table's spec; ConfigError naming the tables it has when it has no ``name``."""
        return self._shard(name).spec

    def array(self, name: str) -> np.ndarray:
        """A sparse table's rows ``[rows, dim]`` in id order, or a dense table in its shape."""
        shard = self._shard(name)
        array = self._formats.of(shard).as_array(shard)
        if array is not None:
            return array
        raise ConfigError(f"checkpoint {self.path}: {name!r} is a hash table, with no rows by position: use pull(name, keys)")

    def arrays(self) -> dict[str, np.ndarray]:
        """:meth:`array` of every sparse and dense table, by name."""
        whole = {name: self._formats.of(shard).as_array(shard) for name, shard in self._shards.items()}
        return {name: array for name, array in whole.items() if array is not None}

    def pull(self, name: str, ids: np.ndarray) -> np.ndarray:
        """Rows of ``ids`` (float32 ``[n, dim]``) of a sparse or hash table; an id a hash table
        does not hold reads its initial row, as a pull from the pserver that saved it would."""
        shard = self._shard(name)
        rows = self._formats.of(shard).rows(shard, np.asarray(ids, np.int64))
        if rows is not None:
            return rows
        raise ConfigError(f"checkpoint {self.path}: {name!r} is a dense table, read it with array(name)")

    def keys(self, name: str) -> np.ndarray:
        """The keys a hash table holds, sorted (int64)."""
        shard = self._shard(name)
        keys = self._formats.of(shard).keys(shard)
        if keys is None:
            raise ConfigError(f"checkpoint {self.path}: {name!r} is not a hash table")
        return keys

    def _shard(self, name: str) -> Shard:
        shard = self._shards.get(name)
        if shard is None:
            raise ConfigError(f"checkpoint {self.path} has no table {name!r} (has {sorted(self._shards)})")
        return shard


def read_checkpoint(
    path: str | os.PathLike[str], tables: Collection[str] | None = None, formats: TableFormats = DEFAULT_FORMATS
) -> Checkpoint:
    """Read a checkpoint saved by any number of pservers; ``tables``: only these (the others'
    files are not read). ConfigError for a directory that is not a complete checkpoint, or that
    lacks one of ``tables``."""
    root = Path(path)
    shards, extra = load_shards(root, shard=0, num_shards=1, only=None if tables is None else set(tables), formats=formats)
    return Checkpoint(root, shards, extra, formats)
