"""Checkpoints of hash tables (aps/checkpoints/hash_files.py): one file per logical shard, so a
checkpoint saved by N pservers loads into M by reassigning files; save modes full, base and
delta; torn or mixed saves refused. Real pservers over TCP on port 0 where the client is in it."""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

import aps
from aps.checkpoints.shards import load_own_shard, load_shards, save_shard, shard_dir_name
from aps.errors import ConfigError, ErrorCode
from aps.sharding import LOGICAL_SHARDS, LogicalSharding
from aps.storage.hash.accessor import show_click_score
from aps.storage.hash.store import HashSparseStore

pytestmark = pytest.mark.timeout(60)

DIM = 8
I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1


def spec(**fields) -> aps.HashTable:
    args = dict(dim=DIM, optimizer=aps.Adagrad(lr=0.05), admit_count=2, pending_keys=4096)
    args.update(fields)
    return aps.HashTable("emb", **args)


def random_keys(n: int, seed: int) -> np.ndarray:
    keys = np.unique(np.random.default_rng(seed).integers(I64_MIN, I64_MAX, n, dtype=np.int64, endpoint=True))
    keys[:3] = [I64_MIN, -1, 0]
    return np.unique(keys)


@contextlib.asynccontextmanager
async def cluster(n: int, root: Path) -> AsyncIterator[tuple[list[aps.PServer], aps.PSClient]]:
    servers = []
    try:
        for k in range(n):
            servers.append(await aps.serve(server_index=k, num_servers=n, checkpoint_root=str(root)))
        async with aps.connect([s.address for s in servers]) as ps:
            yield servers, ps
    finally:
        for s in servers:
            await s.aclose()


def stores(servers: list[aps.PServer]) -> list[HashSparseStore]:
    return [s.core.tables["emb"] for s in servers]  # type: ignore[misc]


def held(servers: list[aps.PServer]) -> dict[str, np.ndarray]:
    """Every key held over the cluster with its row (values, optimizer state, statistics), by key."""
    parts = []
    for store in stores(servers):
        keys, _ = store.index.items()
        parts.append((keys, store.rows_of(keys)))
    keys = np.concatenate([k for k, _ in parts])
    order = np.argsort(keys)
    out = {"keys": keys[order]}
    for name in parts[0][1]:
        out[name] = np.concatenate([rows[name] for _, rows in parts])[order]
    return out


def pending(servers: list[aps.PServer]) -> dict[int, int]:
    """The admission counters of keys not admitted yet, over the cluster."""
    out: dict[int, int] = {}
    for store in stores(servers):
        keys, counts = store.pending_items()
        out.update(zip(keys.tolist(), counts.tolist()))
    return out


async def train(ps: aps.PSClient, keys: np.ndarray, seed: int) -> None:
    """Pushes with shows and clicks; keys pushed once stay pending (admit_count=2)."""
    rng = np.random.default_rng(seed)
    for step in range(3):
        batch = np.concatenate([keys, keys[: len(keys) // 2]]) if step else keys
        grads = rng.standard_normal((len(batch), DIM)).astype(np.float32)
        shows = rng.integers(1, 4, len(batch)).astype(np.float32)
        clicks = (rng.random(len(batch)) < 0.3).astype(np.float32)
        await ps.push_sparse_grad("emb", batch, grads, shows=shows, clicks=clicks)
    await ps.push_sparse_grad("emb", random_keys(300, seed + 7), np.ones((300, DIM), np.float32))  # counted, not admitted


def assert_equal_bytes(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].tobytes() == b[name].tobytes(), name


@pytest.mark.parametrize(("saved", "loaded"), [(2, 2), (2, 3), (3, 1)])
async def test_a_checkpoint_loads_onto_any_number_of_pservers_with_every_key_equal(saved: int, loaded: int, tmp_path: Path) -> None:
    keys = random_keys(3000, seed=1)
    async with cluster(saved, tmp_path) as (servers, ps):
        await ps.create_table(spec())
        await train(ps, keys, seed=2)
        before, counters = held(servers), pending(servers)
        steps = {s.step for s in stores(servers)}
        info = await ps.table_info("emb")
        await ps.save("ckpt")
        rows = await ps.pull_sparse("emb", keys)
    assert len(before["keys"]) == len(keys) and len(counters) >= 290  # keys held, and keys still counted
    files = sorted(p.name for p in (tmp_path / "ckpt").glob("shard-*/*.npz"))
    assert len(files) == LOGICAL_SHARDS  # one file per logical shard over the cluster
    for k in range(saved):  # each in the folder of the pserver that owns it
        names = {p.name for p in (tmp_path / "ckpt" / shard_dir_name(k, saved)).glob("*.npz")}
        assert names == {f"t0000-emb.l{l:04d}.npz" for l in range(k, LOGICAL_SHARDS, saved)}

    async with cluster(loaded, tmp_path) as (servers, ps):
        await ps.load("ckpt")
        assert_equal_bytes(held(servers), before)  # every key's row, optimizer state and statistics
        assert pending(servers) == counters
        for store in stores(servers):  # each key on the server the sharding says
            keys_k, _ = store.index.items()
            owners = LogicalSharding(loaded).owners(keys_k)
            assert (owners == servers[stores(servers).index(store)].core.config.server_index).all()
            assert store.step == max(steps)
        assert (await ps.pull_sparse("emb", keys)).tobytes() == rows.tobytes()
        after = await ps.table_info("emb")
        assert after.keys == info.keys == len(keys)
        assert (after.admitted, after.rejected, after.evicted) == (info.admitted, info.rejected, info.evicted)
        # training goes on from the loaded state: a counted key is admitted at its second push
        counted = next(iter(counters))
        await ps.push_sparse_grad("emb", [counted], np.ones((1, DIM), np.float32))
        assert (await ps.table_info("emb")).keys == len(keys) + 1


async def test_a_save_runs_with_hash_and_fixed_tables_and_the_pserver_resumes_its_own_shard(tmp_path: Path) -> None:
    keys = random_keys(500, seed=3)
    async with cluster(2, tmp_path) as (servers, ps):
        await ps.create_table(spec(admit_count=1))
        await ps.create_table(aps.SparseTable("fixed", rows=10, dim=2))
        await ps.push_sparse_grad("emb", keys, np.ones((len(keys), DIM), np.float32))
        await ps.push_sparse_grad("fixed", [1, 2], np.ones((2, 2), np.float32))
        before = held(servers)
        await ps.save("ckpt", mode="full")
        fixed = await ps.pull_sparse("fixed", np.arange(10))
    manifest = json.loads((tmp_path / "ckpt" / shard_dir_name(1, 2) / "manifest.json").read_text())
    assert manifest["mode"] == "full" and "base_save_id" not in manifest
    entry = manifest["tables"]["emb"]
    assert entry["kind"] == "hash" and sum(entry["keys"].values()) == len(stores(servers)[1])
    # a restarted pserver resumes from its own shard directory alone
    tables, _ = load_own_shard(tmp_path / "ckpt" / shard_dir_name(1, 2), 1, 2)
    store = tables["emb"]
    assert isinstance(store, HashSparseStore) and len(store) == int(np.sum(LogicalSharding(2).owners(keys) == 1))
    k1, _ = store.index.items()
    np.testing.assert_array_equal(store.rows_of(np.sort(k1))["values"], before["values"][np.searchsorted(before["keys"], np.sort(k1))])
    one = [load_shards(tmp_path / "ckpt", 0, 1)[0]]
    assert len(one[0]["emb"]) == len(keys)
    np.testing.assert_array_equal(one[0]["fixed"].values, fixed)


def scored_store(keys: np.ndarray, shows: np.ndarray, clicks: np.ndarray, **fields) -> HashSparseStore:
    store = HashSparseStore(spec(admit_count=1, **fields))
    store.push_grad(keys, np.zeros((len(keys), DIM), np.float32), shows=shows, clicks=clicks)
    return store


def saved_keys(path: Path) -> np.ndarray:
    tables, _ = load_shards(path, 0, 1)
    keys, _ = tables["emb"].index.items()
    return np.sort(keys)


@pytest.mark.slow
def test_base_and_delta_saves_hold_exactly_the_keys_their_rule_says(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    keys = random_keys(2000, seed=5)
    shows = rng.integers(0, 6, len(keys)).astype(np.float32)
    clicks = np.minimum(shows, rng.integers(0, 3, len(keys))).astype(np.float32)
    store = scored_store(keys, shows, clicks)
    fixed = aps.SparseTable("fixed", rows=6, dim=2)
    from aps.storage.tables import SparseShard

    tables = {"emb": store, "fixed": SparseShard(fixed, 0, 1)}
    score = show_click_score(shows, clicks)  # delta score = score for a key pushed once
    base = keys[score >= 1.5]
    assert 0 < len(base) < len(keys)
    save_shard(tmp_path / "base", tables, 0, 1, {}, save_id="b1", mode="base")
    np.testing.assert_array_equal(saved_keys(tmp_path / "base"), np.sort(base))
    manifest = json.loads((tmp_path / "base" / shard_dir_name(0, 1) / "manifest.json").read_text())
    assert manifest["mode"] == "base" and manifest["tables"]["fixed"]["rows"] == 6  # fixed tables whole
    # the base reset the delta score of the keys it wrote, and only theirs
    delta_now = store.rows_of(keys)["delta_score"]
    np.testing.assert_array_equal(delta_now[score >= 1.5], 0.0)
    np.testing.assert_array_equal(delta_now[score < 1.5], (0.1 * (shows - clicks) + clicks).astype(np.float32)[score < 1.5])

    # more pushes: a key's delta score is what was pushed since a base or delta last wrote it
    again = keys[::3]
    s2 = rng.integers(0, 6, len(again)).astype(np.float32)
    store.push_grad(again, np.zeros((len(again), DIM), np.float32), shows=s2, clicks=np.zeros(len(again), np.float32))
    expected_delta = store.rows_of(keys)["delta_score"]
    delta = keys[expected_delta >= np.float32(0.25)]
    assert 0 < len(delta) < len(keys) and np.isin(delta, base).any() and not np.isin(delta, base).all()
    save_shard(tmp_path / "delta", tables, 0, 1, {}, save_id="d1", mode="delta", base_save_id="b1")
    manifest = json.loads((tmp_path / "delta" / shard_dir_name(0, 1) / "manifest.json").read_text())
    assert manifest["mode"] == "delta" and manifest["base_save_id"] == "b1"
    files = (tmp_path / "delta" / shard_dir_name(0, 1)).glob("t0000-emb.l*.npz")
    written = np.sort(np.concatenate([np.load(f)["keys"] for f in files]))
    np.testing.assert_array_equal(written, np.sort(delta))
    after = store.rows_of(keys)["delta_score"]
    np.testing.assert_array_equal(after[expected_delta >= np.float32(0.25)], 0.0)
    np.testing.assert_array_equal(after[expected_delta < np.float32(0.25)], expected_delta[expected_delta < np.float32(0.25)])
    with pytest.raises(ConfigError, match="is a delta save .*'b1'.*load a full or base checkpoint"):
        load_shards(tmp_path / "delta", 0, 1)

    # a second delta right away holds nothing of the hash table: every key's delta was written or is below
    save_shard(tmp_path / "delta2", tables, 0, 1, {}, save_id="d2", mode="delta", base_save_id="b1")
    files = list((tmp_path / "delta2" / shard_dir_name(0, 1)).glob("t0000-emb.l*.npz"))
    assert len(files) == LOGICAL_SHARDS and sum(len(np.load(f)["keys"]) for f in files) == 0


@pytest.mark.slow
async def test_save_modes_through_the_client(tmp_path: Path) -> None:
    keys = random_keys(400, seed=6)
    async with cluster(2, tmp_path) as (servers, ps):
        await ps.create_table(spec(admit_count=1))
        with pytest.raises(aps.ServerError, match="a delta save follows a base save") as refused:
            await ps.save("d0", mode="delta")
        assert refused.value.code == ErrorCode.BAD_REQUEST
        shows = np.where(np.arange(len(keys)) % 2, 3.0, 1.0).astype(np.float32)  # x6: score 1.8 or 0.6
        await ps.push_sparse_grad("emb", keys, np.zeros((len(keys), DIM), np.float32), shows=shows * 6)
        await ps.save("b", mode="base")
        await ps.push_sparse_grad("emb", keys[:10], np.zeros((10, DIM), np.float32), shows=np.full(10, 5.0, np.float32))
        await ps.save("d", mode="delta")
        with pytest.raises(aps.ConfigError, match="save mode must be one of"):
            await ps.save("x", mode="incremental")
    base = json.loads((tmp_path / "b" / shard_dir_name(0, 2) / "manifest.json").read_text())
    delta = json.loads((tmp_path / "d" / shard_dir_name(1, 2) / "manifest.json").read_text())
    assert base["mode"] == "base" and delta["mode"] == "delta" and delta["base_save_id"] == base["save_id"]
    np.testing.assert_array_equal(saved_keys(tmp_path / "b"), np.sort(keys[shows * 6 * 0.1 >= 1.5]))
    written = np.sort(np.concatenate([np.load(f)["keys"] for f in (tmp_path / "d").glob("shard-*/t0000-emb.l*.npz")]))
    # the ten pushed since, and the keys the base did not write (their delta score of 0.6 is still there)
    np.testing.assert_array_equal(written, np.union1d(keys[:10], keys[shows * 6 * 0.1 < 1.5]))


@pytest.mark.slow
def test_a_torn_or_mixed_hash_checkpoint_is_refused(tmp_path: Path) -> None:
    keys = random_keys(800, seed=8)
    parts = [HashSparseStore(spec(admit_count=1)) for _ in range(2)]
    owners = LogicalSharding(2).owners(keys)
    for k, store in enumerate(parts):
        store.push_grad(keys[owners == k], np.ones((int((owners == k).sum()), DIM), np.float32))
    for save_id in ("one", "two"):
        for k, store in enumerate(parts):
            save_shard(tmp_path / save_id, {"emb": store}, k, 2, {}, save_id=save_id)
    assert len(load_shards(tmp_path / "one", 2, 3)[0]["emb"]) > 0

    shard1 = tmp_path / "one" / shard_dir_name(1, 2)
    file = shard1 / "t0000-emb.l0003.npz"
    torn = tmp_path / "torn"
    shutil.copytree(tmp_path / "one", torn)
    (torn / shard_dir_name(1, 2) / file.name).unlink()  # a file gone
    with pytest.raises(ConfigError, match=r"cannot read t0000-emb.l0003.npz"):
        load_shards(torn, 0, 3)
    (torn / shard_dir_name(1, 2) / file.name).write_bytes(file.read_bytes()[: file.stat().st_size // 2])  # cut short
    with pytest.raises(ConfigError, match=r"cannot read t0000-emb.l0003.npz"):
        load_shards(torn, 0, 3)
    mixed = tmp_path / "mixed"  # a save killed after one server replaced its shard
    shutil.copytree(tmp_path / "one", mixed)
    shutil.rmtree(mixed / shard_dir_name(1, 2))
    shutil.copytree(tmp_path / "two" / shard_dir_name(1, 2), mixed / shard_dir_name(1, 2))
    with pytest.raises(ConfigError, match="comes from save 'two'"):
        load_shards(mixed, 0, 1)
    listed = tmp_path / "listed"  # a manifest that does not list every logical shard the server owns
    shutil.copytree(tmp_path / "one", listed)
    manifest_file = listed / shard_dir_name(0, 2) / "manifest.json"
    manifest = json.loads(manifest_file.read_text())
    del manifest["tables"]["emb"]["files"]["0"]
    manifest_file.write_text(json.dumps(manifest))
    with pytest.raises(ConfigError, match="does not list one file for each of the 512 logical shards"):
        load_shards(listed, 0, 1)


@pytest.mark.slow
def test_a_load_refuses_more_keys_than_a_shard_may_hold(tmp_path: Path) -> None:
    keys = random_keys(400, seed=9)
    owners = LogicalSharding(2).owners(keys)
    for k in range(2):
        store = HashSparseStore(spec(admit_count=1, max_keys=300))
        store.push_grad(keys[owners == k], np.ones((int((owners == k).sum()), DIM), np.float32))
        save_shard(tmp_path / "c", {"emb": store}, k, 2, {}, save_id="s")
    with pytest.raises(ConfigError, match=r"has \d+ keys for server 0 of 1, more than the 300 it may hold"):
        load_shards(tmp_path / "c", 0, 1)
    assert len(load_shards(tmp_path / "c", 0, 2)[0]["emb"]) == int((owners == 0).sum())


def test_the_save_mode_is_an_optional_trailing_field_of_save() -> None:
    """A SAVE without a mode is byte for byte the frame of before the field existed (a full
    save, as an older server reads it); with one, it is appended and read back."""
    from aps import wire
    from aps.wire.frame import FrameDecoder

    def decoded(data: bytes) -> wire.Message:
        decoder = FrameDecoder()
        decoder.receive_data(data)
        frame = decoder.next_frame()
        assert frame is not None
        return wire.decode(frame)

    plain = wire.encode_bytes(wire.Save(path="ckpt", save_id="s1"), 3)
    moded = wire.encode_bytes(wire.Save(path="ckpt", save_id="s1", mode="delta"), 3)
    assert moded[wire.HEADER_SIZE :].startswith(plain[wire.HEADER_SIZE :])  # appended after every old field
    assert len(moded) == len(plain) + 2 + len("delta")  # u16 length + UTF-8
    assert decoded(plain) == wire.Save(path="ckpt", save_id="s1", mode=None)
    assert decoded(moded) == wire.Save(path="ckpt", save_id="s1", mode="delta")


@pytest.mark.parametrize(("saved", "loaded"), [(2, 3), (3, 2)])
async def test_admission_and_eviction_counters_survive_a_reshard_summed_once(saved: int, loaded: int, tmp_path: Path) -> None:
    keys = random_keys(2000, seed=5)
    async with cluster(saved, tmp_path) as (servers, ps):
        await ps.create_table(spec())
        await train(ps, keys, seed=6)
        assert await ps.shrink("emb", threshold=1.5) > 0  # some keys evicted
        info = await ps.table_info("emb")
        counters = pending(servers)
        resets = sum(s.pending_resets for s in stores(servers))
        await ps.save("ckpt")
    assert info.admitted > 0 and info.rejected > 0 and info.evicted > 0
    async with cluster(loaded, tmp_path) as (servers, ps):
        await ps.load("ckpt")
        after = await ps.table_info("emb")
        assert (after.admitted, after.rejected, after.evicted) == (info.admitted, info.rejected, info.evicted)
        assert sum(s.pending_resets for s in stores(servers)) == resets
        assert pending(servers) == counters  # every pending key's count, on the server that owns it now
