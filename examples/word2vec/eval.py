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
import codecs
import json
import os
import sys
import time

from aps.errors import ApsError, ConfigError
from aps.models.word2vec.evaluate import analogy_accuracy, load_vectors, read_words
from aps.models.word2vec.export import export_word2vec


def _positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (``--restrict-vocab 0`` would silently ask no question)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def check_text_file(flag: str, path: str, hint: str) -> None:
    """ConfigError unless ``path`` is a readable UTF-8 text file; checked before the (slow) load of
    the vectors, and naming the flag, so a wrong path costs nothing and says what to pass."""
    if not os.path.isfile(path):
        what = "is a directory, not a file" if os.path.isdir(path) else "no such file"
        raise ConfigError(f"{flag} {path}: {what} ({hint})")
    with open(path, "rb") as f:
        head = f.read(8192)
    try:  # incremental: the sample may end inside a multi-byte character
        codecs.getincrementaldecoder("utf-8")().decode(head, final=len(head) < 8192)
    except UnicodeDecodeError:
        raise ConfigError(f"{flag} {path} is not a UTF-8 text file ({hint})") from None
    if b"\0" in head:
        raise ConfigError(f"{flag} {path} is a binary file, not text ({hint})")


def check_output(flag: str, path: str | None) -> None:
    """An output's directory must exist: found out now, not after scoring."""
    if path is not None and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        raise ConfigError(f"{flag} {path}: directory {os.path.dirname(path) or '.'} does not exist")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=os.path.basename(__file__), description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", help="a checkpoint directory saved by the pservers (e.g. model/epoch_0)")
    src.add_argument("--pservers", help="host:port of every pserver, comma-separated, in index order")
    p.add_argument("--token", help="shared secret of the pservers")
    p.add_argument("--dict", default="data/word2vec/dict.txt", help="the dictionary the model was trained with")
    p.add_argument("--questions", default="data/word2vec/questions-words.txt", help="the analogy test set")
    p.add_argument("--table", default="emb", help="which table holds the word vectors (default emb)")
    p.add_argument("--restrict-vocab", type=_positive_int, default=30000, help="candidates: the N most frequent words (default 30000, as gensim)")
    p.add_argument("--export", metavar="PATH", help="also write the vectors in word2vec format")
    p.add_argument("--binary", action="store_true", help="with --export: the binary format")
    p.add_argument("--json", metavar="PATH", help="write the per-section numbers as JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.binary and not args.export:
        parser.error("--binary only applies with --export PATH")
    try:
        check_text_file("--dict", args.dict, "the dict.txt made by examples/word2vec/prepare_data.py")
        check_text_file("--questions", args.questions, "questions-words.txt, also made by prepare_data.py")
        check_output("--export", args.export)
        check_output("--json", args.json)
        pservers = args.pservers.split(",") if args.pservers else None
        vectors = load_vectors(args.checkpoint, pservers, args.table, args.token)
        words = read_words(args.dict)
        if len(words) != vectors.shape[0]:
            raise ConfigError(f"--dict {args.dict} has {len(words):,} words but table {args.table!r} has "
                              f"{vectors.shape[0]:,} rows: pass the dictionary the model was trained with")
        started = time.perf_counter()
        result = analogy_accuracy(vectors, words, args.questions, args.restrict_vocab)
        seconds = time.perf_counter() - started
        if args.export:
            n = export_word2vec(vectors, words, args.export, binary=args.binary)
            print(f"wrote {n} vectors to {args.export}", file=sys.stderr)
    except (ConfigError, OSError) as exc:  # what the command line named is wrong or missing
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    except ApsError as exc:  # e.g. a pserver went away: not the user's typo
        print(f"{parser.prog}: failed: {exc}", file=sys.stderr)
        return 1
    print(result.table())
    total = result.total
    print(f"\naccuracy {100 * total.accuracy:.2f}% ({total.correct}/{total.asked}), coverage "
          f"{100 * total.coverage:.1f}% of {total.questions}, restrict_vocab {result.restrict_vocab}, {seconds:.1f}s")
    if args.json:
        sections = [{"section": s.name, "questions": s.questions, "asked": s.asked, "correct": s.correct,
                     "accuracy": s.accuracy, "coverage": s.coverage} for s in [*result.sections, total]]
        try:
            with open(args.json, "w") as f:
                json.dump(sections, f, indent=1)
        except OSError as exc:
            print(f"{parser.prog}: error: --json {args.json}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
