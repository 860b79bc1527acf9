"""A base save and its delta saves loaded together (``ps.load(base, deltas=[...])``): 2 pservers
save, 3 load, and every key a save wrote has the row the savers held at the last delta."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import aps
from aps.errors import ServerError
from aps.sharding import LogicalSharding
from tests.checkpoints.test_hash_checkpoint import DIM, cluster, held, pending, random_keys, spec

pytestmark = pytest.mark.timeout(60)


async def push(ps: aps.PSClient, keys: np.ndarray, seed: int) -> None:
    """One push: every occurrence counts one show (delta score 0.1 >= the threshold below)."""
    grads = np.random.default_rng(seed).standard_normal((len(keys), DIM)).astype(np.float32)
    await ps.push_sparse_grad("emb", keys, grads)


@pytest.mark.slow
async def test_a_base_and_its_deltas_load_onto_another_cluster_with_the_rows_of_the_last_delta(tmp_path: Path) -> None:
    keys = random_keys(1500, seed=21)
    async with cluster(2, tmp_path) as (servers, ps):
        await ps.create_table(spec(delta_threshold=0.05))
        await ps.create_table(aps.DenseTable("w", shape=(3, 4)))
        for _ in range(2):  # admit_count=2: twice to be admitted
            await push(ps, keys[:1000], seed=1)
        await ps.save("base", mode="base")
        await push(ps, keys[500:1250], seed=2)  # changes some base keys, and counts new ones
        await push(ps, keys[1000:1250], seed=3)  # ... which are admitted now
        await ps.push_dense_grad("w", np.ones((3, 4), np.float32))
        await ps.save("d1", mode="delta")
        await push(ps, keys[250:400], seed=4)
        await push(ps, keys[1450:], seed=5)  # counted, not admitted
        await ps.save("d2", mode="delta")
        before, counters = held(servers), pending(servers)
        info = await ps.table_info("emb")
        rows, dense = await ps.pull_sparse("emb", keys), await ps.pull_dense("w")

    async with cluster(3, tmp_path) as (servers, ps):
        await ps.load("base", deltas=["d1", "d2"])
        after = held(servers)
        # the pservers reset a saved key's delta score once its save was in place; the files
        # hold it as it was when written
        for name in sorted(set(before) - {"delta_score"}):
            assert after[name].tobytes() == before[name].tobytes(), name
        assert pending(servers) == counters
        assert (await ps.pull_sparse("emb", keys)).tobytes() == rows.tobytes()
        assert (await ps.pull_dense("w")).tobytes() == dense.tobytes()
        loaded = await ps.table_info("emb")
        assert (loaded.keys, loaded.admitted, loaded.rejected, loaded.evicted) == (info.keys, info.admitted, info.rejected, info.evicted)

        # the chain is checked (from the manifests, before any table file is read): a delta
        # left out, deltas out of order, deltas onto another delta, a base as a delta
        for deltas in (["d2"], ["d2", "d1"]):
            with pytest.raises(ServerError, match="missing from the list or they are out of order"):
                await ps.load("base", deltas=deltas)
        with pytest.raises(ServerError, match="is a delta save: deltas apply onto a base save"):
            await ps.load("d1", deltas=["d2"])
        with pytest.raises(ServerError, match="is a base save, not a delta"):
            await ps.load("base", deltas=["base"])


def logical_files(root: Path) -> list[Path]:
    return sorted(root.glob("shard-*/*.npz"))


def listed_deleted(root: Path) -> np.ndarray:
    """Every key a save's files list as deleted, sorted."""
    return np.sort(np.concatenate([np.load(f)["deleted_keys"] for f in logical_files(root)]))


def as_written_before_deletions(root: Path) -> None:
    """Make a delta save look like one written before deltas listed deleted keys: no
    ``deleted_keys`` in its files, no ``deleted`` counts in its manifests."""
    for file in logical_files(root):
        with np.load(file) as saved:
            arrays = {name: saved[name] for name in saved.files if name != "deleted_keys"}
        with open(file, "wb") as f:
            np.savez(f, allow_pickle=False, **arrays)
    for path in root.glob("shard-*/manifest.json"):
        manifest = json.loads(path.read_text())
        for entry in manifest["tables"].values():
            entry.pop("deleted", None)
        path.write_text(json.dumps(manifest))


@pytest.mark.slow
async def test_a_delta_drops_the_keys_deleted_since_the_save_before_it_and_an_old_delta_drops_none(tmp_path: Path) -> None:
    keys = random_keys(600, seed=31)
    async def push_shows(ids: np.ndarray, shows: float, seed: int) -> None:
        grads = np.random.default_rng(seed).standard_normal((len(ids), DIM)).astype(np.float32)
        await ps.push_sparse_grad("emb", ids, grads, shows=np.full(len(ids), shows, np.float32))

    async with cluster(2, tmp_path) as (servers, ps):
        await ps.create_table(spec(admit_count=1, base_threshold=0.0, delta_threshold=0.15))
        await push_shows(keys, 1.0, seed=1)
        await ps.save("base", mode="base")  # every key
        await push_shows(keys[:300], 2.0, seed=2)  # delta score 0.2: in the delta
        assert await ps.shrink("emb", threshold=0.15) == 300  # keys[300:] score 0.098: deleted
        await push_shows(keys[300:350], 2.0, seed=3)  # admitted again, delta score 0.2: in the delta
        await push_shows(keys[350:400], 1.0, seed=4)  # admitted again, 0.1: the delta has no row of theirs
        await ps.save("d1", mode="delta")
        info = await ps.table_info("emb")
        before = held(servers)
        assert info.keys == 400
    saved = np.isin(before["keys"], keys[:350])
    # the keys deleted since the base whose rows the delta does not write, each in its logical shard's file
    np.testing.assert_array_equal(listed_deleted(tmp_path / "d1"), np.sort(keys[350:]))
    for file in logical_files(tmp_path / "d1"):
        gone = np.load(file)["deleted_keys"]
        assert (LogicalSharding.logical(gone) == int(file.name.split(".l")[-1][:4])).all()

    async with cluster(3, tmp_path) as (servers, ps):
        await ps.load("base", deltas=["d1"])
        after = held(servers)
        np.testing.assert_array_equal(after["keys"], np.sort(keys[:350]))
        for name in sorted(set(before) - {"delta_score"}):
            assert after[name].tobytes() == before[name][saved].tobytes(), name
        assert (await ps.table_info("emb")).evicted == info.evicted

        # a delta from before deletions were listed loads, deleting nothing
        shutil.copytree(tmp_path / "d1", tmp_path / "d1-old")
        as_written_before_deletions(tmp_path / "d1-old")
        await ps.load("base", deltas=["d1-old"])
        after = held(servers)
        np.testing.assert_array_equal(after["keys"], np.sort(keys))
        for name in sorted(set(before) - {"delta_score"}):
            assert after[name][np.isin(after["keys"], keys[:350])].tobytes() == before[name][saved].tobytes(), name
