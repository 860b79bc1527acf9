"""aps.torch's Predictor (aps/torch/predictor.py) scores lines with a TorchModel's network, sparse
rows from aps-serve and dense tables from the export root it follows: the probabilities equal
``TorchModel.forward`` on the rows and dense values the pserver held when the export was written;
a key aps-serve does not hold reads its initial row; a new delta is used once refreshed (or once
a call meets it). Real parts: a pserver and aps-serve's server in process over TCP on port 0,
exports written by the client's export API (``ps.export``), the zoo DeepFM on Adult lines.
``infer.py --serve`` scores a file through the same path."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

import aps
from aps.errors import ConfigError
from aps.metrics import Auc, logloss
from aps.serving.server import ServingServer, serve_exports
from aps.torch.predictor import Predictor
from aps.torch.zoo.deepfm import build
from aps.trainer.model import Params, WorkerContext
from aps.trainer.reader import Chunk
from tests.conftest import ROOT

pytestmark = pytest.mark.timeout(120)

#: the Adult census set's columns (examples/wide_deep/prepare_adult.py's meta.json: 6 dense, 8
#: slots, 1,000,001 buckets), kept with the tests so that a clean clone needs no download
META = Path(__file__).resolve().parent / "adult_meta.json"


def adult_like_lines(n: int, seed: int = 0) -> list[str]:
    """``n`` lines in Adult's layout: a 0/1 label, 6 integers within its ranges, 8 categorical
    values from small vocabularies (so that keys repeat across lines, as Adult's do)."""
    rng = np.random.default_rng(seed)
    meta = json.loads(META.read_text())
    out = []
    for _ in range(n):
        dense = [str(int(lo + rng.integers(0, diff + 1))) for lo, diff in zip(meta["cont_min"], meta["cont_diff"])]
        cats = [f"c{k}-{int(rng.zipf(1.6)) % (3 + 5 * k)}" for k in range(meta["slots"])]
        out.append("\t".join([str(int(rng.random() < 0.25)), *dense, *cats]))
    return out


LINES = adult_like_lines(300)
HIDDEN = "16,8"
#: shows pushed with every trained key: score 0.1 * 20 = 2 reaches a base's threshold (1.5) and a delta's (0.25)
SHOWS = 20.0


def model_of(meta: Path = META, kind: str = "hash", hidden: str = HIDDEN) -> aps.Model:
    return build(str(meta), hidden=hidden, table=kind)


def small_meta(tmp: Path) -> Path:
    """Adult's meta.json with 1,009 buckets: a fixed table small enough to export in a test."""
    meta = json.loads(META.read_text())
    meta["buckets"] = 1009
    path = tmp / "meta.json"
    path.write_text(json.dumps(meta))
    return path


def batches(model, lines: list[str]):
    chunk = Chunk("lines", 1, ("\n".join(lines) + "\n").encode(), len(lines))
    return list(model.batches(chunk, WorkerContext(0, 0, 1, 1, np.random.default_rng(0))))


def all_ids(model, lines: list[str]) -> np.ndarray:
    return np.unique(np.concatenate([b.sparse_ids[next(iter(model.embeddings))] for b in batches(model, lines)]))


async def train(ps: aps.PSClient, model, ids: np.ndarray, rng: np.random.Generator, shows: float = SHOWS) -> None:
    """One push of random gradients to ``ids`` of every Embedding table and to every dense table."""
    for spec in model.tables():
        if isinstance(spec, aps.DenseTable):
            await ps.push_dense_grad(spec.name, rng.standard_normal(spec.shape).astype(np.float32))
        else:
            grads = rng.standard_normal((len(ids), spec.dim)).astype(np.float32)
            counts = {"shows": np.full(len(ids), shows, np.float32)} if isinstance(spec, aps.HashTable) else {}
            await ps.push_sparse_grad(spec.name, ids, grads, **counts)


async def dense_of(ps: aps.PSClient, model) -> dict[str, np.ndarray]:
    return {s.name: await ps.pull_dense(s.name) for s in model.tables() if isinstance(s, aps.DenseTable)}


async def forward(model, lines: list[str], rows_of, dense: dict[str, np.ndarray]) -> np.ndarray:
    """``TorchModel.forward`` over ``lines`` (the model's own batches) with ``rows_of(table, ids)``
    for the Embedding tables (a fixed table whole, as the trainer's replica) and ``dense``."""
    out = []
    for batch in batches(model, lines):
        sparse = {}
        for spec in model.tables():
            if isinstance(spec, aps.HashTable):
                sparse[spec.name] = await rows_of(spec.name, batch.sparse_ids[spec.name])
            elif isinstance(spec, aps.SparseTable):
                sparse[spec.name] = await rows_of(spec.name, np.arange(spec.rows))
        model.forward(batch, Params(sparse, dense))
        out.append(model.predictions(batch)[0].copy())
    return np.concatenate(out)


@contextlib.asynccontextmanager
async def pserver(root: Path, model) -> AsyncIterator[aps.PSClient]:
    server = await aps.serve(checkpoint_root=str(root))
    try:
        async with aps.connect([server.address]) as ps:
            for spec in model.tables():
                await ps.create_table(spec)
            yield ps
    finally:
        await server.aclose()


@contextlib.asynccontextmanager
async def serving(root: Path) -> AsyncIterator[ServingServer]:
    server = await serve_exports(root, poll=60.0)  # looks at the root when the test says: advance()
    try:
        yield server
    finally:
        await server.aclose()


def assert_close(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == np.float32 and got.shape == want.shape
    assert float(np.abs(got - want).max()) <= 1e-6, float(np.abs(got - want).max())


@pytest.mark.parametrize("kind", ["hash", "fixed"])
async def test_predictions_equal_torch_model_forward_on_the_exported_rows_and_dense_values(tmp_path: Path, kind: str) -> None:
    meta = META if kind == "hash" else small_meta(tmp_path)
    model = model_of(meta, kind)
    async with pserver(tmp_path, model) as ps:
        await train(ps, model, all_ids(model, LINES), np.random.default_rng(1))
        info = await ps.export("ex", kind="base")
        want = await forward(model_of(meta, kind), LINES, ps.pull_sparse, await dense_of(ps, model))
    if kind == "hash":
        assert info.keys["fm.emb"] == len(all_ids(model, LINES))  # every trained key is in the base
    async with serving(tmp_path / "ex") as server, Predictor.open(model, server.address, tmp_path / "ex") as p:
        assert (p.version, p.versions_loaded) == (1, [1])
        assert_close(await p.score_lines(LINES), want)
        for i in range(0, 300, 15):  # batch 1, as online requests come
            assert_close(await p.score_lines([LINES[i]]), want[i : i + 1])
        unlabelled = [line.split("\t", 1)[1] for line in LINES[:7]]
        assert_close(await p.score_lines(unlabelled, labelled=False), want[:7])
        assert (await p.score_lines([])).shape == (0,)
        assert p.versions_loaded == [1]
    assert 0.01 < want.min() < want.max() < 0.99 and want.std() > 0.01


async def test_keys_aps_serve_does_not_hold_read_their_initial_rows(tmp_path: Path) -> None:
    """Neither a key never pushed nor one trained under the base's score threshold is in the base:
    aps-serve answers both with the table's initial row for the key (what a pserver that never
    held it answers), not with zeros, an error, or the row the training pserver holds."""
    model = model_of()
    trained, under = LINES[:200], LINES[200:260]
    unseen = ["\t".join(f.split("\t")[:7] + [f"never-seen-{i}-{k}" for k in range(8)]) for i, f in enumerate(LINES[260:270])]
    exported = all_ids(model, trained)
    low = np.setdiff1d(all_ids(model, under), exported)
    assert len(low) > 0
    async with pserver(tmp_path, model) as ps, pserver(tmp_path, model) as fresh:
        rng = np.random.default_rng(2)
        await train(ps, model, exported, rng)
        await train(ps, model, low, rng, shows=1.0)  # score 0.1: held by the pserver, not exported
        info = await ps.export("ex", kind="base")
        assert info.keys["fm.emb"] == len(exported)
        dense = await dense_of(ps, model)

        async def served_rows(name: str, ids: np.ndarray) -> np.ndarray:
            held, initial = await ps.pull_sparse(name, ids), await fresh.pull_sparse(name, ids)
            return np.where(np.isin(ids, exported)[:, None], held, initial)

        lines = [*under, *unseen]
        want = await forward(model_of(), lines, served_rows, dense)
        as_pserver_holds = await forward(model_of(), under, ps.pull_sparse, dense)
        async with serving(tmp_path / "ex") as server, Predictor.open(model, server.address, tmp_path / "ex") as p:
            assert_close(await p.score_lines(lines), want)
            keys = np.setdiff1d(all_ids(model, unseen), exported)
            assert len(keys) == 80
            for name in ("fm.first", "fm.emb"):
                rows = await p.client.pull_sparse(name, np.concatenate([keys, low]))
                assert np.array_equal(rows, await fresh.pull_sparse(name, np.concatenate([keys, low])))
                assert not np.array_equal(rows[len(keys):], await ps.pull_sparse(name, low))
            assert not np.any(await p.client.pull_sparse("fm.first", keys))  # fm.first's init is Constant(0)
            assert np.all(np.abs(await p.client.pull_sparse("fm.emb", keys)) <= 0.05) and np.any(await p.client.pull_sparse("fm.emb", keys))
    assert float(np.abs(want[: len(under)] - as_pserver_holds).max()) > 1e-4


async def test_a_new_delta_is_scored_after_refresh_and_a_call_that_meets_one_loads_it(tmp_path: Path) -> None:
    model = model_of()
    ids = all_ids(model, LINES)
    rng = np.random.default_rng(3)
    async with pserver(tmp_path, model) as ps:
        await train(ps, model, ids, rng)
        await ps.export("ex", kind="base")
        at_base = await forward(model_of(), LINES, ps.pull_sparse, await dense_of(ps, model))
        async with serving(tmp_path / "ex") as server, Predictor.open(model, server.address, tmp_path / "ex") as p:
            assert_close(await p.score_lines(LINES), at_base)
            assert not await p.refresh()
            await train(ps, model, ids, rng)
            delta = await ps.export("ex", kind="delta")
            at_delta = await forward(model_of(), LINES, ps.pull_sparse, await dense_of(ps, model))
            assert await server.advance() and server.version == delta.version == 2
            assert p.version == 1
            assert await p.refresh() and p.version == 2 and not await p.refresh()
            got = await p.score_lines(LINES)
            assert_close(got, at_delta)
            assert float(np.abs(got - at_base).max()) > 1e-3
            # no refresh: the call that meets version 3 loads its dense tables before scoring
            await train(ps, model, ids[::2], rng)
            await ps.export("ex", kind="delta")
            at_3 = await forward(model_of(), LINES, ps.pull_sparse, await dense_of(ps, model))
            assert await server.advance() and server.version == 3
            assert_close(await p.score_lines(LINES[:40]), at_3[:40])
            assert p.versions_loaded == [1, 2, 3]


async def test_an_export_root_or_model_that_is_not_the_served_one_is_refused(tmp_path: Path) -> None:
    model = model_of()
    (tmp_path / "ex").mkdir()
    async with serving(tmp_path / "ex") as server:
        with pytest.raises(ConfigError, match="serves no export yet"):
            await Predictor.open(model, server.address, tmp_path / "ex")
    async with pserver(tmp_path, model) as ps:
        rng = np.random.default_rng(4)
        await train(ps, model, all_ids(model, LINES[:20]), rng)
        await ps.export("ex", kind="base")
        await train(ps, model, all_ids(model, LINES[:20]), rng)
        await ps.export("other", kind="base")  # version 1 of another root, other values
    async with serving(tmp_path / "ex") as server:
        with pytest.raises(ConfigError, match="is not the one aps-serve .* serves: pass the export root aps-serve follows"):
            await Predictor.open(model, server.address, tmp_path / "other")
        (tmp_path / "empty").mkdir()
        with pytest.raises(ConfigError, match="has no complete export of version 1"):
            await Predictor.open(model, server.address, tmp_path / "empty")
        with pytest.raises(ConfigError, match="mlp.0.weight"):
            await Predictor.open(model_of(hidden="32,8"), server.address, tmp_path / "ex")
        with pytest.raises(ConfigError, match="serves table 'fm.first' as HashTable \\('keys', 1\\).*SparseTable"):
            await Predictor.open(model_of(small_meta(tmp_path), "fixed"), server.address, tmp_path / "ex")


async def test_infer_serve_scores_a_file_through_aps_serve(tmp_path: Path) -> None:
    model = model_of()
    data = tmp_path / "test.txt"
    data.write_text("\n".join(LINES) + "\n")
    async with pserver(tmp_path, model) as ps:
        await train(ps, model, all_ids(model, LINES), np.random.default_rng(5))
        await ps.export("ex", kind="base")
    infer = [sys.executable, str(ROOT / "examples" / "wide_deep" / "infer.py"), "--model", "deepfm",
             "--model-arg", f"meta={META}", "--model-arg", f"hidden={HIDDEN}"]
    async with serving(tmp_path / "ex") as server, Predictor.open(model, server.address, tmp_path / "ex") as p:
        want = await p.score_lines(LINES)
        proc = await asyncio.create_subprocess_exec(
            *infer, "--serve", server.address, "--export", str(tmp_path / "ex"), "--data", str(data),
            "--predictions", str(tmp_path / "probs.txt"), "--json", str(tmp_path / "result.json"),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )
        output, _ = await asyncio.wait_for(proc.communicate(), 100)
        misuse = {}
        for name, args in {"no export": ["--serve", server.address], "neither": [],
                           "not torch": ["--model", "ctr_dnn", "--serve", server.address, "--export", "x"]}.items():
            run = await asyncio.create_subprocess_exec(*infer, *args, "--data", str(data), stdout=asyncio.subprocess.PIPE,
                                                       stderr=asyncio.subprocess.PIPE)
            _, err = await asyncio.wait_for(run.communicate(), 100)
            misuse[name] = (run.returncode, err.decode().strip().splitlines()[-1])
    assert proc.returncode == 0, output.decode()
    probs = np.loadtxt(tmp_path / "probs.txt", dtype=np.float64)
    assert probs.shape == (300,) and float(np.abs(probs - want).max()) <= 1e-6
    result = json.loads((tmp_path / "result.json").read_text())
    labels = np.array([float(line.split("\t", 1)[0]) for line in LINES], np.float32)
    auc = Auc()
    auc.update(want, labels)
    assert result["examples"] == 300 and result["model_versions"] == [1]
    assert result["auc"] == pytest.approx(auc.global_auc(), abs=1e-9)
    assert result["logloss"] == pytest.approx(logloss(want, labels), rel=1e-6)
    assert f"AUC {result['auc']:.6f}" in output.decode() and "model versions [1]" in output.decode()
    assert misuse["no export"] == (2, f"{Path(infer[1]).name}: error: --serve needs --export DIR, the export root aps-serve follows")
    assert misuse["neither"][0] == 2 and "one of the arguments --checkpoint --serve is required" in misuse["neither"][1]
    assert misuse["not torch"] == (2, "infer: error: --serve scores aps.torch models; ctr_dnn is not one "
                                      "(examples/online/predict.py scores the built-in ones)")
