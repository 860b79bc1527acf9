"""One pserver holding a 50M-key x dim 16 hash table: resident bytes per key, save and load time.

    .venv/bin/python bench/hash_scale.py                      # 50M keys (~10 GB resident, ~8 GB on disk)
    .venv/bin/python bench/hash_scale.py --keys 2000000       # a smoke run (~10 s on 2 cores)

Issue 20's size test of a hash table on one pserver, each step through the real processes:

* **fill**: one ``aps-server`` child holds an :class:`~aps.HashTable` ``"emb"`` (dim 16,
  Adagrad, no ``max_keys``); this process pushes ``--keys`` distinct random int64 keys over the
  wire, ``--batch`` new keys a push (shuffled, never repeated), and times it: the insert rate.
  Then the server's resident memory (``/proc/PID/status``: VmRSS, and VmHWM, the peak that also
  sees the slab's doubling copies), read at the last push and again once it settles (a server
  drains an index resize its pushes left unfinished once the table is idle: the settled
  figure is the bytes per key reported) and the bytes the table reports (``table_info``). Bytes per
  key is the RSS growth over the fill divided by the keys held (the baseline is read after a
  push and a pull of the first two keys compiled the kernels), beside the aim
  ``(value + optimizer state + statistics) x 1.3 + 16``.
* **save**: ``save(mode="full")`` into a directory under ``--dir``: its time, the bytes and
  files on disk, and the server's RSS peak meanwhile (sampled every 50 ms: a save that copied
  the whole table would show here).
* **load**: the first server is stopped (at 50M keys two of them do not fit in 24 GiB), and a
  fresh ``aps-server --init-model CHECKPOINT`` (a cluster's restart from a checkpoint,
  docs/operations.md "Re-sharding and resuming") is timed from its start to the moment it
  listens (it loads before it serves; an empty server's start-up time is given beside it). Its
  RSS after the load and its peak (VmHWM), and ``--sample`` keys pulled from it must equal,
  byte for byte, the same keys pulled from the first server before the save.

The checkpoint directory is removed at the end. Before anything starts, the free space of
``--dir``'s disk is checked against an estimate of the checkpoint (keys x (row + key) bytes +
10%). Prints a Markdown table, writes JSON (``--json``).

Results (2026-11-26, small sizes only, 2 cores shared with other jobs, load average 1.5-2.0;
the table in bench/README.md): 5M keys filled at 0.79 M keys/s, 203 resident bytes per key (aim
213.6: met; 232 at 2M: part of the growth is not per key), saved in 7.4 s (0.67 M
keys/s, 108 MB/s, 0.80 GB in 1,025 files; RSS peak 1,448 MiB against 1,145 after the fill),
loaded by ``--init-model`` in 4.2 s to serving (an empty server: 0.5 s), 1,025 MiB resident
after it, the sampled keys equal. 50M keys (the default; load average 1.1 at the start): filled
at 0.66 M keys/s, 10,193 MiB resident, 210 bytes per key (met), saved in 56.4 s (8.00 GB,
peak 12,147 MiB), loaded in 32.0 s to serving, 10,147 MiB after, the sampled keys equal.

Issue 35's compact rows (2026-11-28, after the index's 12-byte slots, commit dfa8a1c; before
it in brackets, run just before on the same machine; bench/README.md, "Compact rows"):
``--keys 5000000 --rowwise --dtype float16`` 101-106 resident bytes per key over two runs
(113-117), 67-80 after a load (73-86); ``--keys 50000000 --rowwise --dtype float16`` 92 (119),
77 after a load (117), loaded in 13.3 s (21.1); ``--keys 5000000`` (Adagrad, float32) 194
(199). With ``--stats compact`` too (16 bytes of statistics a key, not 24): 92-100 at 5M keys,
82 at 50M, 69 after a load. With ``--state-dtype bfloat16`` too, after commit 84709fb (the
server drains an idle table's index resize; memory is read once it settles): 73.8 at 50M keys
(80.6 at the last push), 67 after a load, which meets the issue's aim of <= 80 resident bytes per
key at dim 16 with row-wise Adagrad and float16 values. What a key costs moves
with the index's resize cycle (17-24 bytes of slots a key, more while a resize drains) at the
moment the fill stops, and at 5M keys with the 50-75 MB that do not grow with the keys (rows
mapped ahead, the heap the 200,000-key pushes leave).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import aps  # noqa: E402
from aps.storage.hash.store import row_nbytes  # noqa: E402
from bench.big_table_ping import RssSampler  # noqa: E402
from bench.hash_flood import distinct_keys  # noqa: E402
from bench.pservers import MIB, ServerProcess, markdown_table, memory, settled_memory, write_results  # noqa: E402

TABLE = "emb"
CHECKPOINT = "ckpt"
#: the aim: resident bytes per key <= row bytes x this + AIM_EXTRA
AIM_FACTOR, AIM_EXTRA = 1.3, 16
#: a checkpoint's bytes beyond its rows and keys (zip headers of 1,024 files, the manifest) + 10%
DISK_SLACK, DISK_FIXED = 1.10, 64 * MIB


def table_spec(args: argparse.Namespace) -> aps.HashTable:
    """The issue's table: dim 16, Adagrad (a state row per key, as CTR tables have), no cap;
    ``--rowwise``, ``--dtype``, ``--state-dtype`` and ``--stats`` for the compact rows (docs/concepts.md,
    "Compact rows")."""
    return aps.HashTable(TABLE, dim=args.dim, init=aps.Uniform(-0.01, 0.01),
                         optimizer=aps.Adagrad(lr=args.lr, rowwise=args.rowwise), dtype=args.dtype, stats=args.stats,
                         state_dtype=args.state_dtype)


def checkpoint_estimate(keys: int, spec: aps.HashTable) -> int:
    """Bytes the full save of ``keys`` keys takes on disk, with room to spare."""
    return int(keys * (row_nbytes(spec) + 8) * DISK_SLACK) + DISK_FIXED


def tree_size(directory: Path) -> tuple[int, int]:
    """(bytes, files) under ``directory``."""
    files = [f for f in directory.rglob("*") if f.is_file()]
    return sum(f.stat().st_size for f in files), len(files)


async def fill_and_save(server: ServerProcess, args: argparse.Namespace, base: Path) -> dict[str, Any]:
    """Fill the table over the wire, read memory, pull the sample, save (the module's note)."""
    spec = table_spec(args)
    pid = server.proc.pid
    idle = memory(pid)
    rng = np.random.default_rng(args.seed + 1)
    grads = (rng.standard_normal((args.batch, args.dim)) * 0.01).astype(np.float32)
    pushes = -(-args.keys // args.batch)
    per_push = -(-args.sample // pushes)
    samples: list[np.ndarray] = []
    async with aps.connect([server.address], timeout=None) as ps:
        await ps.create_table(spec)
        # shuffled: a push carries its new keys in no particular order, as a trainer's do
        batches = (rng.permutation(keys) for keys in distinct_keys(args.keys, args.batch, args.seed))
        first = next(batches)
        await ps.push_sparse_grad(TABLE, first[:2], grads[:2])  # compile the kernels first
        await ps.pull_sparse(TABLE, first[:2])
        before = memory(pid)
        started = time.perf_counter()
        for p, keys in enumerate(itertools.chain([first[2:]], batches)):
            await ps.push_sparse_grad(TABLE, keys, grads[: len(keys)])
            samples.append(rng.choice(keys, min(per_push, len(keys)), replace=False))
            if (p + 1) % max(1, pushes // 10) == 0 or p + 1 == pushes:
                done, took = min(args.keys, (p + 1) * args.batch), time.perf_counter() - started
                print(f"  fill: {done:,} keys, {done / took / 1e6:.2f} M keys/s, server RSS "
                      f"{memory(pid)['VmRSS'] / MIB:,.0f} MiB", flush=True)
        fill_s = time.perf_counter() - started
        last_push = memory(pid)
        # the server finishes an index resize its pushes left draining once the table is idle
        # (aps/server/hash_upkeep.py): what the table holds from then on
        after = settled_memory(pid)
        info = await ps.table_info(TABLE)
        sample = np.concatenate(samples)[: args.sample]
        pulled = await ps.pull_sparse(TABLE, sample)

        sampler = RssSampler(server)
        t0 = time.monotonic()
        await ps.save(CHECKPOINT, mode="full")
        t1 = time.monotonic()
        sampler.stop()
    disk_bytes, files = tree_size(base / CHECKPOINT)
    print(f"  save: {t1 - t0:.2f} s, {disk_bytes / MIB:,.0f} MiB in {files} files", flush=True)
    return {
        "idle_rss": idle["VmRSS"], "rss_before": before["VmRSS"],
        "fill": {"keys_held": info.keys, "seconds": fill_s, "keys_per_s": (args.keys - 2) / fill_s,
                 "table_bytes": info.bytes, "rss": after["VmRSS"], "rss_anon": after["RssAnon"], "hwm": after["VmHWM"],
                 "rss_growth": after["VmRSS"] - before["VmRSS"], "hwm_growth": after["VmHWM"] - before["VmRSS"],
                 "rss_growth_at_last_push": last_push["VmRSS"] - before["VmRSS"]},
        "save": {"seconds": t1 - t0, "disk_bytes": disk_bytes, "files": files,
                 "rss_peak": sampler.peak(t0, t1), "rss_anon_peak": sampler.peak(t0, t1, anon=True)},
        "sample": sample, "pulled": pulled,
    }


async def pull_after_load(server: ServerProcess, sample: np.ndarray) -> tuple[int, np.ndarray]:
    async with aps.connect([server.address], timeout=None) as ps:
        info = await ps.table_info(TABLE)
        return info.keys, await ps.pull_sparse(TABLE, sample)


def run(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    """Both servers, one after the other, in ``base`` (their logs, the checkpoint)."""
    flags = ("--no-exit-when-done", "--checkpoint-root", str(base))
    t0 = time.monotonic()
    first = ServerProcess.start(base, *flags, name="pserver-fill")
    start_s = time.monotonic() - t0
    try:
        print(f"aps-server pid {first.proc.pid} on {first.address} (listening after {start_s:.2f} s); "
              f"{args.keys:,} keys x dim {args.dim}; checkpoint under {base}", flush=True)
        res = asyncio.run(fill_and_save(first, args, base))
    finally:
        first_status = first.stop()
    t0 = time.monotonic()
    second = ServerProcess.start(base, *flags, "--init-model", str(base / CHECKPOINT), name="pserver-load",
                                 timeout=args.load_timeout)
    load_s = time.monotonic() - t0
    try:
        loaded = memory(second.proc.pid)
        keys, pulled = asyncio.run(pull_after_load(second, res["sample"]))
    finally:
        second_status = second.stop()
    print(f"  load: serving {load_s:.2f} s after its start, RSS {loaded['VmRSS'] / MIB:,.0f} MiB", flush=True)
    res["load"] = {"seconds_to_serving": load_s, "empty_start_seconds": start_s, "keys_held": keys,
                   "rss": loaded["VmRSS"], "rss_anon": loaded["RssAnon"], "hwm": loaded["VmHWM"],
                   "rss_growth": loaded["VmRSS"] - res["rss_before"]}
    res["sample_keys"] = len(res["sample"])
    res["sample_equal_after_load"] = bool(pulled.tobytes() == res.pop("pulled").tobytes())
    res.pop("sample")
    res["exit_status"] = [first_status, second_status]
    return res


def summarize(res: dict[str, Any], spec: aps.HashTable) -> dict[str, Any]:
    """Bytes per key and rates from what :func:`run` measured."""
    fill, save, load = res["fill"], res["save"], res["load"]
    keys = fill["keys_held"]
    row = row_nbytes(spec)
    return {
        "row_bytes": row, "aim_bytes_per_key": row * AIM_FACTOR + AIM_EXTRA,
        "rss_bytes_per_key": fill["rss_growth"] / keys, "hwm_bytes_per_key": fill["hwm_growth"] / keys,
        "rss_bytes_per_key_at_last_push": fill["rss_growth_at_last_push"] / keys,
        "table_bytes_per_key": fill["table_bytes"] / keys, "load_rss_bytes_per_key": load["rss_growth"] / keys,
        "disk_bytes_per_key": save["disk_bytes"] / keys,
        "save_keys_per_s": keys / save["seconds"], "save_mb_per_s": save["disk_bytes"] / 1e6 / save["seconds"],
        "load_keys_per_s": keys / load["seconds_to_serving"],
        "load_mb_per_s": save["disk_bytes"] / 1e6 / load["seconds_to_serving"],
    }


def report(res: dict[str, Any], s: dict[str, Any]) -> str:
    fill, save, load = res["fill"], res["save"], res["load"]
    mib = lambda b: f"{b / MIB:,.0f}"  # noqa: E731
    table = markdown_table(["step", "seconds", "rate", "server RSS MiB (peak)", "bytes per key", "other"], [
        ["fill", f"{fill['seconds']:.1f}", f"{fill['keys_per_s'] / 1e6:.2f} M keys/s", f"{mib(fill['rss'])} ({mib(fill['hwm'])})",
         f"{s['rss_bytes_per_key']:.1f} resident ({s['rss_bytes_per_key_at_last_push']:.1f} at the last push, "
         f"{s['hwm_bytes_per_key']:.0f} peak), {s['table_bytes_per_key']:.0f} reported",
         f"{fill['keys_held']:,} keys held"],
        ["save (full)", f"{save['seconds']:.1f}", f"{s['save_keys_per_s'] / 1e6:.2f} M keys/s, {s['save_mb_per_s']:.0f} MB/s",
         f"peak {mib(save['rss_peak'])} (anonymous {mib(save['rss_anon_peak'])})", f"{s['disk_bytes_per_key']:.0f} on disk",
         f"{save['disk_bytes'] / 1e9:.2f} GB in {save['files']} files"],
        ["load (--init-model)", f"{load['seconds_to_serving']:.1f}", f"{s['load_keys_per_s'] / 1e6:.2f} M keys/s, "
         f"{s['load_mb_per_s']:.0f} MB/s", f"{mib(load['rss'])} ({mib(load['hwm'])})",
         f"{s['load_rss_bytes_per_key']:.0f} resident", f"an empty server listens after {load['empty_start_seconds']:.1f} s"],
    ])
    met = s["rss_bytes_per_key"] <= s["aim_bytes_per_key"]
    return (table + f"\n\nAim: resident bytes per key <= ({s['row_bytes']} row bytes) x {AIM_FACTOR:g} + {AIM_EXTRA} = "
            f"{s['aim_bytes_per_key']:.1f}: {'MET' if met else 'NOT MET'} ({s['rss_bytes_per_key']:.1f}). "
            f"{res['sample_keys']:,} sampled keys after the load "
            f"{'equal' if res['sample_equal_after_load'] else 'DIFFER FROM'} the rows before the save; "
            f"{load['keys_held']:,} keys held after the load.")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, default=50_000_000, help="distinct keys pushed (default 50,000,000)")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--batch", type=int, default=200_000, help="new keys per push (default 200,000)")
    p.add_argument("--lr", type=float, default=0.05, help="Adagrad's learning rate")
    p.add_argument("--rowwise", action="store_true", help="row-wise Adagrad: one accumulator a key")
    p.add_argument("--dtype", choices=aps.specs.VALUE_DTYPES, default="float32", help="how the values are stored")
    p.add_argument("--state-dtype", choices=aps.specs.STATE_DTYPES, default="float32",
                   help="how the optimizer state (the accumulators) is stored")
    p.add_argument("--stats", choices=aps.specs.STATS_LAYOUTS, default="full",
                   help="each key's statistics: full (24 bytes) or compact (16: no last step, 16-bit days)")
    p.add_argument("--sample", type=int, default=10_000, help="keys compared before the save and after the load")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--load-timeout", type=float, default=3600.0, help="seconds the loading server may take to listen")
    p.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()),
                   help="where the servers run and save (a temporary directory in it, removed after; default %(default)s)")
    p.add_argument("--json", type=Path, default=Path(__file__).resolve().parent / "results" / "hash_scale.json")
    args = p.parse_args(argv)
    if min(args.dim, args.batch, args.sample) < 1 or not math.isfinite(args.lr) or args.lr <= 0:
        p.error("--dim, --batch, --sample and --lr must be positive")
    if args.keys < 1000:
        p.error("--keys must be at least 1000")
    if not args.dir.is_dir():
        p.error(f"--dir {args.dir} is not a directory")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    spec = table_spec(args)
    need, free = checkpoint_estimate(args.keys, spec), shutil.disk_usage(args.dir).free
    if free < need:
        print(f"hash_scale: {args.dir} has {free / 1e9:.1f} GB free, the checkpoint of {args.keys:,} keys needs "
              f"about {need / 1e9:.1f} GB; give --dir on a bigger disk or fewer --keys", file=sys.stderr)
        return 2
    base = Path(tempfile.mkdtemp(prefix="aps-hash-scale-", dir=args.dir))
    try:
        res = run(args, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    res["summary"] = summarize(res, spec)
    res["config"] = {k: str(v) for k, v in vars(args).items()}
    print()
    print(report(res, res["summary"]))
    write_results(args.json, res)
    return 0 if res["sample_equal_after_load"] and res["load"]["keys_held"] == res["fill"]["keys_held"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
