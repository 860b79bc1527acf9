"""aps-serve against the pserver it follows: freshness of deltas, and lookup throughput.

    .venv/bin/python bench/serving.py                       # 50 deltas, 200k keys, dim 16 (~2-3 min)
    .venv/bin/python bench/serving.py --deltas 10 --seconds 2

One ``aps-server`` and one ``aps-serve`` process (real processes, TCP on localhost); this process
is the client of both. A hash table (SGD, ``--dim``) gets ``--keys`` keys and a base export;
then, ``--deltas`` times: ``--delta-keys`` keys (half new, half updated) are pushed, a delta is
exported, and this process pulls those keys from aps-serve every ``--probe`` seconds until the
reply says the delta's version and its rows equal the pserver's. Freshness is the time from the
delta's done marker (the DONE file's mtime) to that reply: the poll of aps-serve, reading and
checking the delta, building the new version and swapping it in (median, p99, max). Meanwhile a process of its own
pings aps-serve every 10 ms: how long building and swapping versions hold its event loop.

Lookups: ``--concurrency`` coroutines pulling ``--batch`` random held keys at a time, for
``--seconds`` each in all, from the pserver and from aps-serve taking turns of ``--slice``
seconds (A B A B ..., so that both see the same share of a shared machine's changing load), in
rows per second; once with ``--batch`` keys per pull and once with one key (the
online-serving case). The aim: aps-serve >= 0.9x the pserver's rows/s; freshness <= 2 s median
and <= 5 s p99. The machine's load average is printed with the numbers (a shared machine).
Prints a Markdown table, writes JSON (``--json``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import aps  # noqa: E402
from aps.serving.layout import MARKER  # noqa: E402
from bench.pservers import PingProbe, ServerProcess, markdown_table, percentiles_ms, write_results  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, default=200_000, help="keys in the base export (default 200,000)")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--deltas", type=int, default=50, help="delta exports timed for freshness (default 50)")
    p.add_argument("--delta-keys", type=int, default=2_000, help="keys pushed before each delta (half new)")
    p.add_argument("--poll", type=float, default=0.2, help="aps-serve --poll seconds (default 0.2)")
    p.add_argument("--probe", type=float, default=0.005, help="seconds between this client's looks for a delta")
    p.add_argument("--batch", type=int, default=1_000, help="keys per lookup (default 1,000)")
    p.add_argument("--concurrency", type=int, default=4, help="lookups in flight (default 4)")
    p.add_argument("--seconds", type=float, default=3.0, help="seconds per lookup run (default 3)")
    p.add_argument("--slice", type=float, default=0.25, help="seconds of each turn while the two alternate (default 0.25)")
    p.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "serving.json")
    return p.parse_args(argv)


def start_serve(workdir: Path, root: Path, poll: float) -> tuple[subprocess.Popen[bytes], str]:
    port_file = workdir / "serve.port"
    log = open(workdir / "serve.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "bin" / "aps-serve"), str(root), "--port-file", str(port_file), "--poll", str(poll),
         "--log-level", "warning"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"aps-serve did not start: see {workdir / 'serve.log'}")
        time.sleep(0.05)
    return proc, f"127.0.0.1:{int(port_file.read_text())}"


async def wait_served(client: aps.PSClient, keys: np.ndarray, version: int, expected: np.ndarray | None, probe: float) -> float:
    """Pull ``keys`` from aps-serve until the reply is of ``version`` (and equals ``expected``);
    returns the wall-clock time of that reply."""
    while True:
        try:
            rows, got = await client.pull_sparse("emb", keys, with_version=True)
        except aps.ServerError:  # nothing loaded yet
            got = None
        if got == version:
            now = time.time()
            if expected is not None and not np.array_equal(rows, expected):
                raise AssertionError(f"version {version} served other rows than the pserver held")
            return now
        await asyncio.sleep(probe)


async def lookups(client: aps.PSClient, picks: list[np.ndarray], concurrency: int, seconds: float) -> tuple[int, float]:
    """(rows, seconds) of ``concurrency`` pull loops over ``picks`` (key batches) for ``seconds``."""
    batch = len(picks[0])
    rows = 0
    stop = time.perf_counter() + seconds

    async def loop(i: int) -> None:
        nonlocal rows
        j = i
        while time.perf_counter() < stop:
            await client.pull_sparse("emb", picks[j % 64])
            rows += batch
            j += concurrency

    started = time.perf_counter()
    await asyncio.gather(*(loop(i) for i in range(concurrency)))
    return rows, time.perf_counter() - started


async def compare(clients: dict[str, aps.PSClient], keys: np.ndarray, batch: int, args: argparse.Namespace) -> dict[str, Any]:
    """Rows per second of each client, taking turns of ``--slice`` seconds for ``--seconds`` each
    in all: on a shared machine the load changes from second to second, and turns this short
    give both the same share of it."""
    rng = np.random.default_rng(batch)
    picks = [keys[rng.integers(0, len(keys), batch)] for _ in range(64)]
    done = {who: [0, 0.0] for who in clients}
    for _ in range(max(1, round(args.seconds / args.slice))):
        for who, client in clients.items():
            rows, took = await lookups(client, picks, args.concurrency, args.slice)
            done[who][0] += rows
            done[who][1] += took
    return {who: rows / took for who, (rows, took) in done.items()}


async def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    root = workdir / "exports"
    root.mkdir()
    pserver = ServerProcess.start(workdir, "--checkpoint-root", str(workdir), "--no-exit-when-done", "--log-level", "warning")
    serve, serve_address = start_serve(workdir, root, args.poll)
    load_start = os.getloadavg()
    try:
        async with aps.connect([pserver.address]) as ps, aps.connect([serve_address]) as client:
            spec = aps.HashTable("emb", dim=args.dim, optimizer=aps.SGD(lr=0.1), base_threshold=0.0, delta_threshold=0.05)
            await ps.create_table(spec)
            rng = np.random.default_rng(0)
            keys = np.unique(rng.integers(-(1 << 63), (1 << 63) - 1, args.keys, dtype=np.int64))
            for part in np.array_split(keys, max(1, len(keys) // 50_000)):
                await ps.push_sparse_grad("emb", part, rng.standard_normal((len(part), args.dim)).astype(np.float32))
            started = time.monotonic()
            base = await ps.export("exports", kind="base")
            export_seconds = [time.monotonic() - started]
            await wait_served(client, keys[:10], base.version, None, args.probe)
            fresh, delta_keys = [], []
            probe = PingProbe(serve_address, interval=0.01)  # from a process of its own
            for _ in range(args.deltas):
                new = rng.integers(-(1 << 63), (1 << 63) - 1, args.delta_keys // 2, dtype=np.int64)
                old = keys[rng.integers(0, len(keys), args.delta_keys - len(new))]
                pushed = np.unique(np.concatenate([new, old]))
                await ps.push_sparse_grad("emb", pushed, rng.standard_normal((len(pushed), args.dim)).astype(np.float32))
                started = time.monotonic()
                info = await ps.export("exports", kind="delta")
                export_seconds.append(time.monotonic() - started)
                done_at = os.stat(Path(info.path) / MARKER).st_mtime
                served_at = await wait_served(client, pushed, info.version, await ps.pull_sparse("emb", pushed), args.probe)
                fresh.append(served_at - done_at)
                delta_keys.append(int(info.keys["emb"]))
                keys = np.union1d(keys, new)
            pings = [dt for _, dt in probe.stop()]
            rates = {str(batch): await compare({"pserver": ps, "aps-serve": client}, keys, batch, args) for batch in (args.batch, 1)}
    finally:
        serve.terminate()
        serve.wait(30)
        pserver.stop()
    f = np.asarray(fresh)
    return {
        "keys": int(len(keys)), "dim": args.dim, "deltas": args.deltas, "delta_keys": args.delta_keys, "poll": args.poll,
        "freshness_s": {"median": float(np.median(f)), "p99": float(np.percentile(f, 99)), "max": float(f.max())} if len(f) else {},
        "export_s": {"median": float(np.median(export_seconds)), "max": float(max(export_seconds))},
        "delta_keys_exported_median": float(np.median(delta_keys)) if delta_keys else 0,
        "lookup_rows_per_s": rates, "concurrency": args.concurrency,
        "ping_ms_while_following": percentiles_ms(pings, (50, 99, 99.9)),
        "loadavg_at_start": [round(x, 2) for x in load_start], "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
    }


def report(r: dict[str, Any]) -> None:
    f = r["freshness_s"]
    rows = [
        [f"freshness over {r['deltas']} deltas (DONE marker -> first lookup with its rows)",
         f"median {f.get('median', 0):.3f} s, p99 {f.get('p99', 0):.3f} s, max {f.get('max', 0):.3f} s", "<= 2 s median, <= 5 s p99"],
        ["export time (base and deltas; not in freshness)", f"median {r['export_s']['median']:.2f} s, max {r['export_s']['max']:.2f} s", ""],
    ]
    p = r["ping_ms_while_following"]
    rows.append(["aps-serve ping every 10 ms while it followed the deltas (builds and swaps)",
                 f"p50 {p.get('p50', 0)} ms, p99 {p.get('p99', 0)} ms, max {p.get('max', 0)} ms ({p.get('n', 0)} pings)", ""])
    for batch, rates in r["lookup_rows_per_s"].items():
        ratio = rates["aps-serve"] / rates["pserver"]
        rows.append([f"lookups, {batch} keys per pull, {r['concurrency']} in flight",
                     f"aps-serve {rates['aps-serve']:,.0f} rows/s, pserver {rates['pserver']:,.0f} rows/s ({ratio:.2f}x)", ">= 0.9x"])
    rows.append(["load average (1, 5, 15 min) at start / end", f"{r['loadavg_at_start']} / {r['loadavg_at_end']}", f"{os.cpu_count()} cpus"])
    print(markdown_table(["measure", "result", "aim"], rows))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="aps-serving-bench-") as tmp:
        result = asyncio.run(run(args, Path(tmp)))
    report(result)
    write_results(args.json, {"args": {k: str(v) for k, v in vars(args).items()}, **result})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
