"""A hash table's growth maps memory ahead, off the request path: the index's next slot array
is made and mapped before the resize that uses it, and the slab rows the next keys take are
mapped before a push reaches them (aps/storage/pages.py, HashSparseStore.reserve).

Residency is read with ``mincore(2)``: which pages of an array the OS has mapped."""

from __future__ import annotations

import ctypes
import math
import mmap
import sys

import numpy as np
import pytest

import aps
from aps.storage.hash.index import MAX_LOAD, PREPARE_LOAD, HashIndex
from aps.storage.hash.slab import MAP_AHEAD_BYTES, MAP_AHEAD_PUSHES
from aps.storage.hash.store import HashSparseStore
from aps.storage.pages import fault_in_zeros, lazy_zeros

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mincore(2) as Linux has it")

PAGE = mmap.PAGESIZE


def resident_share(arr: np.ndarray) -> float:
    """The share of the whole pages inside ``arr``'s bytes that are resident."""
    base = arr.ctypes.data
    first = -(-base // PAGE) * PAGE
    last = (base + arr.nbytes) // PAGE * PAGE
    pages = (last - first) // PAGE
    assert pages > 0, "the array covers no whole page"
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    vec = np.zeros(pages, np.uint8)
    assert libc.mincore(first, last - first, vec.ctypes.data) == 0, ctypes.get_errno()
    return float((vec & 1).mean())


def test_fault_in_zeros_maps_every_page_and_leaves_zeros() -> None:
    # a mapping of its own, as the slab's arrays are: np.zeros even of 64 MiB came back cleared
    # and resident once in a full suite run (glibc served it from memory freed before)
    arr = lazy_zeros((1 << 22, 2), np.int64)
    assert resident_share(arr) < 0.2
    fault_in_zeros(arr[1000:])
    assert resident_share(arr[1000:]) == 1.0
    assert not arr.any()


def random_keys(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(-(1 << 63), (1 << 63) - 1, n, dtype=np.int64, endpoint=True)


def test_a_resize_starts_on_the_slot_array_made_and_mapped_ahead() -> None:
    index = HashIndex(1 << 21)
    keys = random_keys(1 << 21, seed=1)
    slots = index.slots
    at = math.ceil(PREPARE_LOAD * slots)
    index.insert(keys[:at - 1])
    assert not index.resize_ahead_due(1 << 30)
    index.insert(keys[at - 1 : at])
    assert index.resize_ahead_due(1 << 30)
    assert not index.resize_ahead_due(int(0.7 * slots)), "a key limit below the resize point needs no next array"
    index.prepare_resize()
    spare = index._spare
    assert spare.shape[0] == index._next_slots() > slots and resident_share(spare) == 1.0
    assert not index.resize_ahead_due(1 << 30), "made once"
    n = at
    while not index.resizing:  # pushes small beside the table: the resize is the one made ahead
        index.insert(keys[n : n + 100])
        n += 100
    assert index._t is spare, "the resize drains into the array made ahead"
    assert (index.lookup(keys[:n]) >= 0).all() and len(index) == n


def test_an_owner_of_small_pushes_has_the_next_slot_array_made_only_when_they_could_reach_the_resize() -> None:
    """The array made ahead is held beside the current one until the resize drains it (1.4 times
    its slots), so an owner that says how many keys its pushes bring gets it late for small ones."""
    index = HashIndex(1 << 21, slots=1 << 16)
    keys = random_keys(1 << 20, seed=4)
    resize_at = int(MAX_LOAD * index.slots)
    index.insert(keys[: math.ceil(PREPARE_LOAD * index.slots)])
    assert index.resize_ahead_due(1 << 30) and not index.resize_ahead_due(1 << 30, coming=100)
    index.insert(keys[len(index) : resize_at - 100])
    assert index.resize_ahead_due(1 << 30, coming=100)
    assert index.resize_ahead_due(1 << 30, coming=10 * index.slots), "never later than PREPARE_LOAD"


def test_a_resize_of_another_size_drops_the_array_made_ahead() -> None:
    index = HashIndex(1 << 16)
    keys = random_keys(1 << 14, seed=2)
    index.insert(keys[: int(PREPARE_LOAD * index.slots)])
    index.prepare_resize()
    index.rehash(4 * len(index))  # 4x the keys: not the size made ahead
    assert index._spare.shape[0] == 0 and index._t.shape[0] != 2 * 1024
    while not index.rehash_step(1 << 12):
        pass
    assert (index.lookup(keys[: len(index)]) >= 0).all()


def test_reserve_maps_the_slab_rows_the_next_pushes_take_and_no_more() -> None:
    spec = aps.HashTable("emb", dim=64, optimizer=aps.Adagrad(lr=0.1))
    store = HashSparseStore(spec, rows=2_000_000)  # 1 GB of slab reserved, mapped lazily
    keys = random_keys(100_000, seed=3)
    batch = 20_000
    ones = np.ones((batch, 64), np.float32)
    store.push_grad(keys[:batch], ones)  # a push of 20k new keys: the next two are mapped
    assert store.growth_due
    store.reserve()
    ahead = MAP_AHEAD_PUSHES * batch
    assert ahead * store.row_nbytes <= MAP_AHEAD_BYTES
    used = store.index.rows_used
    assert used == batch
    for arr in (store.values, store.state["acc"], store.stats):
        assert resident_share(arr[used : used + ahead]) == 1.0
        assert resident_share(arr[-1_000_000:]) == 0.0, "the slab stays lazily mapped past the window"
    assert not store.values[used:].any() and not store.stats[used:].view(np.uint8).any()
    assert np.array_equal(store.pull(keys[:5]), store.values[store.index.lookup(keys[:5])])
    store.push_grad(keys[batch : 2 * batch], ones)
    assert store.growth_due, "one push of the two mapped is left: map the next"
    store.reserve()
    used = store.index.rows_used
    assert resident_share(store.values[used : used + ahead]) == 1.0
    assert not store.growth_due


def test_rows_mapped_ahead_follow_the_pushes_size_and_stop_at_the_byte_bound() -> None:
    store = HashSparseStore(aps.HashTable("emb", dim=1024), rows=200_000)  # 4 KiB rows
    store.push_grad(random_keys(30_000, seed=6), np.zeros((30_000, 1024), np.float32))
    store.reserve()
    assert store.slab.mapped - store.index.rows_used == MAP_AHEAD_BYTES // store.row_nbytes, "the byte bound"
    small = HashSparseStore(aps.HashTable("emb", dim=8))
    for i in range(20):
        small.push_grad(random_keys(100, seed=10 + i), np.zeros((100, 8), np.float32))
        if small.growth_due:
            small.reserve()
    assert small.slab.mapped - small.index.rows_used <= 1024, "a table of small pushes maps at most 1024 rows ahead"


def test_a_slab_doubling_maps_the_rows_past_the_copied_ones() -> None:
    store = HashSparseStore(aps.HashTable("emb", dim=16))
    keys = random_keys(3000, seed=5)
    store.push_grad(keys[:800], np.zeros((800, 16), np.float32))  # 800 of 1024 rows: due to double
    assert store.growth_due
    before = store.pull(keys[:800])
    store.reserve()
    assert store.capacity == 2048 and resident_share(store.values[800:]) == 1.0
    assert np.array_equal(store.pull(keys[:800]), before)


def test_a_full_slab_asks_for_no_upkeep() -> None:
    store = HashSparseStore(aps.HashTable("emb", dim=4, max_keys=2000))
    for seed in range(4):
        store.push_grad(random_keys(1500, seed=20 + seed), np.zeros((1500, 4), np.float32))
        if store.growth_due:
            store.reserve()
        if store.eviction_due:
            store.delete_keys(store.evict_plan(store.eviction_due))
    assert store.slab.mapped == store.capacity == 2000 and len(store) <= 2000
    assert not store.growth_due, "nothing left to map or grow: no upkeep after every push"
