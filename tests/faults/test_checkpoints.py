"""A pserver's own checkpoints with real processes: periodic, the last K kept, one on SIGTERM
holding every acknowledged push, --resume from the newest; a SIGKILL in the middle of a save
leaves the previous checkpoint loadable and the torn one refused."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import aps
from tests.conftest import BIN, Processes
from tests.faults.cluster import Cluster, wait_for

SMALL = aps.SparseTable("t", rows=10, dim=1, init=aps.Constant(0.0), optimizer=aps.SGD(lr=1.0))
# 2M x 32 float32 = 256 MB: a save takes long enough to be killed in the middle of it
BIG = aps.SparseTable("big", rows=2_000_000, dim=32, init=aps.Constant(0.0), optimizer=aps.SGD(lr=1.0))


def own_checkpoints(directory: Path, shard: str = "shard-00000-of-00001") -> tuple[list[Path], list[Path]]:
    """(complete, incomplete) periodic checkpoints of one shard, oldest first."""
    mine = sorted(directory.glob(f"auto-*-{shard}"))
    complete = [p for p in mine if (p / shard / "manifest.json").is_file()]
    return complete, [p for p in mine if p not in complete]


def stamp(path: Path) -> float:
    """When a periodic checkpoint was started (its name holds the milliseconds)."""
    return int(path.name.split("-")[1]) / 1000


async def push(address: str, value: float) -> None:
    async with aps.connect([address]) as ps:
        await ps.create_table(SMALL)
        await ps.push_sparse_delta("t", [3], [[value]])


async def saves(address: str) -> int:
    async with aps.connect([address]) as ps:
        return int(next(iter((await ps.stats()).values()))["saves"])


async def row(address: str, table: str = "t", index: int = 3) -> float:
    async with aps.connect([address]) as ps:
        return float((await ps.pull_sparse(table, [index]))[0, 0])


@pytest.mark.slow
def test_periodic_keep_last_k_sigterm_and_resume(processes: Processes, tmp_path: Path) -> None:
    cluster = Cluster(processes, tmp_path, 1, 1, "--checkpoint-dir", "ckpt", "--checkpoint-every", "0.2", "--keep-checkpoints", "2")
    address = cluster.addresses[0]
    asyncio.run(push(address, 1.0))
    wait_for(lambda: asyncio.run(saves(address)) >= 4, 30, "four periodic checkpoints", step=0.1)
    complete, _ = own_checkpoints(tmp_path / "ckpt")
    assert len(complete) == 2  # the older ones were deleted

    asyncio.run(push(address, 10.0))
    cluster.servers[0].send_signal(signal.SIGTERM)
    assert cluster.servers[0].wait(timeout=30) == 0
    log = cluster.server_log(0).read_text()
    assert "checkpoint written" in log and "reason=shutdown" in log
    complete, incomplete = own_checkpoints(tmp_path / "ckpt")
    assert len(complete) == 2 and not incomplete

    cluster.restart_server(0, "--resume", "ckpt")
    # the checkpoint written on SIGTERM holds the push acknowledged just before it
    assert asyncio.run(row(address)) == 11.0
    assert f"path=ckpt/{complete[-1].name}" in cluster.server_log(0, 1).read_text()


@pytest.mark.slow
def test_kill_during_own_checkpoint_resumes_from_the_previous_one(processes: Processes, tmp_path: Path) -> None:
    cluster = Cluster(processes, tmp_path, 1, 1, "--checkpoint-dir", "ckpt", "--checkpoint-every", "0.3")
    address = cluster.addresses[0]
    ckpt = tmp_path / "ckpt"

    async def setup(value: float) -> float:
        async with aps.connect([address]) as ps:
            await ps.create_table(BIG)
            await ps.create_table(SMALL)
            await ps.push_sparse_delta("t", [3], [[value]])
            return time.time()

    first = asyncio.run(setup(1.0))
    wait_for(lambda: any(stamp(p) > first for p in own_checkpoints(ckpt)[0]), 60, "a checkpoint after the first push")
    second = asyncio.run(setup(10.0))
    wait_for(lambda: any(stamp(p) > second for p in own_checkpoints(ckpt)[1]), 60, "a checkpoint being written", step=0.005)
    cluster.servers[0].send_signal(signal.SIGKILL)
    assert cluster.servers[0].wait(timeout=10) == -signal.SIGKILL
    complete, torn = own_checkpoints(ckpt)
    assert torn and all(stamp(p) > second for p in torn) and all(stamp(p) < second for p in complete)

    cluster.restart_server(0, "--resume", "ckpt")
    assert asyncio.run(row(address)) == 1.0  # the previous checkpoint: without the second push
    assert f"path=ckpt/{complete[-1].name}" in cluster.server_log(0, 1).read_text()
    # the restarted server's own next checkpoint clears the torn one away
    wait_for(lambda: not own_checkpoints(ckpt)[1], 60, "torn checkpoint removed")


@pytest.mark.slow
def test_kill_during_cluster_save_torn_checkpoint_refused(processes: Processes, tmp_path: Path) -> None:
    cluster = Cluster(processes, tmp_path, 2, 1)
    manifest = [tmp_path / "ckpt" / f"shard-0000{k}-of-00002" / "manifest.json" for k in range(2)]

    async def first_save() -> None:
        async with aps.connect(cluster.addresses) as ps:
            await ps.create_table(BIG)
            await ps.save("ckpt")
            await ps.push_sparse_grad("big", [1], np.ones((1, 32), np.float32))

    asyncio.run(first_save())
    old_id = json.loads(manifest[1].read_text())["save_id"]
    assert json.loads(manifest[0].read_text())["save_id"] == old_id

    async def second_save() -> None:
        async with aps.connect(cluster.addresses, deadline=0) as ps:
            await ps.save("ckpt")

    with ThreadPoolExecutor(1) as pool:
        saving = pool.submit(asyncio.run, second_save())
        wait_for(lambda: any((tmp_path / "ckpt").glob(".shard-00001-of-00002.tmp-*")), 60, "shard 1 being saved", step=0.005)
        cluster.servers[1].send_signal(signal.SIGKILL)
        wait_for(lambda: json.loads(manifest[0].read_text())["save_id"] != old_id, 60, "shard 0 saved again")
        with pytest.raises(aps.ConnectionLost):  # the client learns that the save failed
            saving.result(timeout=30)
    assert json.loads(manifest[1].read_text())["save_id"] == old_id  # shard 1: still the old save

    refused = subprocess.run(
        [sys.executable, str(BIN / "aps-server"), "--init-model", str(tmp_path / "ckpt"), "--port", "0"],
        capture_output=True, text=True, timeout=60,
    )
    assert refused.returncode == 2
    assert "comes from save" in refused.stderr and old_id in refused.stderr

