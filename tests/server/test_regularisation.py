"""L2 decay (``l2``) and gradient clipping by norm (``clip_norm``) on the pservers, against numpy:
every optimizer on sparse fixed, hash and dense tables over real TCP on port 0; only the rows a
push touches decay (lazy); a clip is per row, whatever the sharding; the spec fields travel."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import aps
from aps.errors import ConfigError, ErrorCode, ServerError
from aps.specs import spec_from_dict, spec_to_dict
from aps.storage.tables import SparseShard

from .optim_reference import DenseReference, SparseReference, cluster

pytestmark = pytest.mark.timeout(120)

ROWS, DIM = 40, 3
OPTIMIZERS = {
    "sgd": aps.SGD(lr=0.1, l2=0.5),
    "adagrad": aps.Adagrad(lr=0.1, initial_accumulator=0.1, l2=0.5),
    "adam-row": aps.Adam(lr=0.05, epsilon=1e-3, l2=0.5),
    "adam-step": aps.Adam(lr=0.05, epsilon=1e-3, bias_correction="step", l2=0.5),
}


def pushes(ids_from: np.ndarray, steps: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Random pushes over a part of ``ids_from`` (so some rows are never touched), with repeats."""
    rng = np.random.default_rng(seed)
    touched = ids_from[: len(ids_from) // 2]
    out = []
    for _ in range(steps):
        ids = rng.choice(touched, size=12).astype(np.int64)
        out.append((ids, rng.normal(size=(12, DIM)).astype(np.float32)))
    return out


async def train_sparse(ps: aps.PSClient, spec: aps.SparseTable | aps.HashTable, ids: np.ndarray, steps: int = 6) -> tuple[np.ndarray, SparseReference]:
    """Push the same gradients to the pservers and to numpy; returns the pulled rows and numpy's."""
    await ps.create_table(spec)
    ref = SparseReference(spec.optimizer, ids, await ps.pull_sparse(spec.name, ids))
    for push_ids, grads in pushes(ids, steps, seed=3):
        await ps.push_sparse_grad(spec.name, push_ids, grads)
        ref.push(push_ids, grads)
    return await ps.pull_sparse(spec.name, ids), ref


@pytest.mark.parametrize("name", OPTIMIZERS)
async def test_l2_on_a_fixed_sparse_table_decays_only_the_pushed_rows(name: str) -> None:
    opt = OPTIMIZERS[name]
    spec = aps.SparseTable("emb", ROWS, DIM, init=aps.Uniform(-1.0, 1.0), optimizer=opt)
    ids = np.arange(ROWS, dtype=np.int64)
    async with cluster(2) as (_, ps):
        got, ref = await train_sparse(ps, spec, ids)
    np.testing.assert_allclose(got, ref.values(ids), rtol=2e-6, atol=2e-7)
    untouched = ids[ROWS // 2 :]
    np.testing.assert_array_equal(got[untouched], ref.initial[untouched])  # never pushed: no decay
    plain = SparseReference(dataclasses.replace(opt, l2=0.0), ids, ref.initial)
    for push_ids, grads in pushes(ids, 6, seed=3):
        plain.push(push_ids, grads)
    touched = ids[: ROWS // 2]
    assert np.abs(got[touched] - plain.values(touched)).max() > 1e-2  # the decay made a difference


@pytest.mark.parametrize("name", OPTIMIZERS)
async def test_l2_on_a_hash_table_matches_numpy(name: str) -> None:
    spec = aps.HashTable("emb", DIM, init=aps.Uniform(-1.0, 1.0), optimizer=OPTIMIZERS[name])
    keys = np.random.default_rng(0).integers(-(1 << 62), 1 << 62, size=ROWS, dtype=np.int64)
    async with cluster(2) as (_, ps):
        got, ref = await train_sparse(ps, spec, keys)
    np.testing.assert_allclose(got, ref.values(keys), rtol=2e-6, atol=2e-7)


@pytest.mark.parametrize("name", OPTIMIZERS)
async def test_l2_on_a_dense_table_in_two_blocks_matches_numpy(name: str) -> None:
    spec = aps.DenseTable("w", (3, 4000), init=aps.Normal(0.0, 1.0), optimizer=OPTIMIZERS[name])
    rng = np.random.default_rng(1)
    async with cluster(2) as (servers, ps):
        await ps.create_table(spec)
        assert all(len(s.core.tables["w"].blocks) == 1 for s in servers)  # one block on each
        ref = DenseReference(spec.optimizer, await ps.pull_dense("w"))
        for _ in range(5):
            grad = rng.normal(size=spec.shape).astype(np.float32)
            await ps.push_dense_grad("w", grad)
            ref.push(grad)
        got = await ps.pull_dense("w")
    np.testing.assert_allclose(got.ravel(), ref.values, rtol=2e-6, atol=2e-7)


def test_l2_decays_a_row_towards_zero_with_a_zero_gradient() -> None:
    """The decay term alone: SGD with l2 and a zero gradient shrinks a pushed row by (1 - lr l2)."""
    shard = SparseShard(aps.SparseTable("emb", 4, 2, init=aps.Constant(2.0), optimizer=aps.SGD(lr=0.1, l2=0.5)), 0, 1)
    shard.push_grad(np.array([1, 1], np.int64), np.zeros((2, 2), np.float32))
    np.testing.assert_allclose(shard.values, [[2, 2], [1.9, 1.9], [2, 2], [2, 2]], rtol=1e-6)


@pytest.mark.parametrize("n", [1, 2])
async def test_clip_norm_scales_each_pushed_row_to_at_most_the_norm(n: int) -> None:
    opt = aps.SGD(lr=1.0, clip_norm=1.0)
    spec = aps.SparseTable("emb", 6, 2, init=aps.Constant(0.0), optimizer=opt)
    ids = np.array([0, 1, 1, 2, 5], np.int64)
    grads = np.array([[3, 4], [0.3, 0.4], [0.3, 0.4], [0.1, 0.1], [-6, 8]], np.float32)
    async with cluster(n) as (_, ps):
        await ps.create_table(spec)
        await ps.push_sparse_grad("emb", ids, grads)
        got = await ps.pull_sparse("emb", np.arange(6, dtype=np.int64))
    # row 0: |(3,4)| = 5 -> (0.6, 0.8); row 1: (0.6, 0.8) summed, norm exactly 1, kept;
    # row 2 under the norm, kept; row 5: |(-6,8)| = 10 -> (-0.6, 0.8); the others untouched
    expected = -np.array([[0.6, 0.8], [0.6, 0.8], [0.1, 0.1], [0, 0], [0, 0], [-0.6, 0.8]])
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)


def test_clip_applies_to_the_scaled_gradient_and_before_the_decay() -> None:
    """Sync mode scales by 1 / trainers before the clip; l2's term is added after, unclipped."""
    opt = aps.Adagrad(lr=0.1, l2=0.25, clip_norm=0.5)
    spec = aps.SparseTable("emb", 3, 2, init=aps.Uniform(-1, 1), optimizer=opt)
    shard = SparseShard(spec, 0, 1)
    ids = np.arange(3, dtype=np.int64)
    ref = SparseReference(opt, ids, shard.values.copy())
    rng = np.random.default_rng(5)
    for _ in range(4):
        grads = (rng.normal(size=(3, 2)) * [[0.1], [1.0], [10.0]]).astype(np.float32)
        shard.push_grad(ids, grads, scale=0.5)
        ref.push(ids, grads, scale=0.5)
    np.testing.assert_allclose(shard.values, ref.values(ids), rtol=2e-6, atol=2e-7)


async def test_the_fields_travel_to_the_pservers_and_name_the_table() -> None:
    spec = aps.SparseTable("emb", 10, 2, optimizer=aps.Adam(l2=1e-4, clip_norm=5.0))
    async with cluster(2) as (servers, ps):
        await ps.create_table(spec)
        assert {s.core.tables["emb"].spec for s in servers} == {spec}
        other = aps.SparseTable("emb", 10, 2, optimizer=aps.Adam(l2=1e-3, clip_norm=5.0))
        with pytest.raises(ServerError) as err:
            await ps.create_table(other)  # another l2 is another table
        assert err.value.code == ErrorCode.TABLE_EXISTS


def test_the_spec_fields_round_trip_default_and_are_checked() -> None:
    for opt in (*OPTIMIZERS.values(), aps.SGD(clip_norm=2)):
        spec = aps.SparseTable("emb", 3, 1, optimizer=opt)
        assert spec_from_dict(spec_to_dict(spec)) == spec
    old = spec_to_dict(aps.HashTable("emb", 1, optimizer=aps.Adagrad()))
    del old["optimizer"]["l2"], old["optimizer"]["clip_norm"]  # a spec written before the fields
    assert spec_from_dict(old).optimizer == aps.Adagrad(l2=0.0, clip_norm=None)
    assert aps.SGD(clip_norm=2).clip_norm == 2.0 and isinstance(aps.SGD(clip_norm=2).clip_norm, float)
    with pytest.raises(ConfigError, match="SGD: l2 must be >= 0, got -1.0"):
        aps.SGD(l2=-1)
    with pytest.raises(ConfigError, match="Adam: clip_norm must be a positive number or null, got 0.0"):
        aps.Adam(clip_norm=0)
    with pytest.raises(ConfigError, match="Adagrad: clip_norm must be a number, got 'x'"):
        aps.Adagrad(clip_norm="x")
    with pytest.raises(ConfigError, match="table 'w': clip_norm clips each row of a sparse table"):
        aps.DenseTable("w", (4,), optimizer=aps.SGD(clip_norm=1.0))
    assert aps.DenseTable("w", (4,), optimizer=aps.SGD(l2=0.1)).optimizer.l2 == 0.1
