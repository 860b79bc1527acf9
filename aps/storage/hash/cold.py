"""The cold rows of a disk table's shard: one RocksDB database (through ``rocksdict``) per shard.

Why RocksDB rather than a log-structured file of our own (docs/concepts.md, "Disk tables", has
the numbers from both on one machine): a disk table exists for more keys than RAM holds, so the
RAM a cold key costs decides how far it goes. A log of our own needs an in-RAM index entry per
key (8 bytes of key and 8 of offset at least, 16 bytes or more a key with a hash table's slack);
RocksDB keeps keys on disk beside their rows and holds only a bloom filter and a block index in
RAM (under 2 bytes a key measured). Its reads are slower (docs/concepts.md) and so are its
writes (one Python call a row), but a disk table writes only the rows it pushes out. It also
brings compaction, which a log must be written with, and it is what Paddle's SSD table and
HugeCTR's HPS keep cold rows in.

Tuned for a disk table's steady state, a batched read of held keys while rows go out beside it
(measured on a 2-core VM, 8M records of 50 bytes, each step reading 2,000 held keys and writing
1,900: 6.8 µs a key read as RocksDB comes, 4.4 with the first choice below, 3.0-3.4 with the
second): the table files are read through ``mmap`` rather than ``pread`` into the block cache
(no system call, copy or cache insertion a block; the pages are the kernel's page cache either
way), and the write buffers carry a bloom filter of their keys (a key read is nearly never one
just written, and without it every key searched the buffer's skip list). One read is split over
up to :data:`READ_THREADS` threads, as rocksdict lets go of the GIL while RocksDB reads (2,000
keys: 5.2 ms in one thread, 2.9 in two, on an otherwise idle database). Each level-0 file is one
more place every key is looked for, so a bulk fill faster than compaction keeps up with slows the
reads until the files are merged: 4.7 µs a key with 14 files there after 39M keys were pushed in
(2.7-3.0 with one to four after 12M). Writes wait at :data:`LEVEL0_WAIT` files instead: the same
fill then left 7, and 3 once its first requests ran (4.0 µs a key).

A record is one key's row: each slab array's row bytes one after the other (the value in the
table's dtype, each optimizer state, the statistics), so a row goes out and comes back bitwise.
The key is the logical shard (2 bytes, big-endian) then the key (8 bytes, big-endian): one
logical shard's rows are one key range, which a checkpoint writes a file at a time.

The directory is the shard's working copy, not a durable one: it is emptied when the shard is
made (a checkpoint holds every row, and a restarted pserver loads it), so the database writes no
write-ahead log. A checkpoint holds a snapshot of the database (RocksDB's checkpoint: its files
hard-linked), and a load on the same cluster size starts from that snapshot's files, linked
again. Every call blocks on disk: a pserver runs them off its event loop.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from ...errors import ConfigError
from ...sharding import LOGICAL_SHARDS, LogicalSharding

try:
    import rocksdict
except ImportError:  # pragma: no cover - rocksdict is a dependency; a broken install says so
    rocksdict = None

#: the on-disk key: logical shard, then key, both big-endian (one logical shard is one range)
DISK_KEY = np.dtype([("logical", ">u2"), ("key", ">i8")])
#: rows read back per step when a checkpoint walks a logical shard
WALK_ROWS = 65536
#: bits a key in each file's bloom filter: about 1% false positives, so a pull of a key the
#: table never held seldom reads a block
BLOOM_BITS = 10
#: most threads one batched read is split over (fewer on a machine with fewer cores); a part is
#: at least :data:`READ_PART` keys, below which a thread's hand-off costs more than it saves
READ_THREADS = 4
READ_PART = 256
#: the write buffers' bloom filter, as a share of their bytes (about 13 bits a key written)
MEMTABLE_BLOOM = 0.02
#: level-0 files at which a write waits for compaction to merge some (RocksDB's own triggers, 20
#: files to slow writes and 36 to stop them, let a bulk fill leave 14 there for reads to look
#: through); the wait is ours, outside the GIL (rocksdict holds it through a write, so a write
#: RocksDB stalls would stall the pserver's event loop too), at most LEVEL0_WAIT_S a write
LEVEL0_WAIT = 8
LEVEL0_WAIT_S = 10.0
#: rows one write batch holds at most, for the same reason: a bulk fill sends 100,000 rows out a
#: push, a write of ~150 ms with the GIL held; between batches the event loop runs, and a batch
#: that would find both write buffers full (RocksDB would stall it until a flush) waits first
WRITE_CHUNK = 8192


class ColdRows:
    """Records of ``record_nbytes`` bytes by int64 key, in a RocksDB database at ``directory``;
    ``cache_bytes`` of RAM for its block cache and write buffers together."""

    def __init__(self, directory: Path, record_nbytes: int, cache_bytes: int, *, snapshot: Path | None = None,
                 read_only: bool = False) -> None:
        """An empty database at ``directory`` (whatever it held is removed: the module's note);
        with ``snapshot``, one that starts as that snapshot (:meth:`snapshot`); ``read_only``:
        the database at ``directory`` as it is, for reading (a snapshot another shard loads)."""
        if rocksdict is None:
            raise ConfigError("a disk table needs the rocksdict package (pip install rocksdict)")
        self.directory = Path(directory)
        self.record_nbytes = record_nbytes
        if not read_only:
            shutil.rmtree(self.directory, ignore_errors=True)
            if snapshot is None:
                self.directory.mkdir(parents=True, exist_ok=True)
            else:
                _link_tree(snapshot, self.directory)
        options = rocksdict.Options(raw_mode=True)
        options.create_if_missing(not read_only)
        table = rocksdict.BlockBasedOptions()
        table.set_bloom_filter(BLOOM_BITS, False)
        table.set_block_cache(rocksdict.Cache(max(cache_bytes // 2, 1 << 20)))
        table.set_cache_index_and_filter_blocks(False)
        options.set_block_based_table_factory(table)
        options.set_compression_type(rocksdict.DBCompressionType.none())  # float rows do not compress
        self._write_buffer_nbytes = max(cache_bytes // 4, 1 << 20)
        options.set_write_buffer_size(self._write_buffer_nbytes)
        options.set_max_write_buffer_number(2)
        options.set_max_background_jobs(2)
        options.set_allow_mmap_reads(True)
        options.set_memtable_prefix_bloom_ratio(MEMTABLE_BLOOM)
        options.set_memtable_whole_key_filtering(True)
        access = rocksdict.AccessType.read_only() if read_only else rocksdict.AccessType.read_write()
        self._db = rocksdict.Rdict(str(self.directory), options, access_type=access)
        self._write_options = rocksdict.WriteOptions()
        self._write_options.disable_wal = True
        self._read_threads = max(1, min(READ_THREADS, os.cpu_count() or 1))
        self._readers: ThreadPoolExecutor | None = None  # made at the first read split in parts
        self.reads = self.read_keys = self.found_keys = self.written = 0

    def snapshot(self, target: Path) -> None:
        """A snapshot of every row at ``target`` (a directory that must not exist yet): the write
        buffers are flushed to files, which RocksDB's checkpoint hard-links (it never changes a
        file once written), so it costs little more than the flush however big the table."""
        self._db.flush()  # the rows in write buffers reach files (there is no log to replay)
        rocksdict.Checkpoint(self._db).create_checkpoint(str(target))

    # ------------------------------------------------------------ rows

    @staticmethod
    def _disk_keys(keys: np.ndarray, logicals: np.ndarray | None = None) -> list[bytes]:
        """Each key as :data:`DISK_KEY`'s bytes (``logicals``: the keys' logical shards, if known)."""
        encoded = np.empty(keys.shape[0], DISK_KEY)
        encoded["logical"] = LogicalSharding.logical(keys) if logicals is None else logicals
        encoded["key"] = keys
        raw = encoded.tobytes()
        width = DISK_KEY.itemsize
        return [raw[i : i + width] for i in range(0, len(raw), width)]

    def fetch(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The records of those of ``keys`` held here, in one batched read: (a boolean mask of the
        keys found, uint8[found, record_nbytes] in the order of the keys found)."""
        if not keys.shape[0]:
            return np.zeros(0, np.bool_), np.empty((0, self.record_nbytes), np.uint8)
        got = self._read(self._disk_keys(keys))
        self.reads += 1
        self.read_keys += keys.shape[0]
        found = np.fromiter((value is not None for value in got), np.bool_, len(got))
        present = [value for value in got if value is not None]
        self.found_keys += len(present)
        records = np.frombuffer(b"".join(present), np.uint8).reshape(len(present), self.record_nbytes)
        return found, records

    def _read(self, encoded: list[bytes]) -> list[bytes | None]:
        """A batched read of ``encoded`` keys: this thread reads the first part, the reader
        threads the others at the same time."""
        parts = max(1, min(self._read_threads, len(encoded) // READ_PART))
        if parts == 1:
            return self._db.get(encoded)
        if self._readers is None:
            self._readers = ThreadPoolExecutor(self._read_threads - 1, thread_name_prefix="aps-cold-read")
        bounds = [len(encoded) * i // parts for i in range(parts + 1)]
        others = [self._readers.submit(self._db.get, encoded[bounds[i] : bounds[i + 1]]) for i in range(1, parts)]
        got = self._db.get(encoded[: bounds[1]])
        for other in others:
            got += other.result()
        return got

    def write(self, keys: np.ndarray, records: np.ndarray) -> None:
        """Store each key's record (replacing any it had), in write batches of at most
        :data:`WRITE_CHUNK` rows in the disk keys' order (a sorted batch goes into the write
        buffer's skip list 13% faster: 2,250 rows in 2.7 ms against 3.1), each after
        :meth:`_wait_for_room`."""
        if not keys.shape[0]:
            return
        logicals = LogicalSharding.logical(keys)
        order = np.lexsort((keys.view(np.uint64), logicals))  # DISK_KEY's byte order
        keys, logicals, records = keys[order], logicals[order], np.ascontiguousarray(records[order], np.uint8)
        width = self.record_nbytes
        for start in range(0, keys.shape[0], WRITE_CHUNK):
            part = slice(start, start + WRITE_CHUNK)
            raw = records[part].tobytes()
            self._wait_for_room(len(raw))
            batch = rocksdict.WriteBatch(raw_mode=True)
            for i, key in enumerate(self._disk_keys(keys[part], logicals[part])):
                batch.put(key, raw[i * width : (i + 1) * width])
            self._db.write(batch, self._write_options)
        self.written += keys.shape[0]

    def _wait_for_room(self, nbytes: int) -> None:
        """Sleep (the GIL let go) while level 0 holds :data:`LEVEL0_WAIT` files or more, or
        while ``nbytes`` more would fill the write buffer with the other one still being flushed,
        at most :data:`LEVEL0_WAIT_S` (then RocksDB's own triggers rule)."""
        deadline = time.monotonic() + LEVEL0_WAIT_S
        while time.monotonic() < deadline and (
            self._property("rocksdb.num-files-at-level0") >= LEVEL0_WAIT
            or (self._property("rocksdb.num-immutable-mem-table") > 0
                and self._property("rocksdb.cur-size-active-mem-table") + 2 * nbytes >= self._write_buffer_nbytes)
        ):
            time.sleep(0.005)

    def delete(self, keys: np.ndarray) -> None:
        """Drop the records of ``keys`` (keys not held are no error)."""
        if not keys.shape[0]:
            return
        batch = rocksdict.WriteBatch(raw_mode=True)
        for key in self._disk_keys(keys):
            batch.delete(key)
        self._db.write(batch, self._write_options)

    def walk(self, logical: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Every record of logical shard ``logical`` in key order, a step of at most
        :data:`WALK_ROWS` at a time: (keys int64, uint8[n, record_nbytes])."""
        if not 0 <= logical < LOGICAL_SHARDS:
            raise ValueError(f"logical shard {logical} out of range")
        prefix = np.array([(logical, 0)], DISK_KEY).tobytes()[:2]
        keys: list[bytes] = []
        values: list[bytes] = []
        it = self._db.iter()
        it.seek(prefix)
        while it.valid():
            key = it.key()
            if key[:2] != prefix:
                break
            keys.append(key)
            values.append(it.value())
            if len(keys) == WALK_ROWS:
                yield self._decoded(keys, values)
                keys, values = [], []
            it.next()
        del it
        if keys:
            yield self._decoded(keys, values)

    def _decoded(self, keys: list[bytes], values: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
        decoded = np.frombuffer(b"".join(keys), DISK_KEY)["key"].astype(np.int64)
        return decoded, np.frombuffer(b"".join(values), np.uint8).reshape(len(values), self.record_nbytes)

    # ------------------------------------------------------------ sizes

    def _property(self, name: str) -> int:
        value = self._db.property_int_value(name)
        return int(value or 0)

    @property
    def disk_nbytes(self) -> int:
        """Bytes of the database's files on disk (its sorted tables; it keeps no log)."""
        return self._property("rocksdb.total-sst-files-size")

    @property
    def ram_nbytes(self) -> int:
        """Bytes the database holds in RAM: write buffers, the block cache's use, and each open
        file's bloom filter and block index."""
        return (self._property("rocksdb.cur-size-all-mem-tables") + self._property("rocksdb.block-cache-usage")
                + self._property("rocksdb.estimate-table-readers-mem"))

    def close(self) -> None:
        """Close the database (its files stay until the directory is emptied or removed)."""
        if self._readers is not None:
            self._readers.shutdown()
        self._db.close()

    def destroy(self) -> None:
        """Close the database and remove its directory."""
        self.close()
        shutil.rmtree(self.directory, ignore_errors=True)


def _link_tree(source: Path, target: Path) -> None:
    """Make ``target`` a copy of the snapshot ``source``: its table files hard-linked (immutable;
    the database deletes its own link, never the snapshot's), the rest (the manifest and
    options, which a database appends to or rewrites) copied; copied whole across filesystems."""
    target.mkdir(parents=True)
    for path in source.iterdir():
        if path.suffix == ".sst":
            try:
                os.link(path, target / path.name)
                continue
            except OSError:
                pass
        shutil.copy2(path, target / path.name)
