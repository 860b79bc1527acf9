"""Row-wise Adagrad (``aps.Adagrad(rowwise=True)``): one accumulator a row taking the mean of the
row's squared gradient, one step size for the row. Checked against numpy on the kernel, and over
the wire on fixed and hash tables, through a save on 2 pservers and a load on 3."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import aps
from aps.errors import ConfigError
from aps.specs import spec_from_dict, spec_to_dict
from aps.storage import optim
from aps.storage.hash.store import HashSparseStore, row_nbytes
from tests.checkpoints.test_hash_checkpoint import cluster

pytestmark = pytest.mark.timeout(90)

DIM = 4
ROWWISE = aps.Adagrad(lr=0.1, epsilon=1e-6, initial_accumulator=0.1, rowwise=True)


def reference(values: np.ndarray, acc: np.ndarray, ids: np.ndarray, grads: np.ndarray, opt: aps.Adagrad) -> None:
    """Row-wise Adagrad in numpy, in place: repeated ids' gradients summed first."""
    for row in np.unique(ids):
        g = grads[ids == row].sum(axis=0, dtype=np.float64)
        acc[row, 0] = np.float64(acc[row, 0]) + np.mean(g * g)
        values[row] -= (opt.lr * g / (np.sqrt(np.float64(acc[row, 0])) + opt.epsilon)).astype(np.float32)


def test_the_kernel_takes_one_accumulator_a_row() -> None:
    rng = np.random.default_rng(3)
    values = rng.normal(size=(10, DIM)).astype(np.float32)
    state = optim.new_sparse_state(ROWWISE, 10, DIM)
    assert state["acc"].shape == (10, 1) and (state["acc"] == 0.1).all()
    want_values, want_acc = values.copy(), state["acc"].copy()
    for _ in range(5):
        ids = rng.integers(0, 10, 12).astype(np.int64)  # unsorted, with repeats
        grads = rng.normal(size=(12, DIM)).astype(np.float32)
        optim.apply_sparse(ROWWISE, values, state, ids, grads, 1.0, 0)
        reference(want_values, want_acc, ids, grads, ROWWISE)
    np.testing.assert_allclose(values, want_values, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(state["acc"], want_acc, rtol=1e-5)
    # per-coordinate Adagrad moves the coordinates of a row by different steps; row-wise by one
    flat = aps.Adagrad(lr=0.1)
    row = np.zeros((1, DIM), np.float32)
    optim.apply_sparse(ROWWISE, row, optim.new_sparse_state(ROWWISE, 1, DIM), np.zeros(1, np.int64),
                       np.array([[1.0, 2.0, 3.0, 4.0]], np.float32), 1.0, 0)
    ratio = row[0] / np.array([1.0, 2.0, 3.0, 4.0])
    np.testing.assert_allclose(ratio, ratio[0], rtol=1e-6)
    assert optim.new_sparse_state(flat, 3, DIM)["acc"].shape == (3, DIM)


def test_a_hash_row_is_smaller_by_the_accumulators_it_no_longer_keeps() -> None:
    per_coordinate = aps.HashTable("emb", dim=16, optimizer=aps.Adagrad(lr=0.05))
    rowwise = aps.HashTable("emb", dim=16, optimizer=aps.Adagrad(lr=0.05, rowwise=True))
    assert row_nbytes(per_coordinate) - row_nbytes(rowwise) == 4 * 16 - 4
    store = HashSparseStore(rowwise)
    store.push_grad(np.arange(100, dtype=np.int64), np.ones((100, 16), np.float32))
    assert store.state["acc"].shape[1] == 1 and len(store) == 100


def test_rowwise_is_checked_and_travels_in_the_spec() -> None:
    with pytest.raises(ConfigError, match="rowwise must be true or false"):
        aps.Adagrad(rowwise="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="dense table has no rows"):
        aps.DenseTable("fc", shape=(4, 4), optimizer=ROWWISE)
    table = aps.HashTable("emb", dim=DIM, optimizer=ROWWISE)
    assert spec_from_dict(spec_to_dict(table)) == table
    saved = spec_to_dict(aps.SparseTable("emb", rows=8, dim=DIM, optimizer=aps.Adagrad(lr=0.1)))
    saved["optimizer"].pop("rowwise")  # a spec saved before the option existed
    assert spec_from_dict(saved).optimizer.rowwise is False


@pytest.mark.parametrize("kind", ["fixed", "hash"])
async def test_rowwise_adagrad_over_the_wire_and_across_a_reshard(kind: str, tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    if kind == "hash":
        spec = aps.HashTable("emb", dim=DIM, optimizer=ROWWISE)
        ids = rng.choice(1 << 40, 50, replace=False).astype(np.int64)
    else:
        spec = aps.SparseTable("emb", rows=50, dim=DIM, optimizer=ROWWISE)
        ids = np.arange(50, dtype=np.int64)
    async with cluster(2, tmp_path) as (_, ps):
        await ps.create_table(spec)
        values = (await ps.pull_sparse("emb", ids)).copy()
        acc = np.full((50, 1), 0.1, np.float32)
        for _ in range(3):
            picks = rng.integers(0, 50, 80)
            grads = rng.normal(size=(80, DIM)).astype(np.float32)
            await ps.push_sparse_grad("emb", ids[picks], grads)
            reference(values, acc, picks, grads, ROWWISE)
        np.testing.assert_allclose(await ps.pull_sparse("emb", ids), values, rtol=1e-5, atol=1e-6)
        await ps.save("ckpt")
    async with cluster(3, tmp_path) as (_, ps):
        await ps.load("ckpt")
        np.testing.assert_allclose(await ps.pull_sparse("emb", ids), values, rtol=1e-5, atol=1e-6)
        # the accumulators came back too: the next push steps as the reference does
        grads = rng.normal(size=(50, DIM)).astype(np.float32)
        await ps.push_sparse_grad("emb", ids, grads)
        reference(values, acc, np.arange(50), grads, ROWWISE)
        np.testing.assert_allclose(await ps.pull_sparse("emb", ids), values, rtol=1e-5, atol=1e-6)


def test_a_fixed_shard_of_rowwise_adagrad_is_sized_by_its_one_accumulator_a_row() -> None:
    from aps.storage.tables import make_shard, shard_nbytes

    for optimizer in (aps.Adagrad(lr=0.1), ROWWISE, aps.Adam(lr=0.1)):
        spec = aps.SparseTable("emb", rows=1000, dim=16, optimizer=optimizer)
        shard = make_shard(spec, 0, 2)
        assert shard_nbytes(spec, 0, 2) == shard.values.nbytes + sum(a.nbytes for a in shard.state.values())
