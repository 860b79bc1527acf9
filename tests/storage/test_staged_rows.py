"""A disk table's first-touch buffer (aps/storage/hash/staged.py): a pull answers a key on disk
from the record it read, without taking a RAM row for it; the key's second pull or its push
brings the staged record in without reading disk again; rows equal an all-RAM table's whatever
path they took; whatever changes the records on disk empties the buffer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import aps
from aps.storage.hash.disk_store import DiskHashStore, hot_keys
from aps.storage.hash.staged import StagedRows
from aps.storage.hash.store import HashSparseStore

DIM = 8


def records(keys: np.ndarray, width: int = 4) -> np.ndarray:
    """A record per key that says which key it belongs to."""
    return np.repeat((keys % 251).astype(np.uint8)[:, None], width, axis=1)


def test_take_returns_each_found_keys_record_once_newest_first() -> None:
    staged = StagedRows(100, 4)
    staged.add(np.array([1, 5, 9], np.int64), records(np.array([1, 5, 9])))
    staged.add(np.array([2, 5, 7], np.int64), records(np.array([2, 5, 7])) + 100)  # 5 again, newer
    found, got = staged.take(np.array([7, 5, 3, 1], np.int64))
    assert found.tolist() == [True, True, False, True]
    assert got[:, 0].tolist() == [107, 105, 1]
    found, got = staged.take(np.array([5, 1, 2], np.int64))  # 5 and 1 were taken
    assert found.tolist() == [False, False, True] and got[:, 0].tolist() == [102]


def test_the_oldest_generations_go_past_the_capacity_and_clear_forgets_all() -> None:
    staged = StagedRows(5, 4)
    staged.add(np.array([1, 2, 3], np.int64), records(np.array([1, 2, 3])))
    staged.add(np.array([4, 6], np.int64), records(np.array([4, 6])))
    assert len(staged) == 5 and staged.nbytes == 5 * (4 + 9)
    staged.add(np.array([8], np.int64), records(np.array([8])))  # 6 held: the first generation goes
    assert len(staged) == 3
    found, _ = staged.take(np.array([1, 4, 8], np.int64))
    assert found.tolist() == [False, True, True]
    staged.add(np.arange(10, 20, dtype=np.int64), records(np.arange(10, 20)))  # more than fit: the first 5
    assert len(staged) == 5
    found, _ = staged.take(np.arange(10, 20, dtype=np.int64))
    assert found.tolist() == [True] * 5 + [False] * 5
    staged.clear()
    assert len(staged) == 0 and not staged.take(np.array([6], np.int64))[0].any()


def spec(disk: bool = True, dtype: str = "float16") -> aps.HashTable:
    return aps.HashTable("emb", dim=DIM, init=aps.Uniform(-0.01, 0.01), optimizer=aps.Adagrad(lr=0.05, rowwise=True),
                         dtype=dtype, disk=aps.Disk(ram_bytes=4 << 20) if disk else None)


def filled(tmp_path: Path, dtype: str = "float16") -> tuple[DiskHashStore, HashSparseStore, np.ndarray]:
    """A disk table and an all-RAM one after the same pushes of three times the hot rows' keys."""
    disk, ram = DiskHashStore(spec(dtype=dtype), tmp_path), HashSparseStore(spec(disk=False, dtype=dtype))
    keys = np.arange(3 * hot_keys(spec(dtype=dtype)), dtype=np.int64)
    rng = np.random.default_rng(0)
    for at in range(0, keys.size, 20_000):
        part = keys[at : at + 20_000]
        grads = rng.standard_normal((part.size, DIM)).astype(np.float32)
        disk.push_grad(part, grads)
        ram.push_grad(part, grads)
    assert disk.cold_keys > keys.size // 2
    return disk, ram, keys


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_a_pull_answers_from_disk_without_bringing_the_keys_in_and_the_second_pull_brings_them(dtype: str,
                                                                                              tmp_path: Path) -> None:
    disk, ram, keys = filled(tmp_path, dtype)
    cold = keys[: min(2000, disk.staged.capacity)]  # the first pushed: on disk by now; all fit the buffer
    assert (disk.hot.index.lookup(cold) < 0).all()
    read, paged, hot = disk.cold.found_keys, disk.paged_in, len(disk.hot)
    assert np.array_equal(disk.pull(cold), ram.pull(cold))
    assert disk.cold.found_keys - read == cold.size and disk.paged_in == paged and len(disk.hot) == hot
    assert (disk.hot.index.lookup(cold) < 0).all()
    assert np.array_equal(disk.pull(cold), ram.pull(cold))  # the second pull: from the buffer, into RAM
    assert disk.cold.found_keys - read == cold.size and disk.paged_in - paged == cold.size
    assert disk.staged_hits == cold.size and (disk.hot.index.lookup(cold) >= 0).all()


def test_a_pull_then_a_push_of_the_same_keys_reads_disk_once_and_rows_stay_equal(tmp_path: Path) -> None:
    disk, ram, keys = filled(tmp_path)
    rng = np.random.default_rng(1)
    for step in range(6):
        batch = np.concatenate([keys[rng.integers(0, keys.size, 3000)], rng.integers(keys.size, 2 * keys.size, 200)])
        read = disk.cold.found_keys
        assert np.array_equal(disk.pull(batch), ram.pull(batch))
        first = disk.cold.found_keys - read
        grads = rng.standard_normal((batch.size, DIM)).astype(np.float32)
        disk.push_grad(batch, grads)
        ram.push_grad(batch, grads)
        assert disk.cold.found_keys - read == first  # the push found the pulled keys staged
    assert disk.staged_hits > 0
    assert len(disk) == len(ram)
    assert np.array_equal(disk.pull(keys), ram.pull(keys))


def test_deleting_a_staged_key_forgets_its_record(tmp_path: Path) -> None:
    disk, ram, keys = filled(tmp_path)
    cold = keys[:100]
    disk.pull(cold)
    assert len(disk.staged) == cold.size
    assert disk.delete_keys(cold[:10]) == 10
    ram.delete_keys(cold[:10])
    assert len(disk.staged) == 0
    assert np.array_equal(disk.pull(cold), ram.pull(cold))  # the deleted keys read their initial rows
    assert len(disk) == len(ram)
