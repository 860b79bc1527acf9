"""Sorted pushes: a push whose ids are unique and ascending (what a trainer's accumulator hands
out) is applied without a sort; the SORTED flag promises that order and a push that breaks the
promise is refused before anything changes.

Values are checked against the same push sent unsorted (the optimizer kernels' sort path), over
real TCP to servers on port 0, and the kernels' ``ordered`` path against the sorting one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import numpy as np
import pytest

import aps
from aps import wire
from aps.client.link import Link
from aps.errors import ErrorCode
from aps.storage import optim
from aps.storage.hash.store import HashSparseStore
from aps.wire.frame import Flag

pytestmark = pytest.mark.timeout(60)

OPTIMIZERS = [aps.SGD(lr=0.5), aps.Adagrad(lr=0.3), aps.Adam(lr=0.1)]
FINAL, SORTED = int(Flag.FINAL), int(Flag.SORTED)


@pytest.fixture
async def pair() -> AsyncIterator[list[list[aps.PServer]]]:
    """Two clusters of two servers each: one receives pushes in order, one shuffled."""
    clusters = [[await aps.serve(port=0, server_index=k, num_servers=2) for k in range(2)] for _ in range(2)]
    yield clusters
    for cluster in clusters:
        for srv in cluster:
            await srv.aclose()


async def links(cluster: list[aps.PServer]) -> list[Link]:
    return [await Link.open(s.address, 9, -1, None, wire.DEFAULT_MAX_FRAME, 1) for s in cluster]


async def rows_of(cluster: list[aps.PServer], table: str, ids: np.ndarray) -> np.ndarray:
    async with aps.connect([s.address for s in cluster], timeout=5) as ps:
        return await ps.pull_sparse(table, ids)


@pytest.mark.parametrize("opt", OPTIMIZERS, ids=lambda o: type(o).__name__)
async def test_sorted_push_equals_the_sorting_path(pair: list[list[aps.PServer]], opt: aps.Optimizer) -> None:
    """The same gradients, flagged SORTED in ascending order to one cluster and shuffled
    (unflagged) to the other, leave the same rows on both, push after push."""
    table = aps.SparseTable("emb", rows=1000, dim=5, init=aps.Uniform(-1, 1), optimizer=opt)
    for cluster in pair:
        async with aps.connect([s.address for s in cluster], timeout=5) as ps:
            await ps.create_table(table)
    start = await rows_of(pair[0], "emb", np.arange(1000))
    ordered, shuffled = await links(pair[0]), await links(pair[1])
    rng = np.random.default_rng(3)
    touched = np.zeros(0, np.int64)
    try:
        for step in range(4):
            ids = np.unique(rng.integers(0, 1000, 300))
            grads = rng.standard_normal((len(ids), 5)).astype(np.float32)
            perm = rng.permutation(len(ids))
            for k in range(2):  # each server gets its own ids (global), ascending or shuffled
                mine = ids % 2 == k
                await ordered[k].request(wire.PushSparseGrad(table="emb", ids=ids[mine], values=grads[mine]), 10 + step, FINAL | SORTED)
                p = perm[mine[perm]]
                await shuffled[k].request(wire.PushSparseGrad(table="emb", ids=ids[p], values=grads[p]), 10 + step, FINAL)
            touched = np.union1d(touched, ids)
    finally:
        for link in ordered + shuffled:
            link.close()
    a, b = await rows_of(pair[0], "emb", touched), await rows_of(pair[1], "emb", touched)
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    untouched = np.setdiff1d(np.arange(1000), touched)[:50]
    np.testing.assert_array_equal(await rows_of(pair[0], "emb", untouched), await rows_of(pair[1], "emb", untouched))
    assert np.all(np.any(a != start[touched], axis=1)), "every pushed row changed"


@pytest.mark.parametrize(
    "ids",
    [np.array([0, 4, 2]), np.array([0, 2, 2, 4]), np.array([4, 2, 0])],
    ids=["unsorted", "repeated", "descending"],
)
async def test_a_push_that_breaks_the_sorted_promise_is_refused_and_changes_nothing(ids: np.ndarray) -> None:
    srv = await aps.serve(port=0)
    try:
        table = aps.SparseTable("emb", rows=10, dim=2, init=aps.Uniform(-1, 1), optimizer=aps.Adagrad(lr=1.0))
        async with aps.connect([srv.address], timeout=5) as ps:
            await ps.create_table(table)
            before = await ps.pull_sparse("emb", np.arange(10))
        (link,) = await links([srv])
        try:
            for rid, msg in enumerate(
                [
                    wire.PushSparseGrad(table="emb", ids=ids, values=np.ones((len(ids), 2), np.float32)),
                    wire.PushSparseDelta(table="emb", ids=ids, values=np.ones((len(ids), 2), np.float32)),
                ],
                start=20,
            ):
                with pytest.raises(aps.ServerError) as info:
                    await link.request(msg, rid, FINAL | SORTED)
                assert info.value.code == ErrorCode.BAD_REQUEST and "SORTED" in info.value.message
            # the same ids without the flag are served (sorted by the kernel)
            await link.request(wire.PushSparseDelta(table="emb", ids=ids, values=np.ones((len(ids), 2), np.float32)), 30)
        finally:
            link.close()
        async with aps.connect([srv.address], timeout=5) as ps:
            after = await ps.pull_sparse("emb", np.arange(10))
        want = before.copy()
        np.add.at(want, ids, np.ones((len(ids), 2), np.float32))  # only the unflagged delta landed
        np.testing.assert_allclose(after, want, rtol=1e-6)
        assert srv.core.versions.version("emb") == 0  # no refused gradient push counted as applied
    finally:
        await srv.aclose()


async def test_sorted_flag_still_refuses_ids_out_of_range_or_not_owned(pair: list[list[aps.PServer]]) -> None:
    cluster = pair[0]
    table = aps.SparseTable("emb", rows=10, dim=2, optimizer=aps.SGD(lr=1.0))
    async with aps.connect([s.address for s in cluster], timeout=5) as ps:
        await ps.create_table(table)
    (first, second) = await links(cluster)
    try:
        cases = [(first, np.array([0, 2, 10]), ErrorCode.ID_OUT_OF_RANGE), (second, np.array([1, 2]), ErrorCode.BAD_REQUEST)]
        for rid, (link, ids, code) in enumerate(cases, start=40):
            with pytest.raises(aps.ServerError) as info:
                await link.request(wire.PushSparseGrad(table="emb", ids=ids, values=np.ones((len(ids), 2), np.float32)), rid, SORTED)
            assert info.value.code == code
    finally:
        first.close()
        second.close()


@pytest.mark.parametrize("opt", OPTIMIZERS, ids=lambda o: type(o).__name__)
def test_ordered_kernels_equal_the_sorting_kernels(opt: aps.Optimizer) -> None:
    """apply_sparse / add_rows with ordered=True on ascending ids (repeats included: each run is
    summed once) give what the sorting path gives on the same rows shuffled."""
    rng = np.random.default_rng(5)
    ids = np.sort(rng.integers(0, 40, 120))
    grads = rng.standard_normal((len(ids), 3)).astype(np.float32)
    perm = rng.permutation(len(ids))
    start = rng.standard_normal((40, 3)).astype(np.float32)
    results = []
    for order, ordered in ((np.arange(len(ids)), True), (perm, False)):
        values = start.copy()
        state = optim.new_sparse_state(opt, 40, 3)
        for step in range(3):
            optim.apply_sparse(opt, values, state, ids[order], grads[order], 0.5, step, ordered)
        optim.add_rows(values, ids[order], grads[order], ordered)
        results.append(values)
    np.testing.assert_allclose(results[0], results[1], rtol=1e-6, atol=1e-6)
    assert not np.allclose(results[0], start)


@pytest.mark.parametrize("opt", OPTIMIZERS, ids=lambda o: type(o).__name__)
def test_ordered_kernels_take_distinct_ids_in_any_order(opt: aps.Optimizer) -> None:
    """``ordered`` promises only that equal ids are adjacent: distinct ids in push order (a hash
    table's rows of unique keys) give what the sorting path gives."""
    rng = np.random.default_rng(6)
    ids = rng.permutation(300)[:200].astype(np.int64)
    grads = rng.standard_normal((200, 4)).astype(np.float32)
    start = rng.standard_normal((300, 4)).astype(np.float32)
    results = []
    for ordered in (True, False):
        values = start.copy()
        state = optim.new_sparse_state(opt, 300, 4)
        for step in range(3):
            optim.apply_sparse(opt, values, state, ids, grads, 0.5, step, ordered)
        results.append(values)
    np.testing.assert_array_equal(results[0], results[1])


@pytest.mark.parametrize("opt", OPTIMIZERS, ids=lambda o: type(o).__name__)
def test_a_hash_push_of_distinct_keys_skips_the_sort_and_equals_a_plain_one(opt: aps.Optimizer) -> None:
    """HashSparseStore.push_grad / push_delta with ``distinct`` (keys the server saw flagged
    SORTED) leave the rows and statistics a plain push leaves."""
    spec = aps.HashTable("emb", dim=4, optimizer=opt, seed=1)
    stores = [HashSparseStore(spec), HashSparseStore(spec)]
    rng = np.random.default_rng(7)
    universe = np.unique(rng.integers(-(1 << 62), 1 << 62, 500))
    for _ in range(4):
        keys = np.sort(rng.choice(universe, 200, replace=False))
        grads = rng.standard_normal((200, 4)).astype(np.float32)
        for store, distinct in zip(stores, (True, False)):
            store.push_grad(keys, grads, distinct=distinct)
            store.push_delta(keys[:50], grads[:50], distinct=distinct)
    np.testing.assert_array_equal(stores[0].pull(universe), stores[1].pull(universe))
    for name in ("show", "click", "delta_score", "last_step"):
        np.testing.assert_array_equal(getattr(stores[0], name), getattr(stores[1], name))


def test_scan_ids_validates_orders_and_maps_in_one_pass() -> None:
    local = np.empty(4, np.int64)
    assert optim.scan_ids(np.array([1, 3, 5, 9]), 10, 2, 1, local) == (-1, 2)
    assert local.tolist() == [0, 1, 2, 4]
    assert optim.scan_ids(np.array([1, 1, 3]), 10, 1, 0, local) == (-1, 1)
    assert optim.scan_ids(np.array([3, 1, 1]), 10, 1, 0, local) == (-1, 0)
    assert optim.scan_ids(np.array([1, 3, 4]), 10, 2, 1, local) == (2, 0)  # 4 is server 0's
    assert optim.scan_ids(np.array([1, 10]), 10, 1, 0, local) == (1, 0)
    assert optim.scan_ids(np.zeros(0, np.int64), 10, 1, 0, local) == (-1, 2)


@pytest.mark.parametrize("opt", OPTIMIZERS[:2], ids=lambda o: type(o).__name__)
async def test_client_sorted_unique_pushes_equal_plain_ones(pair: list[list[aps.PServer]], opt: aps.Optimizer) -> None:
    """PSClient.push_sparse_grad / push_sparse_delta with sorted_unique=True (what the trainer
    modes send) leave the rows a plain push of the same ids in another order leaves; a broken
    promise is refused and changes nothing."""
    table = aps.SparseTable("emb", rows=1000, dim=5, init=aps.Uniform(-1, 1), optimizer=opt, seed=2)
    clients = [aps.connect([s.address for s in cluster], timeout=5, max_frame=4096) for cluster in pair]
    flagged, plain = [await c.open() for c in clients]
    try:
        for ps in (flagged, plain):
            await ps.create_table(table)
        rng = np.random.default_rng(8)
        for step in range(6):
            ids = np.sort(rng.choice(1000, 300, replace=False)).astype(np.int64)  # over several 4 KiB frames
            grads = rng.standard_normal((300, 5)).astype(np.float32)
            await flagged.push_sparse_grad("emb", ids, grads, sorted_unique=True)
            order = rng.permutation(300)
            await plain.push_sparse_grad("emb", ids[order], grads[order])
            await flagged.push_sparse_delta("emb", ids[:50], grads[:50], sorted_unique=True)
            await plain.push_sparse_delta("emb", ids[:50][::-1], grads[:50][::-1])
        everything = np.arange(1000)
        np.testing.assert_allclose(await flagged.pull_sparse("emb", everything), await plain.pull_sparse("emb", everything), rtol=1e-6)
        before = await flagged.pull_sparse("emb", everything)
        with pytest.raises(aps.ServerError) as refused:
            await flagged.push_sparse_grad("emb", np.array([5, 3]), np.ones((2, 5), np.float32), sorted_unique=True)
        assert refused.value.code == ErrorCode.BAD_REQUEST
        np.testing.assert_array_equal(await flagged.pull_sparse("emb", everything), before)
    finally:
        for ps in clients:
            await ps.aclose()
