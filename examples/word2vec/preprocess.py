"""Turn raw text into the id files word2vec trains on.

The pipeline is PaddlePaddle's distributed word2vec data preparation: build a dictionary
(``word count`` lines), convert the corpus to ids while applying word2vec's subsampling of frequent
words, then resplit the result into many equal files so that every worker of every trainer gets
its own share. Three deliberate differences from the reference, each made where it is documented:

* ``<UNK>`` always has id 0. The reference sorts it among the words by its count, so its id moves
  whenever the corpus changes; a fixed id lets a model or a server reserve that row.
* A word is kept when ``count >= min_count`` (word2vec, gensim). The reference drops
  ``count <= min_count``, which silently removes words that occur exactly ``min_count`` times.
* :func:`resplit` balances tokens (workers are paced by tokens, not lines) and can shuffle lines
  across files, because a corpus concatenated from several sources would otherwise hand each
  worker a different domain.

There is no module state: randomness comes from a seeded :class:`numpy.random.Generator`, so two
runs with the same seed write the same bytes.
"""

from __future__ import annotations

import gzip
import io
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path
from types import MappingProxyType
from typing import Literal

import numpy as np

from aps.errors import ConfigError, DataError

UNK = "<UNK>"
UNK_ID = 0
#: word2vec's MAX_SENTENCE_LENGTH: longer lines are cut so a window never spans a whole book
MAX_SENTENCE_LEN = 1000

_WORD = re.compile(r"[^\W\d_]+")
_WORD_OR_NEWLINE = re.compile(r"[^\W\d_]+|\n")
_NEWLINE = "\n"

PathLike = str | os.PathLike


def tokenize(text: str) -> list[str]:
    """Lower-case ``text`` and return its runs of letters, in order.

    Letters only (Unicode-aware): digits, underscores, punctuation and apostrophes separate words,
    so "Don't" gives ``["don", "t"]`` as in the 1B-word benchmark, and numbers (verse numbers,
    dates, code) never enter the vocabulary. The analogy set (questions-words.txt) is all letters
    and the evaluator lower-cases it, so every analogy word is tokenised the same way.
    """
    return _WORD.findall(text.lower())


def list_text_files(path: PathLike) -> list[Path]:
    """``path`` itself if it is a file, else every regular file below it, sorted by path.

    Hidden files and directories (a leading dot) are skipped, so a half-written ``.tmp`` file or
    a ``.git`` folder never becomes training text. Sorting makes the corpus order, and hence the
    random stream of subsampling, independent of the file system.
    """
    root = Path(path)
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise ConfigError(f"no such file or directory: {root}")
    return sorted(
        p for p in root.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)
    )


def _open_text(path: Path) -> io.TextIOBase:
    """Open a text file for reading, gunzipping ``*.gz``; bad bytes become U+FFFD, not errors."""
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8", errors="replace")
    return open(path, encoding="utf-8", errors="replace")


def iter_text_chunks(path: PathLike, chunk_chars: int = 1 << 24) -> Iterator[str]:
    """Yield the file as blocks of whole lines of about ``chunk_chars`` characters.

    Whole lines so that a word or a sentence is never cut; blocks so that the regex and the numpy
    work run on many lines per call instead of once per line.
    """
    with _open_text(Path(path)) as f:
        while lines := f.readlines(chunk_chars):
            yield "".join(lines)


class Dictionary:
    """Words with their corpus counts; a word's id is its position.

    Id 0 is always ``<UNK>``, whose count is the number of tokens of words dropped for being rarer
    than ``min_count``. Ids 1.. are the kept words by count, descending, ties by word, so the most
    frequent words have the smallest ids. The dictionary file has one ``word count`` line per id in
    that order (line 1 is ``<UNK>``, so that file is sorted by count except its first line).
    """

    __slots__ = ("words", "counts", "min_count", "_index")

    def __init__(self, words: Sequence[str], counts: Sequence[int] | np.ndarray,
                 min_count: int | None = None) -> None:
        if not words or words[0] != UNK:
            raise ConfigError(f"a dictionary starts with {UNK!r} at id {UNK_ID}")
        counts_arr = np.array(counts, dtype=np.int64)
        if counts_arr.shape != (len(words),):
            raise ConfigError(f"{len(words)} words but {counts_arr.shape} counts")
        if (counts_arr < 0).any():
            raise ConfigError("word counts cannot be negative")
        counts_arr.flags.writeable = False
        self.words: tuple[str, ...] = tuple(words)
        self.counts: np.ndarray = counts_arr
        self.min_count = min_count
        self._index = {w: i for i, w in enumerate(self.words)}
        if len(self._index) != len(self.words):
            dup = next(w for w, c in Counter(self.words).items() if c > 1)
            raise ConfigError(f"word {dup!r} appears twice in the dictionary")

    @classmethod
    def from_counts(cls, counts: Mapping[str, int], min_count: int = 5) -> Dictionary:
        """Keep words with ``count >= min_count``; fold the rest (and any ``<UNK>`` key) into id 0."""
        if min_count < 1:
            raise ConfigError(f"min_count must be >= 1, got {min_count}")
        unk = counts.get(UNK, 0)
        kept: list[tuple[str, int]] = []
        for word, count in counts.items():
            if word == UNK:
                continue
            if count >= min_count:
                kept.append((word, count))
            else:
                unk += count
        kept.sort(key=lambda wc: (-wc[1], wc[0]))
        return cls([UNK] + [w for w, _ in kept], [unk] + [c for _, c in kept], min_count)

    def __len__(self) -> int:
        return len(self.words)

    def __contains__(self, word: object) -> bool:
        return word in self._index and word != UNK

    def __repr__(self) -> str:
        return f"Dictionary({len(self)} ids, {self.total} tokens, min_count={self.min_count})"

    @property
    def word_to_id(self) -> Mapping[str, int]:
        """Read-only word → id mapping (``<UNK>`` included)."""
        return MappingProxyType(self._index)

    @property
    def total(self) -> int:
        """Number of corpus tokens, ``<UNK>`` included: the corpus size subsampling is relative to."""
        return int(self.counts.sum())

    def id_of(self, word: str) -> int:
        """The id of ``word``, or :data:`UNK_ID` when it is not in the dictionary."""
        return self._index.get(word, UNK_ID)

    def encode(self, tokens: Iterable[str]) -> np.ndarray:
        """Ids of ``tokens`` as int64 (unknown words → :data:`UNK_ID`), mapped in C via ``map``."""
        count = len(tokens) if isinstance(tokens, Sequence) else -1
        return np.fromiter(map(self._index.get, tokens, repeat(UNK_ID)), np.int64, count)

    def keep_probabilities(self, sample: float = 1e-3) -> np.ndarray:
        """Probability that one occurrence of each id survives subsampling.

        word2vec's formula, ``keep = (sqrt(f / t) + 1) * t / f`` with ``t = sample * total`` and
        ``f`` the word's count, clipped to 1: words rarer than about ``2.6 t`` are always kept and
        very frequent words lose most occurrences, which speeds training and improves rare-word
        vectors. ``sample <= 0`` disables subsampling.
        """
        counts = self.counts.astype(np.float64)
        keep = np.ones_like(counts)
        if sample > 0 and self.total > 0:
            t = sample * self.total
            seen = counts > 0
            keep[seen] = (np.sqrt(counts[seen] / t) + 1.0) * t / counts[seen]
            np.minimum(keep, 1.0, out=keep)
        return keep

    def save(self, dict_path: PathLike, word_to_id_path: PathLike | None = None) -> None:
        """Write ``word count`` lines (and ``word id`` lines); atomically, so a crash leaves no half file."""
        _atomic_write(Path(dict_path), "".join(f"{w} {c}\n" for w, c in zip(self.words, self.counts.tolist())))
        if word_to_id_path is not None:
            _atomic_write(Path(word_to_id_path), "".join(f"{w} {i}\n" for i, w in enumerate(self.words)))

    @classmethod
    def load(cls, dict_path: PathLike) -> Dictionary:
        """Read a file written by :meth:`save`; the line number (from 0) is the id."""
        path = Path(dict_path)
        words: list[str] = []
        counts: list[int] = []
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                parts = line.split()
                if len(parts) != 2 or not parts[1].isdigit():
                    raise DataError(f"expected 'word count', got {line.rstrip()!r}", str(path), lineno)
                words.append(parts[0])
                counts.append(int(parts[1]))
        if not words or words[0] != UNK:
            raise DataError(f"first line must be {UNK} (id {UNK_ID})", str(path), 1)
        return cls(words, counts, min(counts[1:], default=None))


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def count_words(source: PathLike | Iterable[str | PathLike | Iterable[str]]) -> Counter[str]:
    """Count tokens from files, tokens or sentences.

    ``source`` is one path (a file, or a directory read with :func:`list_text_files`), or an
    iterable whose items are :class:`os.PathLike` (files to tokenise), ``str`` (one token each:
    already tokenised text) or iterables of ``str`` (a sentence of tokens). Give file names as
    :class:`pathlib.Path`: a plain ``str`` item is a token.
    """
    counter: Counter[str] = Counter()
    items: Iterable = list_text_files(source) if isinstance(source, (str, os.PathLike)) else source
    tokens: list[str] = []
    for item in items:
        if isinstance(item, str):
            tokens.append(item)
            if len(tokens) >= 1 << 16:
                counter.update(tokens)
                tokens.clear()
        elif isinstance(item, os.PathLike):
            for path in list_text_files(item):
                for chunk in iter_text_chunks(path):
                    counter.update(tokenize(chunk))
        else:
            counter.update(item)
    counter.update(tokens)
    return counter


def build_dictionary(source: PathLike | Iterable[str | PathLike | Iterable[str]],
                     min_count: int = 5) -> Dictionary:
    """Count ``source`` (see :func:`count_words`) and keep words seen at least ``min_count`` times."""
    return Dictionary.from_counts(count_words(source), min_count)


@dataclass
class ConvertStats:
    """What a conversion read and wrote; sums with ``+=``."""

    lines_in: int = 0
    tokens_in: int = 0
    unk_in: int = 0
    lines_out: int = 0
    tokens_out: int = 0

    def __iadd__(self, other: ConvertStats) -> ConvertStats:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        return self


def encode_text(text: str, dictionary: Dictionary, *, keep_prob: np.ndarray | None = None,
                rng: np.random.Generator | None = None, drop_unk: bool = False,
                max_sentence_len: int = MAX_SENTENCE_LEN) -> tuple[list[np.ndarray], ConvertStats]:
    """Convert the lines of ``text`` to id arrays, one per output sentence.

    Each line is a sentence. Tokens are mapped to ids, then each token survives with
    ``keep_prob[id]`` (one uniform draw per input token, in order, so the random stream does not
    depend on how the corpus is cut into blocks), ``<UNK>`` is dropped if ``drop_unk`` (the
    reference keeps it), lines left empty are dropped, and lines longer than ``max_sentence_len``
    are cut. All per-token work is numpy or C-level ``map``; Python loops only per sentence.
    """
    if keep_prob is not None and rng is None:
        raise ConfigError("subsampling needs a random generator (rng)")
    flat = _WORD_OR_NEWLINE.findall(text.lower())
    if not text.endswith(_NEWLINE):
        flat.append(_NEWLINE)
    n = len(flat)
    ids = dictionary.encode(flat)
    is_nl = np.fromiter(map(_NEWLINE.__eq__, flat), np.bool_, n)
    is_word = ~is_nl
    stats = ConvertStats(lines_in=int(is_nl.sum()) if text else 0, tokens_in=int(is_word.sum()))
    stats.unk_in = int(np.count_nonzero(is_word & (ids == UNK_ID)))
    keep = is_word.copy()
    if keep_prob is not None:
        draws = rng.random(stats.tokens_in)
        keep[is_word] = draws < keep_prob[ids[is_word]]
    if drop_unk:
        keep &= ids != UNK_ID
    line_of = np.cumsum(is_nl) - is_nl  # number of newlines before each position
    kept_ids = ids[keep]
    kept_line = line_of[keep]
    m = kept_ids.size
    if m == 0:
        return [], stats
    starts = np.ones(m, np.bool_)
    starts[1:] = kept_line[1:] != kept_line[:-1]
    if max_sentence_len > 0:
        first = np.flatnonzero(starts)
        pos = np.arange(m) - first[np.cumsum(starts) - 1]
        starts |= pos % max_sentence_len == 0
    sentences = np.split(kept_ids, np.flatnonzero(starts)[1:])
    stats.lines_out = len(sentences)
    stats.tokens_out = m
    return sentences, stats


def format_id_lines(sentences: Iterable[np.ndarray]) -> str:
    """One line of space-separated ids per sentence, each ending in a newline."""
    return "".join(" ".join(map(str, s.tolist())) + "\n" for s in sentences)


def convert_corpus(files: Sequence[PathLike], output_dir: PathLike, dictionary: Dictionary, *,
                   sample: float = 1e-3, seed: int = 0, drop_unk: bool = False,
                   max_sentence_len: int = MAX_SENTENCE_LEN,
                   progress: Callable[[Path, ConvertStats], None] | None = None) -> ConvertStats:
    """Write ``output_dir/{index:05d}_{name}`` with the id lines of each input file, in order.

    One output per input (the reference's ``convert_text8`` step) keeps memory flat and makes the
    output reproducible from ``seed``; :func:`resplit` balances the files afterwards. Returns totals.
    """
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    keep_prob = dictionary.keep_probabilities(sample) if sample > 0 else None
    total = ConvertStats()
    for index, src in enumerate(map(Path, files)):
        file_stats = ConvertStats()
        target = out / f"{index:05d}_{src.name.removesuffix('.gz')}"
        with open(target, "w", encoding="ascii") as f:
            for chunk in iter_text_chunks(src):
                sentences, stats = encode_text(chunk, dictionary, keep_prob=keep_prob, rng=rng,
                                               drop_unk=drop_unk, max_sentence_len=max_sentence_len)
                f.write(format_id_lines(sentences))
                file_stats += stats
        total += file_stats
        if progress is not None:
            progress(src, file_stats)
    return total


@dataclass(frozen=True)
class SplitFile:
    """One output of :func:`resplit`."""

    path: Path
    lines: int
    tokens: int
    bytes: int


def line_table(data: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Start offset, length (newline included) and token count of every line of ``data``.

    ``data`` must end with a newline (or be empty). Tokens are runs of non-blank bytes, counted
    with numpy so that a 30M-line corpus is measured without a Python loop.
    """
    buf = np.frombuffer(data, np.uint8)
    ends = np.flatnonzero(buf == 10) + 1
    starts = np.concatenate(([0], ends[:-1])).astype(np.int64)
    word = (buf != 32) & (buf != 10) & (buf != 9) & (buf != 13)
    first = word.copy()
    first[1:] &= ~word[:-1]
    csum = np.concatenate(([0], np.cumsum(first, dtype=np.int64)))
    return starts, ends - starts, csum[ends] - csum[starts]


def _read_lines_bytes(path: Path) -> bytes:
    data = path.read_bytes()
    return data + b"\n" if data and not data.endswith(b"\n") else data


def cut_points(weights: np.ndarray, num_parts: int) -> np.ndarray:
    """``num_parts + 1`` boundaries splitting ``weights`` into contiguous parts of near-equal sum.

    Each inner boundary is the one closest to ``j * total / num_parts``, so a part's sum differs
    from the mean by less than the largest single weight.
    """
    n = weights.size
    csum = np.concatenate(([0], np.cumsum(weights, dtype=np.int64)))
    total = int(csum[-1])
    if total == 0:
        return (np.arange(num_parts + 1) * n) // num_parts
    targets = total * np.arange(1, num_parts) / num_parts
    hi = np.searchsorted(csum, targets, side="left")
    lo = np.maximum(hi - 1, 0)
    inner = np.where(targets - csum[lo] <= csum[hi] - targets, lo, hi)
    return np.concatenate(([0], np.maximum.accumulate(inner), [n]))


def resplit(input_dir: PathLike, output_dir: PathLike, num_files: int = 16, *,
            balance: Literal["tokens", "lines"] = "tokens", shuffle: bool = False, seed: int = 0,
            prefix: str = "part-") -> list[SplitFile]:
    """Redistribute the lines of every file in ``input_dir`` into ``num_files`` balanced files.

    Use a multiple of trainers x workers (2 x 2 → 16 or more) so that every worker of every trainer
    owns whole files. Without ``shuffle`` the files are contiguous runs of the input lines (input
    files in sorted order), so their concatenation equals the inputs' byte for byte; with
    ``balance="lines"`` line counts differ by at most one, with ``"tokens"`` token counts differ
    from the mean by less than the longest line. With ``shuffle`` the lines are dealt in a seeded
    random order first (two passes over the data, never all of it in memory). Existing
    ``prefix*`` files in ``output_dir`` are replaced. A missing final newline is added.
    """
    if num_files < 1:
        raise ConfigError(f"num_files must be >= 1, got {num_files}")
    if balance not in ("tokens", "lines"):
        raise ConfigError(f"balance must be 'tokens' or 'lines', got {balance!r}")
    inputs = list_text_files(input_dir)
    lengths_parts, tokens_parts = [], []
    for path in inputs:  # pass 1: measure every line
        _, lengths, tokens = line_table(_read_lines_bytes(path))
        lengths_parts.append(lengths)
        tokens_parts.append(tokens)
    lengths = np.concatenate(lengths_parts) if inputs else np.zeros(0, np.int64)
    tokens = np.concatenate(tokens_parts) if inputs else np.zeros(0, np.int64)
    n = lengths.size
    rng = np.random.default_rng(seed)
    order = rng.permutation(n) if shuffle else np.arange(n)
    weights = tokens[order] if balance == "tokens" else np.ones(n, np.int64)
    bounds = cut_points(weights, num_files) if balance == "tokens" else (np.arange(num_files + 1) * n) // num_files
    dest = np.empty(n, np.int64)
    dest[order] = np.repeat(np.arange(num_files), np.diff(bounds))

    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob(f"{prefix}*"):
        stale.unlink()
    targets = [out / f"{prefix}{j:05d}" for j in range(num_files)]
    for t in targets:
        t.touch()
    offset = 0
    for path, count in zip(inputs, (p.size for p in lengths_parts)):  # pass 2: scatter
        data = _read_lines_bytes(path)
        view = memoryview(data)
        starts, lens, _ = line_table(data)
        local = dest[offset:offset + count]
        offset += count
        if not shuffle:  # runs of equal destination are contiguous byte ranges
            run_starts = np.flatnonzero(np.diff(local, prepend=-1))
            run_ends = np.append(run_starts[1:], count)
            for a, b in zip(run_starts.tolist(), run_ends.tolist()):
                with open(targets[local[a]], "ab") as f:
                    f.write(view[starts[a]:starts[b - 1] + lens[b - 1]])
            continue
        by_dest = np.argsort(local, kind="stable")
        group_bounds = np.searchsorted(local[by_dest], np.arange(num_files + 1))
        for j in range(num_files):
            rows = by_dest[group_bounds[j]:group_bounds[j + 1]]
            if rows.size:
                with open(targets[j], "ab") as f:
                    f.write(b"".join([view[s:s + ln] for s, ln in zip(starts[rows].tolist(), lens[rows].tolist())]))
    if shuffle:  # pass 3: random order inside each file
        for t in targets:
            lines = t.read_bytes().split(b"\n")[:-1]
            if len(lines) > 1:
                t.write_bytes(b"\n".join([lines[i] for i in rng.permutation(len(lines))]) + b"\n")
    line_counts = np.bincount(dest, minlength=num_files)
    token_counts = np.bincount(dest, weights=tokens, minlength=num_files)
    byte_counts = np.bincount(dest, weights=lengths, minlength=num_files)
    return [SplitFile(t, int(a), int(b), int(c)) for t, a, b, c in zip(targets, line_counts, token_counts, byte_counts)]
