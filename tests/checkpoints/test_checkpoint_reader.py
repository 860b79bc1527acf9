"""aps.read_checkpoint: a checkpoint saved by two pservers (real TCP on port 0) reads back as
the arrays the live cluster serves."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import aps
from tests.server.optim_reference import cluster

SPARSE = aps.SparseTable("emb", rows=7, dim=3, init=aps.Uniform(-1.0, 1.0), optimizer=aps.SGD(lr=0.5), seed=1)
DENSE = aps.DenseTable("fc/w", shape=(5, 4), init=aps.Normal(0.0, 1.0), optimizer=aps.SGD(lr=0.5), seed=2)
HASHED = aps.HashTable("ctr", dim=2, init=aps.Uniform(-1.0, 1.0), optimizer=aps.SGD(lr=0.5), seed=3)


async def test_a_two_shard_checkpoint_reads_back_as_the_live_tables(tmp_path: Path) -> None:
    async with cluster(2, tmp_path) as (_, ps):
        for spec in (SPARSE, DENSE):
            await ps.create_table(spec)
        await ps.push_sparse_grad("emb", [1, 4, 6], np.arange(9, dtype=np.float32).reshape(3, 3))
        await ps.push_dense_grad("fc/w", np.ones((5, 4), np.float32))
        await ps.save("ckpt", extra={"epoch": 3})
        live_emb = await ps.pull_sparse("emb", np.arange(7))
        live_fc = await ps.pull_dense("fc/w")

    saved = aps.read_checkpoint(tmp_path / "ckpt")
    assert sorted(saved.specs) == ["emb", "fc/w"] and saved.extra == {"epoch": 3}
    assert saved.spec("fc/w").shape == (5, 4)
    np.testing.assert_array_equal(saved.array("emb"), live_emb)
    np.testing.assert_array_equal(saved.array("fc/w"), live_fc)
    assert set(saved.arrays()) == {"emb", "fc/w"}
    np.testing.assert_array_equal(saved.pull("emb", [6, 1]), live_emb[[6, 1]])
    with pytest.raises(aps.ConfigError, match=r"has no table 'nope' \(has \['emb', 'fc/w'\]\)"):
        saved.array("nope")
    with pytest.raises(aps.ConfigError, match="dense table"):
        saved.pull("fc/w", [0])


@pytest.mark.slow  # a hash table saves and reads 1024 files (a few seconds on a loaded machine)
async def test_a_hash_table_answers_pulls_as_its_pserver(tmp_path: Path) -> None:
    """Its keys, and pulls as the pserver answers them (a key it does not hold: its initial row);
    one pserver, as a hash table saves a file per logical shard of each."""
    held = np.array([3, 10**12, -5, 77], np.int64)
    asked = np.concatenate([held, [42, -1]])
    async with cluster(1, tmp_path) as (_, ps):
        await ps.create_table(HASHED)
        await ps.push_sparse_grad("ctr", held, np.full((4, 2), 2.0, np.float32))
        await ps.save("ckpt")
        live = await ps.pull_sparse("ctr", asked)
    saved = aps.read_checkpoint(tmp_path / "ckpt")
    np.testing.assert_array_equal(saved.keys("ctr"), np.sort(held))
    np.testing.assert_array_equal(saved.pull("ctr", asked), live)
    assert saved.arrays() == {}
    with pytest.raises(aps.ConfigError, match="hash table"):
        saved.array("ctr")


async def test_only_the_named_tables_are_read(tmp_path: Path) -> None:
    async with cluster(2, tmp_path) as (_, ps):
        for spec in (SPARSE, DENSE):
            await ps.create_table(spec)
        await ps.save("ckpt")
        live = await ps.pull_sparse("emb", np.arange(7))
    saved = aps.read_checkpoint(tmp_path / "ckpt", tables=["emb"])
    assert list(saved.specs) == ["emb"]
    np.testing.assert_array_equal(saved.array("emb"), live)
    with pytest.raises(aps.ConfigError, match=r"has no table 'emb_w' \(has \['emb', 'fc/w'\]\)"):
        aps.read_checkpoint(tmp_path / "ckpt", tables=["emb", "emb_w"])
    with pytest.raises(aps.ConfigError):
        aps.read_checkpoint(tmp_path / "nothing")
