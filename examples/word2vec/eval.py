#!/usr/bin/env python3
"""Word analogy accuracy of trained word2vec embeddings (the reference's eval.py).

Reads the ``emb`` table from a checkpoint the pservers saved (``--checkpoint model/epoch_0``,
any number of shards) or from running pservers (``--pservers host:port,...``), scores
``questions-words.txt`` the way gensim's ``evaluate_word_analogies`` does (3CosAdd over the
first ``--restrict-vocab`` words, questions lower-cased) and prints a Markdown table per
section. ``--export`` also writes the vectors in word2vec format (``--binary`` for the binary
one), readable by ``gensim.models.KeyedVectors.load_word2vec_format``.

    python examples/word2vec/eval.py --checkpoint model/epoch_0
    python examples/word2vec/eval.py --pservers 127.0.0.1:7164 --export vectors.bin --binary
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from aps.errors import ApsError
from aps.models.word2vec.evaluate import analogy_accuracy, load_vectors, read_words
from aps.models.word2vec.export import export_word2vec


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", help="a checkpoint directory saved by the pservers (e.g. model/epoch_0)")
    src.add_argument("--pservers", help="host:port of every pserver, comma-separated, in index order")
    p.add_argument("--token", help="shared secret of the pservers")
    p.add_argument("--dict", default="data/word2vec/dict.txt", help="the dictionary the model was trained with")
    p.add_argument("--questions", default="data/word2vec/questions-words.txt", help="the analogy test set")
    p.add_argument("--table", default="emb", help="which table holds the word vectors (default emb)")
    p.add_argument("--restrict-vocab", type=int, default=30000, help="candidates: the N most frequent words (default 30000, as gensim)")
    p.add_argument("--export", metavar="PATH", help="also write the vectors in word2vec format")
    p.add_argument("--binary", action="store_true", help="with --export: the binary format")
    p.add_argument("--json", metavar="PATH", help="write the per-section numbers as JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        pservers = args.pservers.split(",") if args.pservers else None
        vectors = load_vectors(args.checkpoint, pservers, args.table, args.token)
        words = read_words(args.dict)
        started = time.perf_counter()
        result = analogy_accuracy(vectors, words, args.questions, args.restrict_vocab)
        seconds = time.perf_counter() - started
        if args.export:
            n = export_word2vec(vectors, words, args.export, binary=args.binary)
            print(f"wrote {n} vectors to {args.export}", file=sys.stderr)
    except (ApsError, OSError) as exc:
        print(f"eval.py: error: {exc}", file=sys.stderr)
        return 2
    print(result.table())
    total = result.total
    print(f"\naccuracy {100 * total.accuracy:.2f}% ({total.correct}/{total.asked}), coverage "
          f"{100 * total.coverage:.1f}% of {total.questions}, restrict_vocab {result.restrict_vocab}, {seconds:.1f}s")
    if args.json:
        sections = [{"section": s.name, "questions": s.questions, "asked": s.asked, "correct": s.correct,
                     "accuracy": s.accuracy, "coverage": s.coverage} for s in [*result.sections, total]]
        with open(args.json, "w") as f:
            json.dump(sections, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
