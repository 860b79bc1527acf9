"""Skip-gram word2vec with negative sampling: the reference network as an aps model plug-in.

The network and its data pipeline are PaddlePaddle Fleet's word2vec example:

* three tables: ``emb`` (centre vectors, uniform in ±0.5/dim), ``emb_w`` (output vectors, zeros)
  and ``emb_b`` (output biases, dim 1, zeros), all trained by SGD with the reference's
  exponential decay (``lr * decay_rate ** floor(step / decay_steps)``, staircase);
* for every centre token a window size drawn uniformly from ``[1, window]``, and every other
  token of the line within it is a context (a *pair* = one reference example);
* ``neg_num`` negatives per batch, drawn from the unigram distribution of ``dict.txt`` raised
  to 0.75 and shared by every pair of the batch (the reference's ``neg_array``);
  ``negatives="pair"`` draws ``neg_num`` of them for every pair instead (word2vec.c / gensim:
  many more distinct negatives per epoch, much better vectors after one epoch, slower steps);
* loss per pair ``softplus(-s_true) + sum_k softplus(s_neg_k)`` (sigmoid cross-entropy).

**Loss and learning rate.** A batch is ``batch_size`` consecutive pairs and its loss is the
*mean* over those pairs, exactly the reference's ``reduce_mean(cost)`` over a batch of examples;
gradients are of that mean and the runtime never rescales them. With the reference's
``batch_size=100`` and ``lr=1.0`` each pair's own step is 0.01, about gensim's average
learning rate (0.025 decaying linearly to 0). A larger batch with the same ``lr`` takes smaller
per-pair steps: scale ``lr`` with ``batch_size / 100`` to keep them (the usual linear rule).

**Deliberate differences from the reference**, each small:

* The reference draws window sizes with ``np.random.random_integers(1, window + 1)``, i.e. from
  ``[1, window + 1]``; its documentation says ``[1, window]``, which is what is done here.
* Batches never span input chunks (1 MiB of text by default): the last batch of a chunk may be
  shorter, and is averaged over its own pairs.
* Negatives are drawn once per batch (the PaddleRec reader); Fleet's generator draws them per
  line and every ``batch_size`` pairs of a line, which gives about the same sharing.
  ``negatives="pair"`` is not the reference at all but word2vec.c's sampling (without its
  skipping of a negative equal to the context word); with it, ``lr`` around 2.5 at
  ``batch_size=100`` (a per-pair step of 0.025, gensim's starting rate) works best.
* ``dim`` defaults to 100 (the reference uses 300) so that a benchmark epoch is quick; pass
  ``dim=300`` for the reference size.

Vocabulary size comes from the number of lines of ``dict.txt`` (read in ``__init__``, which the
table specs need); the counts for negative sampling are read lazily in the worker that first
needs them, so the pickled model stays a handful of settings.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ...errors import ConfigError, DataError
from ...specs import SGD, Constant, ExponentialDecay, SparseTable, TableSpec, Uniform
from ...trainer.model import Batch, Grads, Model, Params, WorkerContext
from ...trainer.reader import Chunk
from . import kernels as K

EMB = "emb"
EMB_W = "emb_w"
EMB_B = "emb_b"

NEGATIVES = ("batch", "pair")

_PARSE_ERRORS = {
    K.PARSE_NOT_INT: "is not a word id (a non-negative integer)",
    K.PARSE_OUT_OF_RANGE: "is not a word id of the dictionary (id >= vocabulary size {vocab})",
}


class PairBatch(NamedTuple):
    """``Batch.data`` of word2vec: where each pair's and negative's rows are, plus global ids.

    ``inv_centre[p]`` is the position of pair ``p``'s centre in ``batch.sparse_ids["emb"]``;
    ``inv_context[p]`` and ``inv_negatives[k]`` are positions in ``batch.sparse_ids["emb_w"]``
    (the same list as ``["emb_b"]``); with ``negatives="pair"``, ``inv_negatives`` and
    ``negatives`` are ``[pairs, neg_num]`` and row ``p`` holds pair ``p``'s own negatives.
    ``centre``/``context``/``negatives`` are the global ids (for inspection and tests; the
    kernels use the positions). All are int32 views of per-chunk arrays, so a batch stays valid
    after the next one is made. A NamedTuple because one is built per batch and tuple
    construction is the cheapest.
    """

    inv_centre: np.ndarray
    inv_context: np.ndarray
    inv_negatives: np.ndarray
    centre: np.ndarray
    context: np.ndarray
    negatives: np.ndarray


def count_lines(path: Path) -> int:
    """Lines of a text file (a last line without newline counts), read in blocks."""
    lines = 0
    last = b"\n"
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            lines += block.count(b"\n")
            last = block[-1:]
    return lines + (last != b"\n")


def read_counts(path: Path) -> np.ndarray:
    """The ``count`` column of a ``word count`` dictionary file (line N = id N)."""
    counts = []
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, 1):
            parts = line.split()
            if len(parts) != 2 or not parts[1].isdigit():
                raise DataError(f"expected 'word count', got {line.rstrip()!r}", str(path), lineno)
            counts.append(int(parts[1]))
    return np.asarray(counts, dtype=np.float64)


def negative_cdf(counts: np.ndarray, power: float = 0.75) -> np.ndarray:
    """Cumulative sampling distribution ``count^power / sum`` (the reference's ``cs``)."""
    weights = np.power(np.asarray(counts, dtype=np.float64), power)
    total = weights.sum()
    if not total > 0:
        raise ConfigError("every word count is zero: cannot sample negatives")
    return np.cumsum(weights / total)


def sample_negatives(cdf: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """Ids for uniforms in [0, 1) by inverse CDF (``cs.searchsorted(u)``), clipped to the vocab
    because the last cumulative value may round to just below 1."""
    ids = np.searchsorted(cdf, uniforms)
    np.minimum(ids, cdf.shape[0] - 1, out=ids)
    return ids.astype(np.int32)


def _int(name: str, value: Any, low: int = 1) -> int:
    try:
        out = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"word2vec {name} must be an integer, got {value!r}") from None
    if out != float(value) or out < low:
        raise ConfigError(f"word2vec {name} must be an integer >= {low}, got {value!r}")
    return out


def _float(name: str, value: Any) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"word2vec {name} must be a number, got {value!r}") from None
    if not out > 0 or out != out or out == float("inf"):
        raise ConfigError(f"word2vec {name} must be a positive number, got {value!r}")
    return out


class Word2Vec(Model):
    """Skip-gram with shared (or per-pair) negatives; see the module docstring for the exact semantics.

    Every argument has a default and accepts text (``--model-arg dim=300``).
    """

    name = "word2vec"

    def __init__(
        self,
        dict_path: str = "data/word2vec/dict.txt",
        dim: int = 100,
        window: int = 5,
        neg_num: int = 5,
        batch_size: int = 100,
        lr: float = 1.0,
        decay_steps: int = 100_000,
        decay_rate: float = 0.999,
        seed: int = 0,
        negatives: str = "batch",
    ) -> None:
        path = Path(str(dict_path)).expanduser().resolve()
        if not path.is_file():
            raise ConfigError(
                f"word2vec dictionary {path} not found; make it with examples/word2vec/prepare_data.py"
            )
        self.dict_path = str(path)
        self.vocab_size = count_lines(path)
        if self.vocab_size < 2:
            raise ConfigError(f"word2vec dictionary {path} has {self.vocab_size} lines; need <UNK> and words")
        self.dim = _int("dim", dim)
        self.window = _int("window", window)
        self.neg_num = _int("neg_num", neg_num)
        self.batch_size = _int("batch_size", batch_size)
        self.lr = _float("lr", lr)
        self.decay_steps = _int("decay_steps", decay_steps)
        self.decay_rate = _float("decay_rate", decay_rate)
        self.seed = _int("seed", seed, low=0)
        if negatives not in NEGATIVES:
            raise ConfigError(f"word2vec negatives must be one of {', '.join(NEGATIVES)}, got {negatives!r}")
        self.negatives = str(negatives)
        optimizer = SGD(self.lr, ExponentialDecay(self.decay_steps, self.decay_rate, staircase=True))
        width = 0.5 / self.dim
        self._tables: tuple[SparseTable, ...] = (
            SparseTable(EMB, self.vocab_size, self.dim, Uniform(-width, width), optimizer, seed=self.seed),
            SparseTable(EMB_W, self.vocab_size, self.dim, Constant(0.0), optimizer, seed=self.seed),
            SparseTable(EMB_B, self.vocab_size, 1, Constant(0.0), optimizer, seed=self.seed),
        )
        self._by_name = {t.name: t for t in self._tables}

    # ------------------------------------------------------------ contract

    def tables(self) -> list[TableSpec]:
        return list(self._tables)

    def table(self, name: str) -> TableSpec:
        return self._by_name[name]

    def max_batch_ids(self, table: str) -> int:
        """A batch reads at most one distinct centre per pair, and one context per pair plus the
        negatives: ``neg_num`` shared ones, or ``neg_num`` per pair (never more than the vocabulary)."""
        if table == EMB:
            return min(self.batch_size, self.vocab_size)
        if table in (EMB_W, EMB_B):
            if self.negatives == "pair":
                return min(self.batch_size * (1 + self.neg_num), self.vocab_size)
            return min(self.batch_size + self.neg_num, self.vocab_size)
        raise KeyError(table)

    def describe(self) -> dict[str, Any]:
        return {
            "model": self.name, "vocab": self.vocab_size, "dim": self.dim, "window": self.window,
            "neg_num": self.neg_num, "batch_size": self.batch_size, "lr": self.lr,
            "decay_steps": self.decay_steps, "decay_rate": self.decay_rate, "negatives": self.negatives,
        }

    # ------------------------------------------------------------ data

    def negative_cdf(self) -> np.ndarray:
        """The unigram^0.75 cumulative table, read from the dictionary on first use."""
        return self.local("cdf", self._read_cdf)

    def _read_cdf(self) -> np.ndarray:
        counts = read_counts(Path(self.dict_path))
        if counts.shape[0] != self.vocab_size:
            raise ConfigError(
                f"{self.dict_path} has {counts.shape[0]} entries now, {self.vocab_size} when the model was made"
            )
        return negative_cdf(counts)

    def negative_guide(self) -> np.ndarray:
        """Bucket index over :meth:`negative_cdf` for the per-pair sampler (built on first use)."""
        return self.local("guide", lambda: K.negative_guide(self.negative_cdf()))

    def parse(self, chunk: Chunk, ctx: WorkerContext) -> tuple[np.ndarray, np.ndarray]:
        """Token ids (int32) and line offsets of a chunk; DataError(file, line) on a bad token."""
        buf = np.frombuffer(chunk.data, dtype=np.uint8)
        ids = np.empty(buf.shape[0] // 2 + 1, dtype=np.int32)
        sent_off = np.empty(chunk.lines + 2, dtype=np.int64)
        info = np.zeros(8, dtype=np.int64)
        K.parse_ids(buf, self.vocab_size, ctx.skip_bad_lines, ids, sent_off, info)
        if info[0] != K.PARSE_OK:
            token = bytes(chunk.data[info[5] : info[6]]).decode("utf-8", "replace")
            message = _PARSE_ERRORS[int(info[0])].format(vocab=self.vocab_size)
            raise DataError(f"token {token[:40]!r} {message}", chunk.file, chunk.first_line + int(info[4]))
        ctx.bad_lines += int(info[3])
        return ids[: info[1]], sent_off[: info[2] + 1]

    def batches(self, chunk: Chunk, ctx: WorkerContext) -> Iterator[Batch]:
        """Pairs of the chunk, ``batch_size`` at a time, with their shared (or per-pair) negatives."""
        ids, sent_off = self.parse(chunk, ctx)
        nsent = sent_off.shape[0] - 1
        wins = ctx.rng.integers(1, self.window + 1, size=ids.shape[0], dtype=np.int32)
        npairs = K.count_pairs(sent_off, nsent, wins)
        if npairs == 0:
            return
        cen = np.empty(npairs, dtype=np.int32)
        ctx_ids = np.empty(npairs, dtype=np.int32)
        K.make_pairs(ids, sent_off, nsent, wins, cen, ctx_ids)
        if self.negatives == "pair":
            yield from self._pair_batches(cen, ctx_ids, ctx)
            return
        b = self.batch_size
        nb = -(-npairs // b)
        negs = sample_negatives(self.negative_cdf(), ctx.rng.random((nb, self.neg_num)))
        mark = np.full(self.vocab_size, -1, dtype=np.int32)
        uc = np.empty(npairs, dtype=np.int64)
        uw = np.empty(npairs + nb * self.neg_num, dtype=np.int64)
        uc_off = np.empty(nb + 1, dtype=np.int64)
        uw_off = np.empty(nb + 1, dtype=np.int64)
        inv_c = np.empty(npairs, dtype=np.int32)
        inv_t = np.empty(npairs, dtype=np.int32)
        inv_n = np.empty((nb, self.neg_num), dtype=np.int32)
        K.index_batches(cen, ctx_ids, b, negs, mark, uc, uc_off, uw, uw_off, inv_c, inv_t, inv_n)
        uc_off_l = uc_off.tolist()
        uw_off_l = uw_off.tolist()
        for i in range(nb):
            p0 = i * b
            p1 = min(npairs, p0 + b)
            w_ids = uw[uw_off_l[i] : uw_off_l[i + 1]]
            data = PairBatch(inv_c[p0:p1], inv_t[p0:p1], inv_n[i], cen[p0:p1], ctx_ids[p0:p1], negs[i])
            yield Batch({EMB: uc[uc_off_l[i] : uc_off_l[i + 1]], EMB_W: w_ids, EMB_B: w_ids}, p1 - p0, data)

    def _pair_batches(self, cen: np.ndarray, ctx_ids: np.ndarray, ctx: WorkerContext) -> Iterator[Batch]:
        """:meth:`batches` with ``neg_num`` negatives drawn for every pair."""
        npairs = cen.shape[0]
        b = self.batch_size
        nb = -(-npairs // b)
        k = self.neg_num
        negs = np.empty((npairs, k), dtype=np.int32)
        K.sample_cdf(self.negative_cdf(), self.negative_guide(), ctx.rng.random(npairs * k), negs.reshape(-1))
        mark = np.full(self.vocab_size, -1, dtype=np.int32)
        uc = np.empty(npairs, dtype=np.int64)
        uw = np.empty(npairs * (1 + k), dtype=np.int64)
        uc_off = np.empty(nb + 1, dtype=np.int64)
        uw_off = np.empty(nb + 1, dtype=np.int64)
        inv_c = np.empty(npairs, dtype=np.int32)
        inv_t = np.empty(npairs, dtype=np.int32)
        inv_n = np.empty((npairs, k), dtype=np.int32)
        K.index_batches_pair(cen, ctx_ids, b, negs, mark, uc, uc_off, uw, uw_off, inv_c, inv_t, inv_n)
        uc_off_l = uc_off.tolist()
        uw_off_l = uw_off.tolist()
        for i in range(nb):
            p0 = i * b
            p1 = min(npairs, p0 + b)
            w_ids = uw[uw_off_l[i] : uw_off_l[i + 1]]
            data = PairBatch(inv_c[p0:p1], inv_t[p0:p1], inv_n[p0:p1], cen[p0:p1], ctx_ids[p0:p1], negs[p0:p1])
            yield Batch({EMB: uc[uc_off_l[i] : uc_off_l[i + 1]], EMB_W: w_ids, EMB_B: w_ids}, p1 - p0, data)

    # ------------------------------------------------------------ compute

    def compute(self, batch: Batch, params: Params, grads: Grads) -> float:
        """Gradients of the batch-mean loss into ``grads``; returns the loss summed over pairs."""
        d: PairBatch = batch.data
        s = params.sparse
        ids = batch.sparse_ids
        e, w, b = self._scratch("gather")
        kernel = K.batch_grad_pair if self.negatives == "pair" else K.batch_grad
        return float(
            kernel(
                s[EMB], s[EMB_W], s[EMB_B], ids[EMB], ids[EMB_W], d.inv_centre, d.inv_context, d.inv_negatives,
                e, w, b, grads.sparse[EMB], grads.sparse[EMB_W], grads.sparse[EMB_B],
            )
        )

    def local_sgd(
        self, batch: Batch, params: Params, lrs: dict[str, float], dirty: dict[str, np.ndarray]
    ) -> float:
        """Geo's fused step: the :meth:`compute` gradient into per-process scratch, then SGD on
        the shared replica and the dirty marks, all in one kernel call (Hogwild with the other
        workers, like the reference's threads)."""
        d: PairBatch = batch.data
        s = params.sparse
        ids = batch.sparse_ids
        e, w, b = self._scratch("gather")
        g_e, g_w, g_b = self._scratch("grad")
        kernel = K.local_step_pair if self.negatives == "pair" else K.local_step
        return float(
            kernel(
                s[EMB], s[EMB_W], s[EMB_B], ids[EMB], ids[EMB_W], d.inv_centre, d.inv_context, d.inv_negatives,
                lrs[EMB], lrs[EMB_W], lrs[EMB_B], e, w, b, g_e, g_w, g_b, dirty[EMB], dirty[EMB_W], dirty[EMB_B],
            )
        )

    def _scratch(self, kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Row buffers for one batch (``gather``: its parameter rows, ``grad``: the fused step's
        gradients), allocated once per process at the largest batch size."""
        return self.local(kind, lambda: (
            np.zeros((self.max_batch_ids(EMB), self.dim), np.float32),
            np.zeros((self.max_batch_ids(EMB_W), self.dim), np.float32),
            np.zeros((self.max_batch_ids(EMB_B), 1), np.float32),
        ))
