"""Where a disk table's cold rows go: RocksDB (rocksdict) against a log file of our own with an in-RAM index.

    .venv/bin/python bench/disk_store_choice.py                   # 2M records of 128 + 8 bytes
    .venv/bin/python bench/disk_store_choice.py --records 20000000

Both stores get the same ``--records`` records (an 8-byte random int64 key and a ``--row-bytes``
row of random bytes), written in the same shuffled order, in a child process each (spawned one
after the other, so that one's memory is not the other's) under a temporary directory in
``--dir``. What each is asked:

* **write**: every record, ``--batch`` (20,000) at a time. RocksDB: a ``WriteBatch`` of puts
  (big-endian keys), written with the write-ahead log off, then ``flush()`` (its files written);
  no compression, a 10-bit bloom filter per key, the block cache and write buffers a disk
  table's shard gets at a 256 MiB budget (``--cache-mib`` 32: a 16 MiB cache, two 8 MiB write
  buffers; aps/storage/hash/cold.py). The log: each batch one contiguous buffer of key + row
  records appended with ``os.write``, then ``fdatasync``; its index (a key and a file offset
  per record, int64 each) filled as it goes and sorted by key at the end (timed apart).
* **read**: ``--reads`` batches of ``--read-keys`` (2,000) keys held, drawn at random, each
  timed (p50, p99; microseconds a key at the median). RocksDB: one multi-get
  (``db.get(list_of_keys)``). The log: ``np.searchsorted`` in the sorted keys, then one
  ``os.preadv`` a key into one buffer, in offset order. Then the same with keys not held (the
  bloom filter's work; the log needs no read at all), and with keys held after each file's pages
  were dropped from the page cache (``posix_fadvise(DONTNEED)``, only these files: what a read
  costs when the rows are not cached, here from this machine's virtual disk). Every read is
  checked against the rows written. RocksDB's reads start once its background compactions
  have ended (the time they took is printed), so that no compaction shares the cores with them.
* **memory**: the RAM a key costs the index. RocksDB: ``rocksdb.estimate-table-readers-mem``
  (each file's bloom filter and block index, held outside the block cache) plus
  ``rocksdb.cur-size-all-mem-tables``, per record. The log: its index arrays' bytes per record
  (16); a hash index instead of a sorted one, at a 0.7 load factor, needs 16 / 0.7 = 23. Both
  also as the child's RSS growth per record (this counts RocksDB's block cache and write
  buffers, capped at ``--cache-mib`` whatever the records, and the log's index).
* **disk**: bytes on disk per record (RocksDB: ``rocksdb.total-sst-files-size``; the log: the
  file's size: no overhead, but a log that rows are rewritten into grows until compacted, which
  RocksDB does and a log of our own would have to be written with).

Prints a Markdown table, writes JSON (``--json``).

Results (2026-11-28, 2 cores AMD EPYC, 24 GiB; load average 1.7-2.2 with others' jobs on the
machine; bench/README.md, "Disk tables", has the tables). 2M records of 128 + 8 bytes: RocksDB
writes 0.39 M rows/s, the log 2.75 (4.55 appending, plus 0.29 s to sort its index); 2,000 held
keys in 10.0 ms (5.0 µs a key) against 4.6 ms (2.3 µs) from the page cache, 145 against 112 ms
with the files' pages dropped; 2,000 absent keys 0.96 against 0.65 ms; RAM 1.81 bytes a key
(table readers; the memtables empty after the flush) against 16 (23 as a hash index); disk
148.6 against 136 bytes a key. Over three runs at 2M RocksDB's held reads took 4.7-7.2 µs a
key (7.2 with three files in level 0 beside level 6's five), the log's 2.2-2.4; an earlier
version of this script read while RocksDB's compactions still ran: 12.2 µs a key. 20M records:
RocksDB writes 0.20 M rows/s (half its rate at 2M; its compactions ran on for 10.9 s after the
writes), reads 6.1 µs a key held and 0.53 absent, 1.82 bytes a key of RAM (34.8 MiB of table
readers); the log 2.27 M rows/s, 3.4 and 1.33 µs a key, 16 bytes a key (320 MB of index).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.pservers import markdown_table, write_results  # noqa: E402

KEY = np.dtype(">i8")


def rss() -> int:
    """This process's VmRSS in bytes."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def dataset(args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray]:
    """(the keys held in the order written, keys not held): the same in both children."""
    rng = np.random.default_rng(args.seed)
    drawn = np.unique(rng.integers(-(1 << 63), (1 << 63) - 1, args.records + args.records // 20 + 4096, dtype=np.int64))
    drawn = rng.permutation(drawn)
    return drawn[: args.records].copy(), drawn[args.records : args.records + 4096].copy()


def rows_of(args: argparse.Namespace, first: int, n: int) -> np.ndarray:
    """The rows of records ``first`` .. ``first + n`` (a batch's, from its own seed: reproducible)."""
    return np.random.default_rng((args.seed, first)).integers(0, 256, (n, args.row_bytes), np.uint8)


def row_of(args: argparse.Namespace, positions: np.ndarray) -> np.ndarray:
    """The rows written at ``positions`` (the write order), to check reads against."""
    out = np.empty((positions.shape[0], args.row_bytes), np.uint8)
    for first in np.unique(positions // args.batch * args.batch):
        mine = positions // args.batch * args.batch == first
        n = min(args.batch, args.records - first)
        out[mine] = rows_of(args, int(first), n)[positions[mine] - first]
    return out


def timed_batches(args: argparse.Namespace, draw: Any, read: Any, before: Any = None) -> dict[str, float]:
    """Run ``read(keys)`` on ``args.reads`` batches drawn by ``draw()``; milliseconds p50/p99 and µs a key."""
    seconds = []
    for _ in range(args.reads):
        keys = draw()
        if before is not None:
            before()
        t0 = time.perf_counter()
        read(keys)
        seconds.append(time.perf_counter() - t0)
    ms = np.array(seconds) * 1e3
    p50 = float(np.percentile(ms, 50))
    return {"p50_ms": p50, "p99_ms": float(np.percentile(ms, 99)), "us_per_key": p50 * 1e3 / args.read_keys}


def drop_pages(paths: list[Path]) -> None:
    """Drop these files' pages from the page cache (only theirs)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


# ----------------------------------------------------------------------------- RocksDB


def levels(db: Any) -> str:
    """RocksDB's files per level, e.g. ``"L0 1, L6 5"`` (from ``rocksdb.levelstats``)."""
    found = []
    for line in (db.property_value("rocksdb.levelstats") or "").splitlines()[2:]:
        parts = line.split()
        if len(parts) >= 2 and parts[1] != "0":
            found.append(f"L{parts[0]} {parts[1]}")
    return ", ".join(found)


def rocks(args: argparse.Namespace, directory: Path) -> dict[str, Any]:
    import rocksdict

    keys, absent = dataset(args)
    n = keys.shape[0]
    encoded = keys.astype(KEY).tobytes()
    start_rss = rss()
    cache = args.cache_mib << 20
    options = rocksdict.Options(raw_mode=True)
    options.create_if_missing(True)
    table = rocksdict.BlockBasedOptions()
    table.set_bloom_filter(10, False)
    table.set_block_cache(rocksdict.Cache(cache // 2))
    table.set_cache_index_and_filter_blocks(False)
    options.set_block_based_table_factory(table)
    options.set_compression_type(rocksdict.DBCompressionType.none())
    options.set_write_buffer_size(cache // 4)
    options.set_max_write_buffer_number(2)
    options.set_max_background_jobs(2)
    db = rocksdict.Rdict(str(directory), options)
    write_options = rocksdict.WriteOptions()
    write_options.disable_wal = True
    width = args.row_bytes

    t0 = time.perf_counter()
    for first in range(0, n, args.batch):
        count = min(args.batch, n - first)
        raw = rows_of(args, first, count).tobytes()
        batch = rocksdict.WriteBatch(raw_mode=True)
        for i in range(count):
            at = (first + i) * 8
            batch.put(encoded[at : at + 8], raw[i * width : (i + 1) * width])
        db.write(batch, write_options)
    db.flush()
    write_s = time.perf_counter() - t0

    rng = np.random.default_rng(args.seed + 1)

    def draw_held() -> np.ndarray:
        return rng.integers(0, n, args.read_keys)

    def read(positions: np.ndarray) -> None:
        got = db.get([encoded[p * 8 : p * 8 + 8] for p in positions.tolist()])
        if any(g is None for g in got):
            raise AssertionError("RocksDB lost a key")
        reads.append((positions, got))

    def draw_absent() -> np.ndarray:
        return absent[rng.integers(0, absent.shape[0], args.read_keys)]

    def read_absent(missing: np.ndarray) -> None:
        raw = missing.astype(KEY).tobytes()
        got = db.get([raw[i : i + 8] for i in range(0, len(raw), 8)])
        if any(g is not None for g in got):
            raise AssertionError("RocksDB found a key never written")

    def check() -> None:
        for positions, got in reads[:3]:
            if b"".join(got) != row_of(args, positions).tobytes():
                raise AssertionError("RocksDB read back other bytes than it was given")
        reads.clear()

    def files() -> list[Path]:
        return sorted(directory.glob("*.sst"))

    def prop(name: str) -> int:
        return int(db.property_int_value(name) or 0)

    t0 = time.perf_counter()
    while prop("rocksdb.num-running-compactions") or prop("rocksdb.compaction-pending") or prop("rocksdb.num-running-flushes"):
        time.sleep(0.05)
    settle_s = time.perf_counter() - t0

    reads: list[tuple[np.ndarray, list[bytes]]] = []
    out: dict[str, Any] = {"engine": "RocksDB (rocksdict)", "write_s": write_s, "write_rows_per_s": n / write_s,
                           "compactions_settled_s": settle_s, "files": len(files()), "levels": levels(db)}
    out["read"] = timed_batches(args, draw_held, read)
    check()
    out["absent"] = timed_batches(args, draw_absent, read_absent)
    out["read_dropped"] = timed_batches(args, draw_held, read, lambda: drop_pages(files()))
    check()
    out["table_readers_bytes"] = prop("rocksdb.estimate-table-readers-mem")
    out["memtables_bytes"] = prop("rocksdb.cur-size-all-mem-tables")
    out["block_cache_bytes"] = prop("rocksdb.block-cache-usage")
    out["ram_index_bytes_per_key"] = (out["table_readers_bytes"] + out["memtables_bytes"]) / n
    out["rss_growth_per_key"] = (rss() - start_rss) / n
    out["disk_bytes_per_key"] = prop("rocksdb.total-sst-files-size") / n
    db.close()
    return out


# ----------------------------------------------------------------------------- a log of our own


def log(args: argparse.Namespace, directory: Path) -> dict[str, Any]:
    keys, absent = dataset(args)
    n = keys.shape[0]
    start_rss = rss()
    record = np.dtype([("key", "<i8"), ("row", np.uint8, (args.row_bytes,))])
    path = directory / "rows.log"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    index_keys = np.empty(n, np.int64)
    index_offsets = np.empty(n, np.int64)
    buf = np.empty(args.batch, record)

    t0 = time.perf_counter()
    offset = 0
    for first in range(0, n, args.batch):
        count = min(args.batch, n - first)
        part = buf[:count]
        part["key"] = keys[first : first + count]
        part["row"] = rows_of(args, first, count)
        view = memoryview(part).cast("B")
        written = 0
        while written < len(view):
            written += os.write(fd, view[written:])
        index_keys[first : first + count] = keys[first : first + count]
        index_offsets[first : first + count] = offset + np.arange(count, dtype=np.int64) * record.itemsize
        offset += count * record.itemsize
    os.fdatasync(fd)
    append_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    order = np.argsort(index_keys, kind="stable")
    index_keys, index_offsets = index_keys[order], index_offsets[order]
    del order
    sort_s = time.perf_counter() - t0

    rng = np.random.default_rng(args.seed + 1)
    out_buf = np.empty((args.read_keys, record.itemsize), np.uint8)
    reads: list[tuple[np.ndarray, np.ndarray]] = []

    def draw_held() -> np.ndarray:
        return rng.integers(0, n, args.read_keys)

    def read(positions: np.ndarray) -> None:
        wanted = keys[positions]
        at = np.searchsorted(index_keys, wanted)
        at[at == n] = 0
        if not (index_keys[at] == wanted).all():
            raise AssertionError("the log's index lost a key")
        offsets = index_offsets[at]
        by_offset = np.argsort(offsets)
        for slot, off in zip(by_offset.tolist(), offsets[by_offset].tolist()):
            os.preadv(fd, [out_buf[slot]], off)
        reads.append((positions, out_buf[:, 8:].copy()))

    def draw_absent() -> np.ndarray:
        return absent[rng.integers(0, absent.shape[0], args.read_keys)]

    def read_absent(missing: np.ndarray) -> None:
        at = np.searchsorted(index_keys, missing)
        at[at == n] = 0
        if (index_keys[at] == missing).any():
            raise AssertionError("the log found a key never written")

    def check() -> None:
        for positions, got in reads[:3]:
            if not np.array_equal(got, row_of(args, positions)):
                raise AssertionError("the log read back other bytes than it was given")
        reads.clear()

    out: dict[str, Any] = {"engine": "log + in-RAM index", "write_s": append_s + sort_s, "append_s": append_s,
                           "index_sort_s": sort_s, "write_rows_per_s": n / (append_s + sort_s),
                           "append_rows_per_s": n / append_s}
    out["read"] = timed_batches(args, draw_held, read)
    check()
    out["absent"] = timed_batches(args, draw_absent, read_absent)
    out["read_dropped"] = timed_batches(args, draw_held, read, lambda: drop_pages([path]))
    check()
    out["ram_index_bytes_per_key"] = (index_keys.nbytes + index_offsets.nbytes) / n
    out["ram_index_bytes_per_key_hash_07"] = out["ram_index_bytes_per_key"] / 0.7
    out["rss_growth_per_key"] = (rss() - start_rss) / n
    out["disk_bytes_per_key"] = os.fstat(fd).st_size / n
    os.close(fd)
    return out


def child(engine: str, args: argparse.Namespace, directory: str, conn: Any) -> None:
    try:
        conn.send(("ok", (rocks if engine == "rocks" else log)(args, Path(directory))))
    except BaseException as exc:  # noqa: BLE001 - reported by the parent
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    conn.close()


def run_child(engine: str, args: argparse.Namespace, base: Path) -> dict[str, Any]:
    directory = base / engine
    directory.mkdir()
    ctx = mp.get_context("spawn")
    parent_end, child_end = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=child, args=(engine, args, str(directory), child_end))
    proc.start()
    child_end.close()
    status, result = parent_end.recv()
    proc.join()
    shutil.rmtree(directory, ignore_errors=True)
    if status != "ok":
        raise RuntimeError(f"{engine}: {result}")
    return result


def report(res: dict[str, Any], args: argparse.Namespace) -> str:
    r, g = res["rocks"], res["log"]

    def reads(x: dict[str, float]) -> str:
        return f"{x['p50_ms']:.2f} / {x['p99_ms']:.2f} ({x['us_per_key']:.2f} µs a key)"

    rows = [
        [r["engine"], f"{r['write_rows_per_s'] / 1e6:.2f}", reads(r["read"]), reads(r["absent"]), reads(r["read_dropped"]),
         f"{r['ram_index_bytes_per_key']:.2f}", f"{r['rss_growth_per_key']:.1f}", f"{r['disk_bytes_per_key']:.1f}"],
        [g["engine"], f"{g['write_rows_per_s'] / 1e6:.2f} (append {g['append_rows_per_s'] / 1e6:.2f})", reads(g["read"]),
         reads(g["absent"]), reads(g["read_dropped"]),
         f"{g['ram_index_bytes_per_key']:.0f} ({g['ram_index_bytes_per_key_hash_07']:.0f} as a hash at 0.7 load)",
         f"{g['rss_growth_per_key']:.1f}", f"{g['disk_bytes_per_key']:.1f}"],
    ]
    return (f"{args.records:,} records of {args.row_bytes} + 8 bytes, batches of {args.batch:,} written, "
            f"{args.reads} reads of {args.read_keys:,} keys each\n\n"
            + markdown_table(["store", "write M rows/s", f"{args.read_keys} held keys: p50 / p99 ms",
                              f"{args.read_keys} absent keys", "held, pages dropped", "RAM index bytes/key",
                              "RSS growth bytes/key", "disk bytes/key"], rows)
            + f"\n\nRocksDB: write {r['write_s']:.1f} s, then {r['compactions_settled_s']:.1f} s until its background "
              f"compactions ended; files {r['levels']}; block cache {r['block_cache_bytes'] / 2**20:.1f} MiB in use, "
              f"table readers {r['table_readers_bytes'] / 2**20:.2f} MiB. Log: append {g['append_s']:.1f} s, "
              f"index sort {g['index_sort_s']:.2f} s.")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=2_000_000, help="records written (default 2,000,000)")
    p.add_argument("--row-bytes", type=int, default=128, help="bytes of a record's row besides its key (default 128)")
    p.add_argument("--batch", type=int, default=20_000, help="records a write (default 20,000)")
    p.add_argument("--read-keys", type=int, default=2000, help="keys a batched read (default 2,000)")
    p.add_argument("--reads", type=int, default=50, help="batched reads timed of each kind (default 50)")
    p.add_argument("--cache-mib", type=int, default=32, help="RocksDB's block cache and write buffers (default 32)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()),
                   help="where the files go (a temporary directory in it, removed after; default %(default)s)")
    p.add_argument("--json", type=Path, default=Path(__file__).resolve().parent / "results" / "disk_store_choice.json")
    args = p.parse_args(argv)
    if min(args.records, args.row_bytes, args.batch, args.read_keys, args.reads, args.cache_mib) < 1:
        p.error("every count must be positive")
    if args.read_keys > args.records:
        p.error("--read-keys must not pass --records")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    need = args.records * (args.row_bytes + 8) * 2
    if shutil.disk_usage(args.dir).free < need:
        print(f"disk_store_choice: {args.dir} has less than the {need / 1e9:.1f} GB needed", file=sys.stderr)
        return 2
    base = Path(tempfile.mkdtemp(prefix="aps-disk-choice-", dir=args.dir))
    try:
        res = {"rocks": run_child("rocks", args, base), "log": run_child("log", args, base)}
    finally:
        shutil.rmtree(base, ignore_errors=True)
    res["config"] = {k: str(v) for k, v in vars(args).items()}
    print(report(res, args))
    write_results(args.json, res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
