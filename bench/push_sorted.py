"""Sorted pushes: what sorting a trainer's merged ids costs, and what it saves a pserver.

Part 1 (trainer): merge ``B`` worker batches into a gradient accumulator and hand the push out,
three ways: in arrival order (no sort), sorted once at hand-out (argsort of the distinct ids, rows
permuted; what :class:`aps.trainer.accumulator.GradAccumulator` does), and kept sorted as batches
arrive (each batch's new ids sorted and merged in). Part 2 (pserver): one PUSH_SPARSE_GRAD
through ``ServerCore.handle`` (edge validation, optimizer kernel, no sockets) with the same
distinct ids in arrival order and ascending.

Shapes: CTR-like is 2 batches x 26,000 slot ids (per-batch unique, Zipf-distributed hashed ids
over 1,000,001 buckets), dim 10; word2vec-like is 4 batches x 600 ids over 71,291 words, dim 100.
Run it on any checkout (part 2 only uses APIs that exist before and after the sorted-push work)::

    .venv/bin/python bench/push_sorted.py [--repeat 200] [--json out.json]

Prints a Markdown table of the median microseconds per push.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from numba import njit

import aps
from aps import wire
from aps.server.config import ServerConfig
from aps.server.core import ServerCore
from aps.specs import spec_to_dict

SHAPES = {"ctr": (1_000_001, 10, 2, 26_000, 1.2), "word2vec": (71_291, 100, 4, 600, 1.05)}


def batches(rows: int, dim: int, count: int, per: int, skew: float, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``count`` batches of ``per`` draws, each de-duplicated in first-seen order (as a worker's
    mailbox holds them), with random float32 rows."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        raw = (rng.zipf(skew, per).astype(np.uint64) * np.uint64(2654435761)) % np.uint64(rows)
        _, first = np.unique(raw.astype(np.int64), return_index=True)
        ids = raw[np.sort(first)].astype(np.int64)
        out.append((ids, rng.standard_normal((len(ids), dim)).astype(np.float32)))
    return out


@njit(cache=True, nogil=True)
def _merge_sorted(slot_of, ids, rows, used, b_ids, b_rows, out_ids, out_rows):  # pragma: no cover - bench kernel
    """Keep-sorted variant: add a batch to ``ids[:used]`` (ascending) and write the merged,
    still ascending result to ``out_*`` (slots renumbered). Returns the new count."""
    dim = rows.shape[1]
    fresh = np.empty(b_ids.shape[0], np.int64)
    nf = 0
    for j in range(b_ids.shape[0]):
        r = b_ids[j]
        s = slot_of[r]
        if s >= 0:
            for d in range(dim):
                rows[s, d] += b_rows[j, d]
        else:
            fresh[nf] = j
            nf += 1
    order = np.argsort(b_ids[fresh[:nf]])
    i = 0
    k = 0
    o = 0
    while i < used or k < nf:
        if k >= nf or (i < used and ids[i] < b_ids[fresh[order[k]]]):
            out_ids[o] = ids[i]
            for d in range(dim):
                out_rows[o, d] = rows[i, d]
            i += 1
        else:
            j = fresh[order[k]]
            out_ids[o] = b_ids[j]
            for d in range(dim):
                out_rows[o, d] = b_rows[j, d]
            k += 1
        slot_of[out_ids[o]] = o
        o += 1
    return o


def median_us(fn: Callable[[], object], repeat: int) -> float:
    fn()  # compile / warm
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def trainer_side(shape: str, repeat: int) -> dict[str, float]:
    rows, dim, count, per, skew = SHAPES[shape]
    data = batches(rows, dim, count, per, skew, seed=1)
    table = aps.SparseTable("t", rows=rows, dim=dim)
    from aps.trainer.accumulator import GradAccumulator

    acc = GradAccumulator([table], [], {"t": per}, count)
    buf = acc._sparse[0]

    def fill() -> None:
        acc.clear()
        for ids, grads in data:
            acc.add([ids], [grads], {}, len(ids))

    def arrival() -> None:
        fill()
        buf.ids[: buf.used], buf.rows[: buf.used]  # noqa: B018 - the views a push sends

    def sorted_at_handout() -> None:
        fill()
        acc.sparse()

    cap = buf.capacity
    state = {"ids": np.zeros(cap, np.int64), "rows": np.zeros((cap, dim), np.float32),
             "ids2": np.zeros(cap, np.int64), "rows2": np.zeros((cap, dim), np.float32)}
    slot_of = np.full(rows, -1, np.int32)

    def kept_sorted() -> None:
        used = 0
        for ids, grads in data:
            used = _merge_sorted(slot_of, state["ids"], state["rows"], used, ids, grads, state["ids2"], state["rows2"])
            state["ids"], state["ids2"] = state["ids2"], state["ids"]
            state["rows"], state["rows2"] = state["rows2"], state["rows"]
        slot_of[state["ids"][:used]] = -1

    out = {"arrival order": median_us(arrival, repeat), "kept sorted (merge per batch)": median_us(kept_sorted, repeat)}
    if "sort_slots" in dir(__import__("aps.trainer.accumulator", fromlist=["x"])):
        out["sorted at hand-out"] = median_us(sorted_at_handout, repeat)
    out["distinct ids"] = float(buf.used)
    return out


async def server_side(shape: str, repeat: int, num_servers: int) -> dict[str, float]:
    rows, dim = SHAPES[shape][:2]
    ids, arrival, grads = push_ids(shape)
    ids, arrival, grads = ids[ids % num_servers == 0], arrival[arrival % num_servers == 0], grads[: (ids % num_servers == 0).sum()]
    out: dict[str, float] = {"ids": float(len(ids))}
    for opt_name, opt in (("sgd", aps.SGD(lr=0.1)), ("adagrad", aps.Adagrad(lr=0.1))):
        core = ServerCore(ServerConfig(num_servers=num_servers, server_index=0))
        spec = aps.SparseTable("t", rows=rows, dim=dim, optimizer=opt)
        await core.handle(1, wire.CreateTable(spec_json=json.dumps(spec_to_dict(spec))), 0)
        for label, order in (("arrival order", arrival), ("ascending", ids)):
            msg = wire.PushSparseGrad(table="t", ids=order, values=grads, based_on=-1)
            out[f"{opt_name}, {label}"] = median_us(lambda m=msg: core.handle(1, m, int(wire.Flag.FINAL)), repeat)
    return out


def push_ids(shape: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct ids of one push, ascending and in a random (arrival-like) order, and grads."""
    rows, dim, count, per, skew = SHAPES[shape]
    ids = np.unique(np.concatenate([b[0] for b in batches(rows, dim, count, per, skew, seed=1)]))
    rng = np.random.default_rng(2)
    return ids, rng.permutation(ids), rng.standard_normal((len(ids), dim)).astype(np.float32) * np.float32(1e-6)


async def tcp_side(shape: str, repeat: int) -> dict[str, float]:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from bench.pservers import ServerProcess

    rows, dim = SHAPES[shape][:2]
    ids, arrival, grads = push_ids(shape)
    out: dict[str, float] = {"ids": float(len(ids))}
    with tempfile.TemporaryDirectory() as tmp:
        server = ServerProcess.start(Path(tmp), "--trainers", "1")
        try:
            async with aps.connect([server.address]) as ps:
                await ps.create_table(aps.SparseTable("t", rows=rows, dim=dim, optimizer=aps.SGD(lr=0.1)))
                for label, order in (("sgd, arrival order", arrival), ("sgd, ascending", ids)):
                    await ps.push_sparse_grad("t", order, grads)
                    times = []
                    for _ in range(repeat):
                        t = time.perf_counter()
                        await ps.push_sparse_grad("t", order, grads)
                        times.append(time.perf_counter() - t)
                    out[label] = statistics.median(times) * 1e6
        finally:
            server.stop()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    results: dict[str, dict[str, float]] = {}
    for shape in SHAPES:
        results[f"trainer {shape}"] = trainer_side(shape, args.repeat)
        for n in (1, 2):
            results[f"server {shape}, server 0 of {n}"] = asyncio.run(server_side(shape, args.repeat, n))
        results[f"tcp {shape}, 1 server"] = asyncio.run(tcp_side(shape, args.repeat))
    for name, row in results.items():
        print(f"\n| {name} | median us per push |\n|---|---:|")
        for k, v in row.items():
            print(f"| {k} | {v:,.0f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
