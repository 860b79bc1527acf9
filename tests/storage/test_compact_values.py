"""Hash tables whose values are stored in float16 (``HashTable(dtype="float16")``): every push
computes in float32 on the stored values and writes back rounded to nearest, bit for bit what
the float32 kernels give rounded after each push; pulls, GEO's changed rows, a save on 2
pservers loaded on 3, and aps-serve over an export all read the same rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import aps
from aps.errors import ConfigError
from aps.serving.server import serve_exports
from aps.specs import spec_from_dict, spec_to_dict
from aps.storage import optim
from aps.storage.hash.store import HashSparseStore, row_nbytes
from tests.checkpoints.test_hash_checkpoint import cluster

pytestmark = pytest.mark.timeout(90)

DIM = 8
OPTIMIZERS = [aps.Adagrad(lr=0.05), aps.Adagrad(lr=0.05, rowwise=True), aps.Adam(lr=0.01), aps.SGD(lr=0.1)]


def table(optimizer: object = OPTIMIZERS[1], **fields: object) -> aps.HashTable:
    """A float16 table unless ``dtype`` says otherwise."""
    fields = {"dtype": "float16", **fields}
    return aps.HashTable("emb", dim=DIM, init=aps.Uniform(-0.1, 0.1), optimizer=optimizer, **fields)  # type: ignore[arg-type]


class Float16Reference:
    """The float16 rule written plainly: a float32 copy of a row set, the float32 kernel, then
    every touched row rounded to float16."""

    def __init__(self, spec: aps.HashTable, keys: np.ndarray, initial: np.ndarray) -> None:
        self.spec, self.keys = spec, keys
        self.values = initial.astype(np.float16).astype(np.float32)
        self.state = optim.new_sparse_state(spec.optimizer, len(keys), DIM)
        self.step = 0

    def push(self, picks: np.ndarray, grads: np.ndarray) -> None:
        optim.apply_sparse(self.spec.optimizer, self.values, self.state, picks.astype(np.int64), grads, 1.0, self.step)
        self.values = self.values.astype(np.float16).astype(np.float32)
        self.step += 1


@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=lambda o: f"{type(o).__name__}{'-rowwise' if getattr(o, 'rowwise', 0) else ''}")
def test_a_float16_store_computes_in_float32_and_rounds_each_push(optimizer: object) -> None:
    rng = np.random.default_rng(1)
    spec = table(optimizer)
    store = HashSparseStore(spec)
    keys = rng.choice(1 << 50, 40, replace=False).astype(np.int64)
    fresh = store.pull(keys)  # unknown keys read the initial row a push would store: rounded
    assert np.array_equal(fresh, fresh.astype(np.float16).astype(np.float32))
    reference = Float16Reference(spec, keys, HashSparseStore(table(optimizer, dtype="float32")).pull(keys))
    for _ in range(6):
        picks = rng.integers(0, 40, 60)  # repeats, unsorted
        grads = rng.normal(size=(60, DIM)).astype(np.float32)
        store.push_grad(keys[picks], grads)
        reference.push(picks, grads)
    assert store.values.dtype == np.float16
    assert np.array_equal(store.pull(keys), reference.values)  # bit for bit
    pulled = store.pull(keys)
    assert pulled.dtype == np.float32


def test_deltas_add_in_float32_and_round_and_huge_values_saturate() -> None:
    store = HashSparseStore(table(aps.SGD(lr=1.0)))
    keys = np.array([3, 5], np.int64)
    start = store.pull(keys)
    store.push_delta(keys, np.full((2, DIM), 1e-3, np.float32))
    assert np.array_equal(store.pull(keys), (start + np.float32(1e-3)).astype(np.float16).astype(np.float32))
    store.push_grad(keys, np.full((2, DIM), -1e6, np.float32))  # SGD at lr 1: +1e6, past float16's range
    assert (store.pull(keys) == 65504.0).all()


def test_a_float16_row_takes_half_the_value_bytes_and_the_dtype_is_checked() -> None:
    assert row_nbytes(table(dtype="float32")) - row_nbytes(table()) == 2 * DIM
    with pytest.raises(ConfigError, match="dtype must be one of float32, float16"):
        table(dtype="int8")
    assert spec_from_dict(spec_to_dict(table())) == table()
    saved = spec_to_dict(table(dtype="float32"))
    saved.pop("dtype")  # a spec saved before the option existed
    assert spec_from_dict(saved).dtype == "float32"


async def test_float16_rows_over_the_wire_across_a_reshard_and_served(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    spec = table(base_threshold=0.0)
    keys = rng.choice(1 << 50, 200, replace=False).astype(np.int64)
    async with cluster(2, tmp_path) as (_, ps):
        await ps.create_table(spec)
        await ps.pull_sparse_changed("emb")  # registers this client for GEO's changed-row reads
        for _ in range(3):
            picks = rng.integers(0, 200, 300)
            await ps.push_sparse_grad("emb", keys[picks], rng.normal(size=(300, DIM)).astype(np.float32))
        rows = await ps.pull_sparse("emb", keys)
        assert np.array_equal(rows, rows.astype(np.float16).astype(np.float32))
        changed_keys, changed = await ps.pull_sparse_changed("emb")  # the keys this client admitted
        assert changed.dtype == np.float32 and 0 < len(changed_keys) <= len(keys)
        position = {int(k): i for i, k in enumerate(keys)}
        assert np.array_equal(changed, rows[[position[int(k)] for k in changed_keys]])
        # the same keys in a float32 twin: the float16 table reserves less of the pservers' RAM
        await ps.create_table(aps.HashTable("emb32", dim=DIM, init=spec.init, optimizer=spec.optimizer))
        await ps.push_sparse_grad("emb32", keys, np.ones((200, DIM), np.float32))
        info, twin = await ps.table_info("emb"), await ps.table_info("emb32")
        assert info.disk_bytes == 0 == twin.disk_bytes  # both keep every row in RAM
        assert 0 < info.ram_bytes == info.bytes < twin.ram_bytes
        await ps.save("ckpt")
        await ps.export("ex", kind="base")
    async with cluster(3, tmp_path) as (servers, ps):
        await ps.load("ckpt")
        assert all(s.core.tables["emb"].values.dtype == np.float16 for s in servers)
        assert np.array_equal(await ps.pull_sparse("emb", keys), rows)
    server = await serve_exports(tmp_path / "ex", poll=60.0)
    try:
        async with aps.connect([server.address]) as client:
            assert np.array_equal(await client.pull_sparse("emb", keys), rows)
    finally:
        await server.aclose()
