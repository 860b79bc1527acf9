"""Exports with int8 rows against exports with the rows as stored: size, time, and what aps-serve
serves from them.

    .venv/bin/python bench/export_rows.py                   # 1M keys, dim 16 and 64 (~2 min)
    .venv/bin/python bench/export_rows.py --keys 200000 --dims 16

One ``aps-server`` process (real TCP on localhost) holds a hash table of ``--keys`` keys
(Adagrad, as the CTR models' tables; every key pushed twice, so rows differ in size). For each
``rows`` of ``ps.export(root, kind="base", rows=...)``: the export's seconds and bytes (bytes a
key), then aps-serve started in this process on it with ``--rows exported`` and ``--rows int8``:
the seconds until it serves (reading, checking and loading the export), and every key's row
pulled from it against the pserver's, the worst error in units of its row's scale
(max|row| / 127; int8 rows are within half a scale by construction, rows as stored are exact).
Prints a Markdown table, writes JSON (``--json``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import aps  # noqa: E402
from bench.pservers import ServerProcess, markdown_table, write_results  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
#: keys a pull or push of this bench carries
CHUNK = 50_000


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, default=1_000_000, help="keys in the table (default 1,000,000)")
    p.add_argument("--dims", type=int, nargs="+", default=[16, 64], help="row widths, one table each (default 16 64)")
    p.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "export_rows.json")
    return p.parse_args(argv)


def tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


async def pull_all(client: aps.PSClient, keys: np.ndarray) -> np.ndarray:
    return np.concatenate([await client.pull_sparse("emb", part) for part in np.array_split(keys, max(1, len(keys) // CHUNK))])


def worst_in_scales(served: np.ndarray, exact: np.ndarray) -> float:
    """The largest |served - exact| of any coordinate, in units of its row's max|row| / 127."""
    scale = np.abs(exact).max(axis=1, keepdims=True) / np.float32(127)
    return float((np.abs(served - exact) / np.where(scale > 0, scale, 1)).max())


async def served_from(root: Path, rows: str, keys: np.ndarray, exact: np.ndarray) -> dict[str, float]:
    started = time.monotonic()
    server = await aps.serve_exports(root, poll=60.0, rows=rows)
    try:
        load_s = time.monotonic() - started
        async with aps.connect([server.address]) as client:
            return {"load_s": load_s, "worst_error_in_scales": worst_in_scales(await pull_all(client, keys), exact)}
    finally:
        await server.aclose()


async def one_dim(dim: int, n: int, workdir: Path) -> list[dict[str, Any]]:
    pserver = ServerProcess.start(workdir, "--checkpoint-root", str(workdir), "--no-exit-when-done", "--log-level", "warning")
    results = []
    try:
        async with aps.connect([pserver.address]) as ps:
            spec = aps.HashTable("emb", dim=dim, optimizer=aps.Adagrad(lr=0.05), base_threshold=0.0)
            await ps.create_table(spec)
            rng = np.random.default_rng(dim)
            keys = np.unique(rng.integers(-(1 << 63), (1 << 63) - 1, n, dtype=np.int64))
            for _ in range(2):
                for part in np.array_split(keys, max(1, len(keys) // CHUNK)):
                    grads = rng.standard_normal((len(part), dim)) * rng.lognormal(0.0, 1.0, (len(part), 1))
                    await ps.push_sparse_grad("emb", part, grads.astype(np.float32))
            exact = await pull_all(ps, keys)
            for rows in ("stored", "int8"):
                started = time.monotonic()
                info = await ps.export(f"exports-{rows}", kind="base", rows=rows)
                seconds = time.monotonic() - started
                nbytes = tree_bytes(Path(info.path))
                serving = {option: await served_from(workdir / f"exports-{rows}", option, keys, exact) for option in ("exported", "int8")}
                results.append({"dim": dim, "rows": rows, "keys": int(info.keys["emb"]), "export_s": seconds, "bytes": nbytes,
                                "bytes_per_key": nbytes / len(keys), "serve": serving})
    finally:
        pserver.stop()
    return results


def report(results: list[dict[str, Any]]) -> None:
    rows = []
    for r in results:
        s = r["serve"]
        rows.append([r["dim"], r["rows"], f"{r['keys']:,}", f"{r['export_s']:.2f}", f"{r['bytes'] / 1e6:.1f}", f"{r['bytes_per_key']:.1f}",
                     f"{s['exported']['load_s']:.2f} / {s['int8']['load_s']:.2f}",
                     f"{s['exported']['worst_error_in_scales']:.3f} / {s['int8']['worst_error_in_scales']:.3f}"])
    print(markdown_table(["dim", "export rows", "keys", "export s", "MB", "bytes/key", "aps-serve load s (exported / int8)",
                          "worst error, scales (exported / int8)"], rows))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="aps-export-rows-") as tmp:
        results = []
        for dim in args.dims:
            workdir = Path(tmp) / f"dim{dim}"
            workdir.mkdir()
            results.extend(asyncio.run(one_dim(dim, args.keys, workdir)))
    report(results)
    write_results(args.json, {"keys": args.keys, "cpus": os.cpu_count(), "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
