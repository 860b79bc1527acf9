"""word2vec model plug-in: kernels against a numpy reference, batching, parsing errors,
evaluation and export. Small inputs built here; the file runs in seconds (after numba's cache)."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import structlog.testing

from aps.errors import ConfigError, DataError
from aps.models import load_model_class, parse_model_args
from aps.models.word2vec.evaluate import analogy_accuracy, normalize_rows, read_questions, read_words
from aps.models.word2vec.export import export_word2vec
from aps.models.word2vec.model import EMB, EMB_B, EMB_W, Word2Vec, negative_cdf
from aps.specs import SGD, Constant, ExponentialDecay, Uniform
from aps.cluster import ClusterSpec
from aps.trainer.kernels import sgd_rows
from aps.trainer.strategy import Strategy
from aps.trainer.trainer import check_trainer
from aps.trainer.model import Batch, Grads, Params, WorkerContext
from aps.trainer.reader import Chunk

VOCAB = 40


@pytest.fixture
def dict_path(tmp_path: Path) -> Path:
    """<UNK> then words w1..w39 with decreasing, very different counts."""
    path = tmp_path / "dict.txt"
    counts = [7] + [int(5000 / k) + 1 for k in range(1, VOCAB)]
    path.write_text("".join(f"{'<UNK>' if i == 0 else f'w{i}'} {c}\n" for i, c in enumerate(counts)))
    return path


def ctx(seed: int = 0, skip: bool = False) -> WorkerContext:
    return WorkerContext(trainer_id=0, worker_id=0, num_trainers=1, num_workers=1, rng=np.random.default_rng(seed), skip_bad_lines=skip)


def chunk(lines: list[str], first_line: int = 1, name: str = "part-7") -> Chunk:
    data = "".join(line + "\n" for line in lines).encode()
    return Chunk(name, first_line, data, len(lines))


def random_params(model: Word2Vec, seed: int = 0, scale: float = 0.3) -> Params:
    rng = np.random.default_rng(seed)
    v, d = model.vocab_size, model.dim
    return Params(
        {
            EMB: rng.normal(0, scale, (v, d)).astype(np.float32),
            EMB_W: rng.normal(0, scale, (v, d)).astype(np.float32),
            EMB_B: rng.normal(0, scale, (v, 1)).astype(np.float32),
        },
        {},
    )


def zero_grads(batch: Batch, model: Word2Vec) -> Grads:
    return Grads({name: np.zeros((len(ids), model.table(name).dim), np.float32) for name, ids in batch.sparse_ids.items()})


def reference_loss_grads(params: Params, batch: Batch) -> tuple[float, dict[str, np.ndarray]]:
    """The reference network in float64, pair by pair, no shortcuts: summed loss and the
    full-table gradients of the batch-mean loss. Negatives are shared (``[K]``) or per pair
    (``[pairs, K]``)."""
    e = params.sparse[EMB].astype(np.float64)
    w = params.sparse[EMB_W].astype(np.float64)
    b = params.sparse[EMB_B].astype(np.float64)
    g = {EMB: np.zeros_like(e), EMB_W: np.zeros_like(w), EMB_B: np.zeros_like(b)}
    d = batch.data
    n = len(d.centre)
    loss = 0.0
    per_pair = d.negatives.ndim == 2
    for p, (c, t) in enumerate(zip(d.centre.tolist(), d.context.tolist())):
        h = e[c]
        negatives = d.negatives[p] if per_pair else d.negatives
        for target, label in [(t, 1.0)] + [(k, 0.0) for k in negatives.tolist()]:
            s = h @ w[target] + b[target, 0]
            loss += np.logaddexp(0.0, -s) if label else np.logaddexp(0.0, s)
            ds = (0.5 * (1.0 + np.tanh(s / 2)) - label) / n  # sigmoid without overflow
            g[EMB_W][target] += ds * h
            g[EMB_B][target, 0] += ds
            g[EMB][c] += ds * w[target]
    return loss, g


def first_batch(model: Word2Vec, lines: list[str], seed: int = 0) -> Batch:
    return next(iter(model.batches(chunk(lines), ctx(seed))))


# ---------------------------------------------------------------- kernels


LINES = ["3 3 3 5 1 0 7", "9 2 4 4 11 12 3 8 20 21 22", "5", "", "30 31 32 33 34 35 36 37 38 39 1 2"]


NEGATIVES = pytest.mark.parametrize("negatives", ["batch", "pair"])  # the reference modes


@NEGATIVES
@pytest.mark.parametrize("scale", [0.3, 30.0], ids=["moderate", "saturated"])
def test_gradients_match_numpy_reference(dict_path: Path, scale: float, negatives: str) -> None:
    # "3 3 3": adjacent equal centres share a run; scale 30 pushes logits past |30| (the clipped branch)
    model = Word2Vec(dict_path=str(dict_path), dim=8, window=3, neg_num=4, batch_size=1000, negatives=negatives,
                     lr_schedule="exponential")
    batch = first_batch(model, LINES)
    params = random_params(model, scale=scale)
    grads = zero_grads(batch, model)
    loss = model.compute(batch, params, grads)
    ref_loss, ref = reference_loss_grads(params, batch)
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    for name in (EMB, EMB_W, EMB_B):
        ids = batch.sparse_ids[name]
        atol = 1e-6 * max(1.0, np.abs(ref[name]).max())
        np.testing.assert_allclose(grads.sparse[name], ref[name][ids], rtol=2e-4, atol=atol)
        untouched = np.setdiff1d(np.arange(model.vocab_size), ids)
        assert not ref[name][untouched].any()  # every row with a gradient is in the batch's ids


@NEGATIVES
def test_gradients_match_finite_differences(dict_path: Path, negatives: str) -> None:
    """d(mean loss)/d(param) by central differences of the float64 reference loss."""
    model = Word2Vec(dict_path=str(dict_path), dim=6, window=2, neg_num=3, batch_size=1000, negatives=negatives,
                     lr_schedule="exponential")
    batch = first_batch(model, LINES)
    params = random_params(model, seed=3)
    grads = zero_grads(batch, model)
    model.compute(batch, params, grads)
    n = batch.examples
    rng = np.random.default_rng(1)
    checked = 0
    for name in (EMB, EMB_W, EMB_B):
        ids = batch.sparse_ids[name]
        for _ in range(6):
            i = int(rng.integers(len(ids)))
            col = int(rng.integers(model.table(name).dim))
            base = params.sparse[name][ids[i], col]
            values = []
            for delta in (1e-3, -1e-3):
                p64 = Params({k: v.astype(np.float64) for k, v in params.sparse.items()}, {})
                p64.sparse[name][ids[i], col] = np.float64(base) + delta
                values.append(reference_loss_grads(p64, batch)[0] / n)
            numeric = (values[0] - values[1]) / 2e-3
            assert grads.sparse[name][i, col] == pytest.approx(numeric, rel=1e-3, abs=1e-6)
            checked += 1
    assert checked == 18


@NEGATIVES
def test_local_sgd_equals_compute_then_sgd(dict_path: Path, negatives: str) -> None:
    """The fused geo step against the runtime's generic path (compute, then sgd_rows), bit for bit."""
    model = Word2Vec(dict_path=str(dict_path), dim=8, window=4, neg_num=3, batch_size=7, negatives=negatives,
                     lr_schedule="exponential")
    lines = [" ".join(str(x) for x in np.random.default_rng(k).integers(0, VOCAB, 15)) for k in range(20)]
    fused = random_params(model, seed=5, scale=0.2)
    plain = Params({k: v.copy() for k, v in fused.sparse.items()}, {})
    dirty_f = {k: np.zeros(VOCAB, np.uint8) for k in fused.sparse}
    dirty_p = {k: np.zeros(VOCAB, np.uint8) for k in fused.sparse}
    lrs = {EMB: 0.5, EMB_W: 0.7, EMB_B: 0.9}
    batches = list(model.batches(chunk(lines), ctx(2)))
    assert len(batches) > 10
    for batch in batches:
        loss_f = model.local_sgd(batch, fused, lrs, dirty_f)
        grads = zero_grads(batch, model)
        loss_p = model.compute(batch, plain, grads)
        for name, ids in batch.sparse_ids.items():
            sgd_rows(plain.sparse[name], ids, grads.sparse[name], lrs[name], dirty_p[name])
        assert loss_f == loss_p
    for name in fused.sparse:
        np.testing.assert_array_equal(fused.sparse[name], plain.sparse[name])
        np.testing.assert_array_equal(dirty_f[name], dirty_p[name])
    assert dirty_f[EMB].sum() > 10


# ---------------------------------------------------------------- batching


def test_windows_are_uniform_in_1_to_window_and_stay_in_line(dict_path: Path) -> None:
    model = Word2Vec(dict_path=str(dict_path), dim=4, window=4, neg_num=2, batch_size=64, negatives="batch")
    # distinct ids inside each line, so a centre's run of pairs is that one token's contexts
    lines = [" ".join(str(x) for x in np.random.default_rng(k).permutation(np.arange(1, VOCAB))[:25]) for k in range(40)]
    batches = list(model.batches(chunk(lines), ctx(9)))
    cen = np.concatenate([b.data.centre for b in batches]).tolist()
    con = np.concatenate([b.data.context for b in batches]).tolist()
    pos = 0
    radii = []
    for line in lines:
        toks = [int(x) for x in line.split()]
        for i, c in enumerate(toks):
            got = []
            while pos < len(cen) and cen[pos] == c:
                got.append(con[pos])
                pos += 1
            matches = [r for r in range(1, 5) if got == toks[max(0, i - r) : i] + toks[i + 1 : i + 1 + r]]
            assert matches, (i, c, got)
            if 4 <= i < len(toks) - 4:  # away from the edges the radius is determined
                assert len(matches) == 1
                radii.append(matches[0])
    assert pos == len(cen)
    counts = np.bincount(radii, minlength=5)[1:]
    assert counts.min() > 0.18 * len(radii), counts  # each of 1..4 about a quarter


def test_batches_unique_ids_inverse_and_shared_negatives(dict_path: Path) -> None:
    model = Word2Vec(dict_path=str(dict_path), dim=4, window=5, neg_num=5, batch_size=50, negatives="batch")
    lines = [" ".join(str(x) for x in np.random.default_rng(k).integers(0, VOCAB, 30)) for k in range(30)]
    batches = list(model.batches(chunk(lines), ctx(4)))
    sizes = [b.examples for b in batches]
    assert all(s == 50 for s in sizes[:-1]) and 0 < sizes[-1] <= 50
    for b in batches:
        d = b.data
        emb_ids, w_ids = b.sparse_ids[EMB], b.sparse_ids[EMB_W]
        assert emb_ids.dtype == np.int64 and w_ids.dtype == np.int64
        assert len(set(emb_ids.tolist())) == len(emb_ids) and len(set(w_ids.tolist())) == len(w_ids)
        np.testing.assert_array_equal(b.sparse_ids[EMB_B], w_ids)
        np.testing.assert_array_equal(emb_ids[d.inv_centre], d.centre)
        np.testing.assert_array_equal(w_ids[d.inv_context], d.context)
        np.testing.assert_array_equal(w_ids[d.inv_negatives], d.negatives)
        assert set(emb_ids.tolist()) == set(d.centre.tolist())
        assert set(w_ids.tolist()) == set(d.context.tolist()) | set(d.negatives.tolist())
        assert d.negatives.shape == (5,)  # one set of negatives for every pair of the batch
        for name in (EMB, EMB_W, EMB_B):
            assert len(b.sparse_ids[name]) <= model.max_batch_ids(name)
    assert (model.max_batch_ids(EMB), model.max_batch_ids(EMB_W)) == (40, 40)  # the vocabulary bounds both
    small = Word2Vec(dict_path=str(dict_path), batch_size=20, neg_num=5, negatives="batch")
    assert (small.max_batch_ids(EMB), small.max_batch_ids(EMB_W), small.max_batch_ids(EMB_B)) == (20, 25, 25)


def test_per_pair_batches_unique_ids_inverse_and_own_negatives(dict_path: Path) -> None:
    model = Word2Vec(dict_path=str(dict_path), dim=4, window=5, neg_num=5, batch_size=50, negatives="pair")
    lines = [" ".join(str(x) for x in np.random.default_rng(k).integers(0, VOCAB, 30)) for k in range(30)]
    batches = list(model.batches(chunk(lines), ctx(4)))
    sizes = [b.examples for b in batches]
    assert all(s == 50 for s in sizes[:-1]) and 0 < sizes[-1] <= 50
    for b in batches:
        d = b.data
        emb_ids, w_ids = b.sparse_ids[EMB], b.sparse_ids[EMB_W]
        assert emb_ids.dtype == np.int64 and w_ids.dtype == np.int64
        assert len(set(emb_ids.tolist())) == len(emb_ids) and len(set(w_ids.tolist())) == len(w_ids)
        np.testing.assert_array_equal(b.sparse_ids[EMB_B], w_ids)
        assert d.negatives.shape == d.inv_negatives.shape == (b.examples, 5)  # one set per pair
        np.testing.assert_array_equal(emb_ids[d.inv_centre], d.centre)
        np.testing.assert_array_equal(w_ids[d.inv_context], d.context)
        np.testing.assert_array_equal(w_ids[d.inv_negatives], d.negatives)
        assert set(emb_ids.tolist()) == set(d.centre.tolist())
        assert set(w_ids.tolist()) == set(d.context.tolist()) | set(d.negatives.ravel().tolist())
        for name in (EMB, EMB_W, EMB_B):
            assert len(b.sparse_ids[name]) <= model.max_batch_ids(name)
        # different pairs draw different negatives (50 draws of 5 from a 40-word vocabulary)
        rows = {tuple(r) for r in d.negatives.tolist()}
        assert len(rows) > 0.9 * b.examples
    assert (model.max_batch_ids(EMB), model.max_batch_ids(EMB_W)) == (40, 40)
    small = Word2Vec(dict_path=str(dict_path), batch_size=3, neg_num=5, negatives="pair")
    assert (small.max_batch_ids(EMB), small.max_batch_ids(EMB_W), small.max_batch_ids(EMB_B)) == (3, 18, 18)


def test_per_pair_negatives_follow_unigram_to_the_075(dict_path: Path) -> None:
    model = Word2Vec(dict_path=str(dict_path), dim=4, window=1, neg_num=5, batch_size=100, negatives="pair")
    lines = ["1 2"] * 4000  # 8000 pairs, 40000 negatives
    negs = np.concatenate([b.data.negatives for b in model.batches(chunk(lines), ctx(1))])
    assert negs.shape == (8000, 5)
    counts = np.array([int(line.split()[1]) for line in dict_path.read_text().splitlines()], np.float64)
    expected = counts**0.75 / (counts**0.75).sum()
    observed = np.bincount(negs.ravel(), minlength=VOCAB) / negs.size
    np.testing.assert_allclose(observed, expected, atol=0.01)
    # pairs of one batch do not share their draws: the first negative varies within a batch
    assert len(set(negs[:100, 0].tolist())) > 5


def test_guided_sampler_equals_searchsorted() -> None:
    from aps.models.word2vec import batching as K
    from aps.models.word2vec.corpus import sample_negatives

    rng = np.random.default_rng(3)
    counts = np.concatenate([rng.integers(1, 10**6, 50), np.ones(3000), rng.integers(0, 3, 500)])
    cdf = negative_cdf(counts)
    u = np.concatenate([rng.random(200_000), [0.0, np.nextafter(1.0, 0.0), cdf[0], cdf[17], cdf[-1]]])
    u = np.concatenate([u, np.arange(1 << 12) / (1 << 12)])  # bucket edges
    out = np.empty(u.shape[0], np.int32)
    K.sample_cdf(cdf, K.negative_guide(cdf, bits=10), u, out)
    np.testing.assert_array_equal(out, sample_negatives(cdf, u))


def test_negatives_follow_unigram_to_the_075(dict_path: Path) -> None:
    model = Word2Vec(dict_path=str(dict_path), dim=4, window=1, neg_num=5, batch_size=1, negatives="batch")
    lines = ["1 2"] * 4000  # 8000 one-pair batches, 40000 negatives
    negs = np.concatenate([b.data.negatives for b in model.batches(chunk(lines), ctx(1))])
    counts = np.array([int(line.split()[1]) for line in dict_path.read_text().splitlines()], np.float64)
    expected = counts**0.75 / (counts**0.75).sum()
    observed = np.bincount(negs, minlength=VOCAB) / len(negs)
    np.testing.assert_allclose(observed, expected, atol=0.01)
    np.testing.assert_allclose(negative_cdf(counts)[-1], 1.0)


def test_batches_are_reproducible_from_the_worker_seed(dict_path: Path) -> None:
    model = Word2Vec(dict_path=str(dict_path), dim=4, batch_size=10)
    lines = ["1 2 3 4 5 6 7 8 9 10 11 12"] * 5
    a = [b.data.context.tolist() + b.data.negatives.tolist() for b in model.batches(chunk(lines), ctx(3))]
    b = [b.data.context.tolist() + b.data.negatives.tolist() for b in model.batches(chunk(lines), ctx(3))]
    c = [b.data.context.tolist() + b.data.negatives.tolist() for b in model.batches(chunk(lines), ctx(4))]
    assert a == b and a != c


# ---------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    "bad,what", [("x3", "not a word id"), ("-1", "not a word id"), ("40", "vocabulary size 40"), ("1" * 25, "vocabulary")]
)
def test_bad_token_is_a_data_error_with_file_and_line(dict_path: Path, bad: str, what: str) -> None:
    model = Word2Vec(dict_path=str(dict_path), dim=4)
    c = chunk(["1 2 3", "4 5", f"6 {bad} 7", "8 9"], first_line=10, name="data/part-3")
    with pytest.raises(DataError) as info:
        list(model.batches(c, ctx()))
    assert info.value.file == "data/part-3" and info.value.line == 12
    assert what in str(info.value) and bad[:20] in str(info.value)


def test_skip_bad_lines_drops_and_counts_them(dict_path: Path) -> None:
    model = Word2Vec(dict_path=str(dict_path), dim=4, window=1, batch_size=1000, negatives="batch")
    c = ctx(skip=True)
    lines = ["1 2", "3 oops 4", "5 6", "7 999", "\t8 \t9\r", ""]
    ids, offsets = model.parse(chunk(lines), c)
    assert ids.tolist() == [1, 2, 5, 6, 8, 9] and offsets.tolist() == [0, 2, 4, 6]
    assert c.bad_lines == 2
    (batch,) = list(model.batches(chunk(lines), c))
    assert sorted(zip(batch.data.centre.tolist(), batch.data.context.tolist())) == [
        (1, 2), (2, 1), (5, 6), (6, 5), (8, 9), (9, 8)
    ]
    assert c.bad_lines == 4


def test_empty_chunk_gives_no_batches(dict_path: Path) -> None:
    model = Word2Vec(dict_path=str(dict_path), dim=4)
    assert list(model.batches(chunk(["", "5", "  "]), ctx())) == []


# ---------------------------------------------------------------- settings and tables


def test_tables_match_the_reference_network(dict_path: Path) -> None:
    model = Word2Vec(dict_path=str(dict_path), dim=20, lr=1.0, negatives="batch", lr_schedule="exponential")
    emb, emb_w, emb_b = model.tables()
    assert (emb.name, emb.rows, emb.dim, emb.init) == (EMB, VOCAB, 20, Uniform(-0.025, 0.025))
    assert (emb_w.name, emb_w.rows, emb_w.dim, emb_w.init) == (EMB_W, VOCAB, 20, Constant(0.0))
    assert (emb_b.name, emb_b.rows, emb_b.dim, emb_b.init) == (EMB_B, VOCAB, 1, Constant(0.0))
    for t in (emb, emb_w, emb_b):
        assert t.optimizer == SGD(1.0, ExponentialDecay(100_000, 0.999, staircase=True))


def test_model_args_from_the_command_line(dict_path: Path) -> None:
    cls = load_model_class("word2vec")
    assert cls is Word2Vec
    args = parse_model_args([f"dict_path={dict_path}", "dim=16", "lr=0.5", "batch_size=200", "decay_rate=0.9"])
    model = cls(**args)
    assert (model.dim, model.lr, model.batch_size, model.decay_rate) == (16, 0.5, 200, 0.9)
    assert Word2Vec(dict_path=str(dict_path), dim="12", lr="2").dim == 12  # text works too
    with pytest.raises(ConfigError, match="dim"):
        Word2Vec(dict_path=str(dict_path), dim="wide")
    with pytest.raises(ConfigError, match="window"):
        Word2Vec(dict_path=str(dict_path), window=0)
    model = cls(**parse_model_args([f"dict_path={dict_path}", "negatives=pair"]))
    assert model.negatives == "pair" and model.describe()["negatives"] == "pair"
    default = Word2Vec(dict_path=str(dict_path))
    assert (default.negatives, default.lr, default.lr_schedule, default.batch_size, default.bias) == ("window", 0.025, "linear", 1000, False)
    assert default.table(EMB).optimizer == SGD(0.025)  # the model scales it (linear schedule, geo)
    with pytest.raises(ConfigError, match="lr_schedule"):
        Word2Vec(dict_path=str(dict_path), lr_schedule="cosine")
    with pytest.raises(ConfigError, match="negatives"):
        Word2Vec(dict_path=str(dict_path), negatives="word")
    with pytest.raises(ConfigError, match="not found"):
        Word2Vec(dict_path=str(dict_path.parent / "missing.txt"))


def test_pickled_model_is_small_and_carries_no_caches(dict_path: Path) -> None:
    model = Word2Vec(dict_path=str(dict_path), dim=8, batch_size=5)
    batch = first_batch(model, LINES)
    model.local_sgd(batch, random_params(model), {EMB: 0.1, EMB_W: 0.1, EMB_B: 0.1}, {k: np.zeros(VOCAB, np.uint8) for k in (EMB, EMB_W, EMB_B)})
    assert set(model._process_local) >= {"cdf", "work"}  # the cdf and scratch buffers exist in this process
    assert "window" in vars(model._process_local["work"])
    blob = pickle.dumps(model)
    assert len(blob) < 4096
    clone = pickle.loads(blob)
    assert "_process_local" not in vars(clone) and clone.tables() == model.tables()


# ---------------------------------------------------------------- evaluation and export


def test_export_reads_back_in_gensim(tmp_path: Path) -> None:
    gensim_models = pytest.importorskip("gensim.models")
    rng = np.random.default_rng(0)
    words = ["<UNK>", "the", "königin", "a", "zebra"]
    vectors = rng.normal(0, 1, (5, 7)).astype(np.float32)
    for binary in (False, True):
        path = tmp_path / f"vec.{'bin' if binary else 'txt'}"
        assert export_word2vec(vectors, words, path, binary=binary) == 4
        kv = gensim_models.KeyedVectors.load_word2vec_format(str(path), binary=binary)
        assert list(kv.index_to_key) == words[1:]
        np.testing.assert_array_equal(kv.vectors, vectors[1:])
    with pytest.raises(ConfigError, match="whitespace"):
        export_word2vec(vectors[:2], ["<UNK>", "two words"], tmp_path / "bad.txt")


def _analogy_fixture(tmp_path: Path) -> tuple[np.ndarray, list[str], Path]:
    # axes: person, royal, female, capital, country, fr, it, noise
    axes = {name: np.eye(8, dtype=np.float32)[i] for i, name in enumerate("person royal female capital country fr it noise".split())}
    table = {
        "<UNK>": axes["noise"],
        "man": axes["person"],
        "woman": axes["person"] + axes["female"],
        "king": axes["person"] + axes["royal"],
        "queen": axes["person"] + axes["royal"] + axes["female"],
        "paris": axes["capital"] + axes["fr"],
        "france": axes["country"] + axes["fr"],
        "rome": axes["capital"] + axes["it"],
        "italy": axes["country"] + axes["it"],
        "rare": axes["noise"] + axes["it"],
    }
    words = list(table)
    questions = tmp_path / "q.txt"
    questions.write_text(
        ": family\nMan Woman King Queen\nwoman man queen king\nman woman king paris\n"
        ": capitals\nParis France Rome Italy\nparis france rome zebra\nrome italy rare france\n"
    )
    return np.stack([table[w] for w in words]), words, questions


def test_analogy_accuracy_on_a_hand_built_embedding(tmp_path: Path) -> None:
    vectors, words, questions = _analogy_fixture(tmp_path)
    result = analogy_accuracy(vectors * 3.0, words, questions, restrict_vocab=8)  # norms do not matter
    family, capitals = result.sections
    # the third family question expects the wrong answer (the truth is queen)
    assert (family.name, family.questions, family.asked, family.correct) == ("family", 3, 3, 2)
    # zebra is unknown and rare is outside the first 8 real words: both skipped
    assert (capitals.name, capitals.questions, capitals.asked, capitals.correct) == ("capitals", 3, 1, 1)
    total = result.total
    assert (total.questions, total.asked, total.correct) == (6, 4, 3)
    assert total.accuracy == 0.75 and total.coverage == pytest.approx(4 / 6)
    assert "| total | 6 | 4 | 3 | 75.0% |" in result.table()
    assert analogy_accuracy(vectors, words, questions, restrict_vocab=30000).sections[1].asked == 2


def test_analogy_accuracy_equals_gensim(tmp_path: Path) -> None:
    gensim_models = pytest.importorskip("gensim.models")
    rng = np.random.default_rng(7)
    words = ["<UNK>"] + [f"w{i}" for i in range(300)]
    vectors = rng.normal(0, 1, (len(words), 12)).astype(np.float32)
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    lines = []
    for s in range(3):
        lines.append(f": section{s}\n")
        for k in range(200):
            q = rng.integers(1, 330, 4)  # ids >= 301 are unknown words
            if k % 2 == 0 and q[:3].max() <= 250:  # half the answers are the brute-force 3CosAdd winner
                scores = unit[1:251] @ (unit[q[1]] - unit[q[0]] + unit[q[2]])
                scores[q[:3] - 1] = -np.inf
                q[3] = 1 + int(scores.argmax())
            lines.append(" ".join(f"W{i - 1}" for i in q) + "\n")
    questions = tmp_path / "q.txt"
    questions.write_text("".join(lines))
    ours = analogy_accuracy(vectors, words, questions, restrict_vocab=250)
    export_word2vec(vectors, words, tmp_path / "v.bin", binary=True)
    kv = gensim_models.KeyedVectors.load_word2vec_format(str(tmp_path / "v.bin"), binary=True)
    _, sections = kv.evaluate_word_analogies(str(questions), restrict_vocab=250)
    for mine, theirs in zip(ours.sections, sections):
        assert mine.correct == len(theirs["correct"]) and mine.asked == len(theirs["correct"]) + len(theirs["incorrect"])
    assert ours.total.asked > 100 and ours.total.correct > 50


def test_read_helpers(tmp_path: Path) -> None:
    (tmp_path / "d.txt").write_text("<UNK> 3\nthe 10\ncat 2\n")
    assert read_words(tmp_path / "d.txt") == ["<UNK>", "the", "cat"]
    (tmp_path / "q.txt").write_text(": s\nA B C D\n\n")
    assert read_questions(tmp_path / "q.txt") == [("s", [("a", "b", "c", "d")])]
    (tmp_path / "bad.txt").write_text(": s\nA B C\n")
    with pytest.raises(ConfigError, match="4 words"):
        read_questions(tmp_path / "bad.txt")
    rows = normalize_rows(np.array([[3.0, 4.0], [0.0, 0.0]]))
    np.testing.assert_allclose(rows, [[0.6, 0.8], [0.0, 0.0]])


# ---------------------------------------------------------------- window mode (pWord2Vec sharing)


def window_reference(params: Params, targets: list[tuple[int, list[int], list[int]]], lr: float | None,
                     bias: bool = True) -> tuple[float, dict[str, np.ndarray]]:
    """Window mode in float64, pair by pair: for each ``(target, contexts, negatives)`` every
    context is an input scored against the target (label 1) and each negative not equal to the
    target (label 0). ``lr=None``: gradients of the summed loss, all at the starting parameters.
    ``lr`` set: SGD applied after each target (what the in-place geo step does), returned as the
    final tables. Without ``bias`` the bias column is a constant (never updated).
    Returns the summed loss and the gradients or tables."""
    p = {k: v.astype(np.float64).copy() for k, v in params.sparse.items()}
    g = {k: np.zeros_like(v) for k, v in p.items()}
    loss = 0.0
    for target, contexts, negatives in targets:
        d = {k: np.zeros_like(v) for k, v in p.items()}
        outs = [(target, 1.0)] + [(n, 0.0) for n in negatives if n != target]
        for c in contexts:
            for o, label in outs:
                s = p[EMB][c] @ p[EMB_W][o] + p[EMB_B][o, 0]
                loss += np.logaddexp(0.0, -s) if label else np.logaddexp(0.0, s)
                ds = 0.5 * (1.0 + np.tanh(s / 2)) - label
                d[EMB][c] += ds * p[EMB_W][o]
                d[EMB_W][o] += ds * p[EMB][c]
                d[EMB_B][o, 0] += ds if bias else 0.0
        for k in p:
            if lr is None:
                g[k] += d[k]
            else:
                p[k] -= lr * d[k]
    return loss, (g if lr is None else p)


def window_targets(batch: Batch) -> list[tuple[int, list[int], list[int]]]:
    d = batch.data
    off = d.ctx_off - d.ctx_off[0]
    return [(int(t), d.context[off[i] : off[i + 1]].tolist(), d.negatives[i].tolist()) for i, t in enumerate(d.target)]


def window_model(dict_path: Path, **kw: object) -> Word2Vec:
    args = {"dim": 8, "window": 3, "neg_num": 4, "batch_size": 1000, "negatives": "window", "lr_schedule": "exponential"}
    return Word2Vec(dict_path=str(dict_path), **{**args, **kw})


@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("scale", [0.3, 30.0], ids=["moderate", "saturated"])
def test_window_gradient_matches_numpy_reference(dict_path: Path, scale: float, bias: bool) -> None:
    model = window_model(dict_path, bias=bias)
    batch = first_batch(model, LINES)
    assert (EMB_B in batch.sparse_ids) == bias and len(model.tables()) == 2 + bias
    targets = window_targets(batch)
    # the tiny skewed vocabulary makes some negative equal its target: those are skipped
    assert any(t in negs for t, _, negs in targets)
    assert sum(len(c) for _, c, _ in targets) == batch.examples
    params = random_params(model, scale=scale)
    if not bias:
        params.sparse[EMB_B][:] = 0.0  # what the model without a bias table computes with
    grads = zero_grads(batch, model)
    loss = model.compute(batch, params, grads)
    ref_loss, ref = window_reference(params, targets, lr=None)
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    for name in batch.sparse_ids:
        ids = batch.sparse_ids[name]
        atol = 1e-6 * max(1.0, np.abs(ref[name]).max())
        np.testing.assert_allclose(grads.sparse[name], ref[name][ids], rtol=2e-4, atol=atol)
        assert not ref[name][np.setdiff1d(np.arange(model.vocab_size), ids)].any()


def test_window_geo_step_is_sgd_in_place_target_by_target(dict_path: Path) -> None:
    model = window_model(dict_path, batch_size=20)
    batches = list(model.batches(chunk(LINES), ctx(5)))
    assert len(batches) > 1
    params = random_params(model, seed=7, scale=0.3)
    params.sparse[EMB_B][:] = 0.0  # no bias table by default in window mode: a constant 0
    start = Params({k: v.copy() for k, v in params.sparse.items()}, {})
    dirty = {k: np.zeros(VOCAB, np.uint8) for k in params.sparse}
    lr = 0.05
    loss = sum(model.local_sgd(b, params, {EMB: lr, EMB_W: lr, EMB_B: lr}, dirty) for b in batches)
    targets = [t for b in batches for t in window_targets(b)]
    ref_loss, ref = window_reference(start, targets, lr=lr, bias=False)
    assert loss == pytest.approx(ref_loss, rel=1e-4)
    assert not ref[EMB_B].any() and not params.sparse[EMB_B].any() and not dirty[EMB_B].any()
    for name in (EMB, EMB_W):
        np.testing.assert_allclose(params.sparse[name], ref[name], rtol=1e-4, atol=1e-6)
        changed = np.flatnonzero((params.sparse[name] != start.sparse[name]).any(axis=1))
        assert set(changed.tolist()) <= set(np.flatnonzero(dirty[name]).tolist())  # every written row is dirty
    assert set(np.flatnonzero(dirty[EMB]).tolist()) == {c for _, cs, _ in targets for c in cs}


def test_window_batches_are_whole_targets_of_about_batch_size_pairs(dict_path: Path) -> None:
    model = window_model(dict_path, batch_size=30, window=5, neg_num=5, dim=4)
    lines = [" ".join(str(x) for x in np.random.default_rng(k).integers(0, VOCAB, 30)) for k in range(30)]
    batches = list(model.batches(chunk(lines), ctx(4)))
    for b in batches[:-1]:
        assert 30 - 2 * 5 < b.examples <= 30 - 1 + 2 * 5
    for b in batches:
        d = b.data
        emb_ids, w_ids = b.sparse_ids[EMB], b.sparse_ids[EMB_W]
        np.testing.assert_array_equal(emb_ids[d.inv_context], d.context)
        np.testing.assert_array_equal(w_ids[d.inv_target], d.target)
        np.testing.assert_array_equal(w_ids[d.inv_negatives], d.negatives)
        assert set(w_ids.tolist()) == set(d.target.tolist()) | set(d.negatives.ravel().tolist())
        assert d.negatives.shape == (len(d.target), 5)  # K negatives per target, shared by its contexts
        assert set(b.sparse_ids) == {EMB, EMB_W}  # no bias table in window mode by default
        for name in (EMB, EMB_W):
            assert len(b.sparse_ids[name]) <= model.max_batch_ids(name)


def test_linear_schedule_reaches_the_floor_at_the_end_of_the_run(dict_path: Path) -> None:
    """Two workers, two epochs: each worker's share of the run, chunk by chunk, ends at the floor."""
    lines = [" ".join(str(x) for x in np.random.default_rng(k).integers(1, VOCAB, 12)) for k in range(100)]
    # the corpus: 2400 tokens an epoch, of which this worker (one of two) reads its 1200
    model = Word2Vec(dict_path=str(dict_path), dim=4, batch_size=50, epochs=2, epoch_tokens=2400, lr_floor=1e-3)
    assert model.describe()["epoch_tokens_from"] == "epoch_tokens"
    worker = WorkerContext(trainer_id=0, worker_id=1, num_trainers=1, num_workers=2, rng=np.random.default_rng(0))
    factors = []
    for _epoch in range(2):
        for part in (lines[:50], lines[50:]):
            factors += [model.lr_factor(b.data.progress) for b in model.batches(chunk(part), worker)]
    assert 0.98 < factors[0] < 1.0  # one batch of ~50 pairs: ~10 of this worker's 2400 tokens
    assert all(a >= b for a, b in zip(factors, factors[1:]))  # it only decays
    assert factors[-1] == 1e-3  # the configured floor, reached at the end of the run
    assert factors[len(factors) // 2] == pytest.approx(0.5, abs=0.05)
    # a third epoch the schedule does not span (a step loop that goes on): the rate holds its
    # floor, and the trainer's worker 0 says so once
    with structlog.testing.capture_logs() as logs:
        for lead in (worker, WorkerContext(trainer_id=0, worker_id=0, num_trainers=1, num_workers=2,
                                           rng=np.random.default_rng(1))):
            for part in (lines, lines):
                assert {model.lr_factor(b.data.progress) for b in model.batches(chunk(part), lead)} == {1e-3}
    said = [entry for entry in logs if entry["event"] == "word2vec_schedule_overrun"]
    assert len(said) == 1 and "holds its floor" in said[0]["text"] and "epoch_tokens" in said[0]["text"]


@pytest.mark.parametrize("negatives", ["window", "pair", "batch"])
def test_linear_schedule_scales_the_pushed_gradient_in_every_mode(dict_path: Path, negatives: str) -> None:
    """Outside geo the pservers' SGD runs at a fixed lr: the linear schedule multiplies the
    gradient by its factor, which is exactly the decayed rate; every mode takes the default."""
    args = dict(dict_path=str(dict_path), dim=4, batch_size=20, negatives=negatives, lr=0.5)
    linear, constant = Word2Vec(**args), Word2Vec(**args, lr_schedule="exponential", decay_rate=1.0)
    batch = first_batch(linear, LINES)
    params = random_params(linear, seed=4)
    grads = []
    for model, progress in ((linear, 0.3), (constant, 0.3), (linear, 0.0)):
        g = zero_grads(batch, model)
        loss = model.compute(Batch(batch.sparse_ids, batch.examples, batch.data._replace(progress=progress)), params, g)
        grads.append((loss, g.sparse))
    (loss_l, g_l), (loss_c, g_c), (_, g_0) = grads
    assert loss_l == pytest.approx(loss_c)  # the loss is not scaled, only the step
    for name in g_c:
        assert np.abs(g_c[name]).max() > 0
        np.testing.assert_allclose(g_l[name], 0.7 * g_c[name], rtol=1e-5, atol=1e-7)
        np.testing.assert_array_equal(g_0[name], g_c[name])
    for mode in ("sync", "async", "half_async", "geo"):
        check_trainer(linear, Strategy(mode=mode), ClusterSpec(["127.0.0.1:1"]), 0)


def test_linear_schedule_reads_the_prepared_token_count(dict_path: Path) -> None:
    model = Word2Vec(dict_path=str(dict_path), dim=4)
    assert model.epoch_tokens == sum(int(line.split()[1]) for line in dict_path.read_text().splitlines())
    (dict_path.parent / "meta.json").write_text('{"tokens_after_downsampling": 12345}')
    prepared = Word2Vec(dict_path=str(dict_path), dim=4)
    assert (prepared.epoch_tokens, prepared.describe()["epoch_tokens_from"]) == (12345, str(dict_path.parent / "meta.json"))


def test_window_geo_step_is_lr_times_trainers(dict_path: Path) -> None:
    """Geo divides each trainer's delta by the trainer count; window mode's local step makes up
    for it: 2 trainers at lr step exactly as 1 trainer at 2 x lr."""
    moved = []
    for trainers, lr in ((2, 1e-2), (1, 2e-2), (1, 1e-2)):
        model = window_model(dict_path)
        worker = WorkerContext(trainer_id=0, worker_id=0, num_trainers=trainers, num_workers=1, rng=np.random.default_rng(0))
        batch = next(iter(model.batches(chunk(LINES), worker)))
        params = random_params(model, seed=1)
        start = params.sparse[EMB].copy()
        model.local_sgd(batch, params, {EMB: lr, EMB_W: lr, EMB_B: lr}, {k: np.zeros(VOCAB, np.uint8) for k in params.sparse})
        moved.append(params.sparse[EMB] - start)
    np.testing.assert_array_equal(moved[0], moved[1])
    assert np.abs(moved[0] - moved[2]).max() > 1e-3


# ---------------------------------------------------------------- the run's epochs, the warm-up


def test_the_trainers_epochs_are_the_ones_the_linear_schedule_spans(dict_path: Path) -> None:
    """One source of truth: the trainer hands its --epochs to the model; an epochs model
    argument that differs is refused at start, in one line that says what to pass."""
    model = Word2Vec(dict_path=str(dict_path), dim=4)
    assert (model.epochs, model.describe()["epochs_from"]) == (1, "trainer")
    model.begin_run(3)
    assert model.epochs == 3
    # the schedule now spans 3 epochs: at the end of the first it is 2/3 of the way up
    worker = ctx()
    lines = ["1 2 3 4 5 6 7 8 9 10"] * 30
    model.epoch_tokens = 300
    last = [b.data.progress for b in model.batches(chunk(lines), worker)][-1]
    assert last == pytest.approx(1 / 3)
    same = Word2Vec(dict_path=str(dict_path), dim=4, epochs=2)
    same.begin_run(2)
    assert same.epochs == 2 and same.describe()["epochs_from"] == "epochs"
    with pytest.raises(ConfigError, match=r"epochs=3 but the trainer runs --epochs 1: .* drop --model-arg epochs \(or pass epochs=1\)"):
        Word2Vec(dict_path=str(dict_path), dim=4, epochs=3).begin_run(1)
    # the exponential schedule does not span the run: nothing to disagree about
    exponential = Word2Vec(dict_path=str(dict_path), dim=4, epochs=3, lr_schedule="exponential")
    exponential.begin_run(1)
    assert exponential.epochs == 1


def test_a_trainer_refuses_a_model_with_other_epochs_before_starting_anything(dict_path: Path) -> None:
    from aps.trainer.trainer import Trainer

    model = Word2Vec(dict_path=str(dict_path), dim=4, epochs=3)
    # no pserver listens at this address: the refusal comes before any connection or worker
    trainer = Trainer(model, Strategy(mode="geo", workers=1), ClusterSpec(["127.0.0.1:9"]), 0)
    with pytest.raises(ConfigError, match="--epochs 2"):
        trainer.train([str(dict_path)], epochs=2)


@pytest.mark.parametrize("negatives", ["window", "pair", "batch"])
def test_warm_up_leaves_no_trace(dict_path: Path, negatives: str) -> None:
    """A worker warms its kernels up before its first batch: the batches it then makes (random
    streams, progress) are those it makes without the warm-up."""
    lines = ["1 2 3 4 5 6 7 8 9 10 11 12"] * 20
    schedule = "linear" if negatives == "window" else "exponential"
    runs = []
    for warm in (False, True):
        model = Word2Vec(dict_path=str(dict_path), dim=4, batch_size=20, negatives=negatives, lr_schedule=schedule)
        worker = ctx(5)
        if warm:
            model.warm_up(worker, local_sgd=negatives == "window")
        runs.append([(b.data.negatives.tolist(), b.data.progress) for b in model.batches(chunk(lines), worker)])
    assert runs[0] == runs[1] and len(runs[0]) > 3


@pytest.mark.parametrize(
    "text,line",
    [("root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1::/usr/sbin:/usr/sbin/nologin\n", 1),  # not a dictionary
     ("<UNK> 7\nw1 100\nw2 many\nw3 4\n", 3),  # a count that is not a number
     ("<UNK> 7\nw1 100\n\nw3 4\n", 3)],  # a blank line would shift every later id
)
def test_a_file_that_is_not_a_dictionary_fails_at_construction(tmp_path: Path, text: str, line: int) -> None:
    """Not in a worker's first batch: the model reads the whole file as it is made."""
    path = tmp_path / "passwd"
    path.write_text(text)
    with pytest.raises(DataError) as info:
        Word2Vec(dict_path=str(path))
    assert (info.value.file, info.value.line) == (str(path), line)
    assert "expected a 'word count' line" in str(info.value)


def test_a_dictionary_of_zero_counts_fails_at_construction(tmp_path: Path) -> None:
    path = tmp_path / "dict.txt"
    path.write_text("<UNK> 0\nw1 0\n")
    with pytest.raises(ConfigError, match="every word count is zero"):
        Word2Vec(dict_path=str(path))


def test_geo_window_batches_skip_the_unique_ids_and_step_the_same(dict_path: Path) -> None:
    """A geo worker's window batches carry no unique ids (its step works on global ids), and
    its step moves the parameters exactly as with them."""
    lines = ["1 2 3 4 5 6 7 8 9 10 11 12 13 14", "3 9 27 1 3 9 27"] * 10
    results = []
    for local in (False, True):
        model = window_model(dict_path, batch_size=40, lr_schedule="linear")
        worker = WorkerContext(trainer_id=0, worker_id=0, num_trainers=1, num_workers=1, rng=np.random.default_rng(2),
                               local_sgd=local)
        batches = list(model.batches(chunk(lines), worker))
        assert len(batches) > 2
        assert all((b.sparse_ids == {} and len(b.data.inv_context) == 0) == local for b in batches)
        params = random_params(model, seed=3)
        dirty = {k: np.zeros(VOCAB, np.uint8) for k in params.sparse}
        for b in batches:
            model.local_sgd(b, params, {EMB: 0.05, EMB_W: 0.05, EMB_B: 0.05}, dirty)
        results.append((params.sparse[EMB], params.sparse[EMB_W], dirty[EMB], dirty[EMB_W]))
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)
    assert results[0][2].sum() > 5  # rows were written (and marked)


def test_index_rows_finds_each_batchs_distinct_rows_in_order_of_first_use() -> None:
    from aps.models.word2vec.batching import BatchRows, index_rows

    ids, bounds = (lambda *x: np.array(x, np.int32)), (lambda *x: np.array(x, np.int64))
    # two batches: inputs [5 7 5] | [7], positives [9] | [5 9], negatives [7 9] | [9 2]
    rows = BatchRows(ids(5, 7, 5, 7), bounds(0, 3, 4), ids(9, 5, 9), bounds(0, 1, 3), ids(7, 9, 9, 2), bounds(0, 2, 4))
    mark = np.full(10, -1, np.int32)
    ix = index_rows(rows, mark)
    assert ix.u_in[: ix.u_in_off[-1]].tolist() == [5, 7, 7] and ix.u_in_off.tolist() == [0, 2, 3]
    assert ix.u_out[: ix.u_out_off[-1]].tolist() == [9, 7, 5, 9, 2] and ix.u_out_off.tolist() == [0, 2, 5]
    assert ix.inv_in.tolist() == [0, 1, 0, 0] and ix.inv_pos.tolist() == [0, 0, 1] and ix.inv_neg.tolist() == [1, 0, 1, 2]
    assert (mark == -1).all()  # left as found, for the next chunk


@pytest.mark.parametrize("negatives,kind", [("window", "WindowSampling"), ("batch", "PairSampling"),
                                            ("pair", "PairSampling")])
def test_each_sampling_mode_is_one_object_that_owns_its_batches_and_bounds(dict_path: Path, negatives: str,
                                                                            kind: str) -> None:
    from aps.models.word2vec import sampling

    model = Word2Vec(dict_path=str(dict_path), dim=4, batch_size=20, neg_num=3, negatives=negatives)
    assert type(model.sampling).__name__ == kind
    batch_type = sampling.WindowBatch if negatives == "window" else sampling.PairBatch
    assert all(isinstance(b.data, batch_type) for b in model.batches(chunk(LINES), ctx()))
    pairs = 20 - 1 + 2 * 5 if negatives == "window" else 20
    outputs = {"window": pairs * 4, "batch": 20 + 3, "pair": 20 * 4}[negatives]
    assert model.sampling.max_batch_ids(EMB) == min(pairs, VOCAB) == model.max_batch_ids(EMB)
    assert model.sampling.max_batch_ids(EMB_W) == min(outputs, VOCAB) == model.max_batch_ids(EMB_W)


def test_kernels_inlining_a_fast_math_step_compile_with_its_flags() -> None:
    """numba's ``inline="always"`` inlines a function's IR into its caller, which is then
    compiled with the *caller's* flags: a caller without fast-math left the window step's dot
    products unvectorised (its reductions need ``reassoc``), 1.7x slower per pair. Every kernel of
    the step module that calls an inlined fast-math function must carry that function's flags."""
    import inspect

    from numba.core.registry import CPUDispatcher

    from aps.models.word2vec import step

    kernels = {name: f for name, f in vars(step).items() if isinstance(f, CPUDispatcher)}
    inlined_fast = {name: f.targetoptions["fastmath"] for name, f in kernels.items()
                    if f.targetoptions.get("inline") == "always" and f.targetoptions.get("fastmath")}
    assert inlined_fast, "the window step is an inlined fast-math function"
    checked = 0
    for name, f in kernels.items():
        source = inspect.getsource(f.py_func)
        for callee, flags in inlined_fast.items():
            if callee != name and f"{callee}(" in source:
                assert set(f.targetoptions.get("fastmath") or ()) >= set(flags), f"{name} inlines {callee}"
                checked += 1
    assert checked >= 2  # window_sgd and window_grad
