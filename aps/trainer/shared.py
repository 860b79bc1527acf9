"""Arrays shared between a trainer process and its compute workers.

Each array is a file in a private directory under /dev/shm (RAM) mapped with ``np.memmap``:
workers started with *spawn* attach by path, nothing is pickled but the layout, and no
resource tracker can unlink memory behind our back. The trainer owns the directory and removes
it when it stops.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass

import numpy as np

from ..metrics import auc_state_shape
from ..specs import DenseTable, SparseTable
from .model import Model

#: per-worker counters, one row each; only that worker writes its row
STAT_FIELDS = ("loss_sum", "examples", "steps", "compute_s", "wait_s", "bad_lines", "epoch", "heartbeat")
STAT = {name: i for i, name in enumerate(STAT_FIELDS)}


@dataclass(frozen=True)
class ArraySpec:
    path: str
    dtype: str
    shape: tuple[int, ...]

    def attach(self) -> np.ndarray:
        if 0 in self.shape:
            return np.zeros(self.shape, dtype=self.dtype)
        return np.asarray(np.memmap(self.path, dtype=self.dtype, mode="r+", shape=self.shape))


@dataclass(frozen=True)
class SharedLayout:
    """Where every shared array lives; small and picklable, sent to each worker at start."""

    root: str
    params: dict[str, ArraySpec]
    dirty: dict[str, ArraySpec]
    mailbox_ids: list[dict[str, ArraySpec]]
    mailbox_sparse: list[dict[str, ArraySpec]]
    mailbox_dense: list[dict[str, ArraySpec]]
    stats: ArraySpec
    auc: ArraySpec


def _shm_dir() -> str:
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    return tempfile.mkdtemp(prefix=f"aps-{os.getpid()}-", dir=base)


class SharedArrays:
    """Creates the shared arrays of one trainer (the owner side)."""

    def __init__(self, model: Model, num_workers: int, with_mailboxes: bool) -> None:
        self.root = _shm_dir()
        self._arrays: dict[str, np.ndarray] = {}
        params = {}
        dirty = {}
        for spec in model.tables():
            shape = (spec.rows, spec.dim) if isinstance(spec, SparseTable) else spec.shape
            params[spec.name] = self._create(f"param.{_safe(spec.name)}", "float32", shape)
            if isinstance(spec, SparseTable):
                dirty[spec.name] = self._create(f"dirty.{_safe(spec.name)}", "uint8", (spec.rows,))
        ids: list[dict[str, ArraySpec]] = []
        sparse: list[dict[str, ArraySpec]] = []
        dense: list[dict[str, ArraySpec]] = []
        for w in range(num_workers if with_mailboxes else 0):
            ids.append({})
            sparse.append({})
            dense.append({})
            for spec in model.tables():
                tag = f"w{w}.{_safe(spec.name)}"
                if isinstance(spec, SparseTable):
                    cap = model.max_batch_ids(spec.name)
                    # two halves: a worker may publish its next batch's ids while this one's
                    # gradients still refer to the current half
                    ids[w][spec.name] = self._create(f"ids.{tag}", "int64", (2, cap))
                    sparse[w][spec.name] = self._create(f"grad.{tag}", "float32", (cap, spec.dim))
                elif isinstance(spec, DenseTable):
                    dense[w][spec.name] = self._create(f"grad.{tag}", "float32", spec.shape)
        stats = self._create("stats", "float64", (num_workers, len(STAT_FIELDS)))
        auc = self._create("auc", "float64", (num_workers, *auc_state_shape()))
        self.layout = SharedLayout(self.root, params, dirty, ids, sparse, dense, stats, auc)

    def _create(self, name: str, dtype: str, shape: tuple[int, ...]) -> ArraySpec:
        path = os.path.join(self.root, name)
        spec = ArraySpec(path, dtype, tuple(int(s) for s in shape))
        if 0 not in spec.shape:
            np.memmap(path, dtype=dtype, mode="w+", shape=spec.shape).flush()  # zero-filled, sparse file
        return spec

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


class Attached:
    """A process's views of the shared arrays (owner or worker side)."""

    def __init__(self, layout: SharedLayout, worker: int | None = None) -> None:
        self.params = {name: spec.attach() for name, spec in layout.params.items()}
        self.dirty = {name: spec.attach() for name, spec in layout.dirty.items()}
        self.stats = layout.stats.attach()
        self.auc = layout.auc.attach()
        self.all_mailbox_ids = [{n: s.attach() for n, s in box.items()} for box in layout.mailbox_ids]
        self.all_mailbox_sparse = [{n: s.attach() for n, s in box.items()} for box in layout.mailbox_sparse]
        self.all_mailbox_dense = [{n: s.attach() for n, s in box.items()} for box in layout.mailbox_dense]


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else f"%{ord(c):02x}" for c in name)
