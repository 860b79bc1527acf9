"""Figures for docs/operations.md, measured with real aps-server processes (not a test).

    .venv/bin/python -m tests.faults.measure save --rows 2500000 --dim 128
    .venv/bin/python -m tests.faults.measure restart --every 1

``save``: a pserver creates, saves and loads one big table while a second client pings it
every 10 ms; prints each phase's time and the ping latency (p50, p99, max) during it.
``restart``: a client pushes +1 to one row as fast as it can while the pserver writes a
checkpoint every EVERY seconds; the pserver is SIGKILLed and restarted with --resume at once;
prints how long the client's pushes stalled and how many acknowledged pushes the restart lost.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import aps

ROOT = Path(__file__).resolve().parents[2]


def start_server(directory: Path, port: int, *args: str) -> tuple[subprocess.Popen, int]:
    port_file = directory / f"port.{time.monotonic_ns()}"
    log = open(directory / "pserver.log", "ab")
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "bin" / "aps-server"), "--port", str(port), "--port-file", str(port_file), *args],
        stdout=log, stderr=subprocess.STDOUT, cwd=directory,
    )
    while not port_file.exists():
        if proc.poll() is not None:
            raise SystemExit(f"aps-server exited with {proc.returncode}; see {directory / 'pserver.log'}")
        time.sleep(0.01)
    return proc, int(port_file.read_text())


async def probe(address: str, stop: asyncio.Event, out: list[float]) -> None:
    async with aps.connect([address]) as ps:
        while not stop.is_set():
            started = time.perf_counter()
            await ps.ping()
            out.append(time.perf_counter() - started)
            await asyncio.sleep(0.01)


def _ms(values: list[float]) -> str:
    if not values:
        return "no pings"
    a = np.array(values) * 1000
    return f"{len(a)} pings: p50 {np.percentile(a, 50):.2f} ms, p99 {np.percentile(a, 99):.2f} ms, max {a.max():.1f} ms"


async def measure_save(rows: int, dim: int, directory: Path) -> dict[str, object]:
    proc, port = start_server(directory, 0, "--max-table-bytes", "0")
    address = f"127.0.0.1:{port}"
    spec = aps.SparseTable("big", rows=rows, dim=dim, init=aps.Uniform(-0.1, 0.1), optimizer=aps.SGD(lr=0.1))
    results: dict[str, object] = {"rows": rows, "dim": dim, "bytes": rows * dim * 4}
    try:
        async with aps.connect([address], timeout=None) as ps:
            phases = {
                "create": lambda: ps.create_table(spec, timeout=None),
                "push 100k rows": lambda: ps.push_sparse_grad(
                    "big", np.arange(100_000), np.ones((100_000, dim), np.float32), timeout=None
                ),
                "save": lambda: ps.save("ckpt"),
                "load": lambda: ps.load("ckpt"),
            }
            for name, call in phases.items():
                stop, pings = asyncio.Event(), []
                prober = asyncio.ensure_future(probe(address, stop, pings))
                await asyncio.sleep(0.2)
                pings.clear()
                started = time.perf_counter()
                await call()
                seconds = time.perf_counter() - started
                stop.set()
                await prober
                results[name] = {"seconds": round(seconds, 3), "ping": _ms(pings)}
                print(f"{name:>15}: {seconds:7.2f} s   ping during it: {_ms(pings)}", flush=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    return results


async def measure_restart(every: float, seconds: float, directory: Path) -> dict[str, object]:
    args = ("--checkpoint-dir", "ckpt", "--checkpoint-every", str(every), "--trainers", "1")
    proc, port = start_server(directory, 0, *args)
    address = f"127.0.0.1:{port}"
    spec = aps.SparseTable("count", rows=1, dim=1, init=aps.Constant(0.0), optimizer=aps.SGD(lr=1.0))
    acked = 0
    async with aps.connect([address]) as ps:
        await ps.create_table(spec)

        async def pusher(stop: asyncio.Event) -> None:
            nonlocal acked
            while not stop.is_set():
                await ps.push_sparse_delta("count", [0], [[1.0]])
                acked += 1

        stop = asyncio.Event()
        task = asyncio.ensure_future(pusher(stop))
        await asyncio.sleep(seconds)
        acked_at_kill = acked
        proc.send_signal(signal.SIGKILL)
        killed = time.perf_counter()
        proc.wait()
        proc, _ = start_server(directory, port, *args, "--resume", "ckpt")
        listening = time.perf_counter() - killed
        while acked == acked_at_kill:
            await asyncio.sleep(0.001)
        recovered = time.perf_counter() - killed
        stop.set()
        await task
        value = float((await ps.pull_sparse("count", [0]))[0, 0])
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    # pushes acknowledged by the killed server (at most one in flight at the kill) minus what survived
    in_checkpoint = value - (acked - acked_at_kill)
    lost = acked_at_kill - in_checkpoint
    rate = acked_at_kill / seconds
    results = {
        "checkpoint_every": every,
        "pushes_per_second": round(rate),
        "restart_to_listening_s": round(listening, 3),
        "client_stall_s": round(recovered, 3),
        "updates_lost": int(lost),
        "updates_lost_seconds": round(lost / rate, 3),
    }
    print(json.dumps(results), flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    s = sub.add_parser("save")
    s.add_argument("--rows", type=int, default=2_500_000)
    s.add_argument("--dim", type=int, default=128)
    r = sub.add_parser("restart")
    r.add_argument("--every", type=float, default=1.0)
    r.add_argument("--seconds", type=float, default=3.5, help="push this long before the kill")
    parser.add_argument("--dir", help="work directory (default: a temporary one, removed after)")
    args = parser.parse_args()
    directory = Path(args.dir or tempfile.mkdtemp(prefix="aps-measure-"))
    directory.mkdir(parents=True, exist_ok=True)
    try:
        if args.what == "save":
            asyncio.run(measure_save(args.rows, args.dim, directory))
        else:
            asyncio.run(measure_restart(args.every, args.seconds, directory))
    finally:
        if not args.dir:
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
