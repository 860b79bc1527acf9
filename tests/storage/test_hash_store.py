"""The hash-keyed sparse store: admission, statistics, eviction, and the fixed tables' optimizer."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from aps.errors import ErrorCode, ServerError
from aps.specs import SGD, Adagrad, Adam, ExponentialDecay, HashTable, Normal, SparseTable, Uniform
from aps.storage.hash.accessor import show_click_score
from aps.storage.hash.index import index_nbytes
from aps.storage.hash.store import HashSparseStore
from aps.storage.init_kernels import init_sparse_rows, table_seed
from aps.storage.tables import SparseShard

I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1


def grads(rng, n, dim):
    return rng.standard_normal((n, dim)).astype(np.float32)


def test_pull_of_unknown_keys_reads_the_initial_row_and_inserts_nothing():
    spec = HashTable("emb", dim=5, init=Normal(0.0, 0.1), seed=3)
    store = HashSparseStore(spec)
    keys = np.array([7, -7, 0, I64_MIN, I64_MAX, 7], np.int64)
    first = store.pull(keys)
    assert len(store) == 0 and store.index.rows_used == 0
    expected = init_sparse_rows(spec.init, table_seed("emb", 3), keys, 5)
    np.testing.assert_array_equal(first, expected)
    np.testing.assert_array_equal(first[0], first[5])
    store.push_grad(keys[:1], np.zeros((1, 5), np.float32))  # admit key 7 only
    assert len(store) == 1
    np.testing.assert_array_equal(store.pull(keys), first)  # zero grad: 7 still reads its initial row
    assert len(store) == 1
    # a key admitted after an eviction starts from its initial row again, whatever it learned
    store.push_grad(keys[:1], np.ones((1, 5), np.float32))
    assert not np.array_equal(store.pull(keys[:1]), first[:1])
    assert store.shrink(threshold=1e9) == 1 and len(store) == 0
    store.push_grad(keys[:1], np.zeros((1, 5), np.float32))
    np.testing.assert_array_equal(store.pull(keys[:1]), first[:1])


@pytest.mark.parametrize(
    "opt",
    [
        SGD(lr=0.1, decay=ExponentialDecay(2, 0.5)),
        Adagrad(lr=0.05, initial_accumulator=0.1),
        Adam(lr=0.01),
    ],
    ids=["sgd", "adagrad", "adam"],
)
def test_the_optimizer_over_the_store_equals_the_fixed_tables(opt):
    """Keys equal to the fixed table's row ids start from the same rows, and the same pushes
    (repeats, unsorted, chunks sharing a step) leave values and state bit for bit equal."""
    rows, dim = 300, 6
    fixed = SparseShard(SparseTable("t", rows=rows, dim=dim, optimizer=opt, init=Uniform(-0.5, 0.5)), 0, 1)
    store = HashSparseStore(HashTable("t", dim=dim, optimizer=opt, init=Uniform(-0.5, 0.5)), rows=64)
    rng = np.random.default_rng(11)
    for step in range(12):
        ids = rng.integers(0, rows, 400).astype(np.int64)
        g = grads(rng, 400, dim)
        advance = step % 3 != 1
        fixed.push_grad(ids, g, scale=0.5, advance_step=advance)
        store.push_grad(ids, g, scale=0.5, advance_step=advance)
    held = np.sort(store.index.items()[0])
    assert len(held) > 64  # the slab grew on the way
    got = store.rows_of(held)
    np.testing.assert_array_equal(got["values"], fixed.values[held])
    for name, arr in fixed.state.items():
        np.testing.assert_array_equal(got[name], arr[held])
    np.testing.assert_array_equal(store.pull(held), fixed.values[held])
    assert store.step == fixed.step


@pytest.mark.parametrize("opt", [SGD(lr=0.1), Adagrad(lr=0.1), Adam(lr=0.01)], ids=["sgd", "adagrad", "adam"])
def test_a_push_of_new_distinct_keys_equals_the_fixed_table(opt):
    """A push whose every key is new and admitted (a fill) walks its rows unsorted, and a later
    push of new keys with repeats sums them: both leave rows equal to the fixed table's."""
    rows, dim = 300, 4
    fixed = SparseShard(SparseTable("t", rows=rows, dim=dim, optimizer=opt, init=Uniform(-0.5, 0.5)), 0, 1)
    store = HashSparseStore(HashTable("t", dim=dim, optimizer=opt, init=Uniform(-0.5, 0.5)))
    rng = np.random.default_rng(12)
    fill = rng.permutation(200).astype(np.int64)  # distinct, in no order
    mixed = np.concatenate([fill[:50], np.arange(200, 300), np.arange(250, 300)]).astype(np.int64)  # held, new, new again
    for ids in (fill, mixed):
        g = grads(rng, len(ids), dim)
        fixed.push_grad(ids, g)
        store.push_grad(ids, g)
    held = np.arange(rows, dtype=np.int64)
    np.testing.assert_array_equal(store.pull(held), fixed.values[held])
    got = store.rows_of(held)
    for name, arr in fixed.state.items():
        np.testing.assert_array_equal(got[name], arr[held])


def test_admission_probability_within_statistical_bounds():
    p = 0.2
    store = HashSparseStore(HashTable("emb", dim=2, admit_probability=p))
    n = 20_000
    keys = np.arange(n, dtype=np.int64) * 7919 - 10**12
    g = np.ones((n, 2), np.float32)
    admitted = store.push_grad(keys, g)
    sd = np.sqrt(n * p * (1 - p))
    assert abs(admitted - n * p) < 5 * sd, admitted
    assert store.rejected == n - admitted and store.admitted == admitted == len(store)
    held = store.index.lookup(keys) >= 0
    # the gradient reached the admitted keys only (SGD lr 0.01, grad 1)
    init = init_sparse_rows(store.spec.init, table_seed("emb", 0), keys, 2)
    np.testing.assert_allclose(store.pull(keys[held]), init[held] - 0.01, atol=1e-7)
    np.testing.assert_array_equal(store.pull(keys[~held]), init[~held])
    # three occurrences in one push: admitted with probability 1 - (1 - p)^3
    fresh = np.repeat(np.arange(n, dtype=np.int64) + (1 << 40), 3)
    rate3 = 1 - (1 - p) ** 3
    got = store.push_grad(fresh, np.ones((3 * n, 2), np.float32))
    assert abs(got - n * rate3) < 5 * np.sqrt(n * rate3 * (1 - rate3)), got
    # one occurrence in each of three pushes: the same rate overall (a new draw per push)
    store3 = HashSparseStore(HashTable("emb", dim=2, admit_probability=p))
    total = sum(store3.push_grad(keys, g) for _ in range(3))
    assert abs(total - n * rate3) < 5 * np.sqrt(n * rate3 * (1 - rate3)), total
    # stateless and deterministic: the same pushes admit the same keys
    again = HashSparseStore(HashTable("emb", dim=2, admit_probability=p))
    again.push_grad(keys, g)
    assert sorted(again.index.items()[0].tolist()) == sorted(keys[held].tolist())


def test_admission_by_count_admits_at_the_nth_occurrence():
    store = HashSparseStore(HashTable("emb", dim=1, admit_count=3, optimizer=SGD(lr=1.0), init=Uniform(0, 0)))
    one = np.ones((1, 1), np.float32)
    a, b = np.array([-1], np.int64), np.array([1 << 62], np.int64)
    assert store.push_grad(a, one) == 0 and store.push_grad(a, one) == 0
    assert len(store) == 0
    assert store.push_grad(a, one) == 1  # third occurrence
    np.testing.assert_array_equal(store.pull(a), [[-1.0]])  # only the admitting push's gradient
    assert store.push_grad(np.repeat(b, 3), np.ones((3, 1), np.float32)) == 1  # three at once
    np.testing.assert_array_equal(store.pull(b), [[-3.0]])
    assert store.rejected == 2 and store.admitted == 2
    # the counter is bounded: pending_keys full starts it over
    small = HashSparseStore(HashTable("emb", dim=1, admit_count=2, pending_keys=4))
    small.push_grad(np.arange(4, dtype=np.int64), np.ones((4, 1), np.float32))
    small.push_grad(np.arange(10, 13, dtype=np.int64), np.ones((3, 1), np.float32))  # 3 new > 0 free
    assert small.pending_resets == 1
    assert small.push_grad(np.array([10], np.int64), np.ones((1, 1), np.float32)) == 1  # counted since
    assert small.push_grad(np.arange(4, dtype=np.int64), np.ones((4, 1), np.float32)) == 0  # forgotten


def test_shrink_deletes_exactly_what_the_rule_says():
    store = HashSparseStore(HashTable("emb", dim=2))
    rng = np.random.default_rng(5)
    keys = rng.integers(I64_MIN, I64_MAX, 3000, dtype=np.int64, endpoint=True)
    keys = np.unique(keys)
    for step in range(10):  # keys pushed at different steps with various shows and clicks
        part = keys[rng.random(len(keys)) < 0.3]
        shows = rng.integers(0, 12, len(part)).astype(np.float32)
        clicks = np.minimum(shows, rng.integers(0, 3, len(part))).astype(np.float32)
        store.push_grad(part, np.zeros((len(part), 2), np.float32), shows=shows, clicks=clicks)
    held = np.sort(store.index.items()[0])
    before = store.rows_of(held)
    decay, threshold, ttl = 0.9, 1.2, 6
    show = (before["show"] * np.float64(decay)).astype(np.float32)
    click = (before["click"] * np.float64(decay)).astype(np.float32)
    dead = (0.1 * (show.astype(np.float64) - click) + click < threshold) | (store.step - before["last_step"] > ttl)
    assert 0 < dead.sum() < len(held)
    assert store.shrink(decay=decay, threshold=threshold, ttl=ttl) == dead.sum()
    assert sorted(store.index.items()[0].tolist()) == held[~dead].tolist()
    after = store.rows_of(held[~dead])
    np.testing.assert_array_equal(after["show"], show[~dead])
    np.testing.assert_array_equal(after["click"], click[~dead])
    np.testing.assert_array_equal(after["values"], before["values"][~dead])
    assert store.evicted == dead.sum()


def test_max_keys_evicts_the_lowest_scores_first():
    cap = 160
    store = HashSparseStore(HashTable("emb", dim=2, max_keys=cap))
    keys = np.arange(cap, dtype=np.int64) * -3
    shows = np.arange(cap, dtype=np.float32)  # key i has score 0.1 i
    store.push_grad(keys, np.zeros((cap, 2), np.float32), shows=shows)
    assert len(store) == cap and store.evicted == 0
    new = np.arange(5, dtype=np.int64) + 10**15
    low = keys[:3]  # low scores, but in the push: kept
    admitted = store.push_grad(np.concatenate([low, new]), np.zeros((8, 2), np.float32))
    assert admitted == 5
    evicted = 5 + cap // 16
    assert store.evicted == evicted and len(store) == cap + 5 - evicted
    gone = keys[3 : 3 + evicted]
    assert (store.index.lookup(gone) == -1).all()
    assert (store.index.lookup(np.concatenate([low, new, keys[3 + evicted :]])) >= 0).all()
    # a flood of new keys never takes the table past the cap
    flood = np.arange(10 * cap, dtype=np.int64) + (1 << 50)
    store.push_grad(flood, np.zeros((len(flood), 2), np.float32))
    assert len(store) == cap and store.capacity == cap
    assert store.rejected == len(flood) - cap


def test_bad_pushes_change_nothing():
    store = HashSparseStore(HashTable("emb", dim=3))
    with pytest.raises(ServerError) as err:
        store.push_grad(np.array([1.0]), np.zeros((1, 3), np.float32))
    assert err.value.code == ErrorCode.BAD_REQUEST
    with pytest.raises(ServerError) as err:
        store.push_grad(np.array([1, 2], np.int64), np.zeros((2, 4), np.float32))
    assert err.value.code == ErrorCode.SHAPE_MISMATCH
    with pytest.raises(ServerError) as err:
        store.push_grad(np.array([1], np.int64), np.zeros((1, 3), np.float32), shows=np.ones(2, np.float32))
    assert err.value.code == ErrorCode.SHAPE_MISMATCH
    assert len(store) == 0 and store.pushes == 0 and store.step == 0


def test_score_is_paddles():
    np.testing.assert_allclose(show_click_score(np.array([10.0, 3.0]), np.array([2.0, 3.0])), [2.8, 3.0])


def flood(store: HashSparseStore, rng: np.random.Generator, pushes: int, per: int) -> Iterator[int]:
    """Push ``per`` random new keys ``pushes`` times, evicting ahead as a server's upkeep does;
    yields each push's number once it is done."""
    for i in range(pushes):
        keys = rng.integers(I64_MIN, I64_MAX, per, dtype=np.int64)
        store.push_grad(keys, np.ones((per, store.spec.dim), np.float32))
        due = store.eviction_due
        if due:
            store.delete_keys(store.evict_plan(due))
        yield i


def test_a_cap_evicting_keys_of_equal_score_spreads_its_tombstones_over_the_slots():
    """Keys of one score (each pushed once) are evicted at random, not in slot order: evicting
    the lowest slots first piled their tombstones into one run without an empty slot, which every
    probe that entered it walked to its end (a 10k-key push took a second after 30 pushes)."""
    store = HashSparseStore(HashTable("capped", dim=2, max_keys=20_000))
    rng = np.random.default_rng(5)
    for _ in flood(store, rng, 40, 2_000):
        pass
    assert len(store) <= 20_000 and store.evicted >= 50_000
    slots = store.index._t[:, 1]
    runs = np.diff(np.flatnonzero(np.concatenate([[True], slots == 0, [True]])))
    assert runs.max() < 200, f"a run of {runs.max()} slots without an empty one"


def test_evict_plan_takes_the_lowest_scores_with_ties_at_random_and_never_a_protected_row():
    """The plan walks rows, not a copy of every key: the keys it names score no higher than any
    key it leaves (protected rows aside), ties at the cut are drawn at random, and a key whose
    row is protected is never named."""
    store = HashSparseStore(HashTable("capped", dim=2))
    rng = np.random.default_rng(11)
    keys = np.unique(rng.integers(I64_MIN, I64_MAX, 5_000, dtype=np.int64))
    shows = rng.integers(1, 6, len(keys)).astype(np.float32)  # five scores, ~1000 keys each
    store.push_grad(keys, np.zeros((len(keys), 2), np.float32), shows=shows)
    store.delete_keys(keys[::7])  # freed rows are not held: never named
    held, rows = store.index.items()
    protected = rows[:300]
    plan = store.evict_plan(1_500, protected)
    assert len(plan) == 1_500 and len(np.unique(plan)) == 1_500
    assert not np.isin(plan, held[:300]).any() and np.isin(plan, held).all()
    score = dict(zip(held.tolist(), show_click_score(store.show[rows], store.click[rows]).tolist()))
    named = np.array([score[k] for k in plan.tolist()])
    left = np.array([score[k] for k in held[300:].tolist() if k not in set(plan.tolist())])
    assert named.max() <= left.min()
    cut = named.max()
    assert (named < cut).sum() < 1_500 < (named <= cut).sum() + (left == cut).sum()  # the cut falls in a tie
    again = store.evict_plan(1_500, protected)
    np.testing.assert_array_equal(np.sort(again), np.sort(plan))  # same counter: the same draw
    store.delete_keys(plan[:10])
    other = store.evict_plan(1_500, protected)  # another eviction count: other ties
    assert set(other.tolist()) - set(plan.tolist())
    assert len(store.evict_plan(10**9)) == len(store)


def test_a_capped_store_under_a_flood_never_resizes_its_index_once_full():
    """Deletes leave no tombstones in the current slot array, so a table held at its cap by
    evictions keeps one slot array of the size its keys need: before, evictions piled up
    tombstones until a resize, which held the old and the new slot array at once (+32 MiB at
    1 M keys, beyond the cap's bytes)."""
    cap = 20_000
    store = HashSparseStore(HashTable("capped", dim=2, max_keys=cap))
    rng = np.random.default_rng(9)
    sizes = set()
    for i in flood(store, rng, 60, 2_000):
        if i >= 15:  # full since the tenth push
            assert not store.index.resizing
            sizes.add(store.index.slots)
    assert store.evicted >= 90_000 and len(store) <= cap
    assert len(sizes) == 1  # one slot array all along
    assert store.index.nbytes <= index_nbytes(cap) + 64


def test_a_rows_statistics_are_one_record_that_growth_keeps() -> None:
    """show, click, delta_score, last_day and last_step are fields of one 24-byte record per
    slab row (a push writes all five: one miss to memory, not five), read through views that
    follow the slab when it grows."""
    store = HashSparseStore(HashTable("emb", dim=2, optimizer=SGD(lr=0.1)))
    assert store.stats.dtype.itemsize == 24 and store.row_nbytes == 2 * 4 + 24
    keys = np.arange(1, 11, dtype=np.int64) * 7919
    store.push_grad(keys, np.ones((10, 2), np.float32), shows=np.full(10, 3, np.float32), clicks=np.ones(10, np.float32))
    capacity = store.capacity
    store.push_grad(np.arange(1, 3000, dtype=np.int64) * -13, np.zeros((2999, 2), np.float32))  # grows the slab
    assert store.capacity > capacity
    held = store.rows_of(keys)
    np.testing.assert_array_equal(held["show"], 3.0)
    np.testing.assert_array_equal(held["click"], 1.0)
    np.testing.assert_allclose(held["delta_score"], 0.1 * 2 + 1.0, rtol=1e-6)
    np.testing.assert_array_equal(held["last_step"], 0)
    assert np.shares_memory(store.show, store.stats) and np.shares_memory(store.last_step, store.stats)


def test_a_shrinks_plan_allocates_little_beyond_the_list_of_keys() -> None:
    """shrink_plan decays and judges every row in one compiled pass: its temporaries were ~70
    bytes a key in numpy (half a gigabyte at 10M keys, whose page faults delayed the pserver's
    pings by 20-80 ms during a shrink); now the keys and rows it walks (16 bytes a key), one
    flag a key and the keys it returns."""
    import tracemalloc

    n = 200_000
    store = HashSparseStore(HashTable("emb", dim=2, optimizer=SGD(lr=0.1)))
    keys = np.arange(1, n + 1, dtype=np.int64) * 7919
    store.push_grad(keys, np.zeros((n, 2), np.float32), shows=np.full(n, 10, np.float32))  # scores 1.0
    store.show[: n // 2] = 0.0  # half the keys score under the threshold
    tracemalloc.start()
    try:
        dead = store.shrink_plan()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(dead) == n // 2
    assert peak < 30 * n, f"{peak / n:.1f} bytes a key"


def test_the_keys_deleted_since_the_last_base_or_delta_save_are_kept_for_the_next_delta() -> None:
    """A cap's eviction and a shrink log the keys they delete, from the store's first base or
    delta save on (no delta can follow before one, so a store never exported logs nothing), each
    key once; a save in place forgets the keys it covered, not the ones deleted after."""
    cap = 32
    store = HashSparseStore(HashTable("emb", dim=2, max_keys=cap))
    zeros = np.zeros((cap, 2), np.float32)
    first = np.arange(cap, dtype=np.int64)
    store.push_grad(first, zeros, shows=np.arange(cap, dtype=np.float32))  # key i scores 0.1 i
    assert store.shrink(threshold=0.15) == 2  # keys 0 and 1
    assert store.deleted.keys().size == 0 and store.deleted.nbytes == 0  # no base or delta save yet

    store.after_save(np.empty(0, np.int64), store.deleted.keys())  # a base save is in place
    store.push_grad(np.array([0, 1, 100], np.int64), zeros[:3])  # at the cap: the lowest scores go
    evicted = first[(store.index.lookup(first) < 0) & (first >= 2)]
    assert evicted.size == cap // 16 + 1 and store.evicted == 2 + evicted.size
    np.testing.assert_array_equal(store.deleted.keys(), evicted)
    assert store.delete_keys(np.array([100, 100, 10**9], np.int64)) == 1  # an unknown key is no deletion
    store.delete_keys(evicted[:1])  # not held: not logged twice
    covered = store.deleted.keys()
    np.testing.assert_array_equal(covered, np.sort(np.append(evicted, 100)))
    assert store.deleted.nbytes == 8 * covered.size

    store.delete_keys(np.array([0], np.int64))  # deleted after the save was written, before it is in place
    store.after_save(np.empty(0, np.int64), covered)
    np.testing.assert_array_equal(store.deleted.keys(), [0])


def test_the_log_of_deleted_keys_is_compacted_to_each_key_once() -> None:
    """A key deleted and admitted again over and over is logged once after a compaction, so the
    log holds about the distinct keys deleted, not every deletion."""
    store = HashSparseStore(HashTable("emb", dim=2))
    store.after_save(np.empty(0, np.int64), np.empty(0, np.int64))
    keys = np.arange(1 << 12, dtype=np.int64)
    for _ in range(40):  # 160k deletions of 4k keys
        store.push_grad(keys, np.zeros((keys.size, 2), np.float32))
        store.delete_keys(keys)
    np.testing.assert_array_equal(store.deleted.keys(), keys)
    assert store.deleted.nbytes <= 8 * (1 << 16)


def test_cold_rows_read_in_parallel_parts_give_what_one_read_gives(tmp_path) -> None:
    """A disk table's batched read split over reader threads (cold.py) returns the records of
    the keys held, in the keys' order, and misses the others, as a read in one part does."""
    from aps.storage.hash.cold import READ_PART, ColdRows

    rng = np.random.default_rng(3)
    keys = np.unique(rng.integers(-(1 << 62), 1 << 62, 6000))
    records = rng.integers(0, 256, (keys.shape[0], 40), dtype=np.uint8)
    cold = ColdRows(tmp_path / "rows", 40, 4 << 20)
    try:
        cold.write(keys, records)
        asked = rng.permutation(np.concatenate([keys[rng.integers(0, keys.shape[0], 4 * READ_PART)],
                                                rng.integers(-(1 << 62), 1 << 62, READ_PART)]))
        cold._read_threads = 3
        found, got = cold.fetch(asked)
        cold._read_threads = 1
        assert cold._read_threads == 1 and cold._readers is not None, "the first read went in parts"
        found_one, got_one = cold.fetch(asked)
        np.testing.assert_array_equal(found, found_one)
        np.testing.assert_array_equal(got, got_one)
        where = {int(k): i for i, k in enumerate(keys)}
        np.testing.assert_array_equal(found, np.array([int(k) in where for k in asked]))
        np.testing.assert_array_equal(got, records[[where[int(k)] for k in asked[found]]])
    finally:
        cold.destroy()


def test_a_cold_write_waits_for_level_0_without_the_gil_then_writes(tmp_path, monkeypatch) -> None:
    """While level 0 holds LEVEL0_WAIT files a write of rows going out waits (at most
    LEVEL0_WAIT_S), sleeping, so other threads (a pserver's event loop) run meanwhile."""
    import threading
    import time

    from aps.storage.hash import cold as cold_module

    cold = cold_module.ColdRows(tmp_path / "rows", 8, 4 << 20)
    try:
        keys = np.arange(100, dtype=np.int64)
        cold.write(keys, np.zeros((100, 8), np.uint8))
        cold.snapshot(tmp_path / "snap")  # flushes: one file in level 0, below any compaction trigger
        monkeypatch.setattr(cold_module, "LEVEL0_WAIT", 1)
        monkeypatch.setattr(cold_module, "LEVEL0_WAIT_S", 0.4)
        ticks, done = [0], threading.Event()

        def tick() -> None:
            while not done.is_set():
                ticks[0] += 1
                time.sleep(0.01)

        other = threading.Thread(target=tick)
        other.start()
        started = time.monotonic()
        cold.write(keys, np.full((100, 8), 7, np.uint8))
        waited = time.monotonic() - started
        done.set()
        other.join()
        assert waited >= 0.4 and ticks[0] >= 10, (waited, ticks)
        found, records = cold.fetch(keys)
        assert found.all() and (records == 7).all()
    finally:
        cold.destroy()
