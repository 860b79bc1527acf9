#!/usr/bin/env python3
"""word2vec: aps vs gensim on the same prepared corpus and hyper-parameters.

* gensim ``Word2Vec(sg=1, workers=2)``;
* aps, 1 pserver + 1 trainer x 2 workers, geo (``aps-local 1x1 --workers 2``);
* aps, 2 pservers + 2 trainers x 1 worker, geo (``aps-local 2x2 --workers 1``: the same two
  compute processes, spread over two trainers);
* both aps set-ups twice: with the reference network's negatives (``neg_num`` drawn once per
  batch of 100 pairs, shared, lr 1.0) and with gensim's sampling (``negatives=pair``: ``neg_num``
  per pair, lr 2.5 = gensim's 0.025 per pair over a batch of 100).

Hyper-parameters: dim 100, window 5, 5 negatives, min_count 5 and sample 1e-3 (both applied once
by prepare_data.py, so gensim gets the already filtered and downsampled corpus with
``min_count=1, sample=0``), the same number of epochs. Words/s = corpus tokens x epochs /
training seconds (gensim: ``train()`` only; aps: the slowest trainer's epoch time, start-up
excluded). Accuracy: gensim's own ``evaluate_word_analogies(restrict_vocab=30000)`` on every
model's vectors, aps's exported through the word2vec binary format.

    python bench/word2vec_vs_gensim.py [--data data/word2vec] [--epochs 1]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def gensim_eval(path: Path, questions: Path) -> tuple[float, int]:
    from gensim.models import KeyedVectors

    kv = KeyedVectors.load_word2vec_format(str(path), binary=True)
    score, sections = kv.evaluate_word_analogies(str(questions), restrict_vocab=30000)
    total = sections[-1]
    return float(score), len(total["correct"]) + len(total["incorrect"])


def run_gensim(data: Path, epochs: int, dim: int, tokens: int, out: Path) -> dict:
    from gensim.models import Word2Vec
    from gensim.models.word2vec import PathLineSentences

    from aps.models.word2vec.evaluate import read_words
    from aps.models.word2vec.export import export_word2vec

    words = read_words(data / "dict.txt")
    model = Word2Vec(sg=1, workers=2, vector_size=dim, window=5, negative=5, sample=0, min_count=1, seed=1)
    corpus = PathLineSentences(str(data / "train"))
    model.build_vocab(corpus)
    started = time.perf_counter()
    model.train(corpus, total_examples=model.corpus_count, epochs=epochs)
    seconds = time.perf_counter() - started
    vectors = np.zeros((len(words), dim), np.float32)  # gensim's keys are our ids
    for key, index in model.wv.key_to_index.items():
        vectors[int(key)] = model.wv.vectors[index]
    export_word2vec(vectors, words, out, binary=True)
    return {"seconds": seconds, "words_per_s": tokens * epochs / seconds}


def run_aps(
    data: Path, epochs: int, dim: int, tokens: int, cluster: str, workers: int, work: Path, out: Path, *model_args: str
) -> dict:
    from aps.models.word2vec.evaluate import load_checkpoint_table, read_words
    from aps.models.word2vec.export import export_word2vec

    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    cmd = [
        sys.executable, str(ROOT / "bin" / "aps-local"), cluster, "--mode", "geo", "--status-interval", "60", "--",
        "--model", "word2vec", "--model-arg", f"dict_path={data / 'dict.txt'}", "--model-arg", f"dim={dim}",
        "--data", str(data / "train"), "--epochs", str(epochs), "--workers", str(workers),
        "--save-dir", str(work / "model"), "--print-period", "60",
    ]
    for arg in model_args:
        cmd += ["--model-arg", arg]
    started = time.perf_counter()
    subprocess.run(cmd, cwd=work, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    seconds = 0.0
    for metrics in (work / "log").glob("trainer.*.metrics.jsonl"):
        records = [json.loads(line) for line in metrics.read_text().splitlines()]
        epoch_time = sum(r["seconds"] for r in records if r["event"] == "epoch")
        seconds = max(seconds, epoch_time)
    vectors = load_checkpoint_table(work / "model" / f"epoch_{epochs - 1}", "emb")
    export_word2vec(vectors, read_words(data / "dict.txt"), out, binary=True)
    return {"seconds": seconds, "wall_seconds": wall, "words_per_s": tokens * epochs / seconds}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(ROOT / "data" / "word2vec"))
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--dim", type=int, default=100)
    parser.add_argument("--json", default=str(ROOT / "bench" / "results" / "word2vec_vs_gensim.json"))
    args = parser.parse_args()
    data = Path(args.data).resolve()
    meta = json.loads((data / "meta.json").read_text())
    tokens = sum(f["tokens"] for f in meta["files"])
    questions = data / "questions-words.txt"
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        runs = [
            ("gensim sg=1 workers=2", lambda out: run_gensim(data, args.epochs, args.dim, tokens, out)),
            ("aps 1 pserver + 1 trainer x 2 workers (geo)",
             lambda out: run_aps(data, args.epochs, args.dim, tokens, "1x1", 2, t / "a", out)),
            ("aps 2 pservers + 2 trainers x 1 worker (geo)",
             lambda out: run_aps(data, args.epochs, args.dim, tokens, "2x2", 1, t / "b", out)),
            ("aps 1 pserver + 1 trainer x 2 workers (geo), negatives per pair, lr 2.5",
             lambda out: run_aps(data, args.epochs, args.dim, tokens, "1x1", 2, t / "c", out, "negatives=pair", "lr=2.5")),
            ("aps 2 pservers + 2 trainers x 1 worker (geo), negatives per pair, lr 2.5",
             lambda out: run_aps(data, args.epochs, args.dim, tokens, "2x2", 1, t / "d", out, "negatives=pair", "lr=2.5")),
        ]
        for k, (name, run) in enumerate(runs):
            out = t / f"vectors{k}.bin"
            result = run(out)
            result["accuracy"], result["asked"] = gensim_eval(out, questions)
            rows[name] = result
            print(f"{name}: {result['words_per_s']:,.0f} words/s, accuracy {100 * result['accuracy']:.2f}%", file=sys.stderr)
    base = rows["gensim sg=1 workers=2"]
    print(f"\nword2vec, {tokens:,} tokens x {args.epochs} epoch(s), dim {args.dim}, window 5, 5 negatives; {os.cpu_count()} cores\n")
    print("| run | words/s | vs gensim | analogy accuracy (gensim evaluator, restrict_vocab 30000) | questions asked |")
    print("|---|---:|---:|---:|---:|")
    for name, r in rows.items():
        print(f"| {name} | {r['words_per_s']:,.0f} | {r['words_per_s'] / base['words_per_s']:.2f}x | {100 * r['accuracy']:.2f}% | {r['asked']} |")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "tokens": tokens, "epochs": args.epochs, "dim": args.dim, "cpus": os.cpu_count(),
        "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M"), "rows": rows,
    }, indent=2))
    print(f"\nJSON: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
