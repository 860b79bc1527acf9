"""Load test: 64 concurrent clients x N mixed requests against 2 aps-server processes, checked exact.

    .venv/bin/python bench/ps_load.py                          # 64 clients x 500 requests, ~1-2 minutes
    .venv/bin/python bench/ps_load.py --requests 50            # smoke run, ~15 s

Every client has its own connections (one ``aps.connect`` per client, to both pservers) and runs
its requests one after another: sparse pulls and SGD pushes of ``--batch`` random ids (repeats
included) on a ``--rows`` x ``--dim`` table, dense pulls and SGD pushes of a ``--dense`` float32
vector split over both servers. The clients run in ``--procs`` processes so that the client side
is not one event loop.

Exactness: both tables start at 0, the learning rate is 1/2 and every gradient is a multiple of
1/4 below 2 in magnitude, so every float32 sum the servers make is exact in any order. Each
process sums the gradients it sent (float64, exact) and the final tables must equal
``0 - lr * sum`` element for element. Reported: requests, errors (must be 0), p50/p99/max latency
per op and overall, requests/s, each server's RSS before/after and peak (VmHWM). Prints a
Markdown table, writes JSON (``--json``).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

import aps

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.pservers import MIB, ServerProcess, markdown_table, percentiles_ms, write_results  # noqa: E402

LR = 0.5
OPS = ("pull_sparse", "push_sparse", "pull_dense", "push_dense")
MIX = np.array([0.4, 0.3, 0.15, 0.15])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=64, help="concurrent clients (default 64)")
    p.add_argument("--requests", type=int, default=500, help="requests per client (default 500)")
    p.add_argument("--procs", type=int, default=4, help="client processes the clients are spread over (default 4)")
    p.add_argument("--rows", type=int, default=100_000, help="sparse table rows (default 100000)")
    p.add_argument("--dim", type=int, default=16, help="sparse table dim (default 16)")
    p.add_argument("--batch", type=int, default=256, help="ids per sparse request (default 256)")
    p.add_argument("--dense", type=int, default=20_000, help="dense table size in float32 (default 20000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=Path(__file__).resolve().parent / "results" / "ps_load.json")
    args = p.parse_args(argv)
    if args.clients < 1 or args.requests < 1 or not 1 <= args.procs <= args.clients:
        p.error("need --clients >= 1, --requests >= 1 and 1 <= --procs <= --clients")
    return args


def tables(args: argparse.Namespace) -> tuple[aps.SparseTable, aps.DenseTable]:
    sparse = aps.SparseTable("load.emb", rows=args.rows, dim=args.dim, init=aps.Constant(0.0), optimizer=aps.SGD(lr=LR))
    dense = aps.DenseTable("load.w", shape=(args.dense,), init=aps.Constant(0.0), optimizer=aps.SGD(lr=LR))
    return sparse, dense


def _grads(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return (rng.integers(-7, 8, size=shape) / 4).astype(np.float32)  # exact; |g| < 2


async def _client(ps: aps.PSClient, args: argparse.Namespace, rng: np.random.Generator, acc: dict[str, np.ndarray],
                  latencies: dict[str, list[float]], errors: Counter[str]) -> None:
    sparse, dense = tables(args)
    for op in rng.choice(len(OPS), size=args.requests, p=MIX):
        name = OPS[int(op)]
        started = time.perf_counter()
        try:
            if name == "pull_sparse":
                rows = await ps.pull_sparse(sparse.name, rng.integers(0, args.rows, size=args.batch))
                assert rows.shape == (args.batch, args.dim)
            elif name == "push_sparse":
                ids = rng.integers(0, args.rows, size=args.batch)
                grads = _grads(rng, (args.batch, args.dim))
                await ps.push_sparse_grad(sparse.name, ids, grads)
                np.add.at(acc["sparse"], ids, grads)
            elif name == "pull_dense":
                assert (await ps.pull_dense(dense.name)).shape == (args.dense,)
            else:
                grad = _grads(rng, (args.dense,))
                await ps.push_dense_grad(dense.name, grad)
                acc["dense"] += grad
        except Exception as exc:  # counted and reported: the run must show zero
            errors[f"{name}: {type(exc).__name__}: {exc}"[:200]] += 1
            continue
        latencies[name].append(time.perf_counter() - started)


async def _warm_up(ps: aps.PSClient, args: argparse.Namespace) -> None:
    """One request of each op, pushes of zero gradients (no change to the tables), so that the
    kernels of this process and of the servers are loaded before the clock starts."""
    sparse, dense = tables(args)
    ids = np.arange(min(args.batch, args.rows))
    await ps.pull_sparse(sparse.name, ids)
    await ps.push_sparse_grad(sparse.name, ids, np.zeros((len(ids), args.dim), np.float32))
    await ps.pull_dense(dense.name)
    await ps.push_dense_grad(dense.name, np.zeros(args.dense, np.float32))


def _client_process(index: int, addresses: list[str], clients: int, args: argparse.Namespace, go: Any, out: Any) -> None:
    """Run ``clients`` clients in one event loop; send back what they pushed and how long it took."""

    async def run() -> dict[str, Any]:
        acc = {"sparse": np.zeros((args.rows, args.dim)), "dense": np.zeros(args.dense)}
        latencies: dict[str, list[float]] = {op: [] for op in OPS}
        errors: Counter[str] = Counter()
        conns = [await aps.connect(addresses, timeout=120) for _ in range(clients)]
        for ps in conns:
            await ps.ping()  # both connections open before the clock starts
        await _warm_up(conns[0], args)
        go.wait()
        started = time.perf_counter()
        rngs = [np.random.default_rng([args.seed, index, k]) for k in range(clients)]
        await asyncio.gather(*(_client(ps, args, rng, acc, latencies, errors) for ps, rng in zip(conns, rngs)))
        elapsed = time.perf_counter() - started
        for ps in conns:
            await ps.aclose()
        return {"acc": acc, "latencies": latencies, "errors": errors, "seconds": elapsed}

    out.send(asyncio.run(run()))
    out.close()


async def setup_and_check(addresses: list[str], args: argparse.Namespace, expected: dict[str, np.ndarray] | None) -> dict[str, Any]:
    """Create the tables (expected None), or read them back and compare with ``expected``."""
    sparse, dense = tables(args)
    async with aps.connect(addresses, timeout=300) as ps:
        if expected is None:
            await ps.create_table(sparse)
            await ps.create_table(dense)
            return {}
        got_sparse = await ps.pull_sparse(sparse.name, np.arange(args.rows))
        got_dense = await ps.pull_dense(dense.name)
    out: dict[str, Any] = {}
    for name, got in (("sparse", got_sparse), ("dense", got_dense)):
        want = expected[name]
        out[name] = {
            "exact": bool(np.array_equal(got, want)),
            "elements_differing": int(np.count_nonzero(got != want)),
            "max_abs_diff": float(np.max(np.abs(got.astype(np.float64) - want))) if got.size else 0.0,
            "elements_touched": int(np.count_nonzero(want)),
        }
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="aps-load-") as tmp:
        work = Path(tmp)
        servers = [ServerProcess.start(work, "--servers", "2", "--index", str(k), "--no-exit-when-done", name=f"pserver-{k}")
                   for k in range(2)]
        try:
            addresses = [s.address for s in servers]
            asyncio.run(setup_and_check(addresses, args, None))
            rss_before = [s.rss()[0] for s in servers]
            go = ctx.Event()
            shares = [len(part) for part in np.array_split(np.arange(args.clients), args.procs)]
            pipes, procs = [], []
            for index, share in enumerate(shares):
                parent, child = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_client_process, args=(index, addresses, share, args, go, child))
                proc.start()
                child.close()
                pipes.append(parent)
                procs.append(proc)
            time.sleep(0.5)
            go.set()
            started = time.perf_counter()
            parts = [pipe.recv() for pipe in pipes]
            wall = time.perf_counter() - started
            for proc in procs:
                proc.join(60)
            rss_after = [s.rss() for s in servers]
            expected_acc = {name: sum(p["acc"][name] for p in parts) for name in ("sparse", "dense")}
            expected = {name: (0.0 - LR * acc).astype(np.float32) for name, acc in expected_acc.items()}
            check = asyncio.run(setup_and_check(addresses, args, expected))
        finally:
            statuses = [s.stop() for s in servers]
    latencies = {op: [x for p in parts for x in p["latencies"][op]] for op in OPS}
    errors: Counter[str] = Counter()
    for p in parts:
        errors.update(p["errors"])
    done = sum(len(v) for v in latencies.values())
    return {
        "config": {k: str(v) for k, v in vars(args).items()},
        "requests": done,
        "errors": sum(errors.values()),
        "error_kinds": dict(errors),
        "seconds": round(wall, 3),
        "requests_per_s": round(done / wall, 1),
        "latency_ms": {"all": percentiles_ms([x for v in latencies.values() for x in v]),
                       **{op: percentiles_ms(v) for op, v in latencies.items()}},
        "final_values": check,
        "servers": [
            {"rss_before": before, "rss_after": after[0], "rss_peak": after[1], "exit_status": status}
            for before, after, status in zip(rss_before, rss_after, statuses)
        ],
    }


def report(r: dict[str, Any], args: argparse.Namespace) -> None:
    exact = all(v["exact"] for v in r["final_values"].values())
    print(f"\n{args.clients} clients x {args.requests} requests ({', '.join(f'{o} {w:.0%}' for o, w in zip(OPS, MIX))}) "
          f"against 2 pservers; sparse {args.rows:,} x {args.dim}, {args.batch} ids per request; dense {args.dense:,}\n")
    print(markdown_table(
        ["requests", "errors", "final values exact", "requests/s", "p50 ms", "p99 ms", "max ms",
         *(f"server {k} RSS before / after / peak MiB" for k in range(len(r["servers"])))],
        [[f"{r['requests']:,}", r["errors"], "yes" if exact else "NO", f"{r['requests_per_s']:,}",
          r["latency_ms"]["all"]["p50"], r["latency_ms"]["all"]["p99"], r["latency_ms"]["all"]["max"],
          *(f"{s['rss_before'] / MIB:.0f} / {s['rss_after'] / MIB:.0f} / {s['rss_peak'] / MIB:.0f}" for s in r["servers"])]],
    ))
    print("\nLatency per op\n")
    print(markdown_table(["op", "requests", "p50 ms", "p99 ms", "max ms"],
                         [[op, f"{v['n']:,}", v.get("p50"), v.get("p99"), v.get("max")]
                          for op, v in r["latency_ms"].items() if op != "all"]))
    for name, v in r["final_values"].items():
        print(f"\n{name}: {'exact' if v['exact'] else 'DIFFERS'} ({v['elements_touched']:,} elements changed from 0, "
              f"{v['elements_differing']:,} differ, max |diff| {v['max_abs_diff']:g})", end="")
    print()
    for kind, n in r["error_kinds"].items():
        print(f"error x{n}: {kind}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    report(result, args)
    write_results(args.json, result)
    ok = result["errors"] == 0 and all(v["exact"] for v in result["final_values"].values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
