"""GEO change tracking bounded over the whole server (aps/storage/tracking.py): one bit per row,
one byte budget for every client and table with gone clients' tracking dropped first, and the
rule that makes dropping safe: a client whose tracking was dropped gets every row at its next
read, so it never misses a changed row. Real TCP on port 0 for the server-level tests."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

import aps
from aps import wire
from aps.client.link import Link
from aps.errors import ConfigError
from aps.storage.tracking import ENTRY_OVERHEAD, DroppedFilter, TrackingBudget, bitmap_bytes, mark_rows, take_marked
from tests.conftest import eventually

pytestmark = pytest.mark.timeout(90)

ROWS = 800  # a 100-byte bitmap per tracked client
ENTRY = bitmap_bytes(ROWS) + ENTRY_OVERHEAD
TABLE = aps.SparseTable("g", rows=ROWS, dim=2, init=aps.Constant(0.0), optimizer=aps.SGD(lr=1.0))


# ---------------------------------------------------------------- packed bitmaps


@pytest.mark.parametrize("rows", [1, 7, 8, 9, 1000, 100_003])
def test_packed_bitmap_marks_and_takes_exactly_the_rows_set(rows: int) -> None:
    rng = np.random.default_rng(rows)
    bits = np.zeros(bitmap_bytes(rows), np.uint8)
    want = np.zeros(rows, bool)
    for _ in range(3):
        ids = rng.integers(0, rows, size=int(rng.integers(0, 2 * rows + 1)))
        mark_rows(bits, ids)
        want[ids] = True
    assert bits.nbytes == (rows + 7) // 8
    np.testing.assert_array_equal(np.unpackbits(bits, bitorder="little")[:rows].astype(bool), want)
    got = take_marked(bits)
    assert got.dtype == np.int64 and got.tolist() == np.flatnonzero(want).tolist()
    assert not bits.any() and take_marked(bits).tolist() == []


# ---------------------------------------------------------------- the budget's ledger


def test_budget_drops_gone_clients_first_then_the_least_recently_read() -> None:
    budget = TrackingBudget(4 * ENTRY)
    for client in (1, 2, 3, 4):
        assert budget.read(client, "t", 100) == []
    assert budget.bytes == 4 * ENTRY and len(budget) == 4 and budget.charged(2, "t") == ENTRY
    budget.gone(3)
    budget.gone(1)
    assert budget.read(5, "t", 100) == [(3, "t")]  # gone longest first, though 1 is older by reads
    budget.dropped(3, "t", over_budget=True)
    assert budget.read(6, "t", 100) == [(1, "t")]
    budget.dropped(1, "t", over_budget=True)
    budget.gone(2)
    budget.back(2)  # it came back: connected again
    assert budget.read(2, "t", 100) == []  # read again: 4 is now the least recently read
    assert budget.read(7, "t", 100) == [(4, "t")]  # no gone client left; never the reader itself
    budget.dropped(4, "t", over_budget=True)
    assert budget.bytes == 4 * ENTRY and budget.dropped_over_budget == 3
    assert all(budget.was_dropped(c, "t") for c in (1, 3, 4)) and not budget.was_dropped(2, "t")
    # a reader's other tables are fair game; a gone client's every table goes before the rest
    assert budget.read(6, "u", 100) == [(5, "t")]  # the least recently read
    budget.dropped(5, "t", over_budget=True)
    budget.gone(6)
    assert budget.read(8, "t", 100) == [(6, "t")]
    budget.dropped(6, "t", over_budget=True)
    assert budget.read(9, "t", 100) == [(6, "u")]
    budget.dropped(6, "u", over_budget=True)
    assert budget.tables_of(6) == [] and budget.bytes == 4 * ENTRY  # 2, 7, 8, 9
    # a reader bigger than the budget alone is kept
    assert budget.read(10, "big", 10 * ENTRY) == [(2, "t"), (7, "t"), (8, "t"), (9, "t")]
    for client in (2, 7, 8, 9):
        budget.dropped(client, "t", over_budget=True)
    assert budget.bytes == 10 * ENTRY + ENTRY_OVERHEAD and budget.tables_of(10) == ["big"]
    with pytest.raises(ValueError):
        TrackingBudget(-1)
    assert TrackingBudget(0).read(1, "t", 1 << 40) == []  # 0: no budget


def test_dropped_filter_never_forgets_a_drop_and_rarely_invents_one() -> None:
    dropped = DroppedFilter()
    rng = np.random.default_rng(3)
    pairs = [(int(c), f"table{int(c) % 7}") for c in rng.integers(0, 1 << 62, size=20_000)]
    for client, table in pairs:
        dropped.add(client, table)
    assert all(pair in dropped for pair in pairs) and dropped.added == 20_000
    assert dropped.nbytes == 256 * 1024
    fresh = [(int(c), "table0") for c in rng.integers(0, 1 << 62, size=20_000)]
    assert sum(pair in dropped for pair in fresh) < 10  # about 1e-6 each at this fill
    with pytest.raises(ValueError):
        DroppedFilter(bits=1000)


# ---------------------------------------------------------------- a live server


@contextlib.asynccontextmanager
async def geo_server(**options: object) -> AsyncIterator[tuple[aps.PServer, aps.PSClient]]:
    srv = await aps.serve(port=0, **options)
    try:
        async with aps.connect([srv.address], timeout=10) as ps:
            await ps.create_table(TABLE)
            yield srv, ps
    finally:
        await srv.aclose()


async def read_changes(link: Link, request_id: int, max_rows: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Every changed row (following ``more``): ids and values."""
    ids, values = [], []
    while True:
        reply = await link.request(wire.PullSparseChanged(table="g", max_rows=max_rows), request_id)
        request_id += 1
        assert isinstance(reply, wire.ChangedReply)
        ids.append(reply.ids)
        values.append(reply.values)
        if not reply.more:
            return np.concatenate(ids), np.concatenate(values)


async def test_over_the_budget_a_gone_client_is_dropped_first_and_gets_every_row_back() -> None:
    async with geo_server(max_tracking_bytes=3 * ENTRY) as (srv, ps):
        links = {c: await Link.open(srv.address, c, -1, None, wire.DEFAULT_MAX_FRAME, 1) for c in (1, 2, 3)}
        for link in links.values():
            assert len((await read_changes(link, 10))[0]) == 0  # registers
        links[1].close()
        await eventually(lambda: 1 not in srv.core._clients)
        link4 = await Link.open(srv.address, 4, -1, None, wire.DEFAULT_MAX_FRAME, 1)
        assert len((await read_changes(link4, 10))[0]) == 0
        shard = srv.core.tables["g"]
        # over the budget: the gone client's tracking went, not a connected one's
        assert sorted(shard._dirty) == [2, 3, 4] and srv.core.changes.tracking.bytes == 3 * ENTRY
        await ps.push_sparse_delta("g", [3, 4], np.ones((2, 2), np.float32))
        everything = await ps.pull_sparse("g", np.arange(ROWS))
        ids, values = await read_changes(links[2], 20)
        assert ids.tolist() == [3, 4]
        back = await Link.open(srv.address, 1, -1, None, wire.DEFAULT_MAX_FRAME, 1)
        ids, values = await read_changes(back, 20, max_rows=300)  # in three replies
        np.testing.assert_array_equal(ids, np.arange(ROWS))  # dropped: every row, never a miss
        np.testing.assert_array_equal(values, everything)
        assert len((await read_changes(back, 30))[0]) == 0  # tracked again from here
        assert srv.core.changes.tracking.bytes <= 3 * ENTRY and len(srv.core.changes.tracking) == 3
        for link in (links[2], links[3], link4, back):
            link.close()


async def test_a_load_makes_every_tracking_client_read_every_row(tmp_path: Path) -> None:
    """LOAD replaces the tables under the geo clients: any row may differ from their replicas."""
    async with geo_server(checkpoint_root=str(tmp_path)) as (srv, ps):
        geo = await Link.open(srv.address, 7, -1, None, wire.DEFAULT_MAX_FRAME, 1)
        assert len((await read_changes(geo, 10))[0]) == 0
        await ps.push_sparse_delta("g", [5], np.full((1, 2), 2.0, np.float32))
        await ps.save("ckpt")
        assert (await read_changes(geo, 20))[0].tolist() == [5]
        await ps.push_sparse_delta("g", [6], np.ones((1, 2), np.float32))
        await ps.load("ckpt")  # row 6 goes back to 0: a change no push announced
        ids, values = await read_changes(geo, 30)
        np.testing.assert_array_equal(ids, np.arange(ROWS))
        np.testing.assert_array_equal(values, await ps.pull_sparse("g", np.arange(ROWS)))
        assert values[6].tolist() == [0.0, 0.0] and values[5].tolist() == [2.0, 2.0]
        assert len((await read_changes(geo, 40))[0]) == 0 and srv.core.changes.tracking.bytes == ENTRY
        geo.close()


async def test_clients_never_miss_a_change_under_a_tight_budget() -> None:
    """Random pushes, reads, disconnects and returns of 6 GEO clients with room for the tracking
    of 3: after each read a client's replica equals the server's table on every row."""
    rng = np.random.default_rng(11)
    async with geo_server(max_tracking_bytes=3 * ENTRY, client_linger=0.05) as (srv, ps):
        links: dict[int, Link | None] = {}
        for client in range(6):  # a new client is tracked from its first read, then pulls the table
            links[client] = await Link.open(srv.address, client, -1, None, wire.DEFAULT_MAX_FRAME, 1)
            assert len((await read_changes(links[client], 10))[0]) == 0
        table = await ps.pull_sparse("g", np.arange(ROWS))
        replicas = {c: table.copy() for c in range(6)}
        request_id = 100
        full_reads = 0
        for _step in range(120):
            ids = rng.integers(0, ROWS, size=int(rng.integers(1, 20)))
            await ps.push_sparse_delta("g", ids, rng.normal(size=(len(ids), 2)).astype(np.float32))
            client = int(rng.integers(0, 6))
            if links[client] is not None and rng.random() < 0.2:
                links[client].close()
                links[client] = None
                continue
            if links[client] is None:
                links[client] = await Link.open(srv.address, client, -1, None, wire.DEFAULT_MAX_FRAME, 1)
            changed, values = await read_changes(links[client], request_id, max_rows=int(rng.choice([0, 50])))
            request_id += 1000
            full_reads += int(len(changed) == ROWS)
            replicas[client][changed] = values
            np.testing.assert_array_equal(replicas[client], await ps.pull_sparse("g", np.arange(ROWS)))
            assert srv.core.changes.tracking.bytes <= 3 * ENTRY
        assert srv.core.changes.tracking.dropped_over_budget > 0 and full_reads > 0  # the budget did bite
        for link in links.values():
            if link is not None:
                link.close()


def test_a_negative_tracking_budget_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="max_tracking_bytes"):
        aps.PServer(aps.ServerConfig(max_tracking_bytes=-1))
