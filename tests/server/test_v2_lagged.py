"""Lagged-gradient discard (aps-server --async-lagged-grad-discard-ratio) on a real pserver over
TCP on port 0: pull replies carry versions, pushes name them, a push computed from parameters
more than ratio x trainers updates old is dropped and counted, a fresh one is applied."""

from __future__ import annotations

import numpy as np
import pytest

import aps
from aps import wire
from aps.errors import ConfigError
from aps.server import ServerConfig

pytestmark = pytest.mark.timeout(60)

EMB = aps.SparseTable("emb", rows=64, dim=4, init=aps.Constant(0.5), optimizer=aps.SGD(lr=1.0))
#: 20,000 elements: one dense block on one server (blocks are max(8192, size / servers) long)
FC = aps.DenseTable("fc", shape=(100, 200), init=aps.Constant(0.25), optimizer=aps.SGD(lr=1.0))
GRAD = np.full((1, 4), 0.125, dtype=np.float32)


async def lag_stats(ps: aps.PSClient) -> dict:
    (stats,) = (await ps.stats()).values()
    return stats["lagged_grads"]


async def test_stale_sparse_push_is_dropped_and_counted_fresh_one_applied() -> None:
    # 2 trainers, ratio 1.5: a gradient may be at most 3 updates behind
    async with await aps.serve(port=0, num_trainers=2, async_lagged_grad_discard_ratio=1.5) as server:
        async with aps.connect([server.address]) as stale, aps.connect([server.address]) as fresh:
            await stale.create_table(EMB)
            await stale.pull_sparse("emb", [1])  # the stale trainer reads version 0 ...
            for step in range(4):  # ... while the fresh one makes 4 updates, each from fresh rows
                await fresh.pull_sparse("emb", [2])
                await fresh.push_sparse_grad("emb", [2], GRAD)
            assert (await lag_stats(fresh))["dropped"] == 0
            await stale.push_sparse_grad("emb", [1], GRAD)  # 4 updates behind > 3: dropped
            rows = await fresh.pull_sparse("emb", [1, 2])
            np.testing.assert_array_equal(rows[0], np.full(4, 0.5, np.float32))
            np.testing.assert_allclose(rows[1], np.full(4, 0.5 - 4 * 0.125, np.float32))
            lag = await lag_stats(fresh)
            assert lag == {"limit": 3.0, "dropped": 1, "dropped_by_table": {"emb": 1}}

            # the fresh trainer pulled at version 4 and pushes right away: applied
            await fresh.push_sparse_grad("emb", [2], GRAD)
            # the stale one catches up (pulls version 5), then three others update: 3 behind, kept
            await stale.pull_sparse("emb", [1])
            for _ in range(3):
                await fresh.pull_sparse("emb", [2])
                await fresh.push_sparse_grad("emb", [2], GRAD)
            await stale.push_sparse_grad("emb", [1], GRAD)
            rows = await fresh.pull_sparse("emb", [1, 2])
            np.testing.assert_allclose(rows[0], np.full(4, 0.5 - 0.125, np.float32))
            np.testing.assert_allclose(rows[1], np.full(4, 0.5 - 8 * 0.125, np.float32))
            assert (await lag_stats(fresh))["dropped"] == 1


async def test_stale_dense_push_is_dropped() -> None:
    async with await aps.serve(port=0, num_trainers=1, async_lagged_grad_discard_ratio=1.0) as server:
        async with aps.connect([server.address]) as stale, aps.connect([server.address]) as fresh:
            await stale.create_table(FC)
            await stale.pull_dense("fc")
            grad = np.full(FC.shape, 0.5, dtype=np.float32)
            for _ in range(2):
                await fresh.pull_dense("fc")
                await fresh.push_dense_grad("fc", grad)
            await stale.push_dense_grad("fc", grad)  # 2 updates behind > 1: dropped
            np.testing.assert_allclose(await fresh.pull_dense("fc"), np.full(FC.shape, 0.25 - 2 * 0.5, np.float32))
            lag = await lag_stats(fresh)
            assert lag["dropped"] == 1 and lag["dropped_by_table"] == {"fc": 1}
            await stale.pull_dense("fc")
            await stale.push_dense_grad("fc", grad)  # fresh: applied
            np.testing.assert_allclose(await fresh.pull_dense("fc"), np.full(FC.shape, 0.25 - 3 * 0.5, np.float32))
            assert (await lag_stats(fresh))["dropped"] == 1


async def test_versions_on_the_wire_and_unstated_or_sync_pushes_kept() -> None:
    async with await aps.serve(port=0, num_trainers=1, async_lagged_grad_discard_ratio=1.0) as server:
        async with aps.connect([server.address]) as ps:
            await ps.create_table(EMB)
            # a push that names no version (a client that never pulled) is never judged
            for _ in range(5):
                await ps.push_sparse_grad("emb", [3], GRAD)
            # the raw reply of a pull carries the version: 5 updates so far
            reply = await ps._call(0, wire.PullSparse(table="emb", ids=np.array([3], np.int64)))
            assert isinstance(reply, wire.ArrayReply) and reply.version == 5
            np.testing.assert_allclose(reply.values[0], np.full(4, 0.5 - 5 * 0.125, np.float32))
            # a raw push naming version 0 (5 behind) is dropped, one naming 4 is applied
            for based_on in (0, 4):
                msg = wire.PushSparseGrad(table="emb", ids=np.array([3], np.int64), values=GRAD, based_on=based_on)
                assert isinstance(await ps._call(0, msg, int(wire.Flag.FINAL)), wire.Ok)
            rows = await ps.pull_sparse("emb", [3])
            np.testing.assert_allclose(rows[0], np.full(4, 0.5 - 6 * 0.125, np.float32))
            assert (await lag_stats(ps))["dropped"] == 1
            # sync pushes are never dropped, however stale the version they name
            msg = wire.PushSparseGrad(table="emb", ids=np.array([3], np.int64), values=GRAD, based_on=0)
            await ps._call(0, msg, int(wire.Flag.FINAL | wire.Flag.SYNC))
            rows = await ps.pull_sparse("emb", [3])
            np.testing.assert_allclose(rows[0], np.full(4, 0.5 - 7 * 0.125, np.float32))
            assert (await lag_stats(ps))["dropped"] == 1


async def test_off_by_default() -> None:
    async with await aps.serve(port=0) as server, aps.connect([server.address]) as ps:
        await ps.create_table(EMB)
        await ps.pull_sparse("emb", [1])
        msg = wire.PushSparseGrad(table="emb", ids=np.array([1], np.int64), values=GRAD, based_on=0)
        for _ in range(3):
            await ps._call(0, msg, int(wire.Flag.FINAL))
        rows = await ps.pull_sparse("emb", [1])
        np.testing.assert_allclose(rows[0], np.full(4, 0.5 - 3 * 0.125, np.float32))
        assert await lag_stats(ps) == {"limit": None, "dropped": 0, "dropped_by_table": {}}


@pytest.mark.parametrize("ratio", [-1.0, float("nan"), float("inf")])
def test_bad_ratio_is_a_config_error(ratio: float) -> None:
    with pytest.raises(ConfigError, match="async_lagged_grad_discard_ratio"):
        ServerConfig(async_lagged_grad_discard_ratio=ratio)


def test_push_layout_as_documented() -> None:
    """The byte-by-byte example of docs/protocol.md, decoded whole, one byte at a time, and with
    the next frame's bytes behind it."""
    msg = wire.PushSparseGrad(table="e", ids=np.array([7], np.int64), values=np.array([[0.5, 0.25]], np.float32), based_on=12)
    frame = wire.encode_bytes(msg, 9, int(wire.Flag.FINAL))
    assert frame[2] == wire.PROTOCOL_VERSION == 3
    payload = frame[wire.HEADER_SIZE:]
    assert payload.hex() == (
        "010065" "0201000000000000" "0100000000000000" "0000000000"
        "0700000000000000" "0102000000000000" "0100000000000000" "0200000000000000"
        "0000003f0000803e" "0c00000000000000"
    )
    reply = wire.encode_bytes(wire.ArrayReply(op=wire.Op.PULL_SPARSE, values=np.zeros((1, 2), np.float32), version=12), 9)
    assert reply[-8:] == (12).to_bytes(8, "little")
    for feed in ([frame], [bytes([b]) for b in frame], [frame + frame[:5]]):
        decoder = wire.FrameDecoder()
        for piece in feed:
            decoder.receive_data(piece)
        back = wire.decode(decoder.next_frame())
        assert isinstance(back, wire.PushSparseGrad) and back.based_on == 12 and back.ids.tolist() == [7]
        assert back.values.tolist() == [[0.5, 0.25]] and decoder.next_frame() is None
