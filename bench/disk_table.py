"""A disk table of more than 10x its RAM budget on one pserver, against an all-RAM hash table.

    .venv/bin/python bench/disk_table.py                                   # the default size (see --keys)
    .venv/bin/python bench/disk_table.py --keys 2000000 --ram-bytes 32MiB  # a smoke run

The measurement: one ``aps-server`` child at a time (so the two never share the cores), each
holding table ``"emb"``: dim 16, row-wise Adagrad (lr 0.05), float16 values (``--dtype``,
``--no-rowwise``). First a disk table, ``disk=aps.Disk(ram_bytes=--ram-bytes)`` (default 256
MiB), its cold rows under the server's ``--data-dir``; then the same spec without ``disk``,
with the same keys and the same requests. For each:

* **fill**: ``--keys`` distinct random int64 keys pushed over the wire (``push_sparse_grad``),
  ``--batch`` new keys a push: the insert rate. ``--keys`` defaults to the least whole million
  whose rows (row bytes + 10 bytes of on-disk key, :func:`default_keys`) pass 10x the RAM
  budget, so the table on disk is at least 10x what it may hold in RAM (measured and printed
  after the fill: ``disk_bytes`` / ``ram_bytes``).
* **memory**: the server's VmRSS and RssAnon (``/proc/PID/status``) when it is idle with the
  table created (after a push and a pull of two keys compiled the kernels and its RSS settled),
  during the fill and after it, and ``table_info``'s ``ram_bytes`` and ``disk_bytes``. RAM per
  cold key is the process's own memory, RssAnon: the disk store reads its files through
  ``mmap`` (aps/storage/hash/cold.py), so VmRSS also counts the pages of those files the
  process has touched (RssFile), which are the kernel's page cache (clean, dropped under memory
  pressure, and there with ``pread`` too, where RSS never showed them). It is given two ways.
  *Marginal*: the least-squares slope of RssAnon against cold keys (keys held minus
  the hot keys STATS reports) over the fill's progress points once the hot rows are full (cold
  keys >= the hot capacity): what one more key on disk costs in RAM, the hot rows being a fixed
  cost by then. *Beyond the budget*: (RssAnon after the fill - idle RssAnon - ``ram_bytes``) / cold
  keys: every byte the server grew by past the budget it was given, charged to the cold keys
  (negative when the hot rows and caches have not used all of their budget).
* **traffic**: a hot set of ``--hot-share`` (50%) of the hot rows the budget holds
  (:func:`aps.storage.hash.disk_store.hot_keys`), drawn at random from all keys (so it starts
  mostly on disk); requests of ``--request`` (20,000) keys, 90% drawn from the hot set and 10%
  uniformly from all keys (``--hot-fraction``; with repeats, as a trainer's batches have). A
  warm-up pushes the whole hot set once (a push brings keys into RAM; a pull of a key on disk
  only stages its record, aps/storage/hash/staged.py), then runs ``--warmup`` (400) requests, a pull and a push
  in turn, so that the hot rows and their clock bits settle (its hit rate over its second half
  is printed); then ``--requests`` (600) pulls and as many pushes (a gradient for each key),
  one request at a time, a pull and a push of other keys in turn, each timed (p50, p99; rows/s
  = rows / the requests' summed time). The hit rate is measured, not assumed: 1 - (rows the
  server read from disk, STATS' ``disk_read_rows`` read after every request) / (distinct keys of
  each request, summed), for pulls and pushes apart. Pulls and pushes alternate because the hit
  rate comes in waves: once nearly every hot row is referenced, the hand clears a whole turn's
  bits in one request and the next turn takes rows soon after their bits were cleared (in
  process, 256 MiB, 12M keys: 0.917 for 600 requests, then 0.82-0.87 for about 150), and a
  phase of pulls then one of pushes would give whichever met the dip the lower rate. At 256 MiB
  a turn of the hand passes 2.1M rows at about 1,700 a request, some 1,200 requests: the 1,200
  timed requests span about one. Why half of the hot rows and not more: a request's 2,000 uniform keys bring
  about 1,900 rows in from disk, which fill the RAM rows the hot set leaves and stay one to two
  turns of the CLOCK hand, so the hand turns once per (RAM rows not in the hot set) / (1.5 x
  1,900) requests; a hot key, drawn by a request with probability 18,000 / (hot set), must be
  asked for within one turn to stay. At 80% of the hot rows that
  span is about 150 requests and a fifth of the hot keys miss it, so the hit rate falls below
  90% (in-process, 256 MiB, 12M keys: 91% for the first 300 requests after the hot set came
  in, then 81-86%); at 50% it is about 360 requests and the hit rate stays at 91-92%.
* **pings**: a probe in a process of its own pings the server every ``--interval`` seconds on its
  own connection the whole time (``bench.pservers.PingProbe``): ping p50/p99 per phase, the aim
  read on the timed pulls and pushes.
* **save and load**: ``save(mode="full")`` under the server's checkpoint root, timed, MB/s =
  bytes of the checkpoint's files / seconds; ``--sample`` keys pulled before it. The server is
  stopped, and a fresh one (the same flags, a new ``--data-dir``) is timed ``ps.load(PATH)``:
  MB/s = the same bytes / seconds; the sampled keys pulled from it must equal, byte for byte,
  the rows before the save, and it must hold as many keys. A disk table's full save is a
  snapshot whose rows on disk are hard links to the table's own files, and a load onto as many
  pservers links them again, so the bytes of the checkpoint are not all bytes written or read:
  the bytes of RocksDB's table files in the checkpoint (``*.sst``, which its checkpoint links,
  the data directory and the checkpoint root being on one file system here) and those of the
  loading server's ``--data-dir`` files with another link after the load are printed, and MB/s
  without them beside. Then (``--reshard N``, default 2) the checkpoint, written by one server,
  is loaded onto a cluster of N fresh servers: each reads its logical shards' rows out of the
  snapshot (RocksDB's files opened read-only) into a new store, nothing linked, and the sample
  must equal again; its seconds and MB/s of checkpoint are printed.

Aims (the issue's): RAM <= 10 bytes per cold key; a disk table's pulls >= 1.5 M rows/s and
pushes >= 0.5 M rows/s at a 90% hot hit rate; a 20k-key pull's p99 <= 50 ms; ping p99 < 50 ms
while it serves; save and load >= 300 MB/s. Prints a Markdown table with each aim met or not,
writes JSON (``--json``). Everything runs in a temporary directory under ``--dir``, removed
after.

Results at commit 694548c (2026-11-28, the defaults, nothing else running; bench/README.md has
the table): a pull stages the cold rows it reads instead of bringing them in, so pulls 1.59,
1.51 and 1.51 M rows/s over three runs at an 89.7% hit rate (aim 1.5: met; 1.29-1.47 at
ea48b63, all-RAM 4.26-4.42), p50 11.6-12.3 / p99 23.1-24.0 ms; pushes 0.77-0.82 M rows/s; RAM
per cold key 0.17-0.34 bytes marginal by RssAnon; pings p99 4.9-5.2 ms in the traffic; save
0.9-1.1 s, load 1.3-1.4 s by hard links.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import aps  # noqa: E402
from aps.storage.hash.disk_store import hot_keys  # noqa: E402
from aps.storage.hash.store import row_nbytes  # noqa: E402
from bench.big_table_ping import RssSampler  # noqa: E402
from bench.hash_flood import distinct_keys  # noqa: E402
from bench.pservers import (  # noqa: E402
    MIB,
    PingProbe,
    ServerProcess,
    markdown_table,
    memory,
    percentiles_ms,
    settled_memory,
    window,
    write_results,
)

TABLE = "emb"
CHECKPOINT = "ckpt"
#: the count of a disk table's misses: rows read from disk (DiskHashStore.counts)
MISSES = "disk_read_rows"
#: bytes of a cold row's key on disk (logical shard + key, aps/storage/hash/cold.py)
DISK_KEY_BYTES = 10
#: the aims
AIM_COLD_KEY_BYTES = 10.0
AIM_PULL_ROWS_S = 1.5e6
AIM_PUSH_ROWS_S = 0.5e6
AIM_PULL_P99_MS = 50.0
AIM_PING_P99_MS = 50.0
AIM_SAVE_LOAD_MB_S = 300.0

_UNITS = {"": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}


def byte_size(text: str) -> int:
    """``268435456``, ``256MiB``, ``1GiB``, ``500M`` as bytes."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not found or found.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 268435456, 256MiB, 1GiB)")
    return int(float(found.group(1)) * _UNITS[found.group(2).lower()])


def table_spec(args: argparse.Namespace, disk: bool) -> aps.HashTable:
    """The table of the run: the disk table, or (``disk`` false) the same table all in RAM."""
    return aps.HashTable(TABLE, dim=args.dim, init=aps.Uniform(-0.01, 0.01),
                         optimizer=aps.Adagrad(lr=args.lr, rowwise=args.rowwise), dtype=args.dtype,
                         disk=aps.Disk(ram_bytes=args.ram_bytes) if disk else None)


def default_keys(spec: aps.HashTable) -> int:
    """The least whole million of keys whose rows and on-disk keys pass 10x the RAM budget."""
    assert spec.disk is not None
    need = 10 * spec.disk.ram_bytes / (row_nbytes(spec) + DISK_KEY_BYTES)
    return int(math.ceil(need / 1e6) * 1e6)


def tree_size(directory: Path) -> tuple[int, int, int, int]:
    """(bytes, files, bytes of the files with another hard link, bytes of RocksDB's table files)
    under ``directory``."""
    files = [f for f in directory.rglob("*") if f.is_file()]
    stats = [f.stat() for f in files]
    return (sum(st.st_size for st in stats), len(stats), sum(st.st_size for st in stats if st.st_nlink > 1),
            sum(st.st_size for f, st in zip(files, stats) if f.suffix == ".sst"))


class Workload:
    """The keys of the fill, the hot set, and the requests both tables are sent (the module's note)."""

    def __init__(self, args: argparse.Namespace, hot_capacity: int) -> None:
        rng = np.random.default_rng(args.seed)
        self.batches = [rng.permutation(b) for b in distinct_keys(args.keys, args.batch, args.seed)]
        self.all = np.concatenate(self.batches)
        n = self.all.shape[0]
        self.hot_n = min(n, max(1, int(hot_capacity * args.hot_share)))
        picks = np.unique(rng.integers(0, n, self.hot_n + self.hot_n // 8 + 16))
        while picks.shape[0] < self.hot_n:  # repeats took some: draw more
            picks = np.unique(np.concatenate([picks, rng.integers(0, n, self.hot_n)]))
        self.hot = self.all[rng.permutation(picks)[: self.hot_n]]
        from_hot = int(round(args.request * args.hot_fraction))

        def request() -> np.ndarray:
            keys = np.concatenate([self.hot[rng.integers(0, self.hot_n, from_hot)],
                                   self.all[rng.integers(0, n, args.request - from_hot)]])
            return rng.permutation(keys)

        self.warmup = [request() for _ in range(args.warmup)]
        self.pulls = [request() for _ in range(args.requests)]
        self.pushes = [request() for _ in range(args.requests)]
        self.distinct = {"pulls": sum(int(np.unique(r).shape[0]) for r in self.pulls),
                         "pushes": sum(int(np.unique(r).shape[0]) for r in self.pushes)}
        self.grads = (rng.standard_normal((max(args.batch, args.request), args.dim)) * 0.01).astype(np.float32)
        self.sample = self.all[rng.integers(0, n, args.sample)]


async def table_counts(ps: aps.PSClient) -> dict[str, int]:
    """STATS' counts of the table, summed over the pservers (one here)."""
    out: dict[str, int] = {}
    for server in (await ps.stats()).values():
        for key, value in server["tables"][TABLE].items():
            if isinstance(value, int) and not isinstance(value, bool):
                out[key] = out.get(key, 0) + value
    return out


async def serve(server: ServerProcess, args: argparse.Namespace, spec: aps.HashTable, work: Workload,
                marks: dict[str, tuple[float, float]], home: Path) -> dict[str, Any]:
    """Fill, traffic, sample, save, on one server (the module's note); ``marks`` the phases' times."""
    pid = server.proc.pid
    disk = spec.disk is not None
    res: dict[str, Any] = {"kind": "disk" if disk else "ram"}
    async with aps.connect([server.address], timeout=None) as ps:
        await ps.create_table(spec)
        first = work.batches[0]
        await ps.push_sparse_grad(TABLE, first[:2], work.grads[:2])  # compile the kernels first
        await ps.pull_sparse(TABLE, first[:2])
        idle = settled_memory(pid)
        res["idle_rss"] = idle["VmRSS"]
        res["idle_anon"] = idle["RssAnon"]

        # ---- fill
        points: list[tuple[int, int, int, int]] = []  # (keys pushed, cold keys, VmRSS, RssAnon)
        pushes = len(work.batches)
        started = time.monotonic()
        for p, keys in enumerate(work.batches):
            keys = keys[2:] if p == 0 else keys
            await ps.push_sparse_grad(TABLE, keys, work.grads[: len(keys)])
            point, shown = (p + 1) * 20 // pushes, p * 20 // pushes  # twenty points, a line every fourth
            if point != shown or p + 1 == pushes:
                counts = await table_counts(ps) if disk else {}
                done, took = min(args.keys, (p + 1) * args.batch), time.monotonic() - started
                cold = counts.get("keys", 0) - counts.get("hot_keys", 0)
                now = memory(pid)
                rss = now["VmRSS"]
                points.append((done, cold, rss, now["RssAnon"]))
                if point % 4 == 0:
                    print(f"  fill: {done:,} keys, {done / took / 1e6:.2f} M keys/s, server RSS {rss / MIB:,.0f} MiB"
                          + (f", {cold:,} cold" if disk else ""), flush=True)
        marks["fill"] = (started, time.monotonic())
        after = memory(pid)
        info = await ps.table_info(TABLE)
        counts = await table_counts(ps)
        res["fill"] = {"seconds": marks["fill"][1] - started, "keys_held": info.keys,
                       "keys_per_s": (args.keys - 2) / (marks["fill"][1] - started),
                       "rss": after["VmRSS"], "hwm": after["VmHWM"], "rss_growth": after["VmRSS"] - idle["VmRSS"],
                       "anon": after["RssAnon"], "anon_growth": after["RssAnon"] - idle["RssAnon"], "rss_file": after["RssFile"],
                       "ram_bytes": info.ram_bytes, "disk_bytes": info.disk_bytes,
                       "hot_keys": counts.get("hot_keys", info.keys), "points": points}
        print(f"  after the fill: {info.keys:,} keys, RSS {after['VmRSS'] / MIB:,.0f} MiB, table_info ram_bytes "
              f"{info.ram_bytes / MIB:,.0f} MiB, disk_bytes {info.disk_bytes / MIB:,.0f} MiB", flush=True)

        # ---- traffic
        t0 = time.monotonic()
        for at in range(0, work.hot_n, args.request):  # a push brings keys into RAM (a pull stages them)
            part = work.hot[at : at + args.request]
            await ps.push_sparse_grad(TABLE, part, work.grads[: len(part)])
        half = len(work.warmup) // 2
        for i, keys in enumerate(work.warmup):
            if i == half:
                before = await table_counts(ps)
            if i % 2:
                await ps.push_sparse_grad(TABLE, keys, work.grads[: len(keys)])
            else:
                await ps.pull_sparse(TABLE, keys)
        marks["warm-up"] = (t0, time.monotonic())
        if half:
            missed = (await table_counts(ps)).get(MISSES, 0) - before.get(MISSES, 0)
            distinct = sum(int(np.unique(k).shape[0]) for k in work.warmup[half:])
            res["warmup"] = {"requests": len(work.warmup), "seconds": marks["warm-up"][1] - t0,
                             "hit_rate_second_half": 1 - missed / distinct}
            print(f"  warm-up: {len(work.warmup)} requests, hit rate {1 - missed / distinct:.1%} over the "
                  "second half", flush=True)
        # pulls and pushes in turn (other keys each), so that both meet the same turns of the CLOCK hand
        seconds: dict[str, list[float]] = {"pulls": [], "pushes": []}
        paged: dict[str, int] = {"pulls": 0, "pushes": 0}
        last = (await table_counts(ps)).get(MISSES, 0)
        t0 = time.monotonic()
        for pull, push in zip(work.pulls, work.pushes):
            for phase, keys in (("pulls", pull), ("pushes", push)):
                sent = time.perf_counter()
                if phase == "pulls":
                    await ps.pull_sparse(TABLE, keys)
                else:
                    await ps.push_sparse_grad(TABLE, keys, work.grads[: len(keys)])
                seconds[phase].append(time.perf_counter() - sent)
                if disk:
                    now = (await table_counts(ps))[MISSES]
                    paged[phase] += now - last
                    last = now
        marks["traffic"] = (t0, time.monotonic())
        for phase, requests in (("pulls", work.pulls), ("pushes", work.pushes)):
            rows, took = sum(len(k) for k in requests), sum(seconds[phase])
            res[phase] = {"requests": len(requests), "rows": rows, "seconds": took, "rows_per_s": rows / took,
                          "latency_ms": percentiles_ms(seconds[phase]), "disk_read_rows": paged[phase],
                          "hit_rate": 1 - paged[phase] / work.distinct[phase]}
            print(f"  {phase}: {rows / took / 1e6:.2f} M rows/s, p50 {res[phase]['latency_ms']['p50']:.1f} "
                  f"p99 {res[phase]['latency_ms']['p99']:.1f} ms, hit rate {res[phase]['hit_rate']:.1%}", flush=True)
        res["rss_after_traffic"] = memory(pid)["VmRSS"]

        # ---- save
        res["sample_before"] = await ps.pull_sparse(TABLE, work.sample)
        sampler = RssSampler(server)
        t0 = time.monotonic()
        await ps.save(CHECKPOINT, mode="full")
        marks["save"] = (t0, time.monotonic())
        sampler.stop()
        res["save"] = {"seconds": marks["save"][1] - t0, "rss_peak": sampler.peak(*marks["save"])}
        # RocksDB's checkpoint links its table files (one file system here) rather than writing them
        disk_bytes, files, _, linked = tree_size(home / CHECKPOINT)
        res["save"].update(disk_bytes=disk_bytes, files=files, linked_bytes=linked)
    return res


async def load(server: ServerProcess, path: Path, data_dir: Path, work: Workload,
               marks: dict[str, tuple[float, float]]) -> dict[str, Any]:
    """LOAD the checkpoint into a fresh server, then pull the sample from it."""
    async with aps.connect([server.address], timeout=None) as ps:
        sampler = RssSampler(server)
        t0 = time.monotonic()
        await ps.load(str(path))
        marks["load"] = (t0, time.monotonic())
        sampler.stop()
        info = await ps.table_info(TABLE)
        linked = tree_size(data_dir)[2] if data_dir.is_dir() else 0  # its table files linked to the checkpoint's
        pulled = await ps.pull_sparse(TABLE, work.sample)
    after = memory(server.proc.pid)
    return {"seconds": marks["load"][1] - t0, "keys_held": info.keys, "ram_bytes": info.ram_bytes,
            "disk_bytes": info.disk_bytes, "rss_peak": sampler.peak(*marks["load"]), "rss": after["VmRSS"],
            "linked_bytes": linked, "pulled": pulled}


async def reshard(servers: list[ServerProcess], path: Path, work: Workload) -> dict[str, Any]:
    """LOAD the checkpoint (saved by one server) onto a cluster of ``len(servers)``: each reads its
    logical shards' rows out of the snapshot, nothing linked; then pull the sample from them."""
    async with aps.connect([s.address for s in servers], timeout=None) as ps:
        t0 = time.monotonic()
        await ps.load(str(path))
        seconds = time.monotonic() - t0
        info = await ps.table_info(TABLE)
        pulled = await ps.pull_sparse(TABLE, work.sample)
    return {"servers": len(servers), "seconds": seconds, "keys_held": info.keys, "ram_bytes": info.ram_bytes,
            "disk_bytes": info.disk_bytes, "pulled": pulled}


def run_kind(args: argparse.Namespace, disk: bool, work: Workload, base: Path) -> dict[str, Any]:
    """One table kind through every step: a server to fill, traffic and save, a second to load."""
    kind = "disk" if disk else "ram"
    spec = table_spec(args, disk)
    home = base / kind
    home.mkdir()

    def flags(name: str) -> tuple[str, ...]:
        return ("--no-exit-when-done", "--checkpoint-root", str(home), "--data-dir", str(home / f"data-{name}"))

    marks: dict[str, tuple[float, float]] = {}
    server = ServerProcess.start(home, *flags("fill"), name=f"pserver-{kind}-fill")
    print(f"{kind} table: aps-server pid {server.proc.pid} on {server.address}; {args.keys:,} keys x dim {args.dim}, "
          f"{spec.dtype}, {'row-wise ' if args.rowwise else ''}Adagrad"
          + (f", disk.ram_bytes {args.ram_bytes / MIB:,.0f} MiB" if disk else ""), flush=True)
    probe = PingProbe(server.address, interval=args.interval)
    try:
        res = asyncio.run(serve(server, args, spec, work, marks, home))
    finally:
        pings = probe.stop()
        res_status = server.stop()
    res["fill_exit_status"] = res_status
    print(f"  save: {res['save']['seconds']:.1f} s, {res['save']['disk_bytes'] / MIB:,.0f} MiB in "
          f"{res['save']['files']} files, {res['save']['linked_bytes'] / MIB:,.0f} MiB of them RocksDB's table files "
          "(hard links)", flush=True)

    second = ServerProcess.start(home, *flags("load"), name=f"pserver-{kind}-load")
    probe = PingProbe(second.address, interval=args.interval)
    try:
        loaded = asyncio.run(load(second, home / CHECKPOINT, home / "data-load", work, marks))
    finally:
        pings += probe.stop()
        load_status = second.stop()
    pulled = loaded.pop("pulled")
    res["load"] = {**loaded, "exit_status": load_status}
    res["sample_keys"] = len(work.sample)
    res["sample_equal_after_load"] = bool(pulled.tobytes() == res.pop("sample_before").tobytes())
    print(f"  load: {loaded['seconds']:.1f} s, {loaded['keys_held']:,} keys, {loaded['linked_bytes'] / MIB:,.0f} MiB "
          f"of its table files linked to the checkpoint's, sample "
          f"{'equal' if res['sample_equal_after_load'] else 'DIFFERS'}", flush=True)
    if args.reshard > 1:
        n = args.reshard
        cluster = [ServerProcess.start(home, "--servers", str(n), "--index", str(k), *flags(f"reshard-{k}"),
                                       name=f"pserver-{kind}-reshard-{k}") for k in range(n)]
        try:
            moved = asyncio.run(reshard(cluster, home / CHECKPOINT, work))
        finally:
            for server in cluster:
                server.stop()
        equal = bool(moved.pop("pulled").tobytes() == pulled.tobytes())
        res["reshard"] = {**moved, "sample_equal": equal}
        print(f"  load onto {n} servers: {moved['seconds']:.1f} s, {moved['keys_held']:,} keys, sample "
              f"{'equal' if equal else 'DIFFERS'}", flush=True)
    res["ping_ms"] = {name: percentiles_ms(window(pings, start, end)) for name, (start, end) in marks.items()}
    res["ping_ms"]["serving"] = res["ping_ms"]["traffic"]
    shutil.rmtree(home, ignore_errors=True)
    return res


def summarize(res: dict[str, Any], spec: aps.HashTable, hot_capacity: int) -> dict[str, Any]:
    """RAM per cold key, rates, ratios (the module's note)."""
    fill, save, load = res["fill"], res["save"], res["load"]
    out: dict[str, Any] = {
        "save_mb_per_s": save["disk_bytes"] / 1e6 / save["seconds"],
        "load_mb_per_s": save["disk_bytes"] / 1e6 / load["seconds"],
        "save_written_mb_per_s": (save["disk_bytes"] - save["linked_bytes"]) / 1e6 / save["seconds"],
        "load_read_mb_per_s": (save["disk_bytes"] - load["linked_bytes"]) / 1e6 / load["seconds"],
        "save_keys_per_s": fill["keys_held"] / save["seconds"], "load_keys_per_s": fill["keys_held"] / load["seconds"],
        "rss_bytes_per_key": fill["rss_growth"] / fill["keys_held"],
    }
    if spec.disk is None:
        return out
    cold = fill["keys_held"] - fill["hot_keys"]
    points = [(c, anon) for _, c, _, anon in fill["points"] if c >= hot_capacity]
    slope = None
    if len(points) >= 3:
        xs, ys = np.array([p[0] for p in points], float), np.array([p[1] for p in points], float)
        slope = float(np.polyfit(xs, ys, 1)[0])
    out.update({
        "cold_keys": cold, "hot_keys": fill["hot_keys"], "hot_capacity": hot_capacity,
        "marginal_ram_per_cold_key": slope,
        "beyond_budget_per_cold_key": (fill["anon_growth"] - spec.disk.ram_bytes) / cold if cold else None,
        "disk_over_ram_budget": fill["disk_bytes"] / spec.disk.ram_bytes,
        "keys_over_hot_capacity": fill["keys_held"] / hot_capacity,
        "reported_ram_over_budget": fill["ram_bytes"] / spec.disk.ram_bytes,
    })
    return out


def aims(disk: dict[str, Any], s: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """(aim, measured, met) of the disk table."""
    ram = s["marginal_ram_per_cold_key"]
    beyond = s["beyond_budget_per_cold_key"]
    serving = disk["ping_ms"]["serving"]
    hit = f"at a {disk['pulls']['hit_rate']:.1%} / {disk['pushes']['hit_rate']:.1%} hit rate"
    return [
        (f"RAM <= {AIM_COLD_KEY_BYTES:g} bytes a cold key",
         f"{ram:.2f} marginal, {beyond:.2f} beyond the budget" if ram is not None else f"{beyond:.2f} beyond the budget",
         max(ram if ram is not None else -math.inf, beyond) <= AIM_COLD_KEY_BYTES),
        (f"pull >= {AIM_PULL_ROWS_S / 1e6:g} M rows/s", f"{disk['pulls']['rows_per_s'] / 1e6:.2f} M {hit}",
         disk["pulls"]["rows_per_s"] >= AIM_PULL_ROWS_S),
        (f"push >= {AIM_PUSH_ROWS_S / 1e6:g} M rows/s", f"{disk['pushes']['rows_per_s'] / 1e6:.2f} M",
         disk["pushes"]["rows_per_s"] >= AIM_PUSH_ROWS_S),
        (f"20k-key pull p99 <= {AIM_PULL_P99_MS:g} ms", f"{disk['pulls']['latency_ms']['p99']:.1f} ms",
         disk["pulls"]["latency_ms"]["p99"] <= AIM_PULL_P99_MS),
        (f"ping p99 < {AIM_PING_P99_MS:g} ms while serving", f"{serving.get('p99', math.nan):.1f} ms ({serving['n']} pings)",
         serving.get("p99", math.inf) < AIM_PING_P99_MS),
        (f"save >= {AIM_SAVE_LOAD_MB_S:g} MB/s", f"{s['save_mb_per_s']:.0f} MB/s of checkpoint ({s['save_written_mb_per_s']:.0f} "
         "written, the rest hard links)", s["save_mb_per_s"] >= AIM_SAVE_LOAD_MB_S),
        (f"load >= {AIM_SAVE_LOAD_MB_S:g} MB/s", f"{s['load_mb_per_s']:.0f} MB/s of checkpoint ({s['load_read_mb_per_s']:.0f} "
         "read, the rest hard links)", s["load_mb_per_s"] >= AIM_SAVE_LOAD_MB_S),
    ]


def report(results: dict[str, Any]) -> str:
    mib = lambda b: f"{b / MIB:,.0f}"  # noqa: E731
    rows = []
    for kind in ("disk", "ram"):
        r, s = results[kind], results[kind]["summary"]
        fill, pulls, pushes, save, load = r["fill"], r["pulls"], r["pushes"], r["save"], r["load"]
        ping = r["ping_ms"]["serving"]
        rows.append([
            "disk" if kind == "disk" else "all-RAM",
            f"{fill['keys_per_s'] / 1e6:.2f}",
            f"{mib(fill['rss'])} (+{mib(fill['rss_growth'])}); {mib(fill['anon'])} (+{mib(fill['anon_growth'])})",
            f"{mib(fill['ram_bytes'])} / {mib(fill['disk_bytes'])}",
            f"{pulls['rows_per_s'] / 1e6:.2f} ({pulls['hit_rate']:.1%})",
            f"{pulls['latency_ms']['p50']:.1f} / {pulls['latency_ms']['p99']:.1f}",
            f"{pushes['rows_per_s'] / 1e6:.2f} ({pushes['hit_rate']:.1%})",
            f"{pushes['latency_ms']['p50']:.1f} / {pushes['latency_ms']['p99']:.1f}",
            f"{ping.get('p50', math.nan):.1f} / {ping.get('p99', math.nan):.1f} / {ping.get('max', math.nan):.0f}",
            f"{save['seconds']:.1f} s, {s['save_mb_per_s']:.0f} ({s['save_written_mb_per_s']:.0f})",
            f"{load['seconds']:.1f} s, {s['load_mb_per_s']:.0f} ({s['load_read_mb_per_s']:.0f})",
            f"{save['disk_bytes'] / 1e9:.2f} GB ({save['linked_bytes'] / 1e9:.2f} linked)",
        ])
    table = markdown_table(["table", "fill M keys/s", "RSS; anonymous, after fill MiB (growth)", "ram_bytes / disk_bytes MiB",
                            "pull M rows/s (hit)", "pull p50 / p99 ms", "push M rows/s (hit)", "push p50 / p99 ms",
                            "ping p50 / p99 / max ms", "save, MB/s (written)", "load, MB/s (read)", "checkpoint"], rows)
    d, s = results["disk"], results["disk"]["summary"]
    ratio = results["ram"]
    lines = [table, "",
             f"Disk table: {d['fill']['keys_held']:,} keys, {s['hot_keys']:,} in RAM (capacity {s['hot_capacity']:,}), "
             f"{s['cold_keys']:,} on disk; disk_bytes {s['disk_over_ram_budget']:.1f}x the RAM budget, keys "
             f"{s['keys_over_hot_capacity']:.1f}x the hot capacity; table_info ram_bytes {s['reported_ram_over_budget']:.2f}x "
             f"the budget. Against the all-RAM table: pulls {d['pulls']['rows_per_s'] / ratio['pulls']['rows_per_s']:.2f}x, "
             f"pushes {d['pushes']['rows_per_s'] / ratio['pushes']['rows_per_s']:.2f}x, fill "
             f"{d['fill']['keys_per_s'] / ratio['fill']['keys_per_s']:.2f}x; RSS {d['fill']['rss'] / ratio['fill']['rss']:.2f}x.",
             "", markdown_table(["aim (disk table)", "measured", "met"],
                                [[a, m, "met" if ok else "NOT MET"] for a, m, ok in results["aims"]]), ""]
    for kind in ("disk", "ram"):
        r = results[kind]
        if "reshard" in r:
            m = r["reshard"]
            lines.append(f"{kind}: loaded onto {m['servers']} servers in {m['seconds']:.1f} s "
                         f"({r['save']['disk_bytes'] / 1e6 / m['seconds']:.0f} MB/s of checkpoint, every row read), "
                         f"{m['keys_held']:,} keys held, the sample {'equal' if m['sample_equal'] else 'DIFFERENT'}.")
        lines.append(f"{kind}: {r['sample_keys']:,} sampled keys after the load "
                     f"{'equal' if r['sample_equal_after_load'] else 'DIFFER FROM'} the rows before the save; "
                     f"{r['load']['keys_held']:,} keys held after the load (of {r['fill']['keys_held']:,}).")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, default=None,
                   help="distinct keys pushed (default: the least million whose rows pass 10x --ram-bytes)")
    p.add_argument("--ram-bytes", type=byte_size, default=256 << 20, help="disk.ram_bytes (default 256MiB)")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--dtype", choices=aps.specs.VALUE_DTYPES, default="float16", help="how the values are stored")
    p.add_argument("--no-rowwise", dest="rowwise", action="store_false", help="element-wise Adagrad (default row-wise)")
    p.add_argument("--lr", type=float, default=0.05, help="Adagrad's learning rate")
    p.add_argument("--batch", type=int, default=100_000, help="new keys a push in the fill (default 100,000)")
    p.add_argument("--request", type=int, default=20_000, help="keys a pull or push of the traffic (default 20,000)")
    p.add_argument("--requests", type=int, default=600, help="timed pulls, and as many pushes (default 600)")
    p.add_argument("--warmup", type=int, default=400,
                   help="requests after the hot set's pull, pulls and pushes in turn, untimed (default 400)")
    p.add_argument("--hot-share", type=float, default=0.5, help="the hot set's size, a share of the hot rows (0.5)")
    p.add_argument("--hot-fraction", type=float, default=0.9, help="a request's keys from the hot set (0.9)")
    p.add_argument("--interval", type=float, default=0.01, help="seconds between two pings (default 0.01)")
    p.add_argument("--sample", type=int, default=10_000, help="keys compared before the save and after the load")
    p.add_argument("--reshard", type=int, default=2, help="then load the checkpoint onto N servers (default 2; 0: not)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()),
                   help="where the servers run, keep disk rows and save (a temporary directory in it; default %(default)s)")
    p.add_argument("--json", type=Path, default=Path(__file__).resolve().parent / "results" / "disk_table.json")
    args = p.parse_args(argv)
    if min(args.dim, args.batch, args.request, args.requests, args.sample) < 1 or args.warmup < 0:
        p.error("--dim, --batch, --request, --requests and --sample must be positive")
    if not (0 < args.hot_share <= 1 and 0 <= args.hot_fraction <= 1 and args.lr > 0):
        p.error("--hot-share must be in (0, 1], --hot-fraction in [0, 1], --lr positive")
    if not args.dir.is_dir():
        p.error(f"--dir {args.dir} is not a directory")
    if args.keys is None:
        args.keys = default_keys(table_spec(args, disk=True))
    if args.keys < 10_000:
        p.error("--keys must be at least 10,000")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    spec = table_spec(args, disk=True)
    capacity = hot_keys(spec)
    record = row_nbytes(spec) + DISK_KEY_BYTES
    # the all-RAM checkpoint and the disk table's checkpoint, rows and load's rows, at once at most
    need = int(args.keys * record * 3.5) + (1 << 30)
    free = shutil.disk_usage(args.dir).free
    if free < need:
        print(f"disk_table: {args.dir} has {free / 1e9:.1f} GB free, {args.keys:,} keys need about {need / 1e9:.1f} GB",
              file=sys.stderr)
        return 2
    print(f"{args.keys:,} keys, hot capacity {capacity:,} rows in {args.ram_bytes / MIB:,.0f} MiB, rows of "
          f"{row_nbytes(spec)} bytes (+{DISK_KEY_BYTES} of key on disk: {args.keys * record / args.ram_bytes:.1f}x "
          f"the budget)", flush=True)
    t0 = time.monotonic()
    work = Workload(args, capacity)
    print(f"workload: {time.monotonic() - t0:.1f} s; hot set {work.hot_n:,} keys, {args.requests} pulls and pushes of "
          f"{args.request:,} keys ({args.hot_fraction:.0%} from the hot set)", flush=True)
    base = Path(tempfile.mkdtemp(prefix="aps-disk-table-", dir=args.dir))
    results: dict[str, Any] = {}
    try:
        for disk in (True, False):
            res = run_kind(args, disk, work, base)
            res["summary"] = summarize(res, table_spec(args, disk), capacity)
            results["disk" if disk else "ram"] = res
    finally:
        shutil.rmtree(base, ignore_errors=True)
    results["aims"] = aims(results["disk"], results["disk"]["summary"])
    results["config"] = {k: str(v) for k, v in vars(args).items()}
    print()
    print(report(results))
    write_results(args.json, results)
    ok = all(results[k]["sample_equal_after_load"] and results[k]["load"]["keys_held"] == results[k]["fill"]["keys_held"]
             for k in ("disk", "ram"))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
