"""word2vec end to end: a corpus with planted analogies is learnt through real pservers.

The corpus (made here, seeded) has ``FAMILIES`` topics; for each topic ``i`` four words
``country{i}``, ``capital{i}``, ``singular{i}``, ``plural{i}``. Every sentence holds one of them
with two of its topic's words and two words of its *role* (``nation flag border`` for countries,
``city mayor downtown`` for capitals, ...), shuffled, plus a filler word. So a word's vector is
"its topic + its role", and ``country_i : capital_i :: country_j : ?`` has the answer
``capital_j`` - but only if training worked: random vectors score about 1 / vocabulary.

Two ways to run the same cluster shape: the Trainer API with an in-process pserver (always), and
``bin/aps-local`` with real processes (1 pserver, 2 trainers x 1 worker) and the model's default
setting; the Trainer-API tests use the reference network's setting.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import aps
from aps.cluster import ClusterSpec
from aps.models.word2vec.evaluate import analogy_accuracy, load_checkpoint_table, pull_table, read_words
from aps.models.word2vec.model import Word2Vec
from aps.trainer import Strategy, Trainer, TrainOptions

ROOT = Path(__file__).resolve().parents[2]
FAMILIES = 10
ROLES = {
    "country": ["nation", "flag", "border"],
    "capital": ["city", "mayor", "downtown"],
    "singular": ["one", "single", "alone"],
    "plural": ["many", "several", "crowd"],
}
RELATIONS = [("country", "capital"), ("singular", "plural")]
#: the reference network's setting (shared negatives per batch, staircase decay), for the API tests
MODEL_ARGS = {"dim": 16, "window": 5, "neg_num": 5, "batch_size": 100, "lr": 1.0, "negatives": "batch", "lr_schedule": "exponential"}


def make_corpus(root: Path, families: int = FAMILIES, sentences_per_word: int = 100, files: int = 4, seed: int = 0) -> Path:
    """Write dict.txt, train/part-* (id lines) and questions.txt under ``root``."""
    rng = np.random.default_rng(seed)
    filler = [f"filler{i}" for i in range(20)]
    lines: list[list[str]] = []
    for f in range(families):
        topic = [f"topic{f}x{k}" for k in range(3)]
        for kind, role in ROLES.items():
            for _ in range(sentences_per_word):
                toks = [f"{kind}{f}", *rng.choice(topic, 2, replace=False), *rng.choice(role, 2, replace=False), rng.choice(filler)]
                rng.shuffle(toks)
                lines.append([str(t) for t in toks])
    order = rng.permutation(len(lines))
    counts: dict[str, int] = {}
    for line in lines:
        for t in line:
            counts[t] = counts.get(t, 0) + 1
    words = ["<UNK>"] + sorted(counts, key=lambda w: (-counts[w], w))
    ids = {w: i for i, w in enumerate(words)}
    root.mkdir(parents=True, exist_ok=True)
    (root / "dict.txt").write_text("<UNK> 0\n" + "".join(f"{w} {counts[w]}\n" for w in words[1:]))
    train = root / "train"
    train.mkdir(exist_ok=True)
    for k in range(files):
        part = [lines[i] for i in order[k::files]]
        (train / f"part-{k:05d}").write_text("".join(" ".join(str(ids[t]) for t in line) + "\n" for line in part))
    questions = []
    for a, b in RELATIONS:
        questions.append(f": {a}-{b}\n")
        questions += [f"{a}{i} {b}{i} {a}{j} {b}{j}\n" for i in range(families) for j in range(families) if i != j]
    (root / "questions.txt").write_text("".join(questions))
    return root


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return make_corpus(tmp_path_factory.mktemp("w2v_corpus"))


def score(vectors: np.ndarray, corpus: Path) -> float:
    result = analogy_accuracy(vectors, read_words(corpus / "dict.txt"), corpus / "questions.txt")
    assert result.total.coverage == 1.0 and result.total.questions == 2 * FAMILIES * (FAMILIES - 1)
    return result.total.accuracy


def test_random_vectors_fail_the_planted_analogies(corpus: Path) -> None:
    """The bar the trained runs clear is not reachable by chance."""
    vocab = len(read_words(corpus / "dict.txt"))
    assert score(np.random.default_rng(0).normal(size=(vocab, 16)), corpus) < 0.1


@pytest.mark.slow
async def test_trainer_api_geo_1_pserver_1_trainer_2_workers(corpus: Path, tmp_path: Path) -> None:
    server = await aps.serve(port=0, num_trainers=1, exit_when_done=False, checkpoint_root=str(tmp_path))
    try:
        model = Word2Vec(dict_path=str(corpus / "dict.txt"), **MODEL_ARGS)
        options = TrainOptions(save_dir=str(tmp_path / "model"), print_period=60, live_line=False)
        trainer = Trainer(model, Strategy(mode="geo", workers=2, k_steps=200), ClusterSpec([server.address], 1), 0, options)
        result = await trainer.atrain([str(corpus / "train")], epochs=2)
        live = await pull_table(server.address, "emb")
    finally:
        await server.aclose()
    first, last = result.epochs[0], result.epochs[-1]
    # pairs per epoch: about 6 per token (random windows, so not the same twice)
    assert 50_000 < first["examples"] and abs(first["examples"] - last["examples"]) < 0.05 * first["examples"]
    assert last["loss"] < first["loss"] < 6 * np.log(2)  # below the loss of all-zero logits
    saved = load_checkpoint_table(tmp_path / "model" / "epoch_1", "emb")
    np.testing.assert_array_equal(saved, live)  # what the pserver holds is what it saved
    accuracy = score(saved, corpus)
    assert accuracy >= 0.9

    # the example CLI on the same checkpoint, and gensim's own evaluation of what it exports
    vectors = tmp_path / "vectors.bin"
    cli = [
        sys.executable, str(ROOT / "examples" / "word2vec" / "eval.py"), "--checkpoint", str(tmp_path / "model" / "epoch_1"),
        "--dict", str(corpus / "dict.txt"), "--questions", str(corpus / "questions.txt"), "--export", str(vectors), "--binary",
    ]
    out = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    asked = 2 * FAMILIES * (FAMILIES - 1)
    assert f"| total | {asked} | {asked} | {round(accuracy * asked)} |" in out.stdout
    gensim_models = pytest.importorskip("gensim.models")
    kv = gensim_models.KeyedVectors.load_word2vec_format(str(vectors), binary=True)
    gensim_accuracy, _ = kv.evaluate_word_analogies(str(corpus / "questions.txt"))
    assert gensim_accuracy == pytest.approx(accuracy)


@pytest.mark.slow
async def test_trainer_api_async_uses_compute(corpus: Path) -> None:
    """Async mode takes the other path: rows pulled per batch, ``compute`` gradients pushed and
    applied by the pserver's SGD."""
    server = await aps.serve(port=0, num_trainers=1, exit_when_done=False)
    try:
        model = Word2Vec(dict_path=str(corpus / "dict.txt"), **MODEL_ARGS)
        options = TrainOptions(save_dir=None, print_period=60, live_line=False)
        await Trainer(model, Strategy(mode="async", workers=2), ClusterSpec([server.address], 1), 0, options).atrain(
            [str(corpus / "train")], epochs=2
        )
        live = await pull_table(server.address, "emb")
    finally:
        await server.aclose()
    assert score(live, corpus) >= 0.9


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["geo", "sync", "async", "half_async", "hybrid"])
def test_aps_local_2x2_default_setting_in_every_mode(corpus: Path, tmp_path: Path, mode: str) -> None:
    """The model's default (window-shared negatives, linear decay over the run) through real
    processes, in every mode: 2 pservers, 2 trainers x 1 worker, as README's command line with
    only --mode changed. Outside geo the decay scales the pushed gradients."""
    launcher = ROOT / "bin" / "aps-local"
    epochs = 3 if mode == "geo" else 2
    cmd = [
        sys.executable, str(launcher), "2x2", "--mode", mode, "--log-dir", str(tmp_path / "log"), "--timeout", "240",
        "--status-interval", "0", "--", "--model", "word2vec", f"--model-arg=dict_path={corpus / 'dict.txt'}",
        "--model-arg=dim=16", "--data", str(corpus / "train"), "--workers", "1", "--epochs", str(epochs),
        "--save-dir", str(tmp_path / "model"), "--print-period", "60",
    ]
    if mode == "geo":
        cmd += ["--k-steps", "100"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    saved = load_checkpoint_table(tmp_path / "model" / f"epoch_{epochs - 1}", "emb")
    assert score(saved, corpus) >= 0.9
