"""Trainer leases, a pserver's own checkpoints and --resume, and the client's reconnect deadline,
in one process (real TCP on port 0); tests/faults/ does the same with real processes."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest

import aps
from aps.checkpoints.latest import latest_checkpoint
from aps.errors import ConfigError, ErrorCode
from aps.server.autosave import AutoCheckpoints
from tests.conftest import eventually

EMB = aps.SparseTable("emb", rows=8, dim=2, init=aps.Constant(0.0), optimizer=aps.SGD(lr=1.0))


async def live_and_mute(srv: aps.PServer) -> tuple[aps.PSClient, aps.PSClient]:
    """Trainer 0 (heartbeats on) and trainer 1, known to the server but mute from now on (no
    heartbeats): what a paused or cut-off trainer looks like to a pserver."""
    a = await aps.connect([srv.address], trainer_id=0)
    b = await aps.connect([srv.address], trainer_id=1, heartbeat=0)
    await a.create_table(EMB)
    await b.ping()
    return a, b


async def test_heartbeats_keep_an_idle_trainer_alive() -> None:
    srv = await aps.serve(num_trainers=2, trainer_timeout=0.4, exit_when_done=False)
    try:
        async with aps.connect([srv.address], trainer_id=0) as ps:
            await ps.create_table(EMB)
            await asyncio.sleep(1.5)  # nearly four leases without a request of its own
            assert srv.core.leases.gone == set()
        await eventually(lambda: srv.core.leases.gone == {0})
    finally:
        await srv.aclose()


async def test_sync_round_fails_naming_the_gone_trainer() -> None:
    srv = await aps.serve(num_trainers=2, trainer_timeout=0.3, exit_when_done=True)
    try:
        a, b = await live_and_mute(srv)
        await b.aclose()
        started = time.monotonic()
        with pytest.raises(aps.ServerError, match="trainer 1 is gone") as info:
            await a.push_sparse_grad("emb", [1], np.ones((1, 2), np.float32), sync=True)
        assert info.value.code == ErrorCode.TRAINER_GONE
        assert time.monotonic() - started < 0.3 + 1.0 + 0.5
        # the exit rule counts it: trainer 0's worker_done stops the server
        await a.worker_done()
        await asyncio.wait_for(srv.wait_closed(), 5)
        assert "gone: [1]" in srv.exit_reason
        await a.aclose()
    finally:
        await srv.aclose()


async def test_epoch_barrier_completes_without_the_gone_trainer() -> None:
    srv = await aps.serve(num_trainers=3, trainer_timeout=0.3, exit_when_done=False)
    try:
        clients = [await aps.connect([srv.address], trainer_id=t) for t in range(3)]
        await clients[0].create_table(EMB)
        for c in clients:
            await c.ping()
        waiting = asyncio.ensure_future(clients[0].barrier("aps.epoch.0", value=1))
        named = asyncio.ensure_future(clients[0].barrier("own", count=3))  # the caller's own count stays
        await clients[2].aclose()
        await asyncio.sleep(0.1)
        assert not waiting.done()
        arrived = await clients[1].barrier("aps.epoch.0", value=1)  # completes once trainer 2 is gone
        assert arrived == 2 and await waiting == 2
        assert srv.core.leases.gone == {2} and not named.done()
        named.cancel()
        for c in clients[:2]:
            await c.aclose()
    finally:
        await srv.aclose()


async def test_a_trainer_back_from_gone_passes_at_once_the_barriers_the_others_passed() -> None:
    srv = await aps.serve(num_trainers=2, trainer_timeout=0.5, exit_when_done=False)
    try:
        a, b = await live_and_mute(srv)  # trainer 1 mute: a paused trainer
        await eventually(lambda: srv.core.leases.gone == {1})
        assert await a.barrier("aps.epoch.0", value=1) == 1  # trainer 1 is counted out
        assert await a.barrier("aps.epoch.1", value=1) == 1
        # trainer 1 comes back: it rejoins, and the barriers the others passed complete at once
        assert await asyncio.wait_for(b.barrier("aps.epoch.0", value=5), 1) == 1
        assert srv.core.leases.gone == set()
        assert await asyncio.wait_for(b.barrier("aps.epoch.1", value=5), 1) == 1
        # the next barrier counts it again
        waiting = asyncio.ensure_future(a.barrier("aps.epoch.2", value=1))
        await asyncio.sleep(0.1)
        assert not waiting.done()
        assert await b.barrier("aps.epoch.2", value=5) == 6 and await waiting == 6
        await a.aclose()
        await b.aclose()
    finally:
        await srv.aclose()


async def test_a_gone_trainer_of_a_sync_job_is_told_it_was_dropped() -> None:
    srv = await aps.serve(num_trainers=2, trainer_timeout=0.3, exit_when_done=False)
    try:
        a, b = await live_and_mute(srv)
        with pytest.raises(aps.ServerError, match="trainer 1 is gone"):
            await a.push_sparse_grad("emb", [1], np.ones((1, 2), np.float32), sync=True)
        for request in (b.ping(), b.push_sparse_grad("emb", [1], np.ones((1, 2), np.float32), sync=True)):
            with pytest.raises(aps.ServerError, match="trainer 1 was dropped .* --trainer-timeout 0.3 s") as info:
                await request
            assert info.value.code == ErrorCode.TRAINER_GONE and not info.value.retriable
        assert srv.core.leases.gone == {1}  # it stays counted out: nothing waits for it
        await a.aclose()
        await b.aclose()
    finally:
        await srv.aclose()


async def test_own_checkpoints_keep_k_and_resume_rolls_back_one_shard(tmp_path: Path) -> None:
    options = dict(checkpoint_dir=str(tmp_path), keep_checkpoints=2)
    srv = await aps.serve(num_servers=1, **options)
    async with aps.connect([srv.address]) as ps:
        await ps.create_table(EMB)
        for _ in range(3):
            await ps.push_sparse_delta("emb", [5], [[1.0, 0.0]])
            assert srv.checkpoints is not None
            await srv.checkpoints.save_now("test")
        await ps.push_sparse_delta("emb", [5], [[1.0, 0.0]])  # after the last checkpoint: lost
    await srv.aclose()
    assert len(list(tmp_path.glob("auto-*-shard-00000-of-00001"))) == 2

    srv = await aps.serve(resume=str(tmp_path))
    try:
        async with aps.connect([srv.address]) as ps:
            assert (await ps.pull_sparse("emb", [5]))[0, 0] == 3.0
            # geo: a client new to a resumed server gets every row as changed once
            ids, rows = await ps.pull_sparse_changed("emb")
            assert sorted(ids.tolist()) == list(range(8)) and rows[5, 0] == 3.0
            assert len((await ps.pull_sparse_changed("emb"))[0]) == 0
            with pytest.raises(aps.ServerError, match="resumed alone"):
                await ps.push_sparse_grad("emb", [5], np.ones((1, 2), np.float32), sync=True)
    finally:
        await srv.aclose()


async def test_own_checkpoints_are_written_by_the_cores_save_and_skipped_without_tables(tmp_path: Path) -> None:
    """AutoCheckpoints is handed the core's one save operation, not the core: nothing is written
    while the server holds no tables; then each save is a complete shard with its own save id."""
    srv = await aps.serve(num_servers=1)
    try:
        auto = AutoCheckpoints(srv.core.checkpointing.save_own_shard, 0, 1, str(tmp_path), every=0, keep=1)
        auto.start()
        assert await auto.save_now("test") is None and list(tmp_path.iterdir()) == []
        async with aps.connect([srv.address]) as ps:
            await ps.create_table(EMB)
            await ps.push_sparse_delta("emb", [5], [[2.0, 0.0]])
            first = await auto.save_now("test")
            second = await auto.save_now("test")
        assert first is not None and second is not None and srv.core.stats.saves == 2
        assert list(tmp_path.iterdir()) == [second]  # keep=1
        path, manifest = latest_checkpoint(tmp_path, 0, 1)  # type: ignore[misc]
        assert path == second / "shard-00000-of-00001" and manifest["save_id"].startswith(second.name)
        await auto.stop()
    finally:
        await srv.aclose()


async def test_resume_refuses_a_directory_without_a_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no complete checkpoint of shard 0 of 1"):
        await aps.serve(resume=str(tmp_path))
    with pytest.raises(ConfigError, match="exclude each other"):
        await aps.serve(resume=str(tmp_path), init_model=str(tmp_path))


async def test_client_rides_through_a_restart_within_its_deadline(tmp_path: Path) -> None:
    srv = await aps.serve(checkpoint_dir=str(tmp_path))
    port = srv.port
    ps = await aps.connect([srv.address], deadline=10, backoff=0.01)
    await ps.create_table(EMB)
    await ps.push_sparse_delta("emb", [2], [[4.0, 0.0]])
    await srv.aclose(checkpoint=True)  # as on SIGTERM: a last checkpoint after the drain
    pending = asyncio.ensure_future(ps.pull_sparse("emb", [2]))
    await asyncio.sleep(0.5)
    assert not pending.done()  # reconnecting
    srv = await aps.serve(port=port, resume=str(tmp_path))
    try:
        assert (await pending)[0, 0] == 4.0
    finally:
        await ps.aclose()
        await srv.aclose()


async def test_reconnect_deadline_names_server_and_deadline() -> None:
    srv = await aps.serve()
    ps = await aps.connect([srv.address], deadline=0.3, backoff=0.01, timeout=10)
    await ps.create_table(EMB)
    await srv.aclose()
    started = time.monotonic()
    with pytest.raises(aps.ConnectionLost, match=r"rpc deadline 0.3 s") as info:
        await ps.pull_sparse("emb", [1])
    assert 0.3 <= time.monotonic() - started < 2.0
    assert srv.address in str(info.value)
    await ps.aclose()
