"""The two sparse shardings (aps/sharding.py) against the plain rules they state: fixed tables,
row ``r`` on server ``r % n`` as local row ``r // n``; hash tables, key ``k``'s logical shard
the top 10 bits of ``mix64(k)``, logical shard ``l`` on server ``l % n``. Written out here by
hand, so a change to either class that moves an id shows as a disagreement."""

from __future__ import annotations

import numpy as np
import pytest

from aps.mixer import mix64
from aps.sharding import LOGICAL_SHARDS, LogicalSharding, ModuloSharding, SparseSharding
from aps.specs import HashTable, SparseTable

ROWS = 1000


def plain_logical(keys: np.ndarray) -> np.ndarray:
    return np.array([int(mix64(np.uint64(k))) >> 54 for k in keys.view(np.uint64)], np.int64)


def assert_groups_by(sharding: SparseSharding, ids: np.ndarray, owner: np.ndarray) -> None:
    order, bounds = sharding.group(ids)
    np.testing.assert_array_equal(order, np.argsort(owner, kind="stable"))
    np.testing.assert_array_equal(np.diff(bounds), np.bincount(owner, minlength=sharding.num_servers))


@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_modulo_sharding_is_id_mod_n_at_row_id_div_n(n: int) -> None:
    rng = np.random.default_rng(n)
    ids = rng.integers(0, ROWS, 500, dtype=np.int64)
    sharding = ModuloSharding(n)
    assert SparseSharding.of(SparseTable("t", rows=ROWS, dim=1), n) == sharding
    np.testing.assert_array_equal(sharding.owners(ids), ids % n)
    assert_groups_by(sharding, ids, ids % n)
    np.testing.assert_array_equal(sharding.local_rows(ids), ids // n)
    for server in range(n):
        mine = np.arange(ROWS)[np.arange(ROWS) % n == server]
        assert sharding.local_row_count(ROWS, server) == len(mine)
        np.testing.assert_array_equal(np.arange(ROWS)[sharding.rows_of(server)], mine)
        np.testing.assert_array_equal(sharding.global_ids(np.arange(len(mine)), server), mine)
        bad = np.flatnonzero(ids % n != server)
        assert sharding.first_bad_id(ids, ROWS, server) == (bad[0] if bad.size else -1)
    assert sharding.first_bad_id(np.array([n * 3, ROWS + n * 3], np.int64), ROWS, 0) == 1  # out of range
    assert sharding.first_bad_id(np.array([0, -n], np.int64), ROWS, 0) == 1


@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_logical_sharding_is_top_bits_of_the_mix_mod_n(n: int) -> None:
    rng = np.random.default_rng(n)
    keys = rng.integers(-(1 << 63), (1 << 63) - 1, 500, dtype=np.int64, endpoint=True)
    keys[:4] = [0, -1, -(1 << 63), (1 << 63) - 1]
    logical = plain_logical(keys)
    sharding = LogicalSharding(n)
    assert SparseSharding.of(HashTable("t", dim=1), n) == sharding
    np.testing.assert_array_equal(LogicalSharding.logical(keys), logical)
    np.testing.assert_array_equal(sharding.owners(keys), logical % n)
    assert_groups_by(sharding, keys, logical % n)
    for server in range(n):
        assert list(sharding.logical_shards_of(server)) == [l for l in range(LOGICAL_SHARDS) if l % n == server]
        foreign = np.flatnonzero(logical % n != server)
        assert sharding.first_foreign(keys, server) == (foreign[0] if foreign.size else -1)
    assert [sharding.server_of(l) for l in range(LOGICAL_SHARDS)] == [l % n for l in range(LOGICAL_SHARDS)]
