"""bfloat16 rows (``HashTable(dtype="bfloat16")``) and optimizer state
(``HashTable(state_dtype="bfloat16")``): the rounding against a plain reference of the format, each
push computed in float32 and written back rounded (bit for bit what the float32 kernels give
rounded after each push), and the rows read alike over the wire, across a reshard, from GEO's
changed rows, from aps-serve and from a disk table."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import aps
from aps.errors import ConfigError
from aps.serving.server import serve_exports
from aps.storage import optim
from aps.storage.hash.compact import decode, encode, gather_decoded, read_rows
from aps.storage.hash.store import HashSparseStore, row_nbytes
from tests.checkpoints.test_hash_checkpoint import cluster

pytestmark = pytest.mark.timeout(120)

DIM = 8
OPTIMIZERS = [aps.Adagrad(lr=0.05), aps.Adagrad(lr=0.05, rowwise=True), aps.Adam(lr=0.01), aps.SGD(lr=0.1)]
BF16_MAX = float(np.uint32(0x7F7F0000).view(np.float32))


def bf16(values: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 and back, written from the format's definition: keep the top 16
    bits, rounding the dropped 16 to nearest, ties to the even kept value (finite inputs whose
    rounding stays finite)."""
    bits = np.asarray(values, np.float32).view(np.uint32).astype(np.uint64)
    low, high = bits & 0xFFFF, bits >> 16
    up = (low > 0x8000) | ((low == 0x8000) & (high & 1 == 1))
    return ((high + up) << 16).astype(np.uint32).view(np.float32)


def test_rounding_is_to_nearest_even_saturating_and_keeps_nan() -> None:
    rng = np.random.default_rng(0)
    values = (rng.standard_normal(200_000) * 10.0 ** rng.integers(-38, 38, 200_000)).astype(np.float32)
    ties = np.array([1.00390625, 1.01171875, -1.00390625], np.float32)  # halfway: to the even neighbour
    for x in (values, ties):
        assert np.array_equal(decode(encode(x, np.uint16)), bf16(x))
    assert decode(encode(ties, np.uint16)).tolist() == [1.0, 1.015625, -1.0]
    special = np.array([np.inf, -np.inf, 3.4e38, -3.4e38, np.nan, 0.0, -0.0], np.float32)
    out = decode(encode(special, np.uint16))
    assert out[:4].tolist() == [BF16_MAX, -BF16_MAX, BF16_MAX, -BF16_MAX]  # saturated, never infinite
    assert np.isnan(out[4]) and out[5] == 0.0 and np.signbit(out[6])


def table(optimizer: object = OPTIMIZERS[1], **fields: object) -> aps.HashTable:
    fields = {"dtype": "bfloat16", **fields}
    return aps.HashTable("emb", dim=DIM, init=aps.Uniform(-0.1, 0.1), optimizer=optimizer, **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=lambda o: f"{type(o).__name__}{'-rowwise' if getattr(o, 'rowwise', 0) else ''}")
@pytest.mark.parametrize("dtype,state_dtype", [("bfloat16", "float32"), ("float32", "bfloat16"), ("bfloat16", "bfloat16")])
def test_each_push_computes_in_float32_and_rounds(optimizer: object, dtype: str, state_dtype: str) -> None:
    rng = np.random.default_rng(1)
    spec = table(optimizer, dtype=dtype, state_dtype=state_dtype)
    store = HashSparseStore(spec)
    keys = rng.choice(1 << 50, 40, replace=False).astype(np.int64)
    round_values = bf16 if dtype == "bfloat16" else (lambda x: x)
    round_state = bf16 if state_dtype == "bfloat16" else (lambda x: x)
    values = round_values(HashSparseStore(table(optimizer, dtype="float32")).pull(keys))
    assert np.array_equal(store.pull(keys), values)  # an unknown key reads its initial row, rounded
    state = {n: round_state(a) if a.dtype == np.float32 else a for n, a in optim.new_sparse_state(optimizer, 40, DIM).items()}
    for step in range(6):
        picks = rng.integers(0, 40, 60)  # repeats, unsorted
        grads = rng.normal(size=(60, DIM)).astype(np.float32)
        store.push_grad(keys[picks], grads)
        touched = np.unique(picks)
        before = {n: a.copy() for n, a in state.items()}
        optim.apply_sparse(optimizer, values, state, picks.astype(np.int64), grads, 1.0, step)
        values[touched] = round_values(values[touched])
        for name, arr in state.items():  # only the rows a push touched are written back
            if arr.dtype == np.float32:
                arr[touched] = round_state(arr[touched])
            untouched = np.setdiff1d(np.arange(40), touched)
            arr[untouched] = before[name][untouched]
    assert np.array_equal(store.pull(keys), values)  # bit for bit
    held = store.rows_of(keys)
    for name, arr in state.items():
        assert np.array_equal(decode(held[name]) if held[name].dtype == np.uint16 else held[name], arr), name


def test_bytes_and_the_spec_checks() -> None:
    adam = aps.Adam(lr=0.01)
    assert row_nbytes(table(adam, dtype="float32")) - row_nbytes(table(adam)) == 2 * DIM
    assert row_nbytes(table(adam)) - row_nbytes(table(adam, state_dtype="bfloat16")) == 2 * 2 * DIM  # m and v
    with pytest.raises(ConfigError, match="state_dtype must be one of float32, bfloat16"):
        table(state_dtype="float16")
    with pytest.raises(ConfigError, match="dtype must be one of float32, float16, bfloat16"):
        table(dtype="int8")


async def test_rows_over_the_wire_across_a_reshard_from_geo_served_and_on_disk(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    spec = table(aps.Adam(lr=0.01), state_dtype="bfloat16", base_threshold=0.0)
    keys = rng.choice(1 << 50, 300, replace=False).astype(np.int64)
    pushes = [(rng.integers(0, 300, 400), rng.normal(size=(400, DIM)).astype(np.float32)) for _ in range(3)]
    async with cluster(2, tmp_path) as (_, ps):
        await ps.create_table(spec)
        await ps.pull_sparse_changed("emb")  # registers this client for GEO's changed-row reads
        for picks, grads in pushes:
            await ps.push_sparse_grad("emb", keys[picks], grads)
        rows = await ps.pull_sparse("emb", keys)
        assert np.array_equal(rows, bf16(rows))
        changed_keys, changed = await ps.pull_sparse_changed("emb")
        position = {int(k): i for i, k in enumerate(keys)}
        assert len(changed_keys) > 0 and np.array_equal(changed, rows[[position[int(k)] for k in changed_keys]])
        await ps.save("ckpt")
        await ps.export("ex", kind="base")
    async with cluster(3, tmp_path) as (servers, ps):
        await ps.load("ckpt")
        assert all(s.core.tables["emb"].values.dtype == np.uint16 for s in servers)
        assert np.array_equal(await ps.pull_sparse("emb", keys), rows)
    on_disk = aps.HashTable(**{**spec.__dict__, "disk": aps.Disk(ram_bytes=4 << 20)})
    async with cluster(1, tmp_path) as (_, ps):  # the same pushes on a disk table: the same rows
        await ps.create_table(on_disk)
        for picks, grads in pushes:
            await ps.push_sparse_grad("emb", keys[picks], grads)
        # a key's row depends on its pushes, not on the cluster's size or where the row lives
        assert np.array_equal(await ps.pull_sparse("emb", keys), rows)
    for option in ("exported", "int8"):
        server = await serve_exports(tmp_path / "ex", poll=60.0, rows=option)
        try:
            async with aps.connect([server.address]) as client:
                served = await client.pull_sparse("emb", keys)
                if option == "exported":
                    assert np.array_equal(served, rows)
                else:
                    scale = np.abs(rows).max(axis=1, keepdims=True) / 127
                    assert (np.abs(served - rows) <= scale / 2 + 1e-6).all()
        finally:
            await server.aclose()



def test_gathered_rows_decode_every_16_bit_pattern_as_numpy_does_and_skip_absent_rows() -> None:
    """The pull's gather (one kernel: rows, decode, scatter) against numpy's cast, bit for bit,
    over every float16 pattern (subnormals, infinities, NaN payloads) and every bfloat16 one."""
    bits = np.arange(1 << 16, dtype=np.uint16)
    for stored, want in ((bits.view(np.float16), bits.view(np.float16).astype(np.float32)), (bits, decode(bits))):
        table = stored.reshape(-1, 16)
        rows = np.random.default_rng(0).permutation(table.shape[0]).astype(np.int64)
        np.testing.assert_array_equal(read_rows(table, rows).view(np.uint32), want.reshape(-1, 16)[rows].view(np.uint32))
        rows[::3] = -1  # keys not held: their rows in ``out`` are left as they were
        out = np.full((rows.shape[0], 16), 7.0, np.float32)
        gather_decoded(table, rows, out)
        held = rows >= 0
        np.testing.assert_array_equal(out[held].view(np.uint32), want.reshape(-1, 16)[rows[held]].view(np.uint32))
        assert (out[~held] == 7.0).all()
    one = bits.view(np.float16)  # a 1-D array of one value a row (a row-wise accumulator's shape)
    np.testing.assert_array_equal(read_rows(one, np.arange(5, 9)).view(np.uint32), one[5:9].astype(np.float32).view(np.uint32))
