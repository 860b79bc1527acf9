"""Arrays shared between a trainer process and its compute workers.

Each array is a file in a private directory under /dev/shm (RAM) mapped with ``np.memmap``:
workers attach by path, nothing is pickled but the layout, and no resource tracker can unlink
memory behind our back.

Nothing may outlive the trainer, even when it is SIGKILLed (then no ``finally`` runs), so the
files are removed as early as possible and a dead owner's files by the next trainer:

* **after the last attach**: a mapping stays valid after its file is unlinked, so once every
  process that will use the arrays has mapped them (the layout says how many: the trainer and
  its workers), the last one to attach removes the directory. From then on the memory lives only
  as long as some process maps it, and the kernel frees it when the last one dies, however it
  dies. :meth:`SharedArrays.close` removes whatever is left when the trainer stops normally.
* **a dead owner's directory**: the owner holds an exclusive ``flock`` on ``.owner`` in its
  directory for as long as it lives (the kernel drops it when the process dies, SIGKILL
  included). Creating shared arrays first removes every ``aps-*`` directory whose lock can be
  taken, i.e. whose owner is gone before all its workers attached. The lock, not the pid in the
  name, decides: a pid may be reused, or belong to another pid namespace sharing /dev/shm.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import ApsError
from ..metrics import auc_state_shape
from ..specs import DenseTable, HashTable, SparseTable
from .model import Model

#: per-worker counters, one row each; only that worker writes its row (``stale_sum``: the
#: staleness of every step's sparse rows, summed; docs/modes.md, "Staleness")
STAT_FIELDS = ("loss_sum", "examples", "steps", "compute_s", "wait_s", "bad_lines", "epoch", "heartbeat", "stale_sum")
STAT = {name: i for i, name in enumerate(STAT_FIELDS)}
#: a worker's steps counted by the staleness of their sparse rows: 0 .. STALE_BUCKETS - 2 steps,
#: and the last bucket for anything older (what a progress record's ``staleness_max`` is read from)
STALE_BUCKETS = 65
#: the trainer's counters the workers read (only the trainer writes them): CLOCK_MERGED is how
#: many of this trainer's batches have had their gradients taken from the mailboxes so far;
#: CLOCK_EXCHANGE_AT, in geo mode, the trainer's step count (all workers) at which its next
#: exchange is due: the worker whose step reaches it tells the trainer (Kind.STEPS). 0: none.
CLOCK_MERGED = 0
CLOCK_EXCHANGE_AT = 1
CLOCK_FIELDS = 2
#: columns a hash table's gradient mailbox has past the gradient: each id's shows and clicks
HASH_STAT_COLUMNS = 2


def slot_base(worker: int, step: int, max_ids: int) -> int:
    """First row of the replica of a hash table that ``worker``'s batch of ``step`` uses.

    A hash table's keys are any int64, so its replica cannot be indexed by key: it is a slot area
    of ``workers x 2 x max_batch_ids`` rows, and the i-th unique id of a batch lives in row
    ``slot_base(...) + i``. Each worker has two areas, as its id mailbox has two halves: the
    rows of a prefetched next batch arrive while the current one computes on the other. A batch's
    ids are unique, so no map is needed and nothing is ever evicted."""
    return (2 * worker + step % 2) * max_ids


def replica_shape(
    spec: SparseTable | HashTable | DenseTable, workers: int, max_ids: int, cache_rows: int | None = None
) -> tuple[int, ...]:
    """The shape of a table's local replica: a fixed table whole, a hash table's slot areas
    (:func:`slot_base`) or, in geo mode, its cache of ``cache_rows`` rows
    (:mod:`aps.trainer.local_cache`), a dense table as it is."""
    keys = cache_rows if cache_rows is not None else 2 * max(1, workers) * max_ids
    return spec.values_shape(keys)


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
    #: per worker, its steps by the staleness of their sparse rows (STALE_BUCKETS)
    staleness: ArraySpec
    #: the trainer's counters (CLOCK_MERGED, CLOCK_EXCHANGE_AT)
    clock: ArraySpec
    #: processes that will attach (the trainer and its workers); the last removes the files
    attachers: int
    #: per worker, the AUC counts of its last scoring pass (online training's predict-then-
    #: train): ``[positives | negatives, bucket]``, kept apart from the training AUC
    scores: ArraySpec | None = None
    #: geo on hash tables, per worker and hash table: int64 ``[2, max_batch_ids]``, the cache
    #: rows the trainer mapped the keys of the worker's id mailbox half to (same half)
    mailbox_rows: list[dict[str, ArraySpec]] = field(default_factory=list)
    #: geo on hash tables, per hash table: float32 ``[cache rows, 2]``, the shows and clicks
    #: the workers' batches saw of each cache row since its last delta
    key_counts: dict[str, ArraySpec] = field(default_factory=dict)
    #: parameter buffers of every dense table: 1, or 2 with hybrid's dense_lag 1, where a dense
    #: round pulls into one while the workers compute with the other
    dense_buffers: int = 1
    #: the second buffer of each dense table (the first is ``params``), with two
    dense_spare: dict[str, ArraySpec] = field(default_factory=dict)


_OWNER_LOCK = ".owner"
#: where a trainer's directory is made and locked before it takes its ``aps-PID-`` name
_STAGING = ".aps-new-"
_ATTACHED = ".attached-"
_DIR_NAME = re.compile(r"aps-(\d+)-")
#: a directory without an owner lock (written before locks existed) is removed only when its
#: pid is gone and it is older than this, so one being created this instant is never touched
_UNLOCKED_GRACE_S = 60.0


def shm_base() -> str:
    """Where shared arrays live: /dev/shm (RAM) when writable, else the temporary directory."""
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        return "/dev/shm"
    return tempfile.gettempdir()


def remove_orphans(base: str | None = None) -> list[str]:
    """Remove the shared-array directories under ``base`` whose owner is dead (see the module);
    returns the paths removed. Safe to run while other trainers live: their locks are held."""
    base = base or shm_base()
    removed = []
    try:
        names = os.listdir(base)
    except OSError:
        return removed
    for name in names:
        match = _DIR_NAME.match(name)
        path = os.path.join(base, name)
        if match is None or not os.path.isdir(path) or os.path.islink(path):
            continue
        if _owner_gone(path, int(match.group(1))):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _owner_gone(path: str, pid: int) -> bool:
    try:
        fd = os.open(os.path.join(path, _OWNER_LOCK), os.O_RDWR)
    except FileNotFoundError:
        return _unlocked_orphan(path, pid)
    except OSError:
        return False  # not ours to judge (permissions): leave it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False  # the owner lives
    finally:
        os.close(fd)  # also drops the lock we may have taken: we only wanted to know
    return True


def _unlocked_orphan(path: str, pid: int) -> bool:
    """A directory without a lock: aps's own (it has the stats array) from a pid that is gone,
    and not just being created."""
    if not os.path.exists(os.path.join(path, "stats")):
        return False
    try:
        if time.time() - os.stat(path).st_mtime < _UNLOCKED_GRACE_S:
            return False
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False  # alive under another user, or vanished meanwhile
    return False


class SharedArrays:
    """Creates the shared arrays of one trainer (the owner side).

    ``num_workers`` worker processes and the trainer itself will attach (:class:`Attached`);
    the last of those ``num_workers + 1`` attaches removes the files (see the module).
    ``cache_rows`` (geo): the rows of each hash table's local cache, which then replaces its
    slot areas, with a dirty flag per row and, per worker, the id and row mailboxes through
    which the trainer maps a batch's keys to rows (:mod:`aps.trainer.modes.geo_hash`).
    ``dense_buffers`` 2 (hybrid's dense lag): every dense table gets a second parameter buffer,
    so that a dense round can write one while the workers compute with the other."""

    def __init__(
        self,
        model: Model,
        num_workers: int,
        with_mailboxes: bool,
        cache_rows: dict[str, int] | None = None,
        dense_buffers: int = 1,
    ) -> None:
        base = shm_base()
        remove_orphans(base)
        # made and locked under a name remove_orphans() skips, then renamed: under its own name
        # a directory always has its lock held. (Made under that name, a second trainer starting
        # at the same moment found it unlocked and removed it before its owner could lock it.)
        staging = tempfile.mkdtemp(prefix=f"{_STAGING}{os.getpid()}-", dir=base)
        # held until close() or death: the next trainer's remove_orphans() reads it
        self._lock: int | None = os.open(os.path.join(staging, _OWNER_LOCK), os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        self.root = tempfile.mkdtemp(prefix=f"aps-{os.getpid()}-", dir=base)  # its name, empty: never removed
        os.rename(staging, self.root)  # replaces the empty directory at once
        self._arrays: dict[str, np.ndarray] = {}
        params = {}
        dirty = {}
        hashed = {t.name for t in model.tables() if t.keyed}
        cached = cache_rows or {}
        for spec in model.tables():
            cap = model.max_batch_ids(spec.name) if spec.name in hashed else 0
            shape = replica_shape(spec, num_workers, cap, cached.get(spec.name))
            params[spec.name] = self._create(f"param.{_safe(spec.name)}", "float32", shape)
            if (spec.by_ids and not spec.keyed) or spec.name in cached:  # a dirty flag per fixed row, or per cached row (geo)
                dirty[spec.name] = self._create(f"dirty.{_safe(spec.name)}", "uint8", shape[:1])
        ids: list[dict[str, ArraySpec]] = []
        sparse: list[dict[str, ArraySpec]] = []
        dense: list[dict[str, ArraySpec]] = []
        for w in range(num_workers if with_mailboxes else 0):
            ids.append({})
            sparse.append({})
            dense.append({})
            for spec in model.tables():
                tag = f"w{w}.{_safe(spec.name)}"
                if spec.by_ids:
                    cap = model.max_batch_ids(spec.name)
                    # two halves: a worker may publish its next batch's ids while this one's
                    # gradients still refer to the current half
                    ids[w][spec.name] = self._create(f"ids.{tag}", "int64", (2, cap))
                    width = spec.dim + (HASH_STAT_COLUMNS if spec.name in hashed else 0)
                    sparse[w][spec.name] = self._create(f"grad.{tag}", "float32", (cap, width))
                else:
                    dense[w][spec.name] = self._create(f"grad.{tag}", "float32", spec.shape)
        counts = {name: self._create(f"counts.{_safe(name)}", "float32", (n, 2)) for name, n in cached.items()}
        spare = {
            t.name: self._create(f"param1.{_safe(t.name)}", "float32", t.shape)
            for t in model.dense_tables()
            if dense_buffers > 1
        }
        rows: list[dict[str, ArraySpec]] = []
        for w in range(num_workers if cached else 0):
            if not with_mailboxes:
                ids.append({})
            rows.append({})
            for name in cached:
                cap = model.max_batch_ids(name)
                if not with_mailboxes:
                    ids[w][name] = self._create(f"ids.w{w}.{_safe(name)}", "int64", (2, cap))
                rows[w][name] = self._create(f"rows.w{w}.{_safe(name)}", "int64", (2, cap))
        stats = self._create("stats", "float64", (num_workers, len(STAT_FIELDS)))
        auc = self._create("auc", "float64", (num_workers, *auc_state_shape()))
        staleness = self._create("staleness", "float64", (num_workers, STALE_BUCKETS))
        clock = self._create("clock", "int64", (CLOCK_FIELDS,))
        scores = self._create("scores", "float64", (num_workers, *auc_state_shape()[1:]))
        self.layout = SharedLayout(
            self.root, params, dirty, ids, sparse, dense, stats, auc, staleness, clock, num_workers + 1, scores, rows, counts,
            dense_buffers, spare,
        )

    def _create(self, name: str, dtype: str, shape: tuple[int, ...]) -> ArraySpec:
        path = os.path.join(self.root, name)
        spec = ArraySpec(path, dtype, tuple(int(s) for s in shape))
        if 0 not in spec.shape:
            np.memmap(path, dtype=dtype, mode="w+", shape=spec.shape).flush()  # zero-filled, sparse file
        return spec

    def close(self) -> None:
        """Remove what is left of the files (idempotent; mappings stay valid) and the lock."""
        shutil.rmtree(self.root, ignore_errors=True)
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None


class Attached:
    """A process's views of the shared arrays (owner or worker side).

    Attaching counts: after mapping everything, this process leaves a mark in the directory,
    and the one whose mark completes ``layout.attachers`` removes the directory (the module says
    why). Attaching once more after that is a misuse and fails loudly."""

    def __init__(self, layout: SharedLayout, worker: int | None = None) -> None:
        try:
            self.params = {name: spec.attach() for name, spec in layout.params.items()}
            self.dirty = {name: spec.attach() for name, spec in layout.dirty.items()}
            self.stats = layout.stats.attach()
            self.auc = layout.auc.attach()
            self.staleness = layout.staleness.attach()
            self.clock = layout.clock.attach()
            self.scores = layout.scores.attach() if layout.scores is not None else None
            self.all_mailbox_ids = [{n: s.attach() for n, s in box.items()} for box in layout.mailbox_ids]
            self.all_mailbox_sparse = [{n: s.attach() for n, s in box.items()} for box in layout.mailbox_sparse]
            self.all_mailbox_dense = [{n: s.attach() for n, s in box.items()} for box in layout.mailbox_dense]
            self.all_mailbox_rows = [{n: s.attach() for n, s in box.items()} for box in layout.mailbox_rows]
            self.key_counts = {name: spec.attach() for name, spec in layout.key_counts.items()}
            self.dense_spare = {name: spec.attach() for name, spec in layout.dense_spare.items()}
            self._dense_count = layout.dense_buffers
        except FileNotFoundError as exc:
            raise ApsError(
                f"shared arrays in {layout.root} are gone: all {layout.attachers} processes they were made "
                "for have attached (then the files are removed), or their trainer stopped"
            ) from exc
        _count_attach(layout)

    def dense_buffers(self, names: list[str]) -> list[dict[str, np.ndarray]]:
        """The parameter buffers of the dense tables ``names``: the replica's own arrays, then,
        where the layout has them (hybrid's dense lag), the second ones."""
        buffers = [{name: self.params[name] for name in names}]
        if self._dense_count > 1:
            buffers.append({name: self.dense_spare[name] for name in names})
        return buffers


def _count_attach(layout: SharedLayout) -> None:
    """Mark one more attach; remove the directory if that was the last one expected."""
    try:
        fd, _ = tempfile.mkstemp(prefix=_ATTACHED, dir=layout.root)
        os.close(fd)
        marks = sum(name.startswith(_ATTACHED) for name in os.listdir(layout.root))
    except FileNotFoundError:
        return  # removed meanwhile: by the owner's close(), or by a concurrent last attach
    if marks >= layout.attachers:
        shutil.rmtree(layout.root, ignore_errors=True)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else f"%{ord(c):02x}" for c in name)
