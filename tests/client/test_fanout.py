"""How the client splits one call over servers, frames and dense blocks, and puts the replies
back (aps/client/fanout.py): pure functions, checked against plain numpy without sockets."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import aps
from aps import wire
from aps.client.fanout import Versions, caller_rows, chunks, dense_parts, gather, row_bytes, shares, sum_duplicates
from aps.client.lanes import PortPlan
from aps.errors import CloseReason
from aps.sharding import LogicalSharding, ModuloSharding, SparseSharding


def test_chunks_cover_every_row_once_and_an_empty_call_still_has_one_piece() -> None:
    assert chunks(0, 5) == [slice(0, 0)]
    assert chunks(11, 5) == [slice(0, 5), slice(5, 10), slice(10, 11)]
    assert chunks(3, 5) == [slice(0, 3)]
    assert row_bytes(8) == 8 * 4 + 8


@pytest.mark.parametrize("num_servers", [2, 3, 7])
def test_shares_give_each_server_exactly_its_ids_in_the_callers_order(num_servers: int) -> None:
    ids = np.random.default_rng(1).integers(0, 1000, 500).astype(np.int64)
    parts = shares(ids, ModuloSharding(num_servers))
    assert [p.server for p in parts] == list(range(num_servers))
    seen = np.concatenate([p.rows for p in parts])  # type: ignore[misc]
    np.testing.assert_array_equal(np.sort(seen), np.arange(len(ids)))  # every row once
    for k, rows, shard_ids in parts:
        assert isinstance(rows, np.ndarray)
        np.testing.assert_array_equal(shard_ids, ids[rows])
        assert np.all(shard_ids % num_servers == k)
        assert np.all(np.diff(rows) > 0)  # stable: the caller's order within a server


def test_one_server_share_is_the_callers_array_itself() -> None:
    ids = np.arange(10, dtype=np.int64)
    [share] = shares(ids, ModuloSharding(1))
    assert share.server == 0 and share.rows == slice(None) and share.ids is ids
    assert caller_rows(share.rows, slice(2, 5)) == slice(2, 5)
    np.testing.assert_array_equal(caller_rows(np.array([9, 4, 7, 1]), slice(1, 3)), [4, 7])


def test_sum_duplicates_equals_a_numpy_scatter_add() -> None:
    rng = np.random.default_rng(2)
    ids = rng.integers(0, 50, 400).astype(np.int64)
    values = rng.normal(size=(400, 3)).astype(np.float32)
    out_ids, out_values = sum_duplicates(ids, values)
    expected = np.zeros((50, 3), np.float32)
    np.add.at(expected, ids, values)
    np.testing.assert_array_equal(out_ids, np.unique(ids))
    np.testing.assert_allclose(out_values, expected[out_ids], rtol=1e-5, atol=1e-5)
    unique = np.array([5, 1, 3], np.int64)
    assert sum_duplicates(unique, values[:3])[0] is unique  # nothing repeated: returned as is


def test_dense_parts_cover_each_block_in_pieces_that_fit_and_keep_one_lane_per_block() -> None:
    spec = aps.DenseTable("fc", shape=(300, 100), init=aps.Normal(0.0, 0.1), optimizer=aps.SGD(lr=0.1))
    ports = PortPlan(2, ports_num=3)
    parts = dense_parts(spec, 2, ports, per=5000)
    covered = np.zeros(spec.size, np.int32)
    for p in parts:
        assert 0 < p.count <= 5000 and p.start == p.block.start + p.offset
        covered[p.start : p.start + p.count] += 1
    assert np.all(covered == 1)
    lanes: dict[int, set[int]] = {}
    for p in parts:
        lanes.setdefault(p.block.index, set()).add(p.lane)
    assert all(len(v) == 1 for v in lanes.values())
    assert len({p.block.index for p in parts}) == 2 and {next(iter(v)) for v in lanes.values()} <= {0, 1, 2}


def test_versions_remember_the_oldest_read_of_each_key() -> None:
    versions = Versions()
    assert versions.based_on(0, "emb") == -1
    versions.read(0, "emb", 7)
    replies = [wire.ArrayReply(values=np.zeros(0, np.float32), version=v) for v in (9, 4, 6)]
    versions.note("fc", [(1, 0), (1, 0), (0, 2)], replies)
    assert (versions.based_on(0, "emb"), versions.based_on(1, "fc", 0), versions.based_on(0, "fc", 2)) == (7, 4, 6)
    assert versions.based_on(1, "fc", 1) == -1


async def test_gather_cancels_the_rest_on_the_first_failure() -> None:
    cancelled = []

    async def slow() -> int:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return 1

    async def fails() -> int:
        await asyncio.sleep(0)
        raise aps.ConnectionLost("gone", CloseReason.PEER_CLOSED)

    assert await gather([asyncio.sleep(0, 3), asyncio.sleep(0, 4)]) == [3, 4]
    with pytest.raises(aps.ConnectionLost, match="gone"):
        await gather([slow(), fails(), slow()])
    assert cancelled == [True, True]


@pytest.mark.parametrize("num_servers", [2, 3, 5])
@pytest.mark.parametrize("hashed", [False, True])
def test_group_is_a_stable_sort_by_owner_in_one_pass(num_servers: int, hashed: bool) -> None:
    """SparseSharding.group (the client's split, one compiled counting pass) gives what a stable
    argsort of the owners gives: each server's ids, each part in the caller's order."""
    rng = np.random.default_rng(num_servers)
    if hashed:
        ids = rng.integers(-(1 << 63), (1 << 63) - 1, 5_000, dtype=np.int64, endpoint=True)
        ids[:4] = [0, -1, -(1 << 63), (1 << 63) - 1]
    else:
        ids = rng.integers(0, 10_000, 5_000, dtype=np.int64)
    sharding: SparseSharding = LogicalSharding(num_servers) if hashed else ModuloSharding(num_servers)
    order, bounds = sharding.group(ids)
    owner = sharding.owners(ids)
    np.testing.assert_array_equal(order, np.argsort(owner, kind="stable"))
    np.testing.assert_array_equal(np.diff(bounds), np.bincount(owner, minlength=num_servers))
    assert bounds[0] == 0 and bounds[-1] == len(ids)
    empty_order, empty_bounds = sharding.group(np.empty(0, np.int64))
    assert empty_order.size == 0 and not empty_bounds.any()
