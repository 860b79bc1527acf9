"""Sparse Adam's two bias corrections on a pserver shard, against numpy: ``"row"`` (each row's own
update count, eps on the corrected sqrt(v_hat)) and ``"step"`` (the shard's count for every
pushed row, eps on the raw sqrt(v): PyTorch's SparseAdam); the spec field and its checks."""

from __future__ import annotations

import numpy as np
import pytest

from aps.errors import ConfigError
from aps.models.ctr_dnn.model import CtrDnn
from aps.models.wide_deep.model import WideDeep
from aps.specs import Adam, Constant, SparseTable, spec_from_dict, spec_to_dict
from aps.storage.tables import SparseShard, shard_nbytes

LR, B1, B2, EPS = 0.1, 0.9, 0.999, 1e-3  # a large eps, so where it goes shows


def expected(pushes: list[tuple[list[int], np.ndarray]], rows: int, dim: int, mode: str) -> np.ndarray:
    p = np.zeros((rows, dim))
    m, v = np.zeros_like(p), np.zeros_like(p)
    t_row = np.zeros(rows)
    for step, (ids, g) in enumerate(pushes, 1):
        for r, gr in zip(ids, g.astype(np.float64)):
            m[r] = B1 * m[r] + (1 - B1) * gr
            v[r] = B2 * v[r] + (1 - B2) * gr * gr
            t_row[r] += 1
            t = t_row[r] if mode == "row" else step
            corr2 = np.sqrt(1 - B2**t)
            eps = EPS * corr2 if mode == "row" else EPS
            p[r] -= LR * corr2 / (1 - B1**t) * m[r] / (np.sqrt(v[r]) + eps)
    return p


@pytest.mark.parametrize("mode", ["row", "step"])
def test_sparse_adam_corrects_by_row_or_by_step(mode: str) -> None:
    spec = SparseTable("emb", rows=6, dim=2, init=Constant(0.0), optimizer=Adam(LR, B1, B2, EPS, bias_correction=mode))
    shard = SparseShard(spec, 0, 1)
    rng = np.random.default_rng(0)
    pushes = [([0, 1], rng.normal(size=(2, 2))), ([1, 2], rng.normal(size=(2, 2))), ([2, 5, 0], rng.normal(size=(3, 2))),
              ([5], rng.normal(size=(1, 2)))]
    for ids, g in pushes:
        # one logical push in two chunks: the first does not advance the step
        shard.push_grad(np.array(ids[:1], np.int64), g[:1].astype(np.float32), advance_step=False)
        shard.push_grad(np.array(ids[1:], np.int64), g[1:].astype(np.float32))
    np.testing.assert_allclose(shard.values, expected(pushes, 6, 2, mode), rtol=1e-6, atol=1e-7)
    other = expected(pushes, 6, 2, "step" if mode == "row" else "row")
    assert np.abs(shard.values - other).max() > 1e-3  # the two semantics part on these pushes
    assert shard.step == len(pushes)
    assert ("t" in shard.state) == (mode == "row")
    if mode == "row":
        assert shard.state["t"].tolist() == [2, 2, 2, 0, 0, 2]


def test_only_per_row_correction_keeps_a_step_count_per_row() -> None:
    row = SparseTable("emb", rows=1000, dim=4, optimizer=Adam())
    step = SparseTable("emb", rows=1000, dim=4, optimizer=Adam(bias_correction="step"))
    assert shard_nbytes(row, 0, 1) - shard_nbytes(step, 0, 1) == 1000 * 8
    assert shard_nbytes(step, 0, 1) == 1000 * 4 * 4 * 3


def test_the_spec_field_round_trips_and_is_checked() -> None:
    assert Adam().bias_correction == "row"
    spec = SparseTable("emb", rows=3, dim=1, optimizer=Adam(bias_correction="step"))
    assert spec_from_dict(spec_to_dict(spec)) == spec
    old = spec_to_dict(SparseTable("emb", rows=3, dim=1, optimizer=Adam()))
    del old["optimizer"]["bias_correction"]  # a spec written before the field existed
    assert spec_from_dict(old).optimizer.bias_correction == "row"
    with pytest.raises(ConfigError, match="bias_correction must be one of row, step, got 'table'"):
        Adam(bias_correction="table")


@pytest.mark.parametrize("cls", [CtrDnn, WideDeep])
def test_ctr_models_take_the_bias_correction(cls: type) -> None:
    model = cls(bias_correction="step")
    assert {t.optimizer.bias_correction for t in model.tables()} == {"step"}
    assert model.describe()["bias_correction"] == "step"
    with pytest.raises(ConfigError, match=f"{cls.name} Adam bias_correction must be one of"):
        cls(bias_correction="sum")
