"""FTRL-Proximal (aps.Ftrl) on the pservers against a numpy FTRL, over real TCP on port 0: sparse
fixed, hash and dense tables, its z and n state, l1's exact zeros, a checkpoint's round trip onto
another number of pservers (2 -> 3) after which training goes on as if never saved, the spec."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import aps
from aps.errors import ConfigError
from aps.specs import spec_from_dict, spec_to_dict
from aps.storage.hash.store import HashSparseStore
from aps.storage.tables import SparseShard, shard_nbytes

from .optim_reference import DenseReference, SparseReference, cluster

pytestmark = pytest.mark.timeout(120)

FTRL = aps.Ftrl(alpha=0.1, beta=1.0, l1=0.3, l2=0.5)
ROWS, DIM = 50, 4


def pushes(ids: np.ndarray, steps: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        push_ids = rng.choice(ids[: len(ids) * 3 // 4], size=20).astype(np.int64)  # repeats; a quarter never pushed
        out.append((push_ids, rng.normal(size=(20, DIM)).astype(np.float32)))
    return out


async def push_both(ps: aps.PSClient, ref: SparseReference, name: str, ids: np.ndarray, steps: int, seed: int) -> None:
    for push_ids, grads in pushes(ids, steps, seed):
        await ps.push_sparse_grad(name, push_ids, grads)
        ref.push(push_ids, grads)


def sparse_state(servers: list[aps.PServer], name: str, ids: np.ndarray, array: str) -> np.ndarray:
    """The state ``array`` of rows ``ids`` (global ids of a fixed table, or keys of a hash
    table), from the shards that hold them."""
    out = np.full((len(ids), DIM), np.nan, np.float32)
    n = len(servers)
    for s in servers:
        shard = s.core.tables[name]
        if isinstance(shard, SparseShard):
            mine = ids % n == shard.shard
            out[mine] = shard.state[array][ids[mine] // n]
        else:
            rows = shard.index.lookup(ids)
            out[rows >= 0] = shard.state[array][rows[rows >= 0]]
    assert not np.isnan(out).any()
    return out


def assert_close(got: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-7)


async def test_ftrl_on_a_fixed_table_over_two_pservers_matches_numpy() -> None:
    spec = aps.SparseTable("wide", ROWS, DIM, init=aps.Constant(0.0), optimizer=FTRL)
    ids = np.arange(ROWS, dtype=np.int64)
    async with cluster(2) as (servers, ps):
        await ps.create_table(spec)
        ref = SparseReference(FTRL, ids, np.zeros((ROWS, DIM), np.float32))
        await push_both(ps, ref, "wide", ids, steps=8, seed=1)
        got = await ps.pull_sparse("wide", ids)
        for name in ("z", "n"):
            assert_close(sparse_state(servers, "wide", ids, name), ref.state_of(name, ids))
    assert_close(got, ref.values(ids))
    touched = got[: ROWS * 3 // 4]
    assert (touched == 0).any() and (touched != 0).any()  # l1 holds some weights at exactly zero
    assert not got[ROWS * 3 // 4 :].any()


async def test_ftrl_on_a_hash_table_matches_numpy_and_starts_new_keys_fresh() -> None:
    spec = aps.HashTable("wide", DIM, init=aps.Constant(0.0), optimizer=FTRL)
    keys = np.random.default_rng(2).integers(-(1 << 62), 1 << 62, size=ROWS, dtype=np.int64)
    async with cluster(2) as (servers, ps):
        await ps.create_table(spec)
        ref = SparseReference(FTRL, keys, np.zeros((ROWS, DIM), np.float32))
        await push_both(ps, ref, "wide", keys, steps=8, seed=3)
        got = await ps.pull_sparse("wide", keys)
        stores = [s.core.tables["wide"] for s in servers]
        assert all(isinstance(st, HashSparseStore) and set(st.state) == {"z", "n"} for st in stores)
    assert_close(got, ref.values(keys))


async def test_ftrl_on_a_dense_table_matches_numpy() -> None:
    opt = aps.Ftrl(alpha=0.2, beta=0.5, l1=0.1, l2=0.2)
    spec = aps.DenseTable("wide.dense", (13, 1), init=aps.Constant(0.0), optimizer=opt)
    rng = np.random.default_rng(4)
    async with cluster(2) as (_, ps):
        await ps.create_table(spec)
        ref = DenseReference(opt, np.zeros(13, np.float32))
        for _ in range(6):
            grad = rng.normal(size=(13, 1)).astype(np.float32)
            await ps.push_dense_grad("wide.dense", grad)
            ref.push(grad)
        got = await ps.pull_dense("wide.dense")
    assert_close(got.ravel(), ref.values)


@pytest.mark.parametrize("kind", ["fixed", "hash"])
async def test_ftrl_state_survives_a_checkpoint_onto_three_pservers(kind: str, tmp_path: Path) -> None:
    opt = aps.Ftrl(alpha=0.1, l1=0.05, clip_norm=2.0)
    if kind == "fixed":
        spec: aps.SparseTable | aps.HashTable = aps.SparseTable("wide", ROWS, DIM, init=aps.Constant(0.0), optimizer=opt)
    else:
        spec = aps.HashTable("wide", DIM, init=aps.Constant(0.0), optimizer=opt)
    ids = np.arange(ROWS, dtype=np.int64) * 7919  # hash keys spread over the logical shards
    ids = ids if kind == "hash" else ids // 7919
    ref = SparseReference(spec.optimizer, ids, np.zeros((ROWS, DIM), np.float32))
    async with cluster(2, tmp_path) as (servers, ps):
        await ps.create_table(spec)
        await push_both(ps, ref, "wide", ids, steps=5, seed=5)
        if kind == "hash":  # a hash table holds the pushed keys only
            ids = ids[np.array([ref.t[int(i)] > 0 for i in ids])]
        saved = {name: sparse_state(servers, "wide", ids, name) for name in ("z", "n")}
        await ps.save("ckpt")
    async with cluster(3, tmp_path) as (servers, ps):
        await ps.load("ckpt")
        for name, want in saved.items():
            assert sparse_state(servers, "wide", ids, name).tobytes() == want.tobytes()
        await push_both(ps, ref, "wide", ids, steps=5, seed=6)  # training goes on from the loaded z and n
        got = await ps.pull_sparse("wide", ids)
        for name in ("z", "n"):
            assert_close(sparse_state(servers, "wide", ids, name), ref.state_of(name, ids))
    assert_close(got, ref.values(ids))
    assert ref.state_of("n", ids)[: ROWS // 2].min() > 0  # the rows pushed before and after hold state


def test_ftrl_clips_the_gradient_and_keeps_two_state_arrays() -> None:
    opt = aps.Ftrl(alpha=0.5, l2=1.0, clip_norm=0.5)
    shard = SparseShard(aps.SparseTable("wide", 3, 2, init=aps.Constant(0.0), optimizer=opt), 0, 1)
    ids = np.array([0, 2, 2], np.int64)
    ref = SparseReference(opt, np.arange(3, dtype=np.int64), np.zeros((3, 2), np.float32))
    grads = np.array([[3, -4], [0.1, 0.1], [0.05, 0.0]], np.float32)
    for scale in (1.0, 0.5, 2.0):
        shard.push_grad(ids, grads, scale=scale)
        ref.push(ids, grads, scale=scale)
    assert_close(shard.values, ref.values(np.arange(3)))
    assert_close(shard.state["n"][0], [0.09 * 3, 0.16 * 3])  # |(3, -4)| = 5 clipped to 0.5 each time
    assert shard_nbytes(shard.spec, 0, 1) == 3 * 2 * 4 * 3


def test_the_ftrl_spec_round_trips_and_is_checked() -> None:
    for spec in (aps.SparseTable("w", 3, 1, optimizer=FTRL), aps.HashTable("w", 1, optimizer=aps.Ftrl(clip_norm=1)),
                 aps.DenseTable("w", (2,), optimizer=aps.Ftrl())):
        assert spec_from_dict(spec_to_dict(spec)) == spec
    assert spec_to_dict(FTRL) == {"type": "Ftrl", "alpha": 0.1, "beta": 1.0, "l1": 0.3, "l2": 0.5, "clip_norm": None}
    with pytest.raises(ConfigError, match="Ftrl: alpha must be a positive finite number, got 0.0"):
        aps.Ftrl(alpha=0)
    with pytest.raises(ConfigError, match="Ftrl: l1 must be >= 0, got -0.1"):
        aps.Ftrl(l1=-0.1)
    with pytest.raises(ConfigError, match="Ftrl: l2 must be >= 0"):
        aps.Ftrl(l2=-1)
    with pytest.raises(ConfigError, match="Ftrl: beta must be a number, got 'x'"):
        aps.Ftrl(beta="x")
