"""Word analogy evaluation (``a : b :: c : ?``) and loading trained embeddings.

The test is the reference's (and gensim's ``evaluate_word_analogies``): the answer is the word
whose vector has the highest cosine with ``emb(b) - emb(a) + emb(c)`` (rows unit-normalised,
"3CosAdd"), ``a``, ``b`` and ``c`` themselves excluded. As in gensim, only the first
``restrict_vocab`` words (dictionary order = most frequent first, ``<UNK>`` not counted) are
candidates, and a question with any word outside them is skipped: *coverage* is the share of
questions asked, *accuracy* the share of asked questions answered right. Questions are
lower-cased because the corpus is.

Embeddings come from a checkpoint saved by the pservers (any number of shards, re-sharded into
one) or straight from a live cluster.

Scoring and pulling show a tqdm bar on stderr only when stderr is a terminal: a person running
eval.py sees it move, while logs, pipes and tests get no control characters.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from tqdm import tqdm

from ...errors import ConfigError
from .export import UNK

#: questions scored per matrix product (bounds memory: batch x restrict_vocab float32)
SCORE_BATCH = 512


@dataclass
class Section:
    """One section of the analogy file (e.g. ``capital-common-countries``)."""

    name: str
    questions: int = 0
    asked: int = 0
    correct: int = 0

    @property
    def accuracy(self) -> float:
        return self.correct / self.asked if self.asked else 0.0

    @property
    def coverage(self) -> float:
        return self.asked / self.questions if self.questions else 0.0


@dataclass
class AnalogyResult:
    """Per-section and total counts; ``total.accuracy`` is gensim's "Total accuracy"."""

    sections: list[Section] = field(default_factory=list)
    restrict_vocab: int = 0

    @property
    def total(self) -> Section:
        t = Section("total")
        for s in self.sections:
            t.questions += s.questions
            t.asked += s.asked
            t.correct += s.correct
        return t

    def table(self) -> str:
        """A Markdown table of every section and the total."""
        lines = ["| section | questions | asked | correct | accuracy | coverage |", "|---|---:|---:|---:|---:|---:|"]
        for s in [*self.sections, self.total]:
            lines.append(
                f"| {s.name} | {s.questions} | {s.asked} | {s.correct} | {100 * s.accuracy:.1f}% | {100 * s.coverage:.1f}% |"
            )
        return "\n".join(lines)


def read_questions(path: str | os.PathLike[str]) -> list[tuple[str, list[tuple[str, str, str, str]]]]:
    """Sections of ``questions-words.txt``: ``: name`` lines, then ``a b c d`` lines (lower-cased)."""
    sections: list[tuple[str, list[tuple[str, str, str, str]]]] = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if line.startswith(":"):
                sections.append((line[1:].strip(), []))
                continue
            parts = line.lower().split()
            if not parts:
                continue
            if len(parts) != 4:
                raise ConfigError(f"{path}:{lineno}: expected 4 words, got {line.strip()!r}")
            if not sections:
                sections.append(("questions", []))
            sections[-1][1].append((parts[0], parts[1], parts[2], parts[3]))
    return sections


def read_words(dict_path: str | os.PathLike[str]) -> list[str]:
    """Words of a ``word count`` dictionary; the list index is the id."""
    with open(dict_path, encoding="utf-8") as f:
        return [line.split(maxsplit=1)[0] if line.strip() else "" for line in f]


def normalize_rows(vectors: np.ndarray) -> np.ndarray:
    """Unit rows as float32 (zero rows stay zero instead of becoming NaN)."""
    v = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(v, axis=1, keepdims=True)
    return v / np.where(norms > 0, norms, 1.0).astype(np.float32)


def analogy_accuracy(
    vectors: np.ndarray,
    words: Sequence[str],
    questions: str | os.PathLike[str] | list[tuple[str, list[tuple[str, str, str, str]]]],
    restrict_vocab: int = 30000,
) -> AnalogyResult:
    """Score every analogy question; see the module docstring for the exact rule.

    ``vectors[i]`` is the embedding of ``words[i]``; ``<UNK>`` (and empty words) are never
    candidates and do not count towards ``restrict_vocab``.
    """
    if len(words) != vectors.shape[0]:
        raise ConfigError(f"{len(words)} words but {vectors.shape[0]} vectors")
    sections = read_questions(questions) if isinstance(questions, (str, os.PathLike)) else questions
    real = [i for i, w in enumerate(words) if w and w != UNK][: max(0, restrict_vocab)]
    cand = normalize_rows(vectors[real])
    index = {words[i]: j for j, i in enumerate(real)}
    result = AnalogyResult(restrict_vocab=len(real))
    with tqdm(total=sum(len(items) for _, items in sections), desc="analogies", unit="q",
              disable=not sys.stderr.isatty(), leave=False) as bar:
        for name, items in sections:
            section = Section(name, questions=len(items))
            asked = [q for q in items if all(w in index for w in q)]
            section.asked = len(asked)
            bar.update(len(items) - len(asked))  # skipped questions cost nothing
            if asked:
                ids = np.array([[index[w] for w in q] for q in asked], dtype=np.int64)
                section.correct = int((_predict(cand, ids[:, 0], ids[:, 1], ids[:, 2], bar.update) == ids[:, 3]).sum())
            result.sections.append(section)
    return result


def _predict(cand: np.ndarray, a: np.ndarray, b: np.ndarray, c: np.ndarray,
             done: Callable[[int], object] | None = None) -> np.ndarray:
    """argmax over candidates of cos(target, cand) for target = b - a + c, excluding a, b, c;
    ``done(n)`` is told after each batch of ``n`` questions (the progress bar)."""
    out = np.empty(a.shape[0], dtype=np.int64)
    for start in range(0, a.shape[0], SCORE_BATCH):
        sl = slice(start, start + SCORE_BATCH)
        target = cand[b[sl]] - cand[a[sl]] + cand[c[sl]]
        scores = target @ cand.T  # target's norm does not change the argmax
        rows = np.arange(scores.shape[0])
        for excluded in (a[sl], b[sl], c[sl]):
            scores[rows, excluded] = -np.inf
        out[sl] = scores.argmax(axis=1)
        if done is not None:
            done(scores.shape[0])
    return out


# ---------------------------------------------------------------- where embeddings come from


def load_checkpoint_table(path: str | os.PathLike[str], table: str = "emb") -> np.ndarray:
    """The whole of one sparse table from a pserver checkpoint (any number of shards), rows in
    global id order; the checkpoint's other tables are not read."""
    from ...checkpoints.reader import read_checkpoint  # server code only when reading checkpoints

    return read_checkpoint(path, [table]).array(table)


async def pull_table(
    addresses: Sequence[str] | str, table: str = "emb", token: str | None = None, rows_per_call: int = 1 << 16
) -> np.ndarray:
    """The whole of one sparse table read from live pservers (``aps.connect`` + ``pull_sparse``)."""
    from ...client import connect

    async with connect(addresses, token=token) as ps:
        spec = await ps.table_spec(table)
        rows = getattr(spec, "rows", None)
        if rows is None:
            raise ConfigError(f"table {table!r} is not a sparse table")
        out = np.empty((rows, spec.dim), dtype=np.float32)  # type: ignore[union-attr]
        with tqdm(total=rows, desc=f"pulling {table}", unit="row", unit_scale=True,
                  disable=not sys.stderr.isatty(), leave=False) as bar:
            for start in range(0, rows, rows_per_call):
                ids = np.arange(start, min(rows, start + rows_per_call), dtype=np.int64)
                out[start : start + len(ids)] = await ps.pull_sparse(table, ids)
                bar.update(len(ids))
        return out


def load_vectors(
    checkpoint: str | os.PathLike[str] | None = None,
    pservers: Sequence[str] | str | None = None,
    table: str = "emb",
    token: str | None = None,
) -> np.ndarray:
    """Embeddings from exactly one source: a checkpoint directory or live pservers."""
    if (checkpoint is None) == (pservers is None):
        raise ConfigError("give exactly one of a checkpoint directory or pserver addresses")
    if checkpoint is not None:
        return load_checkpoint_table(checkpoint, table)
    import asyncio

    assert pservers is not None
    return asyncio.run(pull_table(pservers, table, token))
