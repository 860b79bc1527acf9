"""The hash-keyed sparse store against the fixed table, in one process, no sockets.

    .venv/bin/python bench/hash_table.py                         # 1M and 10M keys, dim 16 (~2 min, ~4 GB)
    .venv/bin/python bench/hash_table.py --keys 1000000 --repeat 20

For each table size N (``--keys``), N random int64 keys (any bit pattern) are pushed into a
:class:`~aps.storage.hash.store.HashSparseStore` (Adagrad, ``--dim``) in batches of ``--batch``
new keys: that is the insert rate (admission, index insert, initial rows, optimizer, statistics).
Then, on the full table:

* index alone: ``lookup`` of ``--batch`` held keys, and of ``--batch`` absent keys;
* the store: ``pull`` and ``push_grad`` (Adagrad) of ``--batch`` held keys, beside a fixed
  :class:`~aps.storage.tables.SparseShard` of N rows with the same optimizer doing the same pull
  and push of ``--batch`` random row ids (the issue's aim: hash >= 0.7x fixed rows/s);
* bytes per key: the growth of this process's resident memory while the store was filled, and
  what the store reserves (slab, statistics, index; slab rows no key has used are never touched,
  so they cost address space, not memory), over the keys it holds, beside the aim
  ``row bytes x 1.3 + 16`` (row bytes: value + optimizer state + statistics).

Rates are the median of ``--repeat`` calls, in keys (rows) per second. Each size runs in a fresh
process. Prints a Markdown table, writes JSON (``--json``).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from aps.specs import (  # noqa: E402
    Adagrad,
    HashTable,  # noqa: E402
    SparseTable,
)
from aps.storage.hash.store import HashSparseStore  # noqa: E402
from aps.storage.tables import SparseShard  # noqa: E402
from bench.pservers import markdown_table, write_results  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, nargs="+", default=[1_000_000, 10_000_000], help="table sizes")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--batch", type=int, default=10_000, help="keys per call (default 10,000)")
    p.add_argument("--repeat", type=int, default=50, help="timed calls per row (median)")
    p.add_argument("--json", type=Path, default=Path(__file__).resolve().parent / "results" / "hash_table.json")
    args = p.parse_args(argv)
    if min(args.keys) < args.batch or args.dim < 1 or args.batch < 1 or args.repeat < 1:
        p.error("need --keys >= --batch >= 1, --dim >= 1, --repeat >= 1")
    return args


def rss() -> int:
    """This process's resident set, bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def rate(fn: Callable[[int], object], count: int, repeat: int) -> float:
    """Median keys/s of ``fn(i)`` handling ``count`` keys, over ``repeat`` timed calls."""
    fn(0)  # compile / warm
    times = []
    for i in range(repeat):
        t = time.perf_counter()
        fn(i + 1)
        times.append(time.perf_counter() - t)
    return count / statistics.median(times)


def one_size(n: int, args: argparse.Namespace) -> dict[str, Any]:
    dim, batch, repeat = args.dim, args.batch, args.repeat
    opt = Adagrad(lr=0.05)
    rng = np.random.default_rng(n)
    keys = np.unique(rng.integers(-(1 << 63), (1 << 63) - 1, n + n // 100, dtype=np.int64, endpoint=True))[:n]
    rng.shuffle(keys)
    warm = HashSparseStore(HashTable("warm", dim=dim, optimizer=opt))  # compile before measuring memory
    warm.push_grad(keys[:2], np.zeros((2, dim), np.float32))
    warm.pull(keys[:4])
    del warm
    rss0 = rss()
    store = HashSparseStore(HashTable("emb", dim=dim, optimizer=opt))
    g = rng.standard_normal((batch, dim)).astype(np.float32)
    t = time.perf_counter()
    for lo in range(0, n, batch):
        part = keys[lo : lo + batch]
        store.push_grad(part, g[: len(part)])
    insert_s = time.perf_counter() - t
    assert len(store) == n
    rss_per_key = (rss() - rss0) / n

    held = [keys[rng.integers(0, n, batch)] for _ in range(repeat + 1)]
    absent = [rng.integers(-(1 << 63), (1 << 63) - 1, batch, dtype=np.int64, endpoint=True) for _ in range(repeat + 1)]
    fixed = SparseShard(SparseTable("emb", rows=n, dim=dim, optimizer=opt), 0, 1)
    ids = [rng.integers(0, n, batch).astype(np.int64) for _ in range(repeat + 1)]
    out = {
        "keys": n,
        "dim": dim,
        "insert_keys_per_s": n / insert_s,
        "index_lookup_held_per_s": rate(lambda i: store.index.lookup(held[i]), batch, repeat),
        "index_lookup_absent_per_s": rate(lambda i: store.index.lookup(absent[i]), batch, repeat),
        "hash_pull_rows_per_s": rate(lambda i: store.pull(held[i]), batch, repeat),
        "fixed_pull_rows_per_s": rate(lambda i: fixed.pull(ids[i]), batch, repeat),
        "hash_push_rows_per_s": rate(lambda i: store.push_grad(held[i], g), batch, repeat),
        "fixed_push_rows_per_s": rate(lambda i: fixed.push_grad(ids[i], g), batch, repeat),
        "rss_bytes_per_key": rss_per_key,
        "reserved_bytes_per_key": store.nbytes / len(store),
        "row_bytes": store.row_nbytes,
        "aim_bytes_per_key": store.row_nbytes * 1.3 + 16,
        "index_bytes_per_key": store.index.nbytes / len(store),
        "slab_rows": store.capacity,
    }
    out["pull_ratio"] = out["hash_pull_rows_per_s"] / out["fixed_pull_rows_per_s"]
    out["push_ratio"] = out["hash_push_rows_per_s"] / out["fixed_push_rows_per_s"]
    return out


def report(results: list[dict[str, Any]]) -> None:
    m = 1e6
    rows = [
        [f"{r['keys']:,}", f"{r['insert_keys_per_s'] / m:.2f}", f"{r['index_lookup_held_per_s'] / m:.1f}",
         f"{r['index_lookup_absent_per_s'] / m:.1f}",
         f"{r['hash_pull_rows_per_s'] / m:.2f} / {r['fixed_pull_rows_per_s'] / m:.2f} ({r['pull_ratio']:.2f}x)",
         f"{r['hash_push_rows_per_s'] / m:.2f} / {r['fixed_push_rows_per_s'] / m:.2f} ({r['push_ratio']:.2f}x)",
         f"{r['rss_bytes_per_key']:.0f} / {r['reserved_bytes_per_key']:.0f} (aim {r['aim_bytes_per_key']:.0f}; "
         f"index {r['index_bytes_per_key']:.0f})"]
        for r in results
    ]
    print(markdown_table(
        ["keys held", "insert M keys/s", "lookup held M/s", "lookup absent M/s", "pull M rows/s hash / fixed",
         "push M rows/s hash / fixed", "bytes per key resident / reserved"],
        rows,
    ))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    ctx = mp.get_context("spawn")
    results = []
    for n in args.keys:  # a fresh process per size: memory freed by one size is not reused by the next
        with ctx.Pool(1) as pool:
            results.append(pool.apply(one_size, (n, args)))
    report(results)
    write_results(args.json, {"dim": args.dim, "batch": args.batch, "repeat": args.repeat, "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
