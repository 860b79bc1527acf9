"""One pserver's shard of a disk table (``HashTable(disk=Disk(ram_bytes))``): the hot rows in RAM
in a :class:`~.store.HashSparseStore`, the cold rows on local disk in :class:`~.cold.ColdRows`.

How a request goes: the keys the hot store lacks are looked up on disk in one batched read; the
rows found come into the hot store with their optimizer state and statistics, bitwise as they
went out; then the hot store answers the pull or applies the push exactly as an all-RAM table
does (admission, optimizer, statistics), so a disk table's rows equal an all-RAM table's after
the same pushes. Room for what comes in is made first: rows not pulled or pushed lately go out
to disk, never a row of the request being served. A pull brings in only the keys it asks for a
second time soon after: the first time it answers from the record it read, which waits in a
small buffer (:mod:`.staged`) for the push of the same keys or that second pull, so keys read
once do not push out the rows asked for all the time, and a pull then a push reads disk once.

Why recency rather than the accessor's score: a row comes back whenever it is asked
for, so the cost of a wrong choice is one read, and recency is what predicts the next read; the
score decides which keys a table keeps at all (shrink, ``max_keys``), not where they live.

Which rows go out is the CLOCK rule (second chance): a request sets its rows' reference bit; a
hand sweeps the hot rows, clearing set bits and taking rows whose bit was clear, never a row of
the request being served. It approximates least recently used at a constant cost an eviction,
with no walk or sort of every row that would stall one request of a large table. What goes out
is written only when needed: a row read from disk and not pushed since is still on disk as it
is (``in_cold`` and not ``dirty``), so it just leaves RAM.

Every method blocks on disk: the pserver runs them in a thread, one request of a table at a time
(aps/server/kinds/disk.py). GEO's change tracking is the hot store's bitmaps over the hot rows;
a row going out takes its changed bits along as its key, per client, so a GEO read returns the
keys changed in RAM and on disk alike. A cap by ``max_keys`` counts every key; reaching it
evicts the lowest scores among all of them (one walk of the rows on disk, for a sixteenth of the
cap at a time, as an all-RAM table evicts), inside the push that reaches it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
from numba import njit

from ...errors import ErrorCode, ServerError
from ...sharding import LOGICAL_SHARDS, LogicalSharding
from ...specs import HashTable
from .cold import WALK_ROWS, ColdRows
from .compact import decode
from .evict import decay_and_judge, evictions_now
from .slab import most_that_fit
from .staged import StagedRows
from .store import HashSparseStore, planned_nbytes

#: a hot row's bookkeeping besides its row and index entry: its key (int64) and five flags
_ROW_EXTRA = 13
#: the share of the RAM budget the disk store's block cache and write buffers take, and its cap
_COLD_SHARE = 8
_COLD_CAP = 64 << 20
#: the share of the rest of the budget that stages the records pulls read once (:mod:`.staged`);
#: at 256 MiB about 100,000 records of a dim-16 float16 row, five 20,000-key pulls' worth
_STAGED_SHARE = 32
_NO_PENDING = (np.empty(0, np.int64), np.empty(0, np.int64))


#: the file in a disk table's directory naming the process that uses it
_OWNER = "OWNER"


def new_table_dir(data_dir: Path, table: str) -> Path:
    """A new directory for one disk store of ``table`` under ``data_dir``, after removing those a
    process no longer running left there (a pserver killed before it could remove its own)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    for old in data_dir.glob(f"{table}.*"):
        try:
            pid = int((old / _OWNER).read_text())
        except (OSError, ValueError):
            continue  # not one of ours, or being made right now
        if not _running(pid):
            shutil.rmtree(old, ignore_errors=True)
    made = Path(tempfile.mkdtemp(prefix=f"{table}.", dir=data_dir))
    (made / _OWNER).write_text(str(os.getpid()))
    return made


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def hot_keys(spec: HashTable) -> int:
    """Rows a shard of disk table ``spec`` keeps in RAM: what its budget has room for after the
    disk store's caches (its planned bytes, :func:`~.store.planned_nbytes`, plus the clock and
    flags of each row)."""
    assert spec.disk is not None
    room = _hot_room(spec)
    return most_that_fit(0, 1 << 31, lambda keys: planned_nbytes(spec, keys) + keys * _ROW_EXTRA <= room)


def _hot_room(spec: HashTable) -> int:
    """Bytes of the budget left to the hot rows: less the disk store's caches and the staged records."""
    assert spec.disk is not None
    room = spec.disk.ram_bytes - cold_cache_nbytes(spec)
    return room - room // _STAGED_SHARE


def cold_cache_nbytes(spec: HashTable) -> int:
    """RAM the disk store takes of the budget for its block cache and write buffers."""
    assert spec.disk is not None
    return min(spec.disk.ram_bytes // _COLD_SHARE, _COLD_CAP)


def _column(records: np.ndarray, at: int, like: np.ndarray) -> tuple[np.ndarray, int]:
    """The array of ``like``'s dtype and row shape that each record holds from byte ``at`` (a
    copy), and the byte after it."""
    width = like.itemsize * int(np.prod(like.shape[1:]))
    out = records[:, at : at + width].copy().view(like.dtype).reshape(records.shape[0], *like.shape[1:])
    return out, at + width


def _remove(cold: ColdRows, directory: Path) -> None:
    cold.destroy()
    shutil.rmtree(directory, ignore_errors=True)


@njit(cache=True)
def clock_victims(referenced, held, pinned, hand, count, out):  # pragma: no cover - numba
    """Up to ``count`` held, unpinned rows by the CLOCK rule into ``out``, from ``hand`` on;
    returns (the hand's new place, rows found). Two turns at most: the first clears every
    reference bit it passes, so the second finds any held, unpinned row. The rows taken are
    pinned too; the caller unpins them."""
    n = referenced.shape[0]
    got = 0
    for _ in range(2 * n):
        if got == count:
            break
        row = hand
        hand += 1
        if hand == n:
            hand = 0
        if not held[row] or pinned[row]:
            continue
        if referenced[row]:
            referenced[row] = False
            continue
        out[got] = row
        pinned[row] = True  # taken: the second turn must not take it again
        got += 1
    return hand, got


class DiskHashStore:
    """The keys one pserver holds of a disk table: hot rows in RAM, the rest in ``directory``."""

    def __init__(self, spec: HashTable, directory: Path, *, snapshot: Path | None = None) -> None:
        """An empty shard whose files go under ``directory``; with ``snapshot``, one whose rows on
        disk start as that snapshot of a shard of the same table (:meth:`ColdRows.snapshot`),
        its rows in RAM then put back with :meth:`install_hot`."""
        if spec.disk is None:
            raise ValueError(f"table {spec.name!r} is not a disk table")
        self.spec = spec
        capacity = hot_keys(spec)
        if capacity < 1024:
            raise ServerError(ErrorCode.TOO_LARGE, f"table {spec.name!r}: disk.ram_bytes={spec.disk.ram_bytes} holds "
                              f"{capacity} hot rows; give it room for at least 1024")
        #: the hot rows: an all-RAM hash store of the same table, held to ``capacity`` keys
        self.hot = HashSparseStore(replace(spec, disk=None, max_keys=None), rows=capacity, key_limit=capacity)
        self.cold = ColdRows(directory / "rows", self.hot.row_nbytes, cold_cache_nbytes(spec), snapshot=snapshot)
        #: records pulls read from disk and did not bring in (a key's first touch)
        self.staged = StagedRows.within(spec.disk.ram_bytes - cold_cache_nbytes(spec) - _hot_room(spec), self.hot.row_nbytes)
        #: the files go when the shard does (a load replacing it, the table dropped, the server stopping)
        self._finalizer = weakref.finalize(self, _remove, self.cold, directory)
        self.capacity = capacity
        self.row_key = np.zeros(capacity, np.int64)  # the key each held hot row holds
        self.held = np.zeros(capacity, np.bool_)  # the row holds a key
        self.referenced = np.zeros(capacity, np.bool_)  # a request used it since the hand last passed
        self.pinned = np.zeros(capacity, np.bool_)  # a row of the request being served (set while it runs)
        self.in_cold = np.zeros(capacity, np.bool_)  # its row is on disk too (as read, unless dirty)
        self.dirty = np.zeros(capacity, np.bool_)  # pushed since it came from disk
        self.hand = 0  # where the CLOCK hand is
        self.cold_keys = 0  # keys on disk
        self.hot_in_cold = 0  # hot keys that are on disk too
        self.requested_keys = self.paged_in = self.paged_out = self.written_out = self.staged_hits = 0
        #: per tracked GEO client, keys changed since its last read whose rows went out to disk
        self._cold_changed: dict[int, list[np.ndarray]] = {}

    @property
    def name(self) -> str:
        return self.spec.name

    def __len__(self) -> int:
        """Keys held, in RAM or on disk."""
        return len(self.hot) + self.cold_keys - self.hot_in_cold

    # ------------------------------------------------------------ requests

    def pull(self, keys: np.ndarray) -> np.ndarray:
        """Rows of ``keys`` as :meth:`HashSparseStore.pull`; those on disk are read, and staged
        rather than brought in unless they were staged already (a pull of more keys than half
        the hot rows, a step of that many at a time)."""
        step = max(1, self.capacity // 2)
        if keys.shape[0] <= step:
            rows, _, (at, records) = self._bring_in(keys, admitting=False)
            out = self.hot.pull(keys, rows=rows)
            if at.size:
                out[at] = self._values_of(records)
            return out
        return np.concatenate([self.pull(keys[at : at + step]) for at in range(0, keys.shape[0], step)])

    def push_grad(self, keys: np.ndarray, grads: np.ndarray, **kwargs: object) -> int:
        """:meth:`HashSparseStore.push_grad` after the keys on disk come into RAM."""
        return self._push(keys, lambda: self.hot.push_grad(keys, grads, **kwargs))  # type: ignore[arg-type]

    def push_delta(self, keys: np.ndarray, deltas: np.ndarray, **kwargs: object) -> int:
        """:meth:`HashSparseStore.push_delta` after the keys on disk come into RAM."""
        return self._push(keys, lambda: self.hot.push_delta(keys, deltas, **kwargs))  # type: ignore[arg-type]

    def _push(self, keys: np.ndarray, apply: Callable[[], int]) -> int:
        """Bring the keys in, keep ``max_keys`` (evicting the lowest scores among every key, and
        admitting no more new keys than the cap has room for), apply, note the admitted rows."""
        _, new, _ = self._bring_in(keys, admitting=True)
        cap = self.spec.max_keys
        if cap is None or not new.size:
            admitted = apply()
        else:
            evict = evictions_now(cap, len(self), int(new.size))
            if evict:
                self.delete_keys(self._lowest_scores(evict, np.unique(np.asarray(keys, np.int64))))
            limit = self.hot.key_limit
            self.hot.key_limit = min(limit, len(self.hot) + max(0, cap - len(self)))  # new keys past the cap: rejected
            try:
                admitted = apply()
            finally:
                self.hot.key_limit = limit
        self._note_admitted(new)
        return admitted

    def _lowest_scores(self, count: int, protected: np.ndarray) -> np.ndarray:
        """The ``count`` keys (at most) of lowest score (the accessor's) among every key in RAM
        and on disk, none in ``protected`` (sorted): one walk of the rows on disk, keeping at most
        twice ``count`` candidates at a time."""
        rules = self.hot.accessor
        keys, rows = self.hot.index.items()
        cand_keys, cand_scores = keys, rules.score(self.hot.show[rows], self.hot.click[rows])

        def keep(more_keys: np.ndarray, more_scores: np.ndarray) -> None:
            nonlocal cand_keys, cand_scores
            free = ~np.isin(more_keys, protected, assume_unique=False)
            cand_keys = np.concatenate([cand_keys, more_keys[free]])
            cand_scores = np.concatenate([cand_scores, more_scores[free]])
            if cand_keys.size > 2 * count:
                low = np.argpartition(cand_scores, count)[:count]
                cand_keys, cand_scores = cand_keys[low], cand_scores[low]

        keep(np.empty(0, np.int64), np.empty(0, cand_scores.dtype))
        for logical in range(LOGICAL_SHARDS) if self.cold_keys else ():
            for disk_keys, records in self.cold.walk(logical):
                cold_only = self.hot.index.lookup(disk_keys) < 0
                stats = self._unpacked(records[cold_only])
                keep(disk_keys[cold_only], rules.score(stats["show"], stats["click"]))
        if cand_keys.size > count:
            cand_keys = cand_keys[np.argpartition(cand_scores, count)[:count]]
        return cand_keys

    def _note_admitted(self, candidates: np.ndarray) -> None:
        """Note the rows of the keys a push admitted (of ``candidates``: keys held nowhere before
        it): held, referenced, and not on disk (they are written when they go out)."""
        if not candidates.size:
            return
        rows = self.hot.index.lookup(candidates)
        taken = rows >= 0
        self._hold(candidates[taken], rows[taken])

    def _hold(self, keys: np.ndarray, rows: np.ndarray) -> None:
        self.row_key[rows] = keys
        self.held[rows] = True
        self.referenced[rows] = True

    def _bring_in(self, keys: np.ndarray, admitting: bool) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray]]:
        """Find the rows of ``keys`` the hot store lacks, staged or on disk (one batched read),
        and bring into RAM those staged and, for a push (``admitting``), those on disk too,
        making room for them and for every key a push may admit; a pull stages the records it
        read. Returns each key's hot row (-1 where not in RAM), the keys held nowhere (a push
        may admit them), and, for a pull, the positions in ``keys`` of the keys read from disk
        and not brought in with their records."""
        keys = np.asarray(keys, np.int64)
        self.requested_keys += keys.shape[0]
        rows = self.hot.index.lookup(keys)
        missing = rows < 0
        held = rows[~missing]
        self.referenced[held] = True
        if admitting:
            self.dirty[held] = True
        none = (np.empty(0, np.int64), np.empty((0, self.hot.row_nbytes), np.uint8))
        absent, where = np.unique(keys[missing], return_inverse=True)
        if not absent.size:
            return rows, absent, none
        staged, staged_records = self.staged.take(absent)
        self.staged_hits += int(staged.sum())
        on_disk = np.zeros(absent.shape[0], np.bool_)
        disk_records = none[1]
        if self.cold_keys and not staged.all():
            found, disk_records = self.cold.fetch(absent[~staged])
            on_disk[~staged] = found
        coming = staged | on_disk if admitting else staged
        count = int(coming.sum())
        self._make_room(absent.size if admitting else count, held)
        if count:
            came = absent[coming]
            if admitting:
                slot = np.cumsum(coming) - 1
                records = np.empty((count, self.hot.row_nbytes), np.uint8)
                records[slot[staged]] = staged_records
                records[slot[on_disk]] = disk_records
            else:
                records = staged_records
            new_rows = self.hot.restore(came, self._unpacked(records), _NO_PENDING)
            self._hold(came, new_rows)
            self.in_cold[new_rows] = True
            self.dirty[new_rows] = admitting
            self.hot_in_cold += came.shape[0]
            self.paged_in += came.shape[0]
            absent_rows = np.full(absent.shape[0], -1, rows.dtype)
            absent_rows[coming] = new_rows
            rows[missing] = absent_rows[where]  # the request's other rows are pinned: unmoved
        read_only = none
        if not admitting and on_disk.any():
            self.staged.add(absent[on_disk], disk_records)
            record_of = np.full(absent.shape[0], -1, np.int64)
            record_of[on_disk] = np.arange(disk_records.shape[0])
            of_missing = record_of[where]
            read = of_missing >= 0
            read_only = (np.flatnonzero(missing)[read], disk_records[of_missing[read]])
        return rows, absent[~(staged | on_disk)], read_only

    # ------------------------------------------------------------ rows going out

    def _make_room(self, incoming: int, protected: np.ndarray) -> None:
        """Send hot rows to disk by the CLOCK rule until ``incoming`` more keys fit, never a row
        in ``protected`` (the request's own)."""
        short = incoming - (self.capacity - len(self.hot))
        if short <= 0:
            return
        if short > self.capacity - protected.size:
            raise ServerError(ErrorCode.TOO_LARGE, f"table {self.name!r}: one request needs {incoming + protected.size} "
                              f"rows in RAM, more than the {self.capacity} its disk.ram_bytes holds")
        self.pinned[protected] = True
        victims, got = np.empty(short, np.int64), 0
        try:
            self.hand, got = clock_victims(self.referenced, self.held, self.pinned, self.hand, short, victims)
        finally:
            self.pinned[protected] = False
            self.pinned[victims[:got]] = False
        if got < short:
            raise ServerError(ErrorCode.INTERNAL, f"table {self.name!r}: found {got} of {short} rows to send to disk")
        self._send_out(victims)

    def _send_out(self, rows: np.ndarray) -> None:
        """Write the rows that disk lacks or holds stale, then drop all of them from RAM."""
        keys = self.row_key[rows]
        write = ~self.in_cold[rows] | self.dirty[rows]
        if write.any():
            self.cold.write(keys[write], self._packed(rows[write]))
            self.written_out += int(write.sum())
        already = int(self.in_cold[rows].sum())
        self.cold_keys += rows.size - already
        self.hot_in_cold -= already
        self._keep_changes(keys, rows)
        self.hot.index.delete(keys)
        for flags in (self.held, self.referenced, self.in_cold, self.dirty):
            flags[rows] = False
        self.paged_out += rows.size

    # ------------------------------------------------------------ change tracking (GEO)

    def _keep_changes(self, keys: np.ndarray, rows: np.ndarray) -> None:
        """Rows going out: a tracked client's change mark on each goes with its key to that
        client's keys changed on disk (and is cleared, as another key will take the row)."""
        for client, marked in self.hot.take_marks(rows).items():
            self._cold_changed.setdefault(client, []).append(keys[marked])

    def track(self, client_id: int) -> None:
        self.hot.track(client_id)

    def is_tracked(self, client_id: int) -> bool:
        return self.hot.is_tracked(client_id)

    def untrack(self, client_id: int) -> bool:
        self._cold_changed.pop(int(client_id), None)
        return self.hot.untrack(client_id)

    @property
    def tracking_bytes(self) -> int:
        """Bytes of one client's tracking: its bitmap over the hot rows and, at most, the keys
        changed on disk the client with most of them has."""
        on_disk = max((sum(part.nbytes for part in parts) for parts in self._cold_changed.values()), default=0)
        return self.hot.tracking_bytes + on_disk

    def changed(self, client_id: int) -> np.ndarray:
        """Keys changed by others since ``client_id``'s last call, in RAM or on disk, ascending
        (as :meth:`HashSparseStore.changed`, by key: a disk table's rows have no fixed place)."""
        rows = self.hot.changed(client_id)
        on_disk = self._cold_changed.pop(int(client_id), [])
        return np.unique(np.concatenate([self.row_key[rows], *on_disk]))

    def all_rows(self) -> np.ndarray:
        """Every key held, ascending: what a client whose tracking was dropped reads next."""
        return np.sort(np.concatenate([keys for _, keys, _ in self.logical_rows(range(LOGICAL_SHARDS))]))

    def mark_for(self, client_id: int, keys: np.ndarray) -> None:
        """Mark ``keys`` changed for ``client_id`` alone (those a read could not fit)."""
        rows = self.hot.index.lookup(keys)
        self.hot.mark_for(client_id, rows[rows >= 0])
        if (rows < 0).any():
            self._cold_changed.setdefault(int(client_id), []).append(keys[rows < 0])

    def changed_rows(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(keys, float32 rows) of ``keys``: what a changed-row read sends (their rows come in)."""
        return keys, self.pull(keys)

    # ------------------------------------------------------------ records

    def _byte_views(self) -> list[np.ndarray]:
        """Each slab array as uint8[capacity, its row's bytes] (views of the live arrays)."""
        return [arr.view(np.uint8).reshape(arr.shape[0], -1) for arr in self.hot.slab.arrays()]

    def _packed(self, rows: np.ndarray) -> np.ndarray:
        """The records of hot ``rows``: every slab array's row bytes, one after the other."""
        return np.concatenate([view[rows] for view in self._byte_views()], axis=1)

    def _unpacked(self, records: np.ndarray) -> dict[str, np.ndarray]:
        """Records as the hot store's arrays by name (:meth:`HashSparseStore.slab_arrays`)."""
        slab = self.hot.slab
        arrays: dict[str, np.ndarray] = {}
        at = 0
        for name, like in {"values": slab.values, **slab.state}.items():
            arrays[name], at = _column(records, at, like)
        stats, _ = _column(records, at, self.hot.stats)
        return {**arrays, **{field: stats[field] for field in stats.dtype.names or ()}}

    def _values_of(self, records: np.ndarray) -> np.ndarray:
        """The rows of records as float32 (their values come first: :meth:`_packed`), without
        unpacking their optimizer state and statistics as :meth:`_unpacked` does."""
        return decode(_column(records, 0, self.hot.slab.values)[0])

    # ------------------------------------------------------------ the whole table

    def logical_rows(self, logicals: Iterable[int]) -> Iterator[tuple[int, np.ndarray, dict[str, np.ndarray]]]:
        """For each logical shard of ``logicals``: (it, its keys, their rows by name as
        :meth:`HashSparseStore.slab_arrays`), the rows in RAM over their copies on disk. The keys
        in RAM are grouped once, the rows on disk walked a logical shard at a time."""
        keys, rows = self.hot.index.items()
        logical_of = LogicalSharding.logical(keys)
        order = np.argsort(logical_of, kind="stable")
        keys, rows = keys[order], rows[order]
        bounds = np.searchsorted(logical_of[order], np.arange(LOGICAL_SHARDS + 1))
        slab = self.hot.slab_arrays()
        for logical in logicals:
            at = slice(bounds[logical], bounds[logical + 1])
            hot = keys[at]
            all_keys, parts = [hot], [{name: arr[rows[at]] for name, arr in slab.items()}]
            if self.cold_keys:
                held = np.sort(hot)
                for cold_keys, records in self.cold.walk(logical):
                    keep = ~np.isin(cold_keys, held, assume_unique=True)
                    all_keys.append(cold_keys[keep])
                    parts.append(self._unpacked(records[keep]))
            yield logical, np.concatenate(all_keys), {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}

    def restore(self, keys: np.ndarray, arrays: dict[str, np.ndarray], pending: tuple[np.ndarray, np.ndarray]) -> None:
        """Put saved keys back with their rows (by name, as :meth:`HashSparseStore.restore`), as a
        checkpoint load does: into RAM while it has room, the rest straight to disk."""
        self.staged.clear()  # the records on disk change
        keys = np.asarray(keys, np.int64)
        fit = min(keys.shape[0], self.capacity - len(self.hot))
        rows = self.hot.restore(keys[:fit], {name: arr[:fit] for name, arr in arrays.items()}, pending)
        self._hold(keys[:fit], rows)  # not on disk (in_cold clear): a row sent out is written
        if fit < keys.shape[0]:
            rest = slice(fit, None)
            self.cold.write(keys[rest], self._records_of({name: arr[rest] for name, arr in arrays.items()}))
            self.cold_keys += keys.shape[0] - fit

    def _records_of(self, arrays: dict[str, np.ndarray]) -> np.ndarray:
        """Rows by name (as :meth:`HashSparseStore.slab_arrays`) as records (:meth:`_packed`'s layout)."""
        slab = self.hot.slab
        n = arrays["values"].shape[0]
        stats = np.empty(n, self.hot.stats.dtype)
        for field in stats.dtype.names or ():
            stats[field] = arrays[field]
        parts = [np.ascontiguousarray(arrays["values"], slab.values.dtype), *(np.ascontiguousarray(arrays[name], arr.dtype)
                 for name, arr in slab.state.items()), stats]
        return np.concatenate([part.view(np.uint8).reshape(n, -1) for part in parts], axis=1)

    # ------------------------------------------------------------ deletion, shrink, saves

    def delete_keys(self, keys: np.ndarray) -> int:
        """Delete ``keys`` wherever their rows are (unknown ones are skipped); counted as evicted
        and noted for the next delta save, as :meth:`HashSparseStore.delete_keys`."""
        self.staged.clear()  # the records on disk change
        keys = np.unique(np.asarray(keys, np.int64))
        rows = self.hot.index.lookup(keys)
        hot = rows >= 0
        hot_rows = rows[hot]
        hot_on_disk = keys[hot][self.in_cold[hot_rows]]
        on_disk_too = int(hot_on_disk.size)
        gone = self.hot.delete_keys(keys[hot])
        for flags in (self.held, self.referenced, self.in_cold, self.dirty):
            flags[hot_rows] = False
        self.hot_in_cold -= on_disk_too
        self.cold_keys -= on_disk_too
        cold_only = keys[~hot]
        if cold_only.size and self.cold_keys:
            found, _ = self.cold.fetch(cold_only)
            cold_only = cold_only[found]
            self.hot.deleted.note(cold_only)
            self.hot.evicted += int(cold_only.size)
            self.cold_keys -= int(cold_only.size)
            gone += int(cold_only.size)
        self.cold.delete(np.concatenate([hot_on_disk, cold_only]))
        return gone

    def shrink(
        self, decay: float | None = None, threshold: float | None = None, ttl: int | None = None, days: int = 0
    ) -> int:
        """:meth:`HashSparseStore.shrink` over every key: the hot rows' statistics in RAM, then
        every row on disk, a logical shard at a time (decayed rows written back, dead ones
        deleted). Returns how many keys were deleted. Reads and writes the whole table on disk."""
        self.staged.clear()  # the records on disk change
        dead_hot = self.hot.shrink_plan(decay, threshold, ttl, days)  # advances the day; decays the hot rows
        hot, rules = self.hot, self.hot.accessor
        decay = rules.show_click_decay if decay is None else decay
        threshold = rules.delete_threshold if threshold is None else threshold
        deleted = 0
        for logical in range(LOGICAL_SHARDS) if self.cold_keys else ():
            for keys, records in list(self.cold.walk(logical)):
                cold_only = hot.index.lookup(keys) < 0  # a hot row is the key's row: judged above
                keys, records = keys[cold_only], records[cold_only]
                if not keys.size:
                    continue
                rows = self._unpacked(records)
                dead = np.empty(keys.shape[0], np.bool_)
                decay_and_judge(rows["show"], rows["click"], rows["last_step"], rows["last_day"], keys.shape[0],
                                np.arange(keys.shape[0], dtype=np.int64), float(decay), float(threshold),
                                -1 if ttl is None else int(ttl), hot.step,
                                -1 if self.spec.ttl_days is None else int(self.spec.ttl_days), hot.day,
                                rules.nonclk_coeff, rules.click_coeff, dead)
                self.cold.write(keys[~dead], self._records_of(rows)[~dead])
                self.cold.delete(keys[dead])
                hot.deleted.note(keys[dead])
                hot.evicted += int(dead.sum())
                self.cold_keys -= int(dead.sum())
                deleted += int(dead.sum())
        return deleted + self.delete_keys(dead_hot)

    def after_save(self, keys: np.ndarray, deleted: np.ndarray) -> None:
        """A base or delta save is in place (as :meth:`HashSparseStore.after_save`, by key): the
        rows of ``keys`` it wrote start a new delta, in RAM and on disk, and the ``deleted`` keys
        it covered are forgotten."""
        self.staged.clear()  # the records on disk change
        rows = self.hot.index.lookup(keys)
        hot_rows = rows[rows >= 0]
        self.hot.after_save(hot_rows, deleted)
        self.dirty[hot_rows] = True  # a copy on disk has the old delta score
        cold_only = keys[rows < 0]
        for at in range(0, cold_only.shape[0], WALK_ROWS):
            part = cold_only[at : at + WALK_ROWS]
            found, records = self.cold.fetch(part)
            arrays = self._unpacked(records)
            arrays["delta_score"][:] = 0.0
            self.cold.write(part[found], self._records_of(arrays))

    def hot_rows(self) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray, np.ndarray]:
        """The rows in RAM, for a snapshot: (keys, rows by name, ``in_cold``, ``dirty``); beside
        :meth:`ColdRows.snapshot`, whose copy of a key in RAM is stale where ``dirty``."""
        keys, rows = self.hot.index.items()
        return keys, {name: arr[rows] for name, arr in self.hot.slab_arrays().items()}, self.in_cold[rows], self.dirty[rows]

    def install_hot(self, keys: np.ndarray, rows: dict[str, np.ndarray], in_cold: np.ndarray, dirty: np.ndarray,
                    pending: tuple[np.ndarray, np.ndarray], cold_keys: int) -> None:
        """Put a snapshot's rows in RAM back (:meth:`hot_rows`) over its rows on disk (the
        ``snapshot`` this shard was made from, holding ``cold_keys`` keys), with the admission
        counters; more rows than fit in RAM is an error (a snapshot of a shard of this table
        never has more)."""
        self.staged.clear()
        taken = self.hot.restore(keys, rows, pending)
        self._hold(keys, taken)
        self.in_cold[taken] = in_cold
        self.dirty[taken] = dirty
        self.cold_keys = int(cold_keys)
        self.hot_in_cold = int(in_cold.sum())

    def put_records(self, keys: np.ndarray, records: np.ndarray) -> None:
        """Rows of keys not held, as records of this table (another shard's, :meth:`ColdRows.walk`),
        straight to disk: a load onto another cluster size."""
        self.staged.clear()  # the records on disk change
        self.cold.write(keys, records)
        self.cold_keys += int(keys.shape[0])

    @property
    def day(self) -> int:
        """The shard's day (the hot store's clocks are the table's)."""
        return self.hot.day

    @property
    def growth_due(self) -> bool:
        """Never: the hot rows are reserved whole at creation (the RAM budget)."""
        return False

    @property
    def eviction_due(self) -> int:
        """Never ahead: rows go out to disk as requests need room, and no cap deletes keys."""
        return 0

    @property
    def resize_draining(self) -> bool:
        """Never for the server's idle drain: a disk table's requests run in threads, so a step
        on the event loop could meet one; its hot index's resizes drain at its inserts' pace."""
        return False

    def drain_resize(self, slots: int) -> bool:
        """Nothing to drain here (:attr:`resize_draining`): done."""
        return True

    # ------------------------------------------------------------ reports

    @property
    def nbytes(self) -> int:
        """Bytes in RAM: the hot store, each hot row's clock and flags, and the disk store's
        caches, write buffers, bloom filters and block indexes."""
        flags = self.row_key.nbytes + sum(a.nbytes for a in (self.held, self.referenced, self.pinned, self.in_cold, self.dirty))
        return int(self.hot.nbytes + flags + self.staged.nbytes + self.cold.ram_nbytes)

    @property
    def disk_nbytes(self) -> int:
        """Bytes of the cold rows' files on disk."""
        return self.cold.disk_nbytes

    def counts(self) -> dict[str, int]:
        """TABLE_INFO's and STATS' numbers (as :meth:`HashSparseStore.counts`), with the keys
        ``hot_keys`` in RAM, ``disk_bytes``, the keys requests asked for, the rows brought in
        and sent out, the batched disk reads, the rows they found and the rows written, and the
        keys found staged (:mod:`.staged`)."""
        hot = self.hot.counts()
        return {**hot, "keys": len(self), "bytes": self.nbytes, "disk_bytes": self.disk_nbytes, "hot_keys": len(self.hot),
                "requested_keys": self.requested_keys, "paged_in": self.paged_in, "paged_out": self.paged_out,
                "disk_reads": self.cold.reads, "disk_read_rows": self.cold.found_keys, "disk_written_rows": self.cold.written,
                "staged_hits": self.staged_hits}

    def close(self) -> None:
        """Close the disk store and remove its files (done anyway when the shard is collected)."""
        self._finalizer()
