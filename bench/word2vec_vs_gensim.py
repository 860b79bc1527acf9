#!/usr/bin/env python3
"""word2vec: aps vs gensim on the same prepared corpora, hyper-parameters, epochs and seeds.

* gensim ``Word2Vec(sg=1, workers=2)``, timed as ``train()`` (its own words/s) and as the whole
  ``build_vocab`` + ``train`` (what a user waits for);
* aps ``aps-local 1x1 --workers 2`` in geo mode (1 pserver + 1 trainer with 2 compute workers),
  timed as the whole command (start-up, training, saving, shutdown: what a user waits for) and as
  the trainer's epoch time; the model's default setting, and with ``--reference`` also the
  reference network's (``negatives=batch lr=1.0 lr_schedule=exponential``, one seed).

Hyper-parameters: dim 100, window 5, 5 negatives; min_count 5 and sample 1e-3 applied once by
prepare_data.py, so gensim gets the filtered, downsampled corpus with ``min_count=1, sample=0``.
words/s = *raw* corpus tokens (before min_count and downsampling, as gensim counts them when it
downsamples itself; prepare_data.py's ``total_tokens``) x epochs / seconds, for both systems.
Accuracy: gensim's ``evaluate_word_analogies(restrict_vocab=30000)`` on questions-words.txt (from
gensim's wheel) for every run's vectors, aps's exported in the word2vec binary format; reported
as the mean over ``--seeds`` seeds with the lowest and highest.

    python bench/word2vec_vs_gensim.py [--data data/word2vec,data/word2vec_docs] [--epochs 1,3] [--seeds 3]
    python bench/word2vec_vs_gensim.py --data data/word2vec --epochs 1 --seeds 1 --workers 1,2,4,8,14   # 16 cores

Speed depends on what else runs on the machine: the 1-minute load average before and after each
run is recorded next to its numbers.
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
from collections.abc import Callable
from pathlib import Path
from statistics import mean

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ("negatives=batch", "lr=1.0", "lr_schedule=exponential")


def load_average() -> float:
    return os.getloadavg()[0]


def gensim_eval(path: Path, questions: Path) -> tuple[float, int]:
    from gensim.models import KeyedVectors

    kv = KeyedVectors.load_word2vec_format(str(path), binary=True)
    score, sections = kv.evaluate_word_analogies(str(questions), restrict_vocab=30000)
    total = sections[-1]
    return float(score), len(total["correct"]) + len(total["incorrect"])


def run_gensim(data: Path, epochs: int, dim: int, seed: int, workers: int, out: Path) -> dict:
    from gensim.models import Word2Vec
    from gensim.models.word2vec import PathLineSentences

    from aps.models.word2vec.evaluate import read_words
    from aps.models.word2vec.export import export_word2vec

    words = read_words(data / "dict.txt")
    started = time.perf_counter()
    model = Word2Vec(sg=1, workers=workers, vector_size=dim, window=5, negative=5, sample=0, min_count=1, seed=seed)
    corpus = PathLineSentences(str(data / "train"))
    model.build_vocab(corpus)
    trained = time.perf_counter()
    model.train(corpus, total_examples=model.corpus_count, epochs=epochs)
    done = time.perf_counter()
    vectors = np.zeros((len(words), dim), np.float32)  # gensim's keys are our ids
    for key, index in model.wv.key_to_index.items():
        vectors[int(key)] = model.wv.vectors[index]
    export_word2vec(vectors, words, out, binary=True)
    return {"train_seconds": done - trained, "wall_seconds": done - started}


def run_aps(data: Path, epochs: int, dim: int, seed: int, workers: int, work: Path, out: Path,
            model_args: tuple[str, ...]) -> dict:
    from aps.models.word2vec.evaluate import load_checkpoint_table, read_words
    from aps.models.word2vec.export import export_word2vec

    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    cmd = [
        sys.executable, str(ROOT / "bin" / "aps-local"), "1x1", "--mode", "geo", "--status-interval", "0", "--",
        "--model", "word2vec", "--model-arg", f"dict_path={data / 'dict.txt'}", "--model-arg", f"dim={dim}",
        "--model-arg", f"seed={seed}", "--seed", str(seed),
        "--data", str(data / "train"), "--epochs", str(epochs), "--workers", str(workers),
        "--save-dir", str(work / "model"), "--print-period", "600",
    ]
    for arg in model_args:
        cmd += ["--model-arg", arg]
    started = time.perf_counter()
    subprocess.run(cmd, cwd=work, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    records = [json.loads(line) for line in (work / "log" / "trainer.0.metrics.jsonl").read_text().splitlines()]
    epoch_seconds = sum(r["seconds"] for r in records if r["event"] == "epoch")
    vectors = load_checkpoint_table(work / "model" / f"epoch_{epochs - 1}", "emb")
    export_word2vec(vectors, read_words(data / "dict.txt"), out, binary=True)
    return {"train_seconds": epoch_seconds, "wall_seconds": wall}


def summarise(runs: list[dict], raw_tokens: int, epochs: int) -> dict:
    acc = [r["accuracy"] for r in runs]
    return {
        "runs": runs, "seeds": len(runs),
        "accuracy_mean": mean(acc), "accuracy_min": min(acc), "accuracy_max": max(acc),
        "words_per_s_train": mean(raw_tokens * epochs / r["train_seconds"] for r in runs),
        "words_per_s_wall": mean(raw_tokens * epochs / r["wall_seconds"] for r in runs),
        "load_avg": [min(min(r["load_before"], r["load_after"]) for r in runs),
                     max(max(r["load_before"], r["load_after"]) for r in runs)],
    }


def bench_corpus(data: Path, epochs_list: list[int], seeds: int, dim: int, reference: bool, workers: int,
                 tmp: Path) -> dict:
    meta = json.loads((data / "meta.json").read_text())
    raw_tokens = int(meta["total_tokens"])
    questions = data / "questions-words.txt"
    systems: list[tuple[str, int, Callable[[int, int, Path], dict]]] = [
        ("gensim", seeds, lambda e, s, out: run_gensim(data, e, dim, s, workers, out)),
        ("aps", seeds, lambda e, s, out: run_aps(data, e, dim, s, workers, tmp / "aps", out, ())),
    ]
    if reference:
        systems.append(("aps reference setting", 1, lambda e, s, out: run_aps(data, e, dim, s, workers, tmp / "aps", out, REFERENCE)))
    result: dict = {"data": str(data), "workers": workers, "raw_tokens": raw_tokens, "trained_tokens": int(meta["tokens_after_downsampling"]),
                    "questions_in_vocab": meta.get("analogy", {}).get("in_vocab"), "epochs": {}}
    for epochs in epochs_list:
        rows = {}
        for name, n_seeds, run in systems:
            runs = []
            for seed in range(n_seeds):
                out = tmp / "vectors.bin"
                before = load_average()
                r = run(epochs, seed, out)
                r["load_before"], r["load_after"] = before, load_average()
                r["accuracy"], r["asked"] = gensim_eval(out, questions)
                r["seed"] = seed
                runs.append(r)
                print(f"{data.name} {epochs} epoch(s) {workers} workers {name} seed {seed}: {r['wall_seconds']:.1f} s whole run, "
                      f"{r['train_seconds']:.1f} s training, accuracy {100 * r['accuracy']:.2f}%, "
                      f"load {before:.1f}/{r['load_after']:.1f}", file=sys.stderr, flush=True)
            rows[name] = summarise(runs, raw_tokens, epochs)
        result["epochs"][str(epochs)] = rows
    return result


def table(results: list[dict]) -> str:
    lines = [
        "| corpus | epochs | workers | run | words/s whole run | vs gensim | words/s training | vs gensim | accuracy: mean (min-max), seeds | load avg |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for res in results:
        for epochs, rows in res["epochs"].items():
            base = rows["gensim"]
            for name, r in rows.items():
                lines.append(
                    f"| {Path(res['data']).name} ({res['raw_tokens'] / 1e6:.1f}M raw tokens) | {epochs} | {res['workers']} | {name} "
                    f"| {r['words_per_s_wall']:,.0f} | {r['words_per_s_wall'] / base['words_per_s_wall']:.2f}x "
                    f"| {r['words_per_s_train']:,.0f} | {r['words_per_s_train'] / base['words_per_s_train']:.2f}x "
                    f"| {100 * r['accuracy_mean']:.2f}% ({100 * r['accuracy_min']:.2f}-{100 * r['accuracy_max']:.2f}), {r['seeds']} "
                    f"| {r['load_avg'][0]:.1f}-{r['load_avg'][1]:.1f} |"
                )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=f"{ROOT / 'data' / 'word2vec'},{ROOT / 'data' / 'word2vec_docs'}",
                        help="comma-separated prepared corpora (default: the Debian corpus and the second one)")
    parser.add_argument("--epochs", default="1,3", help="comma-separated epoch counts (default 1,3)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per setting (default 3)")
    parser.add_argument("--dim", type=int, default=100)
    parser.add_argument("--workers", default="2",
                        help="comma-separated worker counts: gensim's workers= and aps's --workers (default 2; "
                             "the 16-core sweep: 1,2,4,8,14)")
    parser.add_argument("--reference", action="store_true", help="also the reference network's setting (one seed)")
    parser.add_argument("--json", default=str(ROOT / "bench" / "results" / "word2vec_vs_gensim.json"))
    args = parser.parse_args()
    corpora = [Path(d).resolve() for d in args.data.split(",")]
    for data in corpora:
        if not (data / "meta.json").is_file():
            print(f"error: {data} is not a prepared corpus (run examples/word2vec/prepare_data.py --out {data})",
                  file=sys.stderr)
            return 2
    epochs_list = [int(e) for e in args.epochs.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        results = [bench_corpus(d, epochs_list, args.seeds, args.dim, args.reference, int(w), Path(tmp))
                   for d in corpora for w in args.workers.split(",")]
    print(f"\nword2vec, dim {args.dim}, window 5, 5 negatives; {os.cpu_count()} cores; "
          "aps = aps-local 1x1 --workers W (geo), gensim = Word2Vec(sg=1, workers=W)\n")
    print(table(results))
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "dim": args.dim, "cpus": os.cpu_count(), "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M"), "corpora": results,
    }, indent=2))
    print(f"\nJSON: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
