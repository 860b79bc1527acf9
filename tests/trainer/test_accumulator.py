"""The gradient accumulator (merge on arrival) and the bounded async sender built on it.

Values are checked exactly against a numpy reference merge (np.add.at adds in arrival order, as
the accumulator does, so float32 sums agree bit for bit); the sender runs against a real pserver
on port 0 with its push held back by taking the trainer's push slot.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import aps
from aps.errors import ApsError
from aps.trainer import Strategy
from aps.trainer.accumulator import GradAccumulator
from aps.trainer.ipc import Kind, Record
from aps.trainer.modes import AsyncSender, Link
from aps.trainer.shared import Attached, SharedArrays
from aps.trainer.runtime import create_tables
from examples.linreg.model import LinReg

EMB = aps.SparseTable("emb", rows=50, dim=4, init=aps.Constant(0.0), optimizer=aps.SGD(lr=1.0))
TAGS = aps.SparseTable("tags", rows=7, dim=2, init=aps.Constant(0.0), optimizer=aps.SGD(lr=1.0))
BIAS = aps.DenseTable("bias", shape=(3,), init=aps.Constant(0.0), optimizer=aps.SGD(lr=1.0))
MAX_IDS = {"emb": 12, "tags": 5}


class TwoTables(LinReg):
    """The linreg test model with other tables: only its table specs are used here."""

    def tables(self) -> list[aps.SparseTable | aps.DenseTable]:
        return [EMB, TAGS, BIAS]

    def max_batch_ids(self, table: str) -> int:
        return MAX_IDS[table]


def random_batch(rng: np.random.Generator) -> tuple[list[np.ndarray], list[np.ndarray], dict[str, np.ndarray]]:
    ids, rows = [], []
    for t in (EMB, TAGS):
        n = int(rng.integers(1, MAX_IDS[t.name] + 1))
        ids.append(rng.integers(0, t.rows, n))  # repeats within a batch on purpose
        rows.append(rng.standard_normal((n, t.dim)).astype(np.float32))
    return ids, rows, {"bias": rng.standard_normal(3).astype(np.float32)}


def reference(batches: list, scale: float = 1.0) -> tuple[list[np.ndarray], np.ndarray]:
    """Dense per-table sums by np.add.at, in arrival order."""
    sums = [np.zeros((t.rows, t.dim), np.float32) for t in (EMB, TAGS)]
    bias = np.zeros(3, np.float32)
    for ids, rows, dense in batches:
        for k in range(2):
            np.add.at(sums[k], ids[k], rows[k])
        bias += dense["bias"]
    if scale != 1.0:
        sums = [s * np.float32(scale) for s in sums]
        bias *= np.float32(scale)
    return sums, bias


def as_dense(acc: GradAccumulator) -> list[np.ndarray]:
    out = []
    for t in (EMB, TAGS):
        ids, rows = acc.sparse()[t.name]
        assert len(np.unique(ids)) == len(ids), "an id occupies one slot"
        full = np.zeros((t.rows, t.dim), np.float32)
        full[ids] = rows
        out.append(full)
    return out


def test_merge_is_exact_against_numpy_reference() -> None:
    rng = np.random.default_rng(7)
    acc = GradAccumulator([EMB, TAGS], [BIAS], MAX_IDS, max_batches=5)
    for round_ in range(3):  # reused after clear(): nothing of a previous round leaks in
        batches = [random_batch(rng) for _ in range(5)]
        for ids, rows, dense in batches:
            acc.add(ids, rows, dense, examples=10)
        sums, bias = reference(batches)
        for got, want in zip(as_dense(acc), sums):
            np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(acc.dense()["bias"], bias)
        assert acc.batches == 5 and acc.examples == 50
        touched = {t: len(np.unique(np.concatenate([b[0][k] for b in batches]))) for k, t in enumerate(("emb", "tags"))}
        assert {t: len(v[0]) for t, v in acc.sparse().items()} == touched
        if round_ == 2:
            acc.scale(0.2)
            sums, bias = reference(batches, scale=0.2)
            for got, want in zip(as_dense(acc), sums):
                np.testing.assert_array_equal(got, want)
            np.testing.assert_array_equal(acc.dense()["bias"], bias)
        acc.clear()
    assert all(len(ids) == 0 for ids, _ in acc.sparse().values())
    np.testing.assert_array_equal(acc.dense()["bias"], np.zeros(3, np.float32))  # no batch: zeros


@pytest.mark.parametrize("rows, draws", [(50, 12), (5_000_000, 3_000)], ids=["comparison-sort", "radix-sort"])
def test_push_hands_out_ids_unique_and_ascending(rows: int, draws: int) -> None:
    """sparse() sorts the distinct ids with their rows (a comparison sort for a few, a 3-pass
    radix sort for 3,000 ids of a 5M-row table); adding after it goes on merging into the moved
    slots, and the values still equal the numpy merge."""
    table = aps.SparseTable("big", rows=rows, dim=3, init=aps.Constant(0.0), optimizer=aps.SGD(lr=1.0))
    rng = np.random.default_rng(11)
    acc = GradAccumulator([table], [], {"big": draws}, max_batches=3)
    want: dict[int, np.ndarray] = {}
    for batch in range(3):
        ids = rng.integers(0, rows, draws)
        ids[: draws // 4] = ids[draws // 4 : 2 * (draws // 4)]  # repeats within the batch
        if batch:
            ids[-5:] = got_ids[:5]  # ids that already have a (moved) slot
        grads = rng.standard_normal((draws, 3)).astype(np.float32)
        acc.add([ids], [grads], {}, 1)
        for i, g in zip(ids.tolist(), grads):
            want[i] = want.get(i, np.zeros(3, np.float32)) + g
        got_ids, got_rows = acc.sparse()["big"]
        assert np.all(np.diff(got_ids) > 0), "unique and ascending"
        assert got_ids.tolist() == sorted(want)
        np.testing.assert_allclose(got_rows, np.array([want[i] for i in got_ids.tolist()]), rtol=1e-5, atol=1e-6)
    acc.clear()
    acc.add([np.array([rows - 1, 0])], [np.ones((2, 3), np.float32)], {}, 1)  # clear() forgot the moved slots
    assert acc.sparse()["big"][0].tolist() == [0, rows - 1]


def test_bounded_by_batches_and_rows() -> None:
    acc = GradAccumulator([EMB, TAGS], [BIAS], MAX_IDS, max_batches=2)
    one = [np.array([1, 2, 3]), np.array([0])]
    rows = [np.ones((3, 4), np.float32), np.ones((1, 2), np.float32)]
    bias = {"bias": np.ones(3, np.float32)}
    acc.add(one, rows, bias, 1)
    acc.add(one, rows, bias, 1)
    assert not acc.fits(one)  # max_batches reached
    with pytest.raises(ApsError, match="does not fit"):
        acc.add(one, rows, bias, 1)
    # rows: "tags" has 7 rows, so 2 batches of 5 ids are sized to 7 slots, not 10
    small = GradAccumulator([EMB, TAGS], [BIAS], MAX_IDS, max_batches=2)
    first = [np.array([0]), np.array([0, 1, 2, 3, 4])]
    small.add(first, [np.ones((1, 4), np.float32), np.ones((5, 2), np.float32)], bias, 1)
    assert small.fits([np.array([0]), np.array([0, 1, 5, 6, 6])])  # 2 new ids: 7 slots
    assert small.sparse()["tags"][0].tolist() == [0, 1, 2, 3, 4]  # fits() left the index alone
    small.add([np.array([0]), np.array([0, 1, 5, 6, 6])], [np.ones((1, 4), np.float32), np.ones((5, 2), np.float32)], bias, 1)
    assert sorted(small.sparse()["tags"][0].tolist()) == list(range(7))
    assert small.sparse()["tags"][1][small.sparse()["tags"][0].tolist().index(6)].tolist() == [2.0, 2.0]


def test_id_outside_table_is_an_error() -> None:
    acc = GradAccumulator([EMB, TAGS], [BIAS], MAX_IDS, max_batches=1)
    with pytest.raises(ApsError, match=r"'tags'.*id 7 not in \[0, 7\)"):
        acc.add([np.array([1]), np.array([3, 7])], [np.ones((1, 4), np.float32), np.ones((2, 2), np.float32)],
                {"bias": np.zeros(3, np.float32)}, 1)


async def test_async_sender_holds_producers_when_full_and_pushes_every_batch() -> None:
    """send_queue_size=2, max_merge_var_num=2: with the push held, the first batch is being
    sent, the next two wait merged in one accumulator, and a fourth producer waits."""
    model = TwoTables()
    server = await aps.serve(port=0, num_trainers=1, exit_when_done=False)
    shared = SharedArrays(model, 4, with_mailboxes=True)
    try:
        async with aps.connect([server.address]) as ps:
            await create_tables(ps, model)
            attached = Attached(shared.layout)
            replies: list[tuple[int, Record]] = []
            strategy = Strategy(mode="async", workers=4, max_merge_var_num=2, send_queue_size=2,
                                min_send_grad_num_before_recv=1, thread_pool_size=1).resolved()
            link = Link(ps, model, strategy, attached, lambda w, r: replies.append((w, r)), 0, 1)
            sender = AsyncSender(link)
            await sender.start()
            await link.push_slots.acquire()  # every push now waits here
            rng = np.random.default_rng(3)
            batches = [random_batch(rng) for _ in range(4)]
            tasks = []
            for w, (ids, rows, dense) in enumerate(batches):
                for t, i, r in zip((EMB, TAGS), ids, rows):
                    attached.all_mailbox_ids[w][t.name][0][: len(i)] = i
                    attached.all_mailbox_sparse[w][t.name][: len(i)] = r
                attached.all_mailbox_dense[w]["bias"][...] = dense["bias"]
                rec = Record(Kind.GRADS, step=0, examples=1, counts=[len(i) for i in ids])
                tasks.append(asyncio.ensure_future(sender.on_grads(w, rec)))
                await asyncio.sleep(0.05)
            assert [t.done() for t in tasks] == [True, True, True, False]
            assert sender.queue_depth == 2 and sender.queue_capacity == 2
            assert sorted(w for w, _ in replies) == [0, 1, 2]
            link.push_slots.release()
            await asyncio.wait_for(tasks[3], 10)
            await sender.flush()
            assert sender.queue_depth == 0
            assert (link.sends, link.pushed_batches) == (3, 4)  # 1 + 2 merged + 1
            assert all(r.kind == Kind.OK and r.answers == Kind.GRADS for _, r in replies)
            await sender.stop()
            sums, bias = reference(batches)
            for t, want in zip((EMB, TAGS), sums):
                got = await ps.pull_sparse(t.name, np.arange(t.rows))
                np.testing.assert_allclose(got, -want, rtol=1e-6, atol=1e-6)  # SGD lr 1 from zeros
            np.testing.assert_allclose(await ps.pull_dense("bias"), -bias, rtol=1e-6, atol=1e-6)
    finally:
        shared.close()
        await server.aclose()
