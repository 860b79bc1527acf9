"""``HashTable(stats="compact")``: each key's statistics in 16 bytes (no last step, days modulo
2^16, aps/storage/hash/stats.py), deciding every shrink as the full 24-byte record does, and
checkpoints that carry them between the two layouts."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import aps
from aps.checkpoints.shards import load_shards, save_shard, shard_dir_name
from aps.errors import ConfigError, ServerError
from aps.specs import MAX_COMPACT_DAYS, spec_from_dict, spec_to_dict
from aps.storage.hash.stats import PIN_DAYS
from aps.storage.hash.store import HashSparseStore, row_nbytes

DIM = 4
TTL_DAYS = 30_000


def spec(stats: str = "compact", **fields) -> aps.HashTable:
    args = dict(dim=DIM, optimizer=aps.SGD(lr=0.1), ttl_days=TTL_DAYS, stats=stats)
    args.update(fields)
    return aps.HashTable("emb", **args)


def by_key(store: HashSparseStore) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    keys, _ = store.index.items()
    keys = np.sort(keys)
    return keys, store.rows_of(keys)


def unseen(store: HashSparseStore, last_day: np.ndarray) -> np.ndarray:
    """Days since each key's last push, as the table's layout reads them."""
    ages = store.day - last_day.astype(np.int64)
    return ages % (1 << 16) if last_day.dtype == np.uint16 else ages


def push(stores: list[HashSparseStore], rng: np.random.Generator, n: int = 300) -> None:
    keys = rng.integers(0, 2000, n).astype(np.int64)
    shows = rng.integers(1, 5, n).astype(np.float32)
    clicks = np.minimum(shows, rng.integers(0, 3, n)).astype(np.float32)
    grads = rng.standard_normal((n, DIM)).astype(np.float32)
    for store in stores:
        store.push_grad(keys, grads, shows=shows, clicks=clicks)


@pytest.mark.parametrize("ttl_days", [TTL_DAYS, None])
def test_compact_statistics_take_16_bytes_and_every_shrink_deletes_what_the_full_record_would(ttl_days: int | None) -> None:
    full, small = HashSparseStore(spec("full", ttl_days=ttl_days)), HashSparseStore(spec(ttl_days=ttl_days))
    assert small.stats.dtype.itemsize == 16 and full.stats.dtype.itemsize == 24
    assert row_nbytes(spec("full")) - row_nbytes(spec()) == 8
    rng = np.random.default_rng(5)
    # day jumps from none to the most a shrink may take: keys age past 2^15 and 2^16 days, are
    # pinned, pushed again, and ttl_days deletes some of them on the way
    for days in [0, 1, 2, 5_000, 20_000, MAX_COMPACT_DAYS, 3, MAX_COMPACT_DAYS, MAX_COMPACT_DAYS, 9_000, 25_000, 1]:
        push([full, small], rng)
        decay, threshold = float(rng.uniform(0.9, 1.0)), float(rng.uniform(0.0, 0.5))
        assert small.shrink(decay, threshold, days=days) == full.shrink(decay, threshold, days=days)
        keys, rows = by_key(full)
        small_keys, small_rows = by_key(small)
        np.testing.assert_array_equal(small_keys, keys)
        for name in ("show", "click", "delta_score"):
            assert small_rows[name].tobytes() == rows[name].tobytes(), name
        assert (small_rows["last_step"] == 0).all()
        np.testing.assert_array_equal(unseen(small, small_rows["last_day"]), np.minimum(unseen(full, rows["last_day"]), PIN_DAYS))
    assert full.evicted == small.evicted > 0 and small.day == full.day > 1 << 17
    if ttl_days is None:  # keys unseen past 2^16 days are held, pinned
        assert (unseen(full, by_key(full)[1]["last_day"]) > 1 << 16).any()


def test_compact_statistics_refuse_a_ttl_in_steps_and_days_past_16_bits() -> None:
    store = HashSparseStore(spec())
    store.push_grad(np.arange(5, dtype=np.int64), np.ones((5, DIM), np.float32))
    with pytest.raises(ServerError, match="no last step"):
        store.shrink(ttl=3)
    with pytest.raises(ServerError, match=f"0 to {MAX_COMPACT_DAYS} days"):
        store.shrink(days=MAX_COMPACT_DAYS + 1)
    assert len(store) == 5 and store.day == 0
    with pytest.raises(ConfigError, match="ttl_days"):
        spec(ttl_days=MAX_COMPACT_DAYS + 1)
    assert spec("full", ttl_days=MAX_COMPACT_DAYS + 1).ttl_days == MAX_COMPACT_DAYS + 1
    with pytest.raises(ConfigError, match="stats must be one of full, compact"):
        spec("tiny")
    assert spec_from_dict(spec_to_dict(spec())).stats == "compact"
    assert aps.HashTable("emb", dim=DIM).stats == "full"


def saved_table(root: Path, store: HashSparseStore, name: str) -> Path:
    save_shard(root / name, {"emb": store}, 0, 1, {}, save_id=name)
    return root / name


def load_as(path: Path, stats: str, **fields) -> HashSparseStore:
    """The saved table loaded with its spec's statistics layout set to ``stats`` (and ``fields``)."""
    manifest_path = path / shard_dir_name(0, 1) / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["tables"]["emb"]["spec"].update(stats=stats, **fields)
    manifest_path.write_text(json.dumps(manifest))
    tables, _ = load_shards(path, 0, 1)
    return tables["emb"]  # type: ignore[return-value]


def test_checkpoints_hold_the_full_layout_and_load_into_either(tmp_path: Path) -> None:
    rng = np.random.default_rng(8)
    full, small = HashSparseStore(spec("full", ttl_days=None)), HashSparseStore(spec(ttl_days=None))
    for days in (0, MAX_COMPACT_DAYS, MAX_COMPACT_DAYS, 2, 0):  # some keys unseen past 2^15 days
        push([full, small], rng)
        full.shrink(1.0, 0.0, days=days)
        small.shrink(1.0, 0.0, days=days)
    keys, rows = by_key(full)
    old = unseen(full, rows["last_day"]) > PIN_DAYS
    assert old.any() and not old.all()
    # a compact table's files: int32 days (its keys' days back from the save's day, ages past
    # 2^15 pinned), int64 steps (the save's step: it kept none)
    path = saved_table(tmp_path, small, "small")
    files = list((path / shard_dir_name(0, 1)).glob("t0000-emb.l*.npz"))
    saved = [np.load(f) for f in files]
    assert {f["last_day"].dtype for f in saved} == {np.dtype(np.int32)}
    assert {f["last_step"].dtype for f in saved} == {np.dtype(np.int64)}
    assert all((f["last_step"] == small.step).all() for f in saved)
    for stats in ("compact", "full"):
        loaded = load_as(path, stats)
        assert loaded.spec.stats == stats and loaded.day == full.day
        got_keys, got = by_key(loaded)
        np.testing.assert_array_equal(got_keys, keys)
        for name in ("values", "show", "click", "delta_score"):
            assert got[name].tobytes() == rows[name].tobytes(), (stats, name)
        np.testing.assert_array_equal(unseen(loaded, got["last_day"]), np.minimum(unseen(full, rows["last_day"]), PIN_DAYS))
    # the full table's files into a compact table with ttl_days: ages past 2^15 pinned, and the
    # shrinks after delete exactly the keys unseen for more than ttl_days
    loaded = load_as(saved_table(tmp_path, full, "full"), "compact", ttl_days=20_000)
    _, got = by_key(loaded)
    np.testing.assert_array_equal(unseen(loaded, got["last_day"]), np.minimum(unseen(full, rows["last_day"]), PIN_DAYS))
    for days in (0, 1, 5_000):
        loaded.shrink(1.0, 0.0, days=days)
        full.shrink(1.0, 0.0, days=days)  # no ttl_days: keeps every key, ages them
        np.testing.assert_array_equal(by_key(loaded)[0], keys[unseen(full, rows["last_day"]) <= 20_000])
    assert 0 < loaded.evicted < len(keys)


def test_a_compact_disk_tables_shrink_walks_its_cold_rows_as_an_all_ram_tables(tmp_path: Path) -> None:
    """The disk tier keeps the same 16-byte records for its rows on disk and judges them with the
    same pass: a disk table whose rows go out decides a shrink as an all-RAM one."""
    from aps.storage.hash.disk_store import DiskHashStore

    disk = DiskHashStore(replace(spec(), disk=aps.Disk(ram_bytes=aps.specs.MIN_DISK_RAM)), tmp_path)
    ram = HashSparseStore(spec())
    rng = np.random.default_rng(3)
    for days in (0, MAX_COMPACT_DAYS, 7, MAX_COMPACT_DAYS, 1):
        for _ in range(4):  # more keys than the disk table holds in RAM
            keys = rng.choice(1 << 20, 20_000, replace=False).astype(np.int64)
            for store in (disk, ram):
                store.push_grad(keys, np.ones((keys.size, DIM), np.float32), clicks=np.full(keys.size, 5.0, np.float32))
        assert disk.shrink(1.0, 0.0, days=days) == ram.shrink(1.0, 0.0, days=days)
        assert len(disk) == len(ram)
    assert disk.cold_keys > 0 and ram.evicted > 0


async def test_a_pserver_answers_a_shrink_by_steps_of_a_compact_table_with_bad_request() -> None:
    srv = await aps.serve()
    try:
        async with aps.connect([srv.address]) as ps:
            await ps.create_table(spec())
            await ps.push_sparse_grad("emb", np.arange(8, dtype=np.int64), np.ones((8, DIM), np.float32))
            with pytest.raises(aps.ServerError, match="no last step"):
                await ps.shrink("emb", ttl=10)
            with pytest.raises(aps.ServerError, match=f"0 to {MAX_COMPACT_DAYS} days"):
                await ps.shrink("emb", days=MAX_COMPACT_DAYS + 1)
            assert await ps.shrink("emb", threshold=0.0, days=3) == 0
            assert (await ps.table_info("emb")).spec.stats == "compact"
    finally:
        await srv.aclose()
