"""aps-serve as real processes following exports of 2 real pservers: base + 3 deltas (and a
base after a shrink) served by two aps-serve processes give exactly the rows the pservers held
at each export, for hash, fixed and dense tables; and the CLI's misuse exits 2."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import aps
from aps.errors import ErrorCode
from tests.conftest import BIN, Processes, wait_port_file

pytestmark = pytest.mark.timeout(120)

DIM = 4
TABLES = (
    aps.HashTable("emb", dim=DIM, optimizer=aps.Adagrad(lr=0.1), base_threshold=0.0, delta_threshold=0.05),
    aps.SparseTable("fixed", rows=100, dim=DIM, optimizer=aps.SGD(lr=0.5)),
    aps.DenseTable("fc", shape=(4, 5), optimizer=aps.SGD(lr=0.5)),
)


def start_serving(processes: Processes, root: Path, n: int) -> list[str]:
    addresses = []
    for i in range(n):
        port_file = processes.tmp / f"serve.{i}.port"
        proc = processes.start("aps-serve", str(root), "--port-file", str(port_file), "--poll", "0.05")
        addresses.append(f"127.0.0.1:{wait_port_file(port_file, proc)}")
    return addresses


async def served_at(client: aps.PSClient, version: int, keys: np.ndarray) -> dict[str, np.ndarray]:
    """Every table's rows from ``client`` once it serves ``version`` (waits for it, 20 s at most)."""
    deadline = time.monotonic() + 20
    while True:
        try:
            rows, got = await client.pull_sparse("emb", keys, with_version=True)
        except aps.ServerError as exc:  # no export loaded yet
            assert exc.code == ErrorCode.UNKNOWN_TABLE, exc
            rows, got = None, None
        if got == version:
            break
        assert got is None or got < version, (got, version)
        assert time.monotonic() < deadline, f"version {version} not served within 20 s (serving {got})"
        await asyncio.sleep(0.05)
    fixed, v1 = await client.pull_sparse("fixed", np.arange(100), with_version=True)
    dense, v2 = await client.pull_dense("fc", with_version=True)
    assert v1 == v2 == version
    return {"emb": rows, "fixed": fixed, "fc": dense}


@pytest.mark.slow
async def test_base_and_three_deltas_served_by_two_processes_equal_the_pservers_at_each_export(
    processes: Processes, tmp_path: Path
) -> None:
    root = tmp_path / "ex"
    root.mkdir()
    pservers = processes.start_servers(2, 1, "--checkpoint-root", str(tmp_path), "--no-exit-when-done")
    serve = start_serving(processes, root, 2)
    rng = np.random.default_rng(5)
    keys = np.unique(rng.integers(-(1 << 63), (1 << 63) - 1, 60, dtype=np.int64))
    async with aps.connect(pservers) as ps, aps.connect([serve[0]]) as one, aps.connect([serve[1]]) as two:
        for spec in TABLES:
            await ps.create_table(spec)
        plan = [("base", keys[:30]), ("delta", keys[20:40]), ("delta", keys[40:45]), ("delta", keys[:5])]
        for step, (kind, pushed) in enumerate(plan):
            grads = rng.standard_normal((len(pushed), DIM)).astype(np.float32)
            shows = np.full(len(pushed), 1.0 if step % 2 else 20.0, np.float32)
            await ps.push_sparse_grad("emb", pushed, grads, shows=shows)
            await ps.push_sparse_grad("fixed", np.abs(pushed) % 100, grads)
            await ps.push_dense_grad("fc", rng.standard_normal((4, 5)).astype(np.float32))
            info = await ps.export("ex", kind=kind)
            assert info.version == step + 1
            held = {
                "emb": await ps.pull_sparse("emb", keys),  # keys never pushed read their initial rows, served or not
                "fixed": await ps.pull_sparse("fixed", np.arange(100)),
                "fc": await ps.pull_dense("fc"),
            }
            for client in (one, two):
                served = await served_at(client, info.version, keys)
                for name, rows in held.items():
                    assert np.array_equal(served[name], rows), (kind, step, name)
        # a shrink deletes the keys pushed once; the next base no longer holds them
        evicted = await ps.shrink("emb", threshold=0.5)
        assert evicted > 0
        info = await ps.export("ex", kind="base")
        held_keys = (await ps.table_info("emb")).keys
        for client in (one, two):
            served = await served_at(client, info.version, keys)
            assert np.array_equal(served["emb"], await ps.pull_sparse("emb", keys))
            assert (await client.table_info("emb")).keys == held_keys == len(keys[:45]) - evicted


def test_misuse_is_one_line_and_exit_2(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, str(BIN / "aps-serve"), str(tmp_path / "missing")], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [f"aps-serve: error: EXPORT_DIR {tmp_path / 'missing'}: no such directory"]


async def test_sigterm_stops_aps_serve_as_it_stops_a_pserver(processes: Processes, tmp_path: Path) -> None:
    """aps-serve answers SIGTERM with aps-server's own loop (PServer.serve_until_signalled): the
    port file holds the port it serves on, and SIGTERM ends it promptly with exit 0 and the
    pserver's stop record naming the signal."""
    (tmp_path / "exports").mkdir()
    port_file = tmp_path / "serve.port"
    proc = processes.start("aps-serve", str(tmp_path / "exports"), "--port-file", str(port_file), "--log-json")
    port = wait_port_file(port_file, proc)
    async with aps.connect([f"127.0.0.1:{port}"]) as client:
        await client.ping()
        assert (await client.stats())[f"127.0.0.1:{port}"]["server_index"] == 0
    assert not (tmp_path / "serve.port.tmp").exists()
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=15) == 0
    assert time.monotonic() - started < 10
    records = [json.loads(line) for line in (tmp_path / "aps-serve.0.log").read_text().splitlines() if line.startswith("{")]
    stops = [r for r in records if r.get("event") == "pserver stopped"]
    assert [r["reason"] for r in stops] == ["signal SIGTERM"]
