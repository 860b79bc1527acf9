"""CTR-DNN and wide&deep kernels against an independent float64 numpy implementation of the same
networks (itself checked by finite differences), on a tiny format so every row is visible."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from aps.errors import ConfigError
from aps.models.ctr_dnn.model import EMBEDDING, CtrDnn
from aps.models.wide_deep.model import DEEP_EMB, WIDE_BIAS, WIDE_DENSE, WIDE_SLOT, WideDeep
from aps.trainer.model import Grads, Params, WorkerContext
from aps.trainer.reader import Chunk

SLOTS, DENSE, BUCKETS = 3, 2, 40


@pytest.fixture
def meta(tmp_path: Path) -> str:
    path = tmp_path / "meta.json"
    path.write_text(json.dumps({"dense": DENSE, "slots": SLOTS, "cont_min": [0, 0], "cont_diff": [10, 4], "buckets": BUCKETS}))
    return str(path)


def _chunk(rng: np.random.Generator, lines: int) -> Chunk:
    rows = []
    for _ in range(lines):
        dense = [str(int(rng.integers(0, 10))) if rng.random() < 0.8 else "" for _ in range(DENSE)]
        cats = [f"{int(rng.integers(0, 6)):08x}" for _ in range(SLOTS)]  # few values: repeated ids
        rows.append("\t".join([str(int(rng.integers(0, 2))), *dense, *cats]))
    return Chunk("mem", 1, ("\n".join(rows) + "\n").encode(), lines)


def _params(model, rng: np.random.Generator) -> Params:
    sparse = {t.name: rng.uniform(-0.5, 0.5, (t.rows, t.dim)).astype(np.float32) for t in model.sparse_tables()}
    dense = {t.name: rng.normal(0, 0.5, t.shape).astype(np.float32) for t in model.dense_tables()}
    return Params(sparse, dense)


def _run(model, batch, params: Params) -> tuple[float, Grads]:
    grads = Grads(
        {name: np.zeros((len(ids), params.sparse[name].shape[1]), np.float32) for name, ids in batch.sparse_ids.items()},
        {name: np.zeros_like(v) for name, v in params.dense.items()},
    )
    return model.compute(batch, params, grads), grads


# ------------------------------------------------------------ float64 references


def _mlp_ref(x, ws, bs):
    hs = [x]
    for k, (w, b) in enumerate(zip(ws, bs)):
        z = hs[-1] @ w + b
        hs.append(np.maximum(z, 0) if k < len(ws) - 1 else z)
    return hs


def _mlp_back(hs, ws, d_out):
    gws, gbs = [], []
    d = d_out
    for k in range(len(ws) - 1, -1, -1):
        if k < len(ws) - 1:
            d = d * (hs[k + 1] > 0)
        gws.insert(0, hs[k].T @ d)
        gbs.insert(0, d.sum(0))
        d = d @ ws[k].T
    return gws, gbs, d


def ctr_dnn_ref(p: dict, ids, dense, y, n_layers):
    """Mean softmax cross-entropy of CTR-DNN and its gradients (dict name -> array)."""
    emb = p[EMBEDDING]
    x = np.concatenate([emb[ids].reshape(len(y), -1), dense], axis=1)
    ws = [p[f"fc{k}.w"] for k in range(1, n_layers + 1)]
    bs = [p[f"fc{k}.b"] for k in range(1, n_layers + 1)]
    hs = _mlp_ref(x, ws, bs)
    logits = hs[-1]
    z = logits - logits.max(1, keepdims=True)
    prob = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    n = len(y)
    yi = y.astype(int)
    loss = -np.log(prob[np.arange(n), yi]).mean()
    d = prob.copy()
    d[np.arange(n), yi] -= 1
    gws, gbs, dx = _mlp_back(hs, ws, d / n)
    g = {f"fc{k}.w": gw for k, gw in enumerate(gws, 1)} | {f"fc{k}.b": gb for k, gb in enumerate(gbs, 1)}
    g_emb = np.zeros_like(emb)
    np.add.at(g_emb, ids.reshape(-1), dx[:, : ids.shape[1] * emb.shape[1]].reshape(-1, emb.shape[1]))
    g[EMBEDDING] = g_emb
    return loss, g, prob[:, 1]


def wide_deep_ref(p: dict, ids, dense, y, n_layers):
    x = np.concatenate([p[DEEP_EMB][ids].reshape(len(y), -1), dense], axis=1)
    ws = [p[f"deep{k}.w"] for k in range(1, n_layers + 1)]
    bs = [p[f"deep{k}.b"] for k in range(1, n_layers + 1)]
    hs = _mlp_ref(x, ws, bs)
    logit = hs[-1][:, 0] + p[WIDE_SLOT][ids, 0].sum(1) + dense @ p[WIDE_DENSE][:, 0] + p[WIDE_BIAS][0]
    prob = 1 / (1 + np.exp(-logit))
    n = len(y)
    loss = -(y * np.log(prob) + (1 - y) * np.log(1 - prob)).mean()
    d = (prob - y) / n
    gws, gbs, dx = _mlp_back(hs, ws, d[:, None])
    g = {f"deep{k}.w": gw for k, gw in enumerate(gws, 1)} | {f"deep{k}.b": gb for k, gb in enumerate(gbs, 1)}
    g_emb = np.zeros_like(p[DEEP_EMB])
    dim = p[DEEP_EMB].shape[1]
    np.add.at(g_emb, ids.reshape(-1), dx[:, : ids.shape[1] * dim].reshape(-1, dim))
    g[DEEP_EMB] = g_emb
    g_wide = np.zeros_like(p[WIDE_SLOT])
    np.add.at(g_wide[:, 0], ids.reshape(-1), np.repeat(d, ids.shape[1]))
    g[WIDE_SLOT] = g_wide
    g[WIDE_DENSE] = dense.T @ d[:, None]
    g[WIDE_BIAS] = np.array([d.sum()])
    return loss, g, prob


CASES = [(CtrDnn, ctr_dnn_ref), (WideDeep, wide_deep_ref)]


@pytest.mark.parametrize("cls,ref", CASES, ids=["ctr_dnn", "wide_deep"])
def test_reference_gradients_match_finite_differences(cls, ref, meta: str) -> None:
    rng = np.random.default_rng(1)
    model = cls(meta=meta, hidden="4,3", embedding_size=2, batch_size=16)
    batch = next(iter(model.batches(_chunk(rng, 16), WorkerContext(0, 0, 1, 1, rng))))
    d = batch.data
    p = {k: v.astype(np.float64) for k, v in (_params(model, rng).sparse | _params(model, rng).dense).items()}
    args = (d.ids, d.dense.astype(np.float64), d.labels.astype(np.float64), len(model.layers))
    _, g, _ = ref(p, *args)
    eps = 1e-6
    for name in p:
        flat = p[name].reshape(-1)
        for j in rng.choice(flat.size, size=min(6, flat.size), replace=False):
            old = flat[j]
            flat[j] = old + eps
            up = ref(p, *args)[0]
            flat[j] = old - eps
            down = ref(p, *args)[0]
            flat[j] = old
            assert (up - down) / (2 * eps) == pytest.approx(g[name].reshape(-1)[j], abs=1e-6), name


@pytest.mark.parametrize("cls,ref", CASES, ids=["ctr_dnn", "wide_deep"])
def test_kernels_match_reference(cls, ref, meta: str) -> None:
    """Loss, probabilities and every table's gradient equal the float64 reference to float32
    precision; sparse gradients come per unique id of the batch (summed over repeats)."""
    rng = np.random.default_rng(2)
    model = cls(meta=meta, hidden="8,6,5", embedding_size=3, batch_size=32)
    batches = list(model.batches(_chunk(rng, 80), WorkerContext(0, 0, 1, 1, rng)))
    assert [b.examples for b in batches] == [32, 32, 16]
    params = _params(model, rng)
    for batch in batches:
        d = batch.data
        loss, grads = _run(model, batch, params)
        p64 = {k: v.astype(np.float64) for k, v in (params.sparse | params.dense).items()}
        ref_loss, ref_g, ref_prob = ref(p64, d.ids, d.dense.astype(np.float64), d.labels.astype(np.float64), len(model.layers))
        assert loss / batch.examples == pytest.approx(ref_loss, rel=1e-5)
        np.testing.assert_allclose(d.probs, ref_prob, rtol=1e-5, atol=1e-6)
        for name, g in grads.dense.items():
            np.testing.assert_allclose(g, ref_g[name].reshape(g.shape), rtol=1e-4, atol=1e-6, err_msg=name)
        for name, ids in batch.sparse_ids.items():
            assert len(np.unique(ids)) == len(ids)
            np.testing.assert_allclose(grads.sparse[name], ref_g[name][ids], rtol=1e-4, atol=1e-6, err_msg=name)
            untouched = np.setdiff1d(np.arange(BUCKETS), ids)
            assert not ref_g[name][untouched].any()


def test_reference_sizes_and_inits() -> None:
    model = CtrDnn()
    specs = {t.name: t for t in model.tables()}
    assert (specs[EMBEDDING].rows, specs[EMBEDDING].dim) == (1_000_001, 10)
    assert [specs[f"fc{k}.w"].shape for k in range(1, 5)] == [(273, 400), (400, 400), (400, 400), (400, 2)]
    assert specs["fc1.w"].init.std == pytest.approx(1 / np.sqrt(273))
    assert all(type(t.optimizer).__name__ == "Adam" for t in model.tables())
    wd = {t.name: t for t in WideDeep().tables()}
    assert wd[DEEP_EMB].dim == 8 and wd[WIDE_SLOT].dim == 1 and wd["deep4.w"].shape == (400, 1)


def test_ctr_dnn_embedding_starts_small_by_default() -> None:
    """The reference's Uniform(-1, 1) lost 0.03-0.04 test AUC against Uniform(-0.05, 0.05) on
    each of three generated data sets (bench/ctr_ablation.py, bench/README.md), in aps and in
    PyTorch alike; the reference's init stays one argument away."""
    init = {t.name: t for t in CtrDnn().tables()}[EMBEDDING].init
    assert (init.low, init.high) == (-0.05, 0.05)
    init = {t.name: t for t in CtrDnn(init_range="1.0").tables()}[EMBEDDING].init
    assert (init.low, init.high) == (-1.0, 1.0)


@pytest.mark.parametrize("args", [{"hidden": "400,x"}, {"batch_size": 0}, {"optimizer": "rmsprop"}, {"lr": -1}])
def test_bad_model_arguments_are_config_errors(args: dict) -> None:
    with pytest.raises(ConfigError):
        CtrDnn(**args)


@pytest.mark.parametrize("cls", [CtrDnn, WideDeep], ids=["ctr_dnn", "wide_deep"])
def test_pickled_model_carries_settings_not_buffers(cls, meta: str) -> None:
    """The model goes to every worker by pickle: its per-process batcher and buffers stay home."""
    import pickle

    rng = np.random.default_rng(3)
    model = cls(meta=meta, hidden="8,6", embedding_size=3, batch_size=32)
    batch = next(iter(model.batches(_chunk(rng, 32), WorkerContext(0, 0, 1, 1, rng))))
    _run(model, batch, _params(model, rng))
    assert {"batcher", "mlp", "x"} <= set(model._process_local)
    blob = pickle.dumps(model)
    assert len(blob) < 8192
    clone = pickle.loads(blob)
    assert "_process_local" not in vars(clone) and clone.tables() == model.tables()
