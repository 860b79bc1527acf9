"""A disk table's pserver SIGKILLed while pushes write rows to disk, then ``--resume``: the last
complete checkpoint loads whole (rows that were on disk and in RAM alike), nothing it held is
lost, and the killed process's disk files are cleared away by the restarted one."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import numpy as np
import pytest

import aps
from tests.conftest import Processes
from tests.faults.cluster import Cluster, wait_for
from tests.faults.test_checkpoints import own_checkpoints, stamp

SPEC = aps.HashTable("emb", dim=8, init=aps.Uniform(-0.01, 0.01), optimizer=aps.Adagrad(lr=0.05, rowwise=True),
                     dtype="float16", disk=aps.Disk(ram_bytes=4 << 20))  # about 36k rows in RAM
BEFORE = np.arange(100_000, dtype=np.int64)  # pushed before the checkpoint: more than RAM holds
DURING = np.arange(1_000_000, 2_000_000, dtype=np.int64)  # pushed while the pserver is killed


async def fill(address: str) -> np.ndarray:
    async with aps.connect([address]) as ps:
        await ps.create_table(SPEC)
        rng = np.random.default_rng(0)
        for at in range(0, BEFORE.size, 20_000):
            keys = BEFORE[at : at + 20_000]
            await ps.push_sparse_grad("emb", keys, rng.standard_normal((keys.size, 8)).astype(np.float32))
        return await ps.pull_sparse("emb", BEFORE)


async def push_until_killed(address: str) -> int:
    """Push new keys until the connection goes; returns how many pushes were acknowledged."""
    done = 0
    try:
        async with aps.connect([address], timeout=5.0) as ps:
            rng = np.random.default_rng(1)
            for at in range(0, DURING.size, 5_000):
                keys = DURING[at : at + 5_000]
                await ps.push_sparse_grad("emb", keys, rng.standard_normal((keys.size, 8)).astype(np.float32))
                done += 1
    except aps.ApsError:
        pass
    return done


async def state(address: str) -> tuple[np.ndarray, aps.client.info.TableInfo]:
    async with aps.connect([address]) as ps:
        rows = await ps.pull_sparse("emb", BEFORE)
        return rows, await ps.table_info("emb")


@pytest.mark.slow
def test_sigkill_during_disk_writes_then_resume_loses_nothing_checkpointed(processes: Processes, tmp_path: Path) -> None:
    cluster = Cluster(processes, tmp_path, 1, 1, "--checkpoint-dir", "ckpt", "--checkpoint-every", "0.5")
    address = cluster.addresses[0]
    ckpt = tmp_path / "ckpt"
    before = asyncio.run(fill(address))
    filled = time.time()
    wait_for(lambda: any(stamp(p) > filled for p in own_checkpoints(ckpt)[0]), 60, "a checkpoint after the fill")

    async def kill_during_pushes() -> int:
        pushing = asyncio.create_task(push_until_killed(address))
        await asyncio.sleep(0.5)  # rows of the fill are going out to disk meanwhile
        cluster.servers[0].send_signal(signal.SIGKILL)
        return await pushing

    acknowledged = asyncio.run(kill_during_pushes())
    assert cluster.servers[0].wait(timeout=10) == -signal.SIGKILL
    assert acknowledged >= 2  # it was killed while writing
    killed_dirs = list((tmp_path / "aps-disk" / "server-0").glob("emb.*"))
    assert killed_dirs  # the killed process's rows on disk were left behind

    cluster.restart_server(0, "--resume", "ckpt")
    rows, info = asyncio.run(state(address))
    assert np.array_equal(rows, before)  # every row of the fill, bitwise, from RAM and disk
    assert info.keys >= BEFORE.size and info.disk_bytes > 0
    assert not any(d.exists() for d in killed_dirs)  # cleared by the restarted pserver
