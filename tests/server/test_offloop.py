"""Big creates, saves and loads run off the event loop: the server answers meanwhile, and pushes
that arrive during a save wait for it (the checkpoint is the state when the SAVE arrived)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

import aps
from aps.checkpoints.shards import load_shards
from tests.conftest import eventually

# 2M x 32 float32 = 256 MB: seconds to initialise and to write with fsync, far more than a ping
BIG = aps.SparseTable("big", rows=2_000_000, dim=32, init=aps.Uniform(-0.1, 0.1), optimizer=aps.SGD(lr=1.0))


@pytest.mark.slow
async def test_ping_and_pull_answered_while_a_big_table_is_created_and_saved(tmp_path: Path) -> None:
    srv = await aps.serve(checkpoint_root=str(tmp_path))
    try:
        async with aps.connect([f"127.0.0.1:{srv.port}"]) as a, aps.connect([f"127.0.0.1:{srv.port}"]) as b:
            create = asyncio.ensure_future(a.create_table(BIG, timeout=None))
            await eventually(lambda: "big" in srv.core.table_set.creating)
            await b.ping()
            assert not create.done(), "the create finished before a ping: the table is too small to show anything"
            await create
            await b.create_table(BIG)  # now exists: the same spec is fine

            before = await b.pull_sparse("big", [0, 1, 2])
            save = asyncio.ensure_future(a.save("ckpt"))
            await eventually(lambda: srv.core.gate.busy)
            push = asyncio.ensure_future(b.push_sparse_grad("big", [0], np.ones((1, 32), np.float32)))
            await b.ping()
            during = await b.pull_sparse("big", [0, 1, 2])  # reads are served during the save
            assert not save.done(), "the save finished before a ping: the table is too small to show anything"
            await asyncio.sleep(0.05)
            assert not push.done(), "a push to a table being saved must wait for the save"
            np.testing.assert_array_equal(during, before)
            await save
            await push
            after = await b.pull_sparse("big", [0])
            np.testing.assert_allclose(after[0], before[0] - 1.0, rtol=0, atol=1e-6)
    finally:
        await srv.aclose()
    tables, _ = load_shards(tmp_path / "ckpt", 0, 1)
    # the checkpoint is the state when the SAVE arrived: without the push that came during it
    np.testing.assert_array_equal(tables["big"].values[:3], before)


@pytest.mark.slow
async def test_pushes_held_by_a_save_all_apply_before_a_later_save(tmp_path: Path) -> None:
    spec = aps.SparseTable("t", rows=4, dim=1, init=aps.Constant(0.0), optimizer=aps.SGD(lr=1.0))
    srv = await aps.serve(checkpoint_root=str(tmp_path))
    try:
        async with aps.connect([f"127.0.0.1:{srv.port}"]) as ps:
            await ps.create_table(spec)
            await ps.create_table(BIG)
            save = asyncio.ensure_future(ps.save("ckpt"))
            await eventually(lambda: srv.core.gate.busy)
            pushes = [asyncio.ensure_future(ps.push_sparse_delta("t", [0], [[float(2**i)]])) for i in range(5)]
            stats = await ps.stats()
            assert not save.done()
            assert next(iter(stats.values()))["tables"]["t"]["rows"] == 4
            await save
            await asyncio.gather(*pushes)
            assert (await ps.pull_sparse("t", [0]))[0, 0] == 31.0
            # a second save runs after the pushes it was queued behind
            await ps.save("ckpt2")
    finally:
        await srv.aclose()
    first, _ = load_shards(tmp_path / "ckpt", 0, 1)
    second, _ = load_shards(tmp_path / "ckpt2", 0, 1)
    assert first["t"].values[0, 0] == 0.0 and second["t"].values[0, 0] == 31.0


@pytest.mark.slow
async def test_load_runs_off_the_loop_and_replaces_tables(tmp_path: Path) -> None:
    srv = await aps.serve(checkpoint_root=str(tmp_path))
    try:
        async with aps.connect([f"127.0.0.1:{srv.port}"]) as a, aps.connect([f"127.0.0.1:{srv.port}"]) as b:
            await a.create_table(BIG)
            saved = await a.pull_sparse("big", [5])
            await a.save("ckpt")
            await a.push_sparse_grad("big", [5], np.ones((1, 32), np.float32))
            load = asyncio.ensure_future(a.load("ckpt"))
            await eventually(lambda: srv.core.gate.busy)
            await b.ping()
            assert not load.done(), "the load finished before a ping: the table is too small to show anything"
            await load
            np.testing.assert_array_equal(await b.pull_sparse("big", [5]), saved)
    finally:
        await srv.aclose()


async def test_sync_push_held_by_a_save_is_withdrawn_when_its_client_goes(tmp_path: Path) -> None:
    srv = await aps.serve(num_trainers=2, checkpoint_root=str(tmp_path))
    try:
        async with aps.connect([f"127.0.0.1:{srv.port}"]) as a:
            await a.create_table(BIG)
            b = await aps.connect([f"127.0.0.1:{srv.port}"], deadline=0)
            await b.ping()
            save = asyncio.ensure_future(a.save("ckpt"))
            await eventually(lambda: srv.core.gate.busy)
            held = asyncio.ensure_future(b.push_sparse_grad("big", [0], np.ones((1, 32), np.float32), sync=True))
            await asyncio.sleep(0.05)
            await b.aclose()  # gone while its push waits behind the save
            await save
            await asyncio.gather(held, return_exceptions=True)
            await asyncio.sleep(0.05)
            assert srv.core.sync_rounds.pending_bytes() == 0  # it did not join a round
    finally:
        await srv.aclose()
