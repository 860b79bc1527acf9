"""Does a pserver keep answering while it creates, fills, saves and loads a big table?

    .venv/bin/python bench/big_table_ping.py                       # 10M x 128 float32 (5.1 GB), ~3-6 minutes
    .venv/bin/python bench/big_table_ping.py --rows 1000000        # 1M x 128 (512 MB), ~30 s

One aps-server process (default limits) and one client in this process run the phases in order:
``idle`` (a baseline), ``create`` (CREATE_TABLE of ``--rows`` x ``--dim``, Uniform init, SGD),
``push`` (one SGD push to every row, ``--chunk-rows`` rows per request), ``save`` (SAVE to a
directory under ``--dir``), ``load`` (LOAD of that checkpoint), then a check that a sample of rows
read after the load equals the same rows read before the save, bit for bit.

Meanwhile a probe in a process of its own pings the server every ``--interval`` seconds on its own
connection. Reported per phase: its wall time, and the pings sent during it (count, p50, p99, max
latency; a ping the server answers late is one sample holding its whole wait), and the server's
RSS peak during it (sampled every 50 ms; also its anonymous part, without the checkpoint file
pages a load maps) and after it. Target (issue 9): ping p99 under 50 ms in every phase.
Prints a Markdown table, writes JSON (``--json``).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

import aps

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.pservers import MIB, PingProbe, ServerProcess, markdown_table, percentiles_ms, window, write_results  # noqa: E402

TARGET_P99_MS = 50.0
PHASES = ("idle", "create", "push", "save", "load")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=10_000_000, help="table rows (default 10,000,000)")
    p.add_argument("--dim", type=int, default=128, help="floats per row (default 128)")
    p.add_argument("--chunk-rows", type=int, default=65_536, help="rows per push request (default 65536: 32 MiB)")
    p.add_argument("--interval", type=float, default=0.01, help="seconds between two pings (default 0.01)")
    p.add_argument("--idle", type=float, default=2.0, help="seconds of the idle baseline (default 2)")
    p.add_argument("--sample", type=int, default=10_000, help="rows compared before the save and after the load")
    p.add_argument("--dir", type=Path, default=None, help="where the server runs and saves (default: a temporary "
                   "directory, removed after); needs room for one checkpoint of the table")
    p.add_argument("--json", type=Path, default=Path(__file__).resolve().parent / "results" / "big_table_ping.json")
    args = p.parse_args(argv)
    if args.rows < 1 or args.dim < 1 or args.chunk_rows < 1:
        p.error("--rows, --dim and --chunk-rows must be >= 1")
    return args


async def phases(server: ServerProcess, args: argparse.Namespace, marks: dict[str, tuple[float, float]],
                 rss: dict[str, int]) -> dict[str, Any]:
    """Run the phases; ``marks[phase] = (start, end)`` on the monotonic clock."""
    spec = aps.SparseTable("big", rows=args.rows, dim=args.dim, init=aps.Uniform(-0.01, 0.01), optimizer=aps.SGD(lr=0.5))
    rng = np.random.default_rng(0)
    sample = np.sort(rng.choice(args.rows, size=min(args.sample, args.rows), replace=False))
    grads = rng.normal(0, 0.01, size=(min(args.chunk_rows, args.rows), args.dim)).astype(np.float32)

    async def phase(name: str, work: Any) -> None:
        start = time.monotonic()
        await work
        marks[name] = (start, time.monotonic())
        rss[name] = server.rss()[0]
        print(f"  {name}: {marks[name][1] - start:.2f} s, server RSS {rss[name] / MIB:,.0f} MiB", flush=True)

    async def push_all(ps: aps.PSClient) -> None:
        for first in range(0, args.rows, args.chunk_rows):
            ids = np.arange(first, min(first + args.chunk_rows, args.rows), dtype=np.int64)
            await ps.push_sparse_grad(spec.name, ids, grads[: len(ids)])

    async with aps.connect([server.address], timeout=None) as ps:
        await phase("idle", asyncio.sleep(args.idle))
        await phase("create", ps.create_table(spec))
        await phase("push", push_all(ps))
        before = await ps.pull_sparse(spec.name, sample)
        await phase("save", ps.save("big-ckpt"))
        await phase("load", ps.load("big-ckpt"))
        after = await ps.pull_sparse(spec.name, sample)
    return {"sample_rows": len(sample), "sample_equal_after_load": bool(before.tobytes() == after.tobytes())}


class RssSampler:
    """Reads the server's RSS every 50 ms in a thread, so each phase's peak can be told apart
    (VmHWM is one peak for the whole life of the process)."""

    def __init__(self, server: ServerProcess) -> None:
        self.samples: list[tuple[float, int, int]] = []  # (time, RSS, anonymous RSS)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(server,), daemon=True)
        self._thread.start()

    def _run(self, server: ServerProcess) -> None:
        while not self._stop.wait(0.05):
            try:
                found = server.memory()
            except (OSError, KeyError):  # the process has gone
                return
            self.samples.append((time.monotonic(), found["VmRSS"], found["RssAnon"]))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def peak(self, start: float, end: float, anon: bool = False) -> int:
        return max((s[2 if anon else 1] for s in self.samples if start <= s[0] <= end), default=0)


def run(args: argparse.Namespace) -> dict[str, Any]:
    base = Path(tempfile.mkdtemp(prefix="aps-bigtable-", dir=args.dir))
    marks: dict[str, tuple[float, float]] = {}
    rss: dict[str, int] = {}
    try:
        server = ServerProcess.start(base, "--no-exit-when-done", "--checkpoint-root", str(base))
        print(f"aps-server pid {server.proc.pid} on {server.address}; table {args.rows:,} x {args.dim} "
              f"({args.rows * args.dim * 4 / 1e9:.2f} GB); checkpoint under {base}", flush=True)
        probe = PingProbe(server.address, interval=args.interval)
        sampler = RssSampler(server)
        try:
            check = asyncio.run(phases(server, args, marks, rss))
        finally:
            pings = probe.stop()
            sampler.stop()
            peak = server.rss()[1] if server.alive() else 0
            status = server.stop()
        checkpoint_bytes = sum(f.stat().st_size for f in (base / "big-ckpt").rglob("*") if f.is_file())
    finally:
        shutil.rmtree(base, ignore_errors=True)
    rows = {}
    for name in PHASES:
        start, end = marks[name]
        rows[name] = {"seconds": round(end - start, 3), "ping_ms": percentiles_ms(window(pings, start, end)),
                      "rss_peak": sampler.peak(start, end), "rss_anon_peak": sampler.peak(start, end, anon=True),
                      "rss_after": rss[name]}
    return {
        "config": {k: str(v) for k, v in vars(args).items()},
        "table_bytes": args.rows * args.dim * 4,
        "checkpoint_bytes": checkpoint_bytes,
        "phases": rows,
        "server_rss_peak": peak,
        "server_exit_status": status,
        **check,
        "target_p99_ms": TARGET_P99_MS,
        "target_met": all(r["ping_ms"].get("p99", 0) < TARGET_P99_MS for r in rows.values()),
    }


def report(r: dict[str, Any], args: argparse.Namespace) -> None:
    print(f"\nOne pserver, table {args.rows:,} x {args.dim} float32 ({r['table_bytes'] / 1e9:.2f} GB), checkpoint "
          f"{r['checkpoint_bytes'] / 1e9:.2f} GB; ping every {args.interval * 1e3:g} ms from a separate process\n")
    print(markdown_table(
        ["phase", "seconds", "pings", "ping p50 ms", "p99 ms", "max ms", "server RSS peak MiB", "of it anonymous",
         "RSS after MiB"],
        [[name, f"{p['seconds']:.2f}", p["ping_ms"]["n"], p["ping_ms"].get("p50", "-"), p["ping_ms"].get("p99", "-"),
          p["ping_ms"].get("max", "-"), f"{p['rss_peak'] / MIB:,.0f}", f"{p['rss_anon_peak'] / MIB:,.0f}",
          f"{p['rss_after'] / MIB:,.0f}"]
         for name, p in r["phases"].items()],
    ))
    print(f"\nserver RSS peak {r['server_rss_peak'] / MIB:,.0f} MiB; sample of {r['sample_rows']:,} rows after the load "
          f"{'equals' if r['sample_equal_after_load'] else 'DIFFERS FROM'} the rows before the save; "
          f"ping p99 < {TARGET_P99_MS:g} ms in every phase: {'yes' if r['target_met'] else 'NO'}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    report(result, args)
    write_results(args.json, result)
    return 0 if result["sample_equal_after_load"] and result["server_exit_status"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
