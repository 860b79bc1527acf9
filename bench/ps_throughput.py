"""Throughput and latency of one aps pserver against Redis, on loopback, in the same run.

    .venv/bin/python bench/ps_throughput.py            # full run (< 2 minutes)
    .venv/bin/python bench/ps_throughput.py --quick    # smoke run (a few seconds of load)

What is measured (see bench/README.md for the details and the caveats):

* batched ``pull_sparse`` / ``push_sparse_grad`` of ``--ids`` random ids x ``--dim`` float32
  on a table of ``--rows`` rows, with 1 client and ``--concurrency`` concurrent clients (each its
  own connection); Redis: one ``MGET`` / ``MSET`` of the same number of 256-byte values stored
  under ``e:{id}``;
* small requests: pull of 1 id (Redis: ``GET`` of 1 key), 1 client sequential and
  ``--concurrency`` concurrent clients; requests/s and per-request p50 / p99 latency. aps also
  runs the 1-client row with ``busy_poll`` (the client spins for the reply instead of sleeping;
  ``--busy-poll``), and N concurrent callers sharing one client (``--callers``), whose pulls the
  client coalesces into fewer requests: there requests/s counts callers' pulls answered, and the
  JSON has the requests actually sent (``wire_requests_per_s``).

The pserver runs in its own process (spawned, uvloop), like redis-server; the client side runs in
this process (uvloop). Both Redis clients of redis-py (sync, asyncio) are tried and the faster one
is reported for each row, so the baseline gets its best showing. The script prints a Markdown
table and writes all numbers plus machine info as JSON (``--json``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as _dt
import json
import multiprocessing as mp
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from machine import machine_busy_seconds, process_cpu_seconds  # bench/machine.py
from ps_hash_rows import bench_hash, hash_report  # bench/ps_hash_rows.py

import aps

# ----------------------------------------------------------------------------- targets

TARGET_PULL_RATIO = 2.0  # aps rows/s on batched pulls >= 2x Redis
TARGET_PAYLOAD_MB_S = 1000.0  # >= 1 GB/s payload (batched pull)
TARGET_SMALL_RPS = 50_000.0  # >= 50k small requests/s
TARGET_SMALL_C8_RATIO = 2.0  # small pulls, --concurrency clients: >= 2x Redis

TABLE = "emb"
#: a row measured while other processes used more CPU than this (in cores) is marked "(!)"
NOISY_OTHER_CPU = 0.2

# ----------------------------------------------------------------------------- helpers


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class CpuMeter:
    """CPU used during one measurement, in CPUs (1.0 = one core busy all the time).

    ``client_cpu``: this process; ``server_cpu``: the server process; ``other_cpu``: everything
    else on the machine. A high ``other_cpu`` means something else competed for the cores and
    the row is not to be trusted.
    """

    def __init__(self, server_pid: int | None) -> None:
        self.server_pid = server_pid

    def __enter__(self) -> CpuMeter:
        self.t0 = time.perf_counter()
        self.c0 = time.process_time()
        self.s0 = process_cpu_seconds(self.server_pid)
        self.m0 = machine_busy_seconds()
        return self

    def __exit__(self, *exc: object) -> None:
        wall = max(1e-9, time.perf_counter() - self.t0)
        self.client_cpu = (time.process_time() - self.c0) / wall
        s1, m1 = process_cpu_seconds(self.server_pid), machine_busy_seconds()
        self.server_cpu = None if s1 is None or self.s0 is None else (s1 - self.s0) / wall
        self.other_cpu = None
        if m1 is not None and self.m0 is not None and self.server_cpu is not None:
            self.other_cpu = max(0.0, (m1 - self.m0) / wall - self.client_cpu - self.server_cpu)

    def as_dict(self) -> dict[str, float | None]:
        return {"client_cpu": self.client_cpu, "server_cpu": self.server_cpu, "other_cpu": self.other_cpu}


class Retry:
    """Re-measure a row that other processes disturbed, within an extra-time budget.

    A row whose ``other_cpu`` is above :data:`NOISY_OTHER_CPU` is run again (up to ``retries``
    more times, while the re-runs so far took less than ``extra_seconds``); the attempt least
    disturbed is kept. The budget keeps a run on a busy machine within a bounded time.
    """

    def __init__(self, retries: int, extra_seconds: float) -> None:
        self.retries = retries
        self.extra_seconds = extra_seconds
        self.spent = 0.0

    @staticmethod
    def _other(row: dict[str, Any]) -> float:
        other = row.get("other_cpu")
        return 0.0 if other is None else float(other)

    def again(self, row: dict[str, Any], attempt: int, cost: float) -> bool:
        """Whether to measure ``row`` again; ``cost`` is the seconds one more attempt takes."""
        if self._other(row) <= NOISY_OTHER_CPU or attempt >= self.retries or self.spent + cost > self.extra_seconds:
            return False
        self.spent += cost
        return True

    def keep(self, best: dict[str, Any] | None, row: dict[str, Any]) -> dict[str, Any]:
        return row if best is None or self._other(row) < self._other(best) else best


def _cpu_note(row: dict[str, Any]) -> str:
    def f(x: float | None) -> str:
        return "?" if x is None else f"{x:.2f}"

    return f"cpu client {f(row.get('client_cpu'))} server {f(row.get('server_cpu'))} other {f(row.get('other_cpu'))}"


def _summary(count: int, elapsed: float, lat: list[float], ids_per_req: int, dim: int) -> dict[str, Any]:
    arr = np.asarray(lat, dtype=np.float64) * 1e6 if lat else np.zeros(1)
    rps = count / elapsed if elapsed > 0 else 0.0
    rows = rps * ids_per_req
    return {
        "requests": count,
        "seconds": round(elapsed, 4),
        "requests_per_s": rps,
        "rows_per_s": rows,
        "payload_mb_per_s": rows * dim * 4 / 1e6,
        "p50_us": float(np.percentile(arr, 50)),
        "p99_us": float(np.percentile(arr, 99)),
        "mean_us": float(arr.mean()),
    }


async def run_async_load(
    op: Callable[[int, int], Awaitable[Any]], workers: int, warmup: float, duration: float
) -> tuple[int, float, list[float]]:
    """``workers`` coroutines call ``op(worker, i)`` back to back; warm-up first, then measure.

    Returns (completed requests, elapsed seconds, per-request latencies in seconds).
    """
    perf = time.perf_counter

    async def loop(w: int, until: float, lat: list[float] | None) -> int:
        i = n = 0
        while perf() < until:
            t0 = perf()
            await op(w, i)
            if lat is not None:
                lat.append(perf() - t0)
            i += 1
            n += 1
        return n

    if warmup > 0:
        end = perf() + warmup
        await asyncio.gather(*(loop(w, end, None) for w in range(workers)))
    lats: list[list[float]] = [[] for _ in range(workers)]
    start = perf()
    end = start + duration
    counts = await asyncio.gather(*(loop(w, end, lats[w]) for w in range(workers)))
    elapsed = perf() - start
    return sum(counts), elapsed, [x for lat in lats for x in lat]


def run_thread_load(
    op: Callable[[int, int], Any], workers: int, warmup: float, duration: float
) -> tuple[int, float, list[float]]:
    """Like :func:`run_async_load` with ``workers`` threads (for the blocking Redis client)."""
    perf = time.perf_counter
    counts = [0] * workers
    lats: list[list[float]] = [[] for _ in range(workers)]
    gate = threading.Barrier(workers + 1)
    marks: dict[str, float] = {}

    def body(w: int) -> None:
        gate.wait()
        i = 0
        while perf() < marks["warm_end"]:
            op(w, i)
            i += 1
        lat, n = lats[w], 0
        while perf() < marks["end"]:
            t0 = perf()
            op(w, i)
            lat.append(perf() - t0)
            i += 1
            n += 1
        counts[w] = n

    threads = [threading.Thread(target=body, args=(w,), daemon=True) for w in range(workers)]
    for t in threads:
        t.start()
    now = perf()
    marks["warm_end"] = now + warmup
    marks["end"] = now + warmup + duration
    gate.wait()
    for t in threads:
        t.join()
    elapsed = perf() - marks["warm_end"]
    return sum(counts), elapsed, [x for lat in lats for x in lat]


class Workload:
    """Pre-built random batches shared by aps and Redis so both serve the same requests.

    Building the requests (random ids, Redis key strings, 256-byte value strings) is done once
    here, outside the timed loops: the timed part is the request itself plus turning a reply
    into a float32 [n, dim] array.
    """

    def __init__(self, rows: int, ids: int, dim: int, batches: int, seed: int = 1) -> None:
        rng = np.random.default_rng(seed)
        self.rows, self.ids, self.dim = rows, ids, dim
        self.batch_ids = [rng.integers(0, rows, ids, dtype=np.int64) for _ in range(batches)]
        self.batch_grads = [rng.standard_normal((ids, dim), dtype=np.float32) * 1e-3 for _ in range(batches)]
        self.small_ids = [np.array([i], dtype=np.int64) for i in rng.integers(0, rows, 4096, dtype=np.int64)]

    # Redis views of the same requests
    def redis_views(self) -> None:
        self.batch_keys = [[b"e:%d" % i for i in ids.tolist()] for ids in self.batch_ids]
        self.batch_kv: list[dict[bytes, bytes]] = []
        width = self.dim * 4
        for keys, grads in zip(self.batch_keys, self.batch_grads):
            buf = grads.tobytes()
            # duplicate ids: MSET keeps the last value, like a dict
            self.batch_kv.append({k: buf[j * width : (j + 1) * width] for j, k in enumerate(keys)})
        self.small_keys = [b"e:%d" % int(a[0]) for a in self.small_ids]


# ----------------------------------------------------------------------------- aps server process


def _server_main(conn: Any, profile_path: str | None) -> None:
    """Entry of the spawned pserver process: uvloop, serve, report the port, run until SIGTERM."""
    import logging

    import structlog
    import uvloop

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    uvloop.install()

    async def run() -> None:
        server = await aps.serve(host="127.0.0.1", port=0, num_trainers=1)
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, server.request_close)
        conn.send(server.port)
        await server.wait_closed()

    if profile_path:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
        try:
            asyncio.run(run())
        finally:
            prof.disable()
            prof.dump_stats(profile_path)
    else:
        asyncio.run(run())


class ApsServerProcess:
    def __init__(self, profile_path: str | None) -> None:
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        self.proc = ctx.Process(target=_server_main, args=(child, profile_path), name="aps-pserver", daemon=True)
        self.proc.start()
        if not parent.poll(60):
            self.stop()
            raise RuntimeError("the aps pserver process did not report its port within 60 s")
        self.port = int(parent.recv())
        self.address = f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid

    def stop(self) -> None:
        if self.proc.is_alive() and self.proc.pid is not None:
            os.kill(self.proc.pid, signal.SIGTERM)
            self.proc.join(15)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)


# ----------------------------------------------------------------------------- aps side


async def measure_row(
    ps: Any, table: str, name: str, op: Callable[[int, int], Awaitable[Any]], workers: int, per: int, dim: int,
    warmup: float, duration: float, server_pid: int | None, retry: Retry, log: Callable[[str], None], coalesced: bool = False,
) -> dict[str, Any]:
    """One row: ``workers`` callers of ``op`` for ``duration`` s after ``warmup``, measured again
    while other processes disturbed it (:class:`Retry`). ``coalesced``: also the callers' pulls
    answered per request ``ps`` sent for ``table``."""
    best: dict[str, Any] | None = None
    for attempt in range(retry.retries + 1):
        sent, served = ps.coalescing(table)
        with CpuMeter(server_pid) as cpu:
            count, elapsed, lat = await run_async_load(op, workers, warmup, duration)
        row = _summary(count, elapsed, lat, per, dim)
        row.update(cpu.as_dict(), attempts=attempt + 1)
        if coalesced:  # callers' pulls answered per request the client sent
            sent_after, served_after = ps.coalescing(table)
            row["pulls_per_request"] = (served_after - served) / max(1, sent_after - sent)
            row["wire_requests_per_s"] = row["requests_per_s"] / row["pulls_per_request"]
        best = retry.keep(best, row)
        if not retry.again(row, attempt, warmup + duration):
            break
        log(f"  (row {name} disturbed: other processes used {row['other_cpu']:.2f} CPU; measuring again)")
    assert best is not None
    log(f"  aps   {name:<20} {best['requests_per_s']:>10,.0f} req/s  p50 {best['p50_us']:>9.1f} us  {_cpu_note(best)}")
    return best


async def bench_aps(
    address: str, wl: Workload, conc: int, warmup: float, duration: float, server_pid: int | None,
    retry: Retry, log: Callable[[str], None], busy_poll: float = 0.0002, callers: tuple[int, ...] = (64, 256),
) -> dict[str, Any]:
    res: dict[str, Any] = {}
    clients = [aps.connect([address], timeout=60.0) for _ in range(conc)]
    for c in clients:
        await c.open()
    spinner = await aps.connect([address], timeout=60.0, busy_poll=busy_poll) if busy_poll else None
    try:
        ps = clients[0]
        t0 = time.perf_counter()
        await ps.create_table(
            aps.SparseTable(TABLE, rows=wl.rows, dim=wl.dim, init=aps.Uniform(-0.01, 0.01), optimizer=aps.SGD(lr=0.1))
        )
        res["create_table_s"] = time.perf_counter() - t0
        for c in clients[1:] + ([spinner] if spinner else []):
            await c.table_spec(TABLE)  # cache the spec so the timed loops send only data requests
        # first calls compile / load the numba kernels on the server: keep them out of the warm-up
        await ps.pull_sparse(TABLE, wl.batch_ids[0])
        await ps.push_sparse_grad(TABLE, wl.batch_ids[0], wl.batch_grads[0])
        nb, ns = len(wl.batch_ids), len(wl.small_ids)

        async def pull(w: int, i: int) -> None:
            out = await clients[w].pull_sparse(TABLE, wl.batch_ids[(w + i * conc) % nb])
            assert out.shape == (wl.ids, wl.dim)

        async def push(w: int, i: int) -> None:
            k = (w + i * conc) % nb
            await clients[w].push_sparse_grad(TABLE, wl.batch_ids[k], wl.batch_grads[k])

        async def small(w: int, i: int) -> None:
            await clients[w].pull_sparse(TABLE, wl.small_ids[(w * 997 + i) % ns])

        async def small_pipelined(w: int, i: int) -> None:  # all workers share one connection
            await ps.pull_sparse(TABLE, wl.small_ids[(w * 997 + i) % ns])

        async def small_spin(w: int, i: int) -> None:
            assert spinner is not None
            await spinner.pull_sparse(TABLE, wl.small_ids[(w * 997 + i) % ns])

        plan = [
            ("pull_batch_c1", pull, 1, wl.ids),
            (f"pull_batch_c{conc}", pull, conc, wl.ids),
            ("push_batch_c1", push, 1, wl.ids),
            (f"push_batch_c{conc}", push, conc, wl.ids),
            ("small_c1", small, 1, 1),
            (f"small_c{conc}", small, conc, 1),
            (f"small_pipelined{conc}", small_pipelined, conc, 1),
        ]
        plan += [(f"small_pipelined{n}", small_pipelined, n, 1) for n in callers if n != conc]
        if spinner is not None:
            plan.append(("small_c1_spin", small_spin, 1, 1))
        for name, op, workers, per in plan:
            res[name] = await measure_row(ps, TABLE, name, op, workers, per, wl.dim, warmup, duration, server_pid, retry, log,
                                          coalesced=op is small_pipelined)
        stats = await ps.stats()
        res["server_stats"] = next(iter(stats.values()))
    finally:
        for c in clients + ([spinner] if spinner else []):
            await c.aclose()
    return res


# ----------------------------------------------------------------------------- Redis side


class RedisServerProcess:
    def __init__(self, exe: str) -> None:
        self.port = _free_port()
        self.proc = subprocess.Popen(
            [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--protected-mode", "yes", "--daemonize", "no", "--loglevel", "warning"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, client: Any, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}: {err.strip()}")
            try:
                if client.ping():
                    return
            except Exception:  # noqa: BLE001 - connection refused until it listens
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def _rows_from_mget(values: list[bytes | None], n: int, dim: int) -> np.ndarray:
    return np.frombuffer(b"".join(values), dtype=np.float32).reshape(n, dim)  # type: ignore[arg-type]


def bench_redis_sync(
    port: int, wl: Workload, conc: int, warmup: float, duration: float, server_pid: int, retry: Retry,
    log: Callable[[str], None],
) -> dict[str, Any]:
    import redis

    clients = [redis.Redis(host="127.0.0.1", port=port, single_connection_client=True) for _ in range(conc)]
    nb, ns = len(wl.batch_keys), len(wl.small_keys)

    def pull(w: int, i: int) -> None:
        out = _rows_from_mget(clients[w].mget(wl.batch_keys[(w + i * conc) % nb]), wl.ids, wl.dim)
        assert out.shape == (wl.ids, wl.dim)

    def push(w: int, i: int) -> None:
        clients[w].mset(wl.batch_kv[(w + i * conc) % nb])

    def small(w: int, i: int) -> None:
        clients[w].get(wl.small_keys[(w * 997 + i) % ns])

    res: dict[str, Any] = {}
    try:
        for name, op, workers, per in _redis_plan(pull, push, small, conc, wl.ids):
            best: dict[str, Any] | None = None
            for attempt in range(retry.retries + 1):
                with CpuMeter(server_pid) as cpu:
                    count, elapsed, lat = run_thread_load(op, workers, warmup, duration)
                row = _summary(count, elapsed, lat, per, wl.dim)
                row.update(cpu.as_dict(), attempts=attempt + 1)
                best = retry.keep(best, row)
                if not retry.again(row, attempt, warmup + duration):
                    break
                log(f"  (row {name} disturbed: other processes used {row['other_cpu']:.2f} CPU; measuring again)")
            assert best is not None
            res[name] = best
            log(f"  redis {name:<20} {res[name]['requests_per_s']:>10,.0f} req/s  p50 {res[name]['p50_us']:>9.1f} us  {_cpu_note(res[name])} (sync)")
    finally:
        for c in clients:
            c.close()
    return res


async def bench_redis_async(
    port: int, wl: Workload, conc: int, warmup: float, duration: float, server_pid: int, retry: Retry,
    log: Callable[[str], None],
) -> dict[str, Any]:
    import redis.asyncio as aredis

    clients = [aredis.Redis(host="127.0.0.1", port=port, single_connection_client=True) for _ in range(conc)]
    nb, ns = len(wl.batch_keys), len(wl.small_keys)

    async def pull(w: int, i: int) -> None:
        out = _rows_from_mget(await clients[w].mget(wl.batch_keys[(w + i * conc) % nb]), wl.ids, wl.dim)
        assert out.shape == (wl.ids, wl.dim)

    async def push(w: int, i: int) -> None:
        await clients[w].mset(wl.batch_kv[(w + i * conc) % nb])

    async def small(w: int, i: int) -> None:
        await clients[w].get(wl.small_keys[(w * 997 + i) % ns])

    res: dict[str, Any] = {}
    try:
        for name, op, workers, per in _redis_plan(pull, push, small, conc, wl.ids):
            best: dict[str, Any] | None = None
            for attempt in range(retry.retries + 1):
                with CpuMeter(server_pid) as cpu:
                    count, elapsed, lat = await run_async_load(op, workers, warmup, duration)
                row = _summary(count, elapsed, lat, per, wl.dim)
                row.update(cpu.as_dict(), attempts=attempt + 1)
                best = retry.keep(best, row)
                if not retry.again(row, attempt, warmup + duration):
                    break
                log(f"  (row {name} disturbed: other processes used {row['other_cpu']:.2f} CPU; measuring again)")
            assert best is not None
            res[name] = best
            log(f"  redis {name:<20} {res[name]['requests_per_s']:>10,.0f} req/s  p50 {res[name]['p50_us']:>9.1f} us  {_cpu_note(res[name])} (asyncio)")
    finally:
        for c in clients:
            await c.aclose()
    return res


def _redis_plan(pull: Any, push: Any, small: Any, conc: int, ids: int) -> list[tuple[str, Any, int, int]]:
    return [
        ("pull_batch_c1", pull, 1, ids),
        (f"pull_batch_c{conc}", pull, conc, ids),
        ("push_batch_c1", push, 1, ids),
        (f"push_batch_c{conc}", push, conc, ids),
        ("small_c1", small, 1, 1),
        (f"small_c{conc}", small, conc, 1),
    ]


def load_redis(port: int, wl: Workload, seed: int = 2) -> float:
    """Store every row as a 256-byte (dim x float32) value under e:{id}; returns seconds taken."""
    import redis

    r = redis.Redis(host="127.0.0.1", port=port)
    rng = np.random.default_rng(seed)
    width = wl.dim * 4
    t0 = time.perf_counter()
    chunk = 20_000
    for start in range(0, wl.rows, chunk):
        stop = min(wl.rows, start + chunk)
        buf = rng.uniform(-0.01, 0.01, (stop - start, wl.dim)).astype(np.float32).tobytes()
        r.mset({b"e:%d" % (start + j): buf[j * width : (j + 1) * width] for j in range(stop - start)})
    elapsed = time.perf_counter() - t0
    assert r.dbsize() == wl.rows, "redis did not store every row"
    r.close()
    return elapsed


def bench_redis(
    exe: str, wl: Workload, conc: int, warmup: float, duration: float, which: str, retry: Retry,
    log: Callable[[str], None],
) -> dict[str, Any]:
    import redis

    server = RedisServerProcess(exe)
    try:
        probe = redis.Redis(host="127.0.0.1", port=server.port)
        server.wait_ready(probe)
        info = probe.info("server")
        probe.close()
        wl.redis_views()
        out: dict[str, Any] = {"redis_version": info.get("redis_version"), "port": server.port}
        out["load_s"] = load_redis(server.port, wl)
        log(f"  redis loaded {wl.rows:,} rows in {out['load_s']:.1f} s")
        runs: dict[str, dict[str, Any]] = {}
        if which in ("sync", "best"):
            runs["sync"] = bench_redis_sync(server.port, wl, conc, warmup, duration, server.pid, retry, log)
        if which in ("async", "best"):
            import uvloop

            runs["asyncio"] = uvloop.run(bench_redis_async(server.port, wl, conc, warmup, duration, server.pid, retry, log))
        out["by_client"] = runs
        # the row reported in the table: the faster client for that row
        for name in next(iter(runs.values())):
            best_client = max(runs, key=lambda c: runs[c][name]["requests_per_s"])
            out[name] = dict(runs[best_client][name], client=best_client)
        return out
    finally:
        server.stop()


# ----------------------------------------------------------------------------- report


def _fmt(x: float | None, kind: str) -> str:
    if x is None:
        return "not run"
    if kind == "rows":
        return f"{x / 1e6:,.2f} M"
    if kind == "mb":
        return f"{x:,.0f}"
    if kind == "rps":
        return f"{x:,.0f}"
    if kind == "us":
        return f"{x:,.1f}"
    return f"{x:g}"


def build_table(res: dict[str, Any], conc: int) -> tuple[str, dict[str, Any]]:
    a, r = res["aps"], res.get("redis")
    rows: list[tuple[str, str, str, str, bool]] = []  # metric, key, field, kind, higher_is_better

    def add(metric: str, key: str, field: str, kind: str, higher: bool = True) -> None:
        rows.append((metric, key, field, kind, higher))

    for op, label in (("pull", "batched pull"), ("push", "batched push")):
        for c in (1, conc):
            key = f"{op}_batch_c{c}"
            add(f"{label}, {c} client{'s' if c > 1 else ''}: rows/s", key, "rows_per_s", "rows")
            add(f"{label}, {c} client{'s' if c > 1 else ''}: payload MB/s", key, "payload_mb_per_s", "mb")
    for c in (1, conc):
        key = f"small_c{c}"
        who = f"{c} client{'s' if c > 1 else ''}"
        add(f"small pull (1 id), {who}: requests/s", key, "requests_per_s", "rps")
        add(f"small pull (1 id), {who}: p50 latency us", key, "p50_us", "us", False)
        add(f"small pull (1 id), {who}: p99 latency us", key, "p99_us", "us", False)
    if "small_c1_spin" in a:
        add("small pull (1 id), 1 client, busy_poll: requests/s", "small_c1_spin", "requests_per_s", "rps")
        add("small pull (1 id), 1 client, busy_poll: p50 latency us", "small_c1_spin", "p50_us", "us", False)
        add("small pull (1 id), 1 client, busy_poll: p99 latency us", "small_c1_spin", "p99_us", "us", False)
    for key in sorted((k for k in a if k.startswith("small_pipelined")), key=lambda k: int(k[len("small_pipelined"):])):
        n = key[len("small_pipelined"):]
        add(f"small pull (1 id), {n} callers sharing 1 client: pulls/s", key, "requests_per_s", "rps")
        add(f"small pull (1 id), {n} callers sharing 1 client: requests sent/s", key, "wire_requests_per_s", "rps")
        add(f"small pull (1 id), {n} callers sharing 1 client: p99 latency us", key, "p99_us", "us", False)

    def noisy(row: dict[str, Any] | None) -> str:
        other = (row or {}).get("other_cpu")
        return " (!)" if other is not None and other > NOISY_OTHER_CPU else ""

    lines = ["| metric | aps | redis | aps/redis |", "| --- | ---: | ---: | ---: |"]
    any_noisy = False
    for metric, key, field, kind, _ in rows:
        arow = a.get(key)
        av = (arow or {}).get(field)
        rrow = r.get(key) if isinstance(r, dict) else None
        rv = (rrow or {}).get(field)
        aps_cell = _fmt(av, kind) + noisy(arow)
        if r is None:
            redis_cell = "not run"
        elif rrow is None:
            redis_cell = "n/a"
        else:
            redis_cell = _fmt(rv, kind) + f" ({rrow['client']})" + noisy(rrow)
        any_noisy = any_noisy or "(!)" in aps_cell + redis_cell
        ratio = f"{av / rv:.2f}x" if av is not None and rv else "-"
        lines.append(f"| {metric} | {aps_cell} | {redis_cell} | {ratio} |")
    if any_noisy:
        lines.append("")
        lines.append(
            f"(!) other processes used more than {NOISY_OTHER_CPU:g} CPU while this was measured "
            "(see other_cpu in the JSON): a pessimistic number."
        )

    # targets
    checks: dict[str, Any] = {}
    ratios = []
    for c in (1, conc):
        key = f"pull_batch_c{c}"
        if r is not None and key in r and r[key]["rows_per_s"]:
            ratios.append(a[key]["rows_per_s"] / r[key]["rows_per_s"])
    checks["batched_pull_vs_redis"] = {
        "target": f">= {TARGET_PULL_RATIO:g}x Redis rows/s (1 and {conc} clients)",
        "measured": [round(x, 3) for x in ratios] if ratios else None,
        "met": (min(ratios) >= TARGET_PULL_RATIO) if ratios else None,
    }
    best_mb = max(a[f"pull_batch_c{c}"]["payload_mb_per_s"] for c in (1, conc))
    checks["payload"] = {
        "target": f">= {TARGET_PAYLOAD_MB_S:g} MB/s batched pull payload (best of 1 / {conc} clients)",
        "measured": round(best_mb, 1),
        "met": best_mb >= TARGET_PAYLOAD_MB_S,
    }
    small_keys = [k for k in a if k.startswith("small_") and isinstance(a[k], dict)]
    best_key = max(small_keys, key=lambda k: a[k]["requests_per_s"])
    best_small = a[best_key]["requests_per_s"]
    checks["small_requests"] = {
        "target": f">= {TARGET_SMALL_RPS:,.0f} small requests/s (best concurrency level)",
        "measured": round(best_small, 1),
        "row": best_key,
        "met": best_small >= TARGET_SMALL_RPS,
    }
    redis_c1 = r.get("small_c1") if isinstance(r, dict) else None
    if redis_c1:
        for key in ("small_c1", "small_c1_spin"):
            if key in a:
                rps, p50 = a[key]["requests_per_s"] / redis_c1["requests_per_s"], a[key]["p50_us"] / redis_c1["p50_us"]
                checks[f"{key}_vs_redis"] = {
                    "target": f"1 client ({'busy_poll' if key.endswith('spin') else 'default'}): >= Redis's requests/s and p50 <= Redis's",
                    "measured": {"requests_ratio": round(rps, 3), "p50_ratio": round(p50, 3)},
                    "met": rps >= 1.0 and p50 <= 1.0,
                }
    redis_cn = r.get(f"small_c{conc}") if isinstance(r, dict) else None
    if redis_cn and f"small_c{conc}" in a:
        ratio = a[f"small_c{conc}"]["requests_per_s"] / redis_cn["requests_per_s"]
        checks["small_cn_vs_redis"] = {
            "target": f">= {TARGET_SMALL_C8_RATIO:g}x Redis's small requests/s with {conc} clients",
            "measured": round(ratio, 3),
            "met": ratio >= TARGET_SMALL_C8_RATIO,
        }
    lines.append("")
    lines.append("Targets:")
    for name, chk in checks.items():
        met = {True: "MET", False: "NOT MET", None: "not checked"}[chk["met"]]
        lines.append(f"- {chk['target']}: measured {chk['measured']} -> **{met}**")
    return "\n".join(lines), checks


def machine_info(redis_exe: str | None) -> dict[str, Any]:
    info: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "aps": aps.__version__,
    }
    with contextlib.suppress(OSError):
        info["loadavg_at_start"] = list(os.getloadavg())
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu_model"] = line.split(":", 1)[1].strip()
                    break
    for mod in ("uvloop", "redis", "hiredis", "numba"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - optional
            info[mod] = None
    if redis_exe:
        with contextlib.suppress(Exception):
            info["redis_server"] = subprocess.run([redis_exe, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
    return info


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="short smoke run: 100k rows, 0.3 s per measurement")
    p.add_argument("--json", default=os.path.join(here, "results", "ps_throughput.json"), help="where to write the JSON results")
    p.add_argument("--dim", type=int, default=64, help="floats per row (default 64: 256-byte rows)")
    p.add_argument("--ids", type=int, default=10_000, help="ids per batched request (default 10000)")
    p.add_argument("--rows", type=int, default=None, help="table rows (default 1,000,000; 100,000 with --quick)")
    p.add_argument("--duration", type=float, default=None, help="seconds measured per row (default 3; 0.3 with --quick)")
    p.add_argument("--warmup", type=float, default=None, help="warm-up seconds before each row (default 0.5; 0.1 with --quick)")
    p.add_argument("--concurrency", type=int, default=8, help="concurrent clients of the multi-client rows (default 8)")
    p.add_argument("--busy-poll", type=float, default=0.0002, metavar="SECONDS",
                   help="aps.connect(busy_poll=) of the extra 1-client row (default 0.0002; 0: skip that row)")
    p.add_argument("--callers", default="64,256",
                   help="comma-separated numbers of concurrent callers sharing one client, besides --concurrency (default 64,256)")
    p.add_argument("--redis-client", choices=("best", "sync", "async"), default="best",
                   help="redis-py client for the baseline: both and report the faster per row (default), or one")
    p.add_argument("--no-redis", action="store_true", help="skip the Redis baseline")
    p.add_argument("--retries", type=int, default=2,
                   help="measure a row again (up to this many times) when other processes used the CPUs meanwhile (default 2)")
    p.add_argument("--retry-seconds", type=float, default=None,
                   help="total seconds that re-measuring disturbed rows may add (default 40; 10 with --quick)")
    p.add_argument("--hash-keys", type=int, default=None,
                   help="keys of the hash table measured beside the fixed one (default 10,000,000; 100,000 with --quick; "
                        "0: skip). For issue 20's comparison give --rows the same number")
    p.add_argument("--profile-server", metavar="PATH", help="run the pserver under cProfile and dump pstats to PATH")
    args = p.parse_args(argv)

    rows = args.rows or (100_000 if args.quick else 1_000_000)
    duration = args.duration if args.duration is not None else (0.3 if args.quick else 3.0)
    warmup = args.warmup if args.warmup is not None else (0.1 if args.quick else 0.5)
    conc = args.concurrency
    if args.ids < 1 or args.dim < 1 or rows < 1 or conc < 1:
        p.error("--ids, --dim, --rows and --concurrency must be positive")
    if args.ids > rows:
        p.error("--ids must not exceed the table's rows")
    hash_keys = args.hash_keys if args.hash_keys is not None else (100_000 if args.quick else 10_000_000)
    if 0 < hash_keys < args.ids:
        p.error("--hash-keys must be 0 or at least --ids")

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    redis_exe = shutil.which("redis-server")
    redis_skip_reason = None
    if args.no_redis:
        redis_skip_reason = "--no-redis"
    elif redis_exe is None:
        redis_skip_reason = "redis-server is not installed (Debian: apt-get install -y redis-server)"
    else:
        try:
            import redis  # noqa: F401
        except ImportError:
            redis_skip_reason = "the redis Python package is not installed (pip install redis hiredis)"
    if redis_skip_reason:
        log(f"NOTE: Redis baseline not run: {redis_skip_reason}")

    import uvloop

    wl = Workload(rows, args.ids, args.dim, batches=16)
    results: dict[str, Any] = {
        "benchmark": "ps_throughput",
        "config": {
            "rows": rows, "dim": args.dim, "ids": args.ids, "concurrency": conc, "duration_s": duration,
            "warmup_s": warmup, "quick": args.quick, "redis_client": args.redis_client, "retries": args.retries,
            "payload_bytes_per_row": args.dim * 4,
        },
        "machine": machine_info(redis_exe),
        "targets": {
            "batched_pull_vs_redis": TARGET_PULL_RATIO, "payload_mb_s": TARGET_PAYLOAD_MB_S, "small_rps": TARGET_SMALL_RPS,
        },
    }

    started = time.perf_counter()
    extra = args.retry_seconds if args.retry_seconds is not None else (10.0 if args.quick else 40.0)
    retry = Retry(max(0, args.retries), extra)
    log(f"aps: one pserver process on loopback, table {rows:,} x {args.dim}, {args.ids:,} ids per batch")
    server = ApsServerProcess(args.profile_server)
    try:
        log(f"  pserver pid {server.pid} at {server.address}")
        uvloop.install()
        results["aps"] = asyncio.run(bench_aps(
            server.address, wl, conc, warmup, duration, server.pid, retry, log, busy_poll=args.busy_poll,
            callers=tuple(int(x) for x in args.callers.split(",") if x.strip()),
        ))
        if hash_keys:
            assert server.pid is not None

            async def measure(ps: Any, table: str, name: str, op: Any, workers: int, per: int) -> dict[str, Any]:
                return await measure_row(ps, table, name, op, workers, per, args.dim, warmup, duration, server.pid, retry, log)

            log(f"aps: a hash table of {hash_keys:,} keys on the same pserver")
            results["aps_hash"] = asyncio.run(bench_hash(server.address, hash_keys, args.ids, args.dim, conc, server.pid, measure, log))
    finally:
        server.stop()

    if redis_skip_reason is None:
        assert redis_exe is not None
        log(f"redis: {redis_exe}, same rows as {args.dim * 4}-byte values under e:{{id}}")
        try:
            results["redis"] = bench_redis(redis_exe, wl, conc, warmup, duration, args.redis_client, retry, log)
        except Exception as exc:  # noqa: BLE001 - report, keep the aps numbers
            redis_skip_reason = f"failed: {type(exc).__name__}: {exc}"
            log(f"NOTE: Redis baseline {redis_skip_reason}")
            results["redis"] = None
    else:
        results["redis"] = None
    results["redis_not_run_reason"] = redis_skip_reason
    results["total_seconds"] = time.perf_counter() - started
    results["retry_seconds_spent"] = retry.spent

    table, checks = build_table(results, conc)
    if results.get("aps_hash"):
        hash_table, hash_checks = hash_report(results["aps"], results["aps_hash"], conc)
        table += "\n\n" + hash_table
        checks.update(hash_checks)
    results["checks"] = checks
    header = (
        f"## aps vs Redis, one server on loopback ({rows:,} rows x dim {args.dim}, "
        f"{args.ids:,} ids per batch, {duration:g} s per row)\n\n"
        f"Targets: batched pull >= {TARGET_PULL_RATIO:g}x Redis rows/s; payload >= {TARGET_PAYLOAD_MB_S / 1000:g} GB/s; "
        f">= {TARGET_SMALL_RPS / 1000:g}k small requests/s. Payload = ids x dim x 4 bytes. "
        f"Latencies: lower is better (ratio < 1 favours aps).\n"
        f"Machine: {results['machine']['cpu_count']} CPUs, Python {results['machine']['python']}, numpy {results['machine']['numpy']}"
    )
    measured_rows: list[dict[str, Any]] = list(results["aps"].values()) + list((results.get("aps_hash") or {}).values())
    if isinstance(results.get("redis"), dict):
        for by_client in results["redis"]["by_client"].values():
            measured_rows.extend(by_client.values())
    others = [r["other_cpu"] for r in measured_rows if isinstance(r, dict) and r.get("other_cpu") is not None]
    results["max_other_cpu"] = max(others) if others else None
    if others and max(others) > NOISY_OTHER_CPU:
        header += (
            f"\n**WARNING: other processes used up to {max(others):.2f} CPUs during the measurements "
            f"(of {results['machine']['cpu_count']}); absolute numbers are pessimistic - rerun on a quiet machine.**"
        )
    if redis_skip_reason:
        header += f"\nRedis: not run ({redis_skip_reason})"
    else:
        r = results["redis"]
        header += f"\nRedis {r['redis_version']}, redis-py {results['machine']['redis']} (hiredis {results['machine']['hiredis']}); " \
                  f"(sync) = blocking client, one thread per client; (asyncio) = redis.asyncio"
    print(header + "\n\n" + table)

    os.makedirs(os.path.dirname(os.path.abspath(args.json)) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(results, f, indent=2, default=float)
    log(f"wrote {args.json} ({results['total_seconds']:.0f} s in all)")
    if redis_skip_reason and not args.no_redis:
        log(f"NOTE: the Redis columns say 'not run': {redis_skip_reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
