"""Table storage and optimizer math against a plain numpy reference (no sockets)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aps.errors import ErrorCode, ServerError
from aps.sharding import dense_blocks
from aps.specs import SGD, Adagrad, Adam, Constant, DenseTable, ExponentialDecay, Normal, SparseTable, Uniform
from aps.storage.init_kernels import init_dense, init_sparse_rows, table_seed
from aps.storage.tables import DenseShard, SparseShard, make_shard

TOL = dict(rtol=1e-6, atol=1e-6)

# ---------------------------------------------------------------- numpy reference


def ref_lr(opt, step: int) -> float:
    if opt.decay is None:
        return opt.lr
    e = step / opt.decay.decay_steps
    if opt.decay.staircase:
        e = np.floor(e)
    return opt.lr * opt.decay.decay_rate**e


class RefOptimizer:
    """Textbook update rules on float64 math with float32 storage, one row-set at a time."""

    def __init__(self, opt, values: np.ndarray) -> None:
        self.opt = opt
        self.values = values.astype(np.float32).copy()
        shape = values.shape
        self.acc = np.full(shape, getattr(opt, "initial_accumulator", 0.0), np.float32)
        self.m = np.zeros(shape, np.float32)
        self.v = np.zeros(shape, np.float32)
        self.t = np.zeros(shape[0], np.int64)  # per row (sparse) / [0] used as block step (dense)

    def apply(self, rows: np.ndarray, g: np.ndarray, lr: float, t: np.ndarray | None = None) -> None:
        """Update ``rows`` (unique) with merged float64 grads ``g``."""
        opt = self.opt
        p = self.values[rows].astype(np.float64)
        if isinstance(opt, SGD):
            p -= lr * g
        elif isinstance(opt, Adagrad):
            acc = self.acc[rows].astype(np.float64) + g * g
            self.acc[rows] = acc
            p -= lr * g / (np.sqrt(acc) + opt.epsilon)
        else:
            t = t[:, None].astype(np.float64)
            m = opt.beta1 * self.m[rows].astype(np.float64) + (1 - opt.beta1) * g
            v = opt.beta2 * self.v[rows].astype(np.float64) + (1 - opt.beta2) * g * g
            self.m[rows], self.v[rows] = m, v
            c2 = np.sqrt(1 - opt.beta2**t)
            p -= lr * c2 / (1 - opt.beta1**t) * m / (np.sqrt(v) + opt.epsilon * c2)
        self.values[rows] = p


def ref_sparse_push(ref: RefOptimizer, ids: np.ndarray, grads: np.ndarray, scale: float, step: int) -> None:
    uniq = np.unique(ids)
    pos = np.searchsorted(uniq, ids)
    g = np.zeros((len(uniq), grads.shape[1]), np.float64)
    np.add.at(g, pos, grads.astype(np.float64))
    ref.t[uniq] += 1
    ref.apply(uniq, g * scale, ref_lr(ref.opt, step), ref.t[uniq])


OPTIMIZERS = [
    SGD(lr=0.1),
    SGD(lr=0.1, decay=ExponentialDecay(decay_steps=2, decay_rate=0.5, staircase=True)),
    Adagrad(lr=0.05, epsilon=1e-6, initial_accumulator=0.1),
    Adagrad(lr=0.05, decay=ExponentialDecay(decay_steps=3, decay_rate=0.7, staircase=False)),
    Adam(lr=0.01),
    Adam(lr=0.01, beta1=0.8, beta2=0.99, decay=ExponentialDecay(decay_steps=2, decay_rate=0.9, staircase=True)),
    Adam(lr=0.01, decay=ExponentialDecay(decay_steps=3, decay_rate=0.5, staircase=False)),
]


def _opt_id(opt) -> str:
    decay = "" if opt.decay is None else ("-stair" if opt.decay.staircase else "-smooth")
    return type(opt).__name__ + decay


def _state(shard: SparseShard) -> dict[str, np.ndarray]:
    return {k: v.copy() for k, v in shard.state_arrays().items()}


# ---------------------------------------------------------------- sparse optimizers


@pytest.mark.parametrize("opt", OPTIMIZERS, ids=_opt_id)
def test_sparse_optimizer_matches_reference(opt) -> None:
    spec = SparseTable("emb", rows=101, dim=5, init=Uniform(-0.5, 0.5), optimizer=opt, seed=3)
    shard = SparseShard(spec, shard=1, num_shards=2)
    rng = np.random.default_rng(0)
    ref = RefOptimizer(opt, shard.values)
    for step in range(7):
        ids = rng.integers(0, 20, size=40).astype(np.int64)  # many duplicates, rows 20.. untouched
        grads = rng.normal(size=(40, 5)).astype(np.float32)
        scale = 0.5 if step % 2 else 1.0
        ref_sparse_push(ref, ids, grads, scale, step)
        shard.push_grad(ids, grads, scale=scale)
        np.testing.assert_allclose(shard.values, ref.values, **TOL)
        if isinstance(opt, Adagrad):
            np.testing.assert_allclose(shard.state["acc"], ref.acc, **TOL)
        if isinstance(opt, Adam):
            np.testing.assert_allclose(shard.state["m"], ref.m, **TOL)
            np.testing.assert_allclose(shard.state["v"], ref.v, **TOL)
            np.testing.assert_array_equal(shard.state["t"], ref.t)
    assert shard.step == 7
    np.testing.assert_array_equal(shard.values[20:], ref.values[20:])


def test_only_touched_rows_move() -> None:
    spec = SparseTable("emb", rows=10, dim=3, optimizer=Adam(lr=0.1))
    shard = SparseShard(spec, 0, 1)
    before = _state(shard)
    ones = np.ones((2, 3), np.float32)
    shard.push_grad(np.array([1, 3], np.int64), ones)
    shard.push_grad(np.array([1, 1], np.int64), ones)
    after = _state(shard)
    untouched = np.setdiff1d(np.arange(10), [1, 3])
    for name in ("values", "m", "v", "t"):
        np.testing.assert_array_equal(after[name][untouched], before[name][untouched])
        assert not np.array_equal(after[name][[1, 3]], before[name][[1, 3]])
    assert after["t"].tolist() == [0, 2, 0, 1, 0, 0, 0, 0, 0, 0]  # lazy Adam: t per row


def test_advance_step_false_keeps_lr_for_chunks() -> None:
    decay = ExponentialDecay(decay_steps=1, decay_rate=0.5)
    spec = SparseTable("emb", rows=4, dim=1, init=Constant(0.0), optimizer=SGD(lr=1.0, decay=decay))
    shard = SparseShard(spec, 0, 1)
    g = np.ones((1, 1), np.float32)
    shard.push_grad(np.array([0], np.int64), g, advance_step=False)
    shard.push_grad(np.array([1], np.int64), g, advance_step=True)
    shard.push_grad(np.array([2], np.int64), g)
    assert shard.step == 2
    assert shard.values[:3, 0].tolist() == [-1.0, -1.0, -0.5]


@settings(max_examples=40, deadline=None)
@given(
    ids=st.lists(st.integers(0, 15), min_size=0, max_size=60),
    scale=st.sampled_from([1.0, 0.25, 1 / 3]),
    seed=st.integers(0, 2**16),
)
def test_sparse_duplicates_are_summed(ids: list[int], scale: float, seed: int) -> None:
    spec = SparseTable("emb", rows=16, dim=3, optimizer=SGD(lr=0.5))
    shard = SparseShard(spec, 0, 1)
    before = shard.values.astype(np.float64)
    local = np.array(ids, np.int64)
    grads = np.random.default_rng(seed).normal(size=(len(ids), 3)).astype(np.float32)
    shard.push_grad(local, grads, scale=scale)
    summed = np.zeros((16, 3))
    np.add.at(summed, local, grads.astype(np.float64))
    np.testing.assert_allclose(shard.values, before - 0.5 * scale * summed, **TOL)


def test_push_delta_sums_duplicates_without_optimizer() -> None:
    spec = SparseTable("emb", rows=8, dim=2, optimizer=Adam(lr=1.0))
    shard = SparseShard(spec, 0, 1)
    before = _state(shard)
    ids = np.array([2, 5, 2], np.int64)
    deltas = np.array([[1, 2], [3, 4], [10, 20]], np.float32)
    shard.push_delta(ids, deltas)
    expected = before["values"].copy()
    expected[2] += [11, 22]
    expected[5] += [3, 4]
    np.testing.assert_allclose(shard.values, expected, **TOL)
    for name in ("m", "v", "t"):
        np.testing.assert_array_equal(shard.state[name], before[name])
    assert shard.step == 0


def test_pull_returns_a_copy() -> None:
    shard = SparseShard(SparseTable("emb", rows=6, dim=2), 0, 1)
    rows = shard.pull(np.array([4, 1, 4], np.int64))
    np.testing.assert_array_equal(rows, shard.values[[4, 1, 4]])
    rows[:] = 99
    assert not (shard.values == 99).any()


# ---------------------------------------------------------------- dense optimizers


@pytest.mark.parametrize("opt", OPTIMIZERS, ids=_opt_id)
def test_dense_optimizer_matches_reference(opt) -> None:
    spec = DenseTable("fc/w", shape=(3, 7000), init=Normal(0.0, 0.1), optimizer=opt, seed=1)
    blocks = [b for b in dense_blocks(spec.name, spec.size, 3)]
    assert len(blocks) == 3
    block = blocks[1]
    shard = DenseShard(spec, [block])
    ref = RefOptimizer(opt, shard.values[1][:, None])
    rng = np.random.default_rng(1)
    rows = np.arange(block.size)
    for step in range(6):
        g = rng.normal(size=block.size).astype(np.float32)
        half = block.size // 2
        shard.push_grad(1, 0, g[:half], scale=0.5, advance_step=False)  # two chunks, one step
        shard.push_grad(1, half, g[half:], scale=0.5)
        t = np.full(block.size, step + 1)
        ref.apply(rows, 0.5 * g[:, None].astype(np.float64), ref_lr(opt, step), t)
        np.testing.assert_allclose(shard.values[1], ref.values[:, 0], **TOL)
        if isinstance(opt, Adagrad):
            np.testing.assert_allclose(shard.state[1]["acc"], ref.acc[:, 0], **TOL)
        if isinstance(opt, Adam):
            np.testing.assert_allclose(shard.state[1]["m"], ref.m[:, 0], **TOL)
            np.testing.assert_allclose(shard.state[1]["v"], ref.v[:, 0], **TOL)
    assert shard.steps == {1: 6}


def test_dense_pull_and_delta_on_sub_ranges() -> None:
    spec = DenseTable("bias", shape=(100,), init=Constant(1.0))
    shard = make_shard(spec, 0, 1)
    assert isinstance(shard, DenseShard)
    shard.push_delta(0, 10, np.full(5, 2.0, np.float32))
    got = shard.pull(0, 8, 10)
    assert got.tolist() == [1.0, 1.0] + [3.0] * 5 + [1.0] * 3
    got[:] = 0
    assert shard.values[0][8] == 1.0
    assert shard.steps == {0: 0}


# ---------------------------------------------------------------- initialisation


def _gather_rows(spec: SparseTable, num_shards: int) -> np.ndarray:
    out = np.empty((spec.rows, spec.dim), np.float32)
    for k in range(num_shards):
        shard = SparseShard(spec, k, num_shards)
        out[shard.global_ids()] = shard.values
    return out


@settings(max_examples=10, deadline=None)
@given(
    rows=st.integers(1, 40),
    dim=st.integers(1, 6),
    init=st.sampled_from([Uniform(-1.0, 2.0), Normal(0.5, 3.0), Constant(0.25)]),
    seed=st.integers(0, 2**40),
)
def test_sparse_init_independent_of_num_shards(rows: int, dim: int, init, seed: int) -> None:
    spec = SparseTable("emb", rows=rows, dim=dim, init=init, seed=seed)
    one = _gather_rows(spec, 1)
    for n in (2, 3, 5):
        assert _gather_rows(spec, n).tobytes() == one.tobytes()


def test_dense_init_independent_of_num_servers() -> None:
    spec = DenseTable("fc", shape=(5, 5000), init=Uniform(-1, 1), seed=9)
    whole = []
    for n in (1, 2, 3):
        flat = np.empty(spec.size, np.float32)
        for k in range(n):
            shard = make_shard(spec, k, n)
            for i, block in shard.blocks.items():
                flat[block.start : block.stop] = shard.values[i]
        whole.append(flat)
    assert whole[0].tobytes() == whole[1].tobytes() == whole[2].tobytes()
    part = init_dense(spec.init, table_seed(spec.name, spec.seed), 100, 200)
    assert part.tobytes() == whole[0][100:200].tobytes()


@pytest.mark.parametrize(
    "init, mean, std",
    [(Uniform(-0.5, 1.5), 0.5, 2 / np.sqrt(12)), (Normal(1.0, 2.0), 1.0, 2.0)],
    ids=["uniform", "normal"],
)
def test_init_every_column_is_random(init, mean: float, std: float) -> None:
    values = init_sparse_rows(init, table_seed("emb", 0), np.arange(20000, dtype=np.int64), 16)
    assert values.dtype == np.float32 and values.shape == (20000, 16)
    col_mean, col_std = values.mean(axis=0), values.std(axis=0)
    assert np.all(np.abs(col_mean - mean) < 0.05 * std), col_mean
    assert np.all(np.abs(col_std / std - 1) < 0.03), col_std
    corr = np.corrcoef(values.T)
    assert np.all(np.abs(corr[~np.eye(16, dtype=bool)]) < 0.05)  # columns independent
    if isinstance(init, Uniform):
        assert values.min() >= init.low and values.max() < init.high


def test_init_depends_on_name_and_seed() -> None:
    ids = np.arange(50, dtype=np.int64)
    a = init_sparse_rows(Uniform(), table_seed("a", 0), ids, 4)
    assert a.tobytes() == init_sparse_rows(Uniform(), table_seed("a", 0), ids, 4).tobytes()
    assert not np.array_equal(a, init_sparse_rows(Uniform(), table_seed("b", 0), ids, 4))
    assert not np.array_equal(a, init_sparse_rows(Uniform(), table_seed("a", 1), ids, 4))


def test_optimizer_state_initial_values() -> None:
    spec = SparseTable("emb", rows=5, dim=2, optimizer=Adagrad(initial_accumulator=0.3))
    shard = SparseShard(spec, 0, 1)
    np.testing.assert_allclose(shard.state["acc"], 0.3)
    dense = make_shard(DenseTable("d", shape=(10,), optimizer=Adagrad(initial_accumulator=0.2)), 0, 1)
    np.testing.assert_allclose(dense.state[0]["acc"], 0.2)


# ---------------------------------------------------------------- change tracking (GEO)


def test_change_tracking() -> None:
    shard = SparseShard(SparseTable("emb", rows=20, dim=2), 0, 1)
    ids = lambda *xs: np.array(xs, np.int64)  # noqa: E731
    d = lambda n: np.ones((n, 2), np.float32)  # noqa: E731
    assert shard.changed(7).tolist() == []  # first call registers, nothing to report
    shard.track(1)
    shard.track(2)
    shard.push_delta(ids(5, 3, 5), d(3), client=1)
    assert shard.changed(1).tolist() == []  # own changes are not echoed back
    assert shard.changed(2).tolist() == [3, 5]
    assert shard.changed(7).tolist() == [3, 5]
    assert shard.changed(2).tolist() == []  # cleared by the previous call
    shard.push_grad(ids(9), d(1), client=2)
    shard.push_grad(ids(4), d(1))  # anonymous push: everyone sees it
    assert shard.changed(1).tolist() == [4, 9]
    assert shard.changed(2).tolist() == [4]
    assert shard.changed(7).dtype == np.int64
    before = shard.nbytes
    shard.track(3)
    assert shard.nbytes == before + 3  # one bit per row: 20 rows in 3 bytes


# ---------------------------------------------------------------- validation


def _raises(code: ErrorCode, fn, *args, **kwargs) -> ServerError:
    with pytest.raises(ServerError) as info:
        fn(*args, **kwargs)
    assert info.value.code == code, info.value
    return info.value


def test_sparse_validation_errors_are_typed_and_change_nothing() -> None:
    shard = SparseShard(SparseTable("ns:emb/1", rows=10, dim=3, optimizer=Adam()), 1, 2)  # 5 local rows
    before = _state(shard)
    g = np.zeros((2, 3), np.float32)
    err = _raises(ErrorCode.ID_OUT_OF_RANGE, shard.push_grad, np.array([0, 5], np.int64), g)
    assert "ns:emb/1" in str(err) and "local id 5" in str(err) and "global id 11" in str(err)
    _raises(ErrorCode.ID_OUT_OF_RANGE, shard.pull, np.array([-1], np.int64))
    _raises(ErrorCode.BAD_REQUEST, shard.pull, np.array([0], np.int32))
    _raises(ErrorCode.BAD_REQUEST, shard.pull, [0, 1])
    _raises(ErrorCode.SHAPE_MISMATCH, shard.pull, np.zeros((1, 1), np.int64))
    _raises(ErrorCode.BAD_REQUEST, shard.push_grad, np.array([0, 1], np.int64), g.astype(np.float64))
    err = _raises(ErrorCode.SHAPE_MISMATCH, shard.push_grad, np.array([0, 1], np.int64), np.zeros((2, 4), np.float32))
    assert "(2, 4)" in str(err) and "(2, 3)" in str(err)
    _raises(ErrorCode.SHAPE_MISMATCH, shard.push_delta, np.array([0], np.int64), g)
    _raises(ErrorCode.BAD_REQUEST, shard.push_grad, np.array([0, 1], np.int64), g, scale=float("nan"))
    after = _state(shard)
    for name in before:
        np.testing.assert_array_equal(after[name], before[name])
    assert shard.step == 0


def test_dense_validation_errors() -> None:
    spec = DenseTable("w", shape=(20000,))
    shard = make_shard(spec, 0, 3)
    held = sorted(shard.blocks)
    missing = next(b.index for b in dense_blocks("w", spec.size, 3) if b.index not in shard.blocks)
    size = shard.blocks[held[0]].size
    err = _raises(ErrorCode.ID_OUT_OF_RANGE, shard.pull, missing, 0, 1)
    assert f"block {missing}" in str(err) and "'w'" in str(err)
    _raises(ErrorCode.ID_OUT_OF_RANGE, shard.pull, held[0], size - 1, 2)
    _raises(ErrorCode.ID_OUT_OF_RANGE, shard.pull, held[0], -1, 1)
    _raises(ErrorCode.ID_OUT_OF_RANGE, shard.push_grad, held[0], size, np.zeros(1, np.float32))
    _raises(ErrorCode.SHAPE_MISMATCH, shard.push_grad, held[0], 0, np.zeros((2, 2), np.float32))
    _raises(ErrorCode.BAD_REQUEST, shard.push_delta, held[0], 0, np.zeros(2, np.float64))
    assert all(step == 0 for step in shard.steps.values())


def test_state_round_trip_and_mismatch() -> None:
    spec = SparseTable("emb", rows=9, dim=2, optimizer=Adam())
    a, b = SparseShard(spec, 0, 2), SparseShard(spec, 0, 2, initialise=False)
    a.push_grad(np.array([1, 2], np.int64), np.ones((2, 2), np.float32))
    b.load_state(a.state_arrays(), step=a.step)
    for name, arr in a.state_arrays().items():
        np.testing.assert_array_equal(b.state_arrays()[name], arr)
    assert b.step == 1
    bad = dict(a.state_arrays(), m=np.zeros((4, 3), np.float32))
    _raises(ErrorCode.SHAPE_MISMATCH, b.load_state, bad)
    _raises(ErrorCode.BAD_REQUEST, b.load_state, {"values": a.values})
