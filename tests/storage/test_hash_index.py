"""The hash index against a Python dict: random inserts, deletes and lookups, resizes in pieces."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aps.storage.hash import index as index_module
from aps.storage.hash.index import HashIndex

I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1
EDGES = [0, -1, 1, I64_MIN, I64_MAX, I64_MIN + 1, I64_MAX - 1]

keys_st = st.lists(st.one_of(st.sampled_from(EDGES), st.integers(-40, 40), st.integers(I64_MIN, I64_MAX)), max_size=60)
ops_st = st.lists(
    st.tuples(st.sampled_from(["insert", "delete", "lookup", "step", "rehash"]), keys_st, st.integers(0, 300)),
    max_size=40,
)


class DictModel:
    """The reference: a dict key -> row, rows taken from a pool the way any allocator may."""

    def __init__(self) -> None:
        self.rows: dict[int, int] = {}


def check_against(index: HashIndex, model: DictModel, capacity: int) -> None:
    assert len(index) == len(model.rows)
    keys, rows = index.items()
    assert dict(zip(keys.tolist(), rows.tolist())) == model.rows
    held = list(model.rows.values())
    assert len(set(held)) == len(held), "two keys share a row"
    assert all(0 <= r < capacity for r in held)
    assert index.free_rows == capacity - len(held)


def check_gather(index: HashIndex, keys: np.ndarray, want: list[int], capacity: int) -> None:
    """gather copies each held key's slab row and leaves an unknown key's output row alone."""
    values = np.arange(capacity * 3, dtype=np.float32).reshape(capacity, 3)
    out = np.full((len(keys), 3), -7.0, np.float32)
    rows, unknown = index.gather(keys, values, out)
    assert rows.tolist() == want
    assert unknown == sum(r < 0 for r in want)
    expect = np.array([values[r] if r >= 0 else [-7.0] * 3 for r in want], np.float32).reshape(-1, 3)
    assert out.tobytes() == expect.tobytes()


@settings(max_examples=150, deadline=None)
@given(ops_st)
def test_index_behaves_like_a_dict(ops):
    run_against_a_dict(ops)


@settings(max_examples=150, deadline=None)
@given(ops_st)
def test_tiny_slot_arrays_of_any_size_behave_like_a_dict(ops):
    """Slot arrays from 16 slots up, in steps of 16 (not powers of two): long runs that wrap
    around the end, deletes that shift keys back across it, and a resize every few inserts."""
    with mock.patch.object(index_module, "_MIN_SLOTS", 16):
        run_against_a_dict(ops)


def run_against_a_dict(ops):
    capacity = 4000
    index = HashIndex(capacity)
    model = DictModel()
    for op, keys, budget in ops:
        arr = np.array(keys, dtype=np.int64)
        if op == "insert":
            rows = index.insert(arr)
            for k, r in zip(keys, rows.tolist()):
                assert model.rows.setdefault(k, r) == r  # an existing key keeps its row
        elif op == "delete":
            rows = index.delete(arr)
            for k, r in zip(keys, rows.tolist()):
                assert r == model.rows.pop(k, -1)
        elif op == "lookup":
            want = [model.rows.get(k, -1) for k in keys]
            assert index.lookup(arr).tolist() == want
            check_gather(index, arr, want, capacity)
        elif op == "step":
            index.rehash_step(budget)
        else:
            index.rehash(len(index) + budget)
        check_against(index, model, capacity)


def test_growth_and_resize_in_pieces_keep_every_key():
    rng = np.random.default_rng(7)
    keys = np.unique(rng.integers(I64_MIN, I64_MAX, 60_000, dtype=np.int64, endpoint=True))
    keys = np.concatenate([np.array(EDGES, np.int64), keys[~np.isin(keys, EDGES)]])
    index = HashIndex(len(keys))
    rows = np.empty(len(keys), np.int64)
    resizes = 0
    for lo in range(0, len(keys), 1000):  # many growths, each drained by later inserts
        rows[lo : lo + 1000] = index.insert(keys[lo : lo + 1000])
        resizes += index.resizing
        assert (index.lookup(keys[: lo + 1000]) == rows[: lo + 1000]).all()
    assert resizes > 0
    assert sorted(rows.tolist()) == list(range(len(keys)))  # a fresh index hands out rows in order
    # an explicit resize, drained in small pieces with lookups and deletes between them
    index.rehash(4 * len(keys))
    deleted = keys[::3]
    pieces = 0
    while not index.rehash_step(5000):
        pieces += 1
        assert (index.lookup(keys[1::3]) == rows[1::3]).all()
        if pieces == 3:
            assert (index.delete(deleted) == rows[::3]).all()
    assert pieces > 10
    assert not index.resizing
    kept = np.ones(len(keys), bool)
    kept[::3] = False
    assert (index.lookup(keys[kept]) == rows[kept]).all()
    assert (index.lookup(deleted) == -1).all()
    assert len(index) == kept.sum()
    # freed rows are handed out again, and nothing beyond the capacity
    again = index.insert(deleted)
    assert sorted(again.tolist()) == sorted(rows[::3].tolist())
    assert index.free_rows == 0


def test_gather_of_large_batches_during_a_resize_reads_every_row():
    """A pull's fused lookup and copy, over several prefetch blocks, while keys live in both the
    old and the new slot array, with unknown and repeated keys mixed in."""
    rng = np.random.default_rng(3)
    keys = np.unique(rng.integers(I64_MIN, I64_MAX, 20_000, dtype=np.int64, endpoint=True))
    index = HashIndex(len(keys))
    rows = index.insert(keys)
    index.rehash(2 * len(keys))
    index.rehash_step(len(keys))  # part drained: keys in both arrays
    assert index.resizing
    values = rng.standard_normal((len(keys), 64)).astype(np.float32)
    unknown = rng.integers(I64_MIN, I64_MAX, 500, dtype=np.int64, endpoint=True)
    unknown = unknown[~np.isin(unknown, keys)]
    pick = rng.integers(0, len(keys), 3000)
    batch = np.concatenate([keys[pick], unknown])
    order = rng.permutation(len(batch))
    batch = batch[order]
    want = np.concatenate([rows[pick], np.full(len(unknown), -1)])[order]
    out = np.zeros((len(batch), 64), np.float32)
    got, missing = index.gather(batch, values, out)
    assert got.tolist() == want.tolist()
    assert missing == len(unknown)
    assert (out[want >= 0] == values[want[want >= 0]]).all()
    assert not out[want < 0].any()


def test_insert_refuses_more_keys_than_free_rows_and_changes_nothing():
    index = HashIndex(3)
    index.insert(np.array([1, 2], np.int64))
    with pytest.raises(ValueError, match="free rows"):
        index.insert(np.array([3, 4], np.int64))
    assert len(index) == 2
    index.grow_rows(4)
    assert index.insert(np.array([3, 4], np.int64)).tolist() == [2, 3]


def test_tombstones_are_dropped_by_a_rehash():
    index = HashIndex(10_000)
    for round_ in range(5):  # insert and delete many keys: slots fill with tombstones
        keys = np.arange(round_ * 10_000, (round_ + 1) * 10_000, dtype=np.int64)
        index.insert(keys)
        index.delete(keys)
    index.insert(np.array([-5], np.int64))
    index.rehash()
    while not index.rehash_step(1 << 20):
        pass
    assert index.slots == 1024  # sized for one key again
    assert index.lookup(np.array([-5, 0, 49_999], np.int64)).tolist()[1:] == [-1, -1]
    assert len(index) == 1


def test_the_keys_of_one_logical_shard_spread_over_every_part_of_the_slots():
    """A pserver's keys share the top bits of their hash (they name the logical shard), and a
    load inserts a logical shard at a time: probes must start from other bits, or those keys
    crowd one stretch of the slots (a 5M-key load once ran for minutes)."""
    from aps.sharding import LogicalSharding

    rng = np.random.default_rng(11)
    keys = rng.integers(I64_MIN, I64_MAX, 8_000_000, dtype=np.int64, endpoint=True)
    keys = np.unique(keys[LogicalSharding.logical(keys) == 5])
    assert len(keys) > 6_000
    index = HashIndex(len(keys))
    index.insert(keys)
    while not index.rehash_step(1 << 20):
        pass
    held = index._t[:, 2] > 0
    parts = held[: len(held) // 16 * 16].reshape(16, -1).sum(axis=1)
    assert parts.min() > 0.6 * len(keys) / 16, parts  # each sixteenth of the slots holds its share
