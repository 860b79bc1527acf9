"""Skip-gram word2vec with negative sampling as an aps model plug-in, in three sampling modes.

Common to all: ``emb`` (input vectors, uniform in ±0.5/dim) and ``emb_w`` (output vectors, zeros),
trained by SGD; for every token a window size drawn uniformly from ``[1, window]``, and every
other token of the line within it is a context (a *pair*); negatives drawn by inverse CDF from
the exact unigram^0.75 distribution of ``dict.txt``'s counts (what word2vec.c's 1e8-entry table
approximates); loss per pair ``softplus(-s_true) + sum_k softplus(s_neg_k)`` (sigmoid
cross-entropy, ``s = <input, output> (+ output bias)``).

**``negatives="window"``, the default** (word2vec.c's direction, pWord2Vec's sharing: Ji et al.,
"Parallelizing Word2Vec in Shared and Distributed Memory", 2016): for each target token, its
``n <= 2 * window`` contexts are the inputs and the target plus ``neg_num`` negatives the outputs,
the negatives drawn once per target and shared by its contexts (one that equals the target is
skipped, as word2vec.c does). The ``n x (1 + K)`` scores are one small dense product; the loss is
*summed* over pairs and ``lr`` is the per-pair step (0.025, gensim's). In geo mode the step
updates the replica in place target after target (Hogwild with the other workers, like
word2vec.c's threads), with no gathered copy and no gradient buffer. No output bias
(``bias=false``; gensim and word2vec.c have none, and it cost accuracy here). A batch is whole
targets, about ``batch_size`` (1000) pairs: only a unit of work.

**``lr_schedule="linear"``, the default**: word2vec.c's ``lr * (1 - progress)``, never below
``lr * lr_floor``, progress counted in tokens over the run (``epochs`` x ``epoch_tokens``; the
trainer hands its ``--epochs`` to the model, and an ``epochs`` model argument that differs is
refused at start; ``epoch_tokens`` defaults to prepare_data.py's
``meta.json`` count beside the dictionary, else the dictionary's counts). Each worker counts its
own tokens times the number of workers. It works in every mode: in geo the workers' local SGD
steps by the decayed rate; in sync, async and half_async the pushed gradient is multiplied by the
schedule's factor, which for the pservers' SGD (a fixed ``lr``) is exactly a decayed learning rate.
A run longer than the schedule spans (a step loop that goes on, a corpus bigger than the one the
dictionary counted) holds the floor and says so once per trainer. ``lr_schedule="exponential"``
is the reference's staircase ``lr * decay_rate ** floor(step / decay_steps)``, applied by the
optimizer spec (the pservers, and the workers in geo).

**The reference network** (PaddlePaddle Fleet's word2vec example) is ``negatives=batch lr=1.0
lr_schedule=exponential``: pairs scored centre-input against context-output with an output bias
``emb_b``, ``batch_size`` (100) consecutive pairs per batch, ``neg_num`` negatives drawn once per
batch and shared by all its pairs (the reference's ``neg_array``), the loss the *mean* over the
batch (``reduce_mean(cost)``), so each pair's step is ``lr / batch_size``. It is about 3x faster
per word than gensim but learns much less per epoch: a batch's shared negative rows each get
~100 gradients in one step. ``negatives="pair"`` (``lr=2.5``) draws ``neg_num`` negatives for
every pair instead, in the same layout.

**Deliberate differences from the reference**, each small:

* The reference draws window sizes with ``np.random.random_integers(1, window + 1)``, i.e. from
  ``[1, window + 1]``; its documentation says ``[1, window]``, which is what is done here.
* Batches never span input chunks (1 MiB of text by default): the last batch of a chunk may be
  shorter, and is averaged over its own pairs.
* Negatives are drawn once per batch (the PaddleRec reader); Fleet's generator draws them per
  line and every ``batch_size`` pairs of a line, which gives about the same sharing.
* ``dim`` defaults to 100 (the reference uses 300) so that a benchmark epoch is quick; pass
  ``dim=300`` for the reference size.

``dict.txt`` is read and checked in ``__init__`` (a file that is not ``word count`` lines is a
DataError naming its file and line, before anything starts; its length is the vocabulary size,
which the table specs need); the counts for negative sampling are read again, lazily, in the
worker that first needs them, so the pickled model stays a handful of settings.

The code is split by job: this module keeps the settings, the tables, parsing and windows, the
negative sampler and the schedule; :mod:`.sampling` holds one class per sampling mode
(:class:`~.sampling.WindowSampling`, :class:`~.sampling.PairSampling`), each owning its batch
type, its gradients and its geo step; :mod:`.batching` and :mod:`.step` are their kernels (text
to batches; a batch's gradients or SGD).
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import structlog

from ...errors import ConfigError, DataError
from ...specs import SGD, Constant, ExponentialDecay, SparseTable, TableSpec, Uniform
from ...trainer.model import Batch, Grads, Model, Params, WorkerContext
from ...trainer.reader import Chunk
from . import batching as B
from . import step as S
from .corpus import check_bool, check_float, check_fraction, check_int, epoch_tokens_of, negative_cdf, read_counts
from .sampling import EMB, EMB_B, EMB_W, Sampling, Settings, Windows, Workspace, sampling_for

NEGATIVES = ("window", "pair", "batch")
LR_SCHEDULES = ("linear", "exponential")
#: default ``lr`` per sampling mode: the per-pair step is gensim's 0.025 in every one of them
DEFAULT_LR = {"window": 0.025, "pair": 2.5, "batch": 1.0}
#: default ``batch_size`` per sampling mode: the reference's 100 pairs; window mode's batches are only
#: a unit of work (its SGD is per target), so bigger ones just cost less Python per pair
DEFAULT_BATCH = {"window": 1000, "pair": 100, "batch": 100}
#: progress past which a linear-schedule run is said to be longer than its schedule (a little
#: over 1: the token count of ``meta.json`` or the dictionary is an estimate of the files' own)
OVERRUN = 1.05

log = structlog.get_logger("aps.models")

_PARSE_ERRORS = {
    B.PARSE_NOT_INT: "is not a word id (a non-negative integer)",
    B.PARSE_OUT_OF_RANGE: "is not a word id of the dictionary (id >= vocabulary size {vocab})",
}


class Word2Vec(Model):
    """Skip-gram with negative sampling; see the module docstring for the exact semantics.

    Every argument has a default and accepts text (``--model-arg dim=300``).
    """

    name = "word2vec"

    def __init__(
        self,
        dict_path: str = "data/word2vec/dict.txt",
        dim: int = 100,
        window: int = 5,
        neg_num: int = 5,
        batch_size: int | None = None,
        lr: float | None = None,
        decay_steps: int = 100_000,
        decay_rate: float = 0.999,
        seed: int = 0,
        negatives: str = "window",
        lr_schedule: str = "linear",
        lr_floor: float = 1e-4,
        epochs: int | None = None,
        epoch_tokens: int = 0,
        bias: bool | None = None,
    ) -> None:
        path = Path(str(dict_path)).expanduser().resolve()
        if not path.is_file():
            raise ConfigError(
                f"word2vec dictionary {path} not found; make it with examples/word2vec/prepare_data.py"
            )
        self.dict_path = str(path)
        # read whole here: a file that is not a dictionary fails now, with its file and line, not
        # in a worker's first batch; the workers read the counts again (the model pickles small)
        counts = read_counts(path)
        self.vocab_size = counts.shape[0]
        if self.vocab_size < 2:
            raise ConfigError(f"word2vec dictionary {path} has {self.vocab_size} lines; need <UNK> and words")
        if not counts.sum() > 0:
            raise ConfigError(f"word2vec dictionary {path}: every word count is zero, so no negatives can be drawn")
        if negatives not in NEGATIVES:
            raise ConfigError(f"word2vec negatives must be one of {', '.join(NEGATIVES)}, got {negatives!r}")
        if lr_schedule not in LR_SCHEDULES:
            raise ConfigError(f"word2vec lr_schedule must be one of {', '.join(LR_SCHEDULES)}, got {lr_schedule!r}")
        self.negatives = str(negatives)
        self.lr_schedule = str(lr_schedule)
        self.dim = check_int("dim", dim)
        self.window = check_int("window", window)
        self.neg_num = check_int("neg_num", neg_num)
        self.batch_size = DEFAULT_BATCH[self.negatives] if batch_size is None or batch_size == "" else check_int(
            "batch_size", batch_size)
        self.lr = DEFAULT_LR[self.negatives] if lr is None or lr == "" else check_float("lr", lr)
        self.decay_steps = check_int("decay_steps", decay_steps)
        self.decay_rate = check_float("decay_rate", decay_rate)
        self.lr_floor = check_fraction("lr_floor", lr_floor)
        #: epochs the linear schedule spans: the trainer's ``--epochs`` (:meth:`begin_run`) unless
        #: given here, in which case the two must agree; 1 for a model no trainer told
        self.epochs = 1 if epochs is None or epochs == "" else check_int("epochs", epochs)
        self.epochs_from = "trainer" if epochs is None or epochs == "" else "epochs"
        self.seed = check_int("seed", seed, low=0)
        self.epoch_tokens = check_int("epoch_tokens", epoch_tokens, low=0)
        self.bias = self.negatives != "window" if bias is None or bias == "" else check_bool("bias", bias)
        self.epoch_tokens_from = "epoch_tokens"
        if self.epoch_tokens == 0:
            self.epoch_tokens, self.epoch_tokens_from = epoch_tokens_of(path, counts)
        if self.lr_schedule == "linear":
            optimizer = SGD(self.lr)  # the model scales the step (geo) or the gradient: see lr_factor
        else:
            optimizer = SGD(self.lr, ExponentialDecay(self.decay_steps, self.decay_rate, staircase=True))
        width = 0.5 / self.dim
        self._tables: tuple[SparseTable, ...] = (
            SparseTable(EMB, self.vocab_size, self.dim, Uniform(-width, width), optimizer, seed=self.seed),
            SparseTable(EMB_W, self.vocab_size, self.dim, Constant(0.0), optimizer, seed=self.seed),
        )
        if self.bias:
            self._tables += (SparseTable(EMB_B, self.vocab_size, 1, Constant(0.0), optimizer, seed=self.seed),)
        self._by_name = {t.name: t for t in self._tables}
        settings = Settings(self.vocab_size, self.dim, self.window, self.neg_num, self.batch_size, self.bias)
        #: how pairs get their negatives and how a batch is stepped (sampling.py)
        self.sampling: Sampling = sampling_for(self.negatives, settings)

    # ------------------------------------------------------------ contract

    def tables(self) -> list[TableSpec]:
        return list(self._tables)

    def table(self, name: str) -> TableSpec:
        return self._by_name[name]

    def max_batch_ids(self, table: str) -> int:
        """Distinct rows a batch may read, never more than the vocabulary (the sampling mode's
        bound: :meth:`~.sampling.Sampling.max_batch_ids`)."""
        return self.sampling.max_batch_ids(table)

    def describe(self) -> dict[str, Any]:
        out = {
            "model": self.name, "vocab": self.vocab_size, "dim": self.dim, "window": self.window,
            "neg_num": self.neg_num, "batch_size": self.batch_size, "negatives": self.negatives, "lr": self.lr,
            "lr_schedule": self.lr_schedule, "bias": self.bias,
        }
        if self.lr_schedule == "linear":
            out.update(lr_floor=self.lr_floor, epochs=self.epochs, epochs_from=self.epochs_from, epoch_tokens=self.epoch_tokens,
                       epoch_tokens_from=self.epoch_tokens_from)
        else:
            out.update(decay_steps=self.decay_steps, decay_rate=self.decay_rate)
        return out

    def begin_run(self, epochs: int) -> None:
        """The trainer's epoch count is the one the linear schedule spans (one source of truth);
        an ``epochs`` given to the model as well must be the same, or the schedule would end
        above its floor (more epochs given) or sit at it for the last ones (fewer), silently."""
        if self.epochs_from == "epochs" and self.epochs != epochs and self.lr_schedule == "linear":
            raise ConfigError(
                f"word2vec epochs={self.epochs} but the trainer runs --epochs {epochs}: the linear schedule spans "
                f"the trainer's epochs, so drop --model-arg epochs (or pass epochs={epochs})"
            )
        self.epochs = epochs

    def lr_factor(self, progress: float) -> float:
        """The linear schedule's factor at ``progress`` (fraction of the run trained):
        word2vec.c's ``1 - progress``, never below ``lr_floor`` (a run that goes on past the
        schedule's end holds the floor: :meth:`_say_overrun`); 1 for the exponential schedule,
        whose decay the optimizer spec carries."""
        if self.lr_schedule != "linear":
            return 1.0
        return max(self.lr_floor, 1.0 - progress)

    def _say_overrun(self, progress: float, ctx: WorkerContext) -> None:
        """One warning per trainer (its worker 0) once the run is clearly longer than the linear
        schedule spans: the rate then stays at its floor, which is right for a step loop that
        simply goes on, and a hint for a corpus the dictionary was not counted on."""
        if self.lr_schedule != "linear" or progress <= OVERRUN or ctx.worker_id != 0:
            return
        said = self.local("overrun_said", lambda: np.zeros(1, np.bool_))
        if said[0]:
            return
        said[0] = True
        log.warning(
            "word2vec_schedule_overrun",
            trainer=ctx.trainer_id,
            progress=round(progress, 2),
            text=(f"this run has gone {progress:.2f}x the tokens the linear schedule spans (epochs={self.epochs} x "
                  f"{self.epoch_tokens:,} tokens); the learning rate holds its floor lr*{self.lr_floor:g} from here. "
                  "If the corpus is not the one the dictionary was counted on, pass --model-arg epoch_tokens=N"),
        )

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
        """Bucket index over :meth:`negative_cdf` for the sampler (built on first use)."""
        return self.local("guide", lambda: B.negative_guide(self.negative_cdf()))

    def draw_negatives(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` ids from the exact unigram^0.75 distribution (inverse CDF of float64 uniforms:
        what word2vec.c's 1e8-entry table approximates)."""
        out = np.empty(n, dtype=np.int32)
        B.sample_cdf(self.negative_cdf(), self.negative_guide(), rng.random(n), out)
        return out

    def parse(self, chunk: Chunk, ctx: WorkerContext) -> tuple[np.ndarray, np.ndarray]:
        """Token ids (int32) and line offsets of a chunk; DataError(file, line) on a bad token."""
        buf = np.frombuffer(chunk.data, dtype=np.uint8)
        ids = np.empty(buf.shape[0] // 2 + 1, dtype=np.int32)
        sent_off = np.empty(chunk.lines + 2, dtype=np.int64)
        info = np.zeros(8, dtype=np.int64)
        B.parse_ids(buf, self.vocab_size, ctx.skip_bad_lines, ids, sent_off, info)
        if info[0] != B.PARSE_OK:
            token = bytes(chunk.data[info[5] : info[6]]).decode("utf-8", "replace")
            message = _PARSE_ERRORS[int(info[0])].format(vocab=self.vocab_size)
            raise DataError(f"token {token[:40]!r} {message}", chunk.file, chunk.first_line + int(info[4]))
        ctx.bad_lines += int(info[3])
        return ids[: info[1]], sent_off[: info[2] + 1]

    def batches(self, chunk: Chunk, ctx: WorkerContext) -> Iterator[Batch]:
        """The chunk's windows as batches of about ``batch_size`` pairs, with their negatives."""
        ids, sent_off = self.parse(chunk, ctx)
        nsent = sent_off.shape[0] - 1
        wins = ctx.rng.integers(1, self.window + 1, size=ids.shape[0], dtype=np.int32)
        ntgt, npairs = B.count_windows(sent_off, nsent, wins)
        seen = self.local("tokens_seen", lambda: np.zeros(1, np.int64))
        self.local("trainers", lambda: ctx.num_trainers)
        start = int(seen[0])
        seen[0] += ids.shape[0]
        if npairs == 0:
            return
        tgt = np.empty(ntgt, dtype=np.int32)
        ctx_off = np.empty(ntgt + 1, dtype=np.int64)
        ctx_ids = np.empty(npairs, dtype=np.int32)
        tok_before = np.empty(ntgt, dtype=np.int64)
        B.make_windows(ids, sent_off, nsent, wins, tgt, ctx_off, ctx_ids, tok_before)
        # the run's progress at each target's end, counted in tokens over every worker (each reads its share)
        per_token = ctx.num_workers * ctx.num_trainers / (self.epoch_tokens * self.epochs)
        done = (start + tok_before + 1) * per_token
        done[-1] = (start + ids.shape[0]) * per_token  # the chunk's last batch covers its tail too
        self._say_overrun(float(done[-1]), ctx)
        draw = partial(self.draw_negatives, rng=ctx.rng)
        yield from self.sampling.batches(Windows(tgt, ctx_off, ctx_ids, done), draw, self._work(), ctx.local_sgd)

    def warm_up(self, ctx: WorkerContext, local_sgd: bool) -> None:
        """Loads every kernel this setting calls (parsing, windows, sampling, indexing, the step)
        on one made-up line, so that a worker's first batch runs at full speed. It draws from its
        own random stream, steps throw-away tables with a zero rate and puts the run's token
        count back; it does read the dictionary's counts, which the first batch needs anyway."""
        tokens = [1 + i % (self.vocab_size - 1) for i in range(4 * self.window + 4)]
        line = " ".join(map(str, tokens)).encode() + b"\n"
        probe = WorkerContext(ctx.trainer_id, ctx.worker_id, ctx.num_trainers, ctx.num_workers, np.random.default_rng(0),
                              local_sgd=ctx.local_sgd)
        seen = self.local("tokens_seen", lambda: np.zeros(1, np.int64))
        before = int(seen[0])
        batches = list(self.batches(Chunk("<warm-up>", 1, line, 1), probe))
        seen[0] = before
        sparse = {t.name: np.zeros((t.rows, t.dim), np.float32) for t in self.sparse_tables()}
        params = Params(sparse=sparse, dense={})
        for batch in batches:
            batch = Batch(batch.sparse_ids, batch.examples, batch.data._replace(progress=0.0))
            if local_sgd:
                dirty = {name: np.zeros(a.shape[0], np.uint8) for name, a in sparse.items()}
                self.local_sgd(batch, params, {name: 0.0 for name in sparse}, dirty)
            else:
                grads = Grads(sparse={name: np.zeros((len(batch.sparse_ids[name]), a.shape[1]), np.float32)
                                      for name, a in sparse.items()})
                self.compute(batch, params, grads)

    # ------------------------------------------------------------ compute

    def compute(self, batch: Batch, params: Params, grads: Grads) -> float:
        """Gradients into ``grads`` (of the batch-mean loss in the reference modes, of the summed
        loss in window mode), times the linear schedule's :meth:`lr_factor` at the batch's
        progress: the pservers' SGD runs at a fixed ``lr``, so the pushed step is the decayed
        rate's, as in geo. Returns the loss summed over pairs (unscaled)."""
        full = S.Tables(params.sparse[EMB], params.sparse[EMB_W], self._bias(params.sparse))
        g = S.Tables(grads.sparse[EMB], grads.sparse[EMB_W], self._bias(grads.sparse, rows=self.max_batch_ids(EMB_W)))
        return self.sampling.compute(batch, full, g, self.lr_factor(batch.data.progress), self._work())

    def local_sgd(
        self, batch: Batch, params: Params, lrs: dict[str, float], dirty: dict[str, np.ndarray]
    ) -> float:
        """Geo's step, Hogwild with the other workers on the shared replica (like word2vec.c's
        threads), as the sampling mode does it. The learning rates are the runtime's times
        :meth:`lr_factor` of the batch's progress, times the mode's
        :meth:`~.sampling.Sampling.geo_rate_scale` (window mode: the number of trainers)."""
        s = params.sparse
        full = S.Tables(s[EMB], s[EMB_W], self._bias(s))
        f = self.lr_factor(batch.data.progress) * self.sampling.geo_rate_scale(self.local("trainers", lambda: 1))
        lr = S.Rates(lrs[EMB] * f, lrs[EMB_W] * f, lrs[EMB_B] * f if self.bias else 0.0)
        marks = S.Marks(dirty[EMB], dirty[EMB_W], dirty[EMB_B] if self.bias else self._no_marks())
        return self.sampling.local_sgd(batch, full, lr, marks, self._work())

    def _work(self) -> Workspace:
        """The sampling mode's buffers in this process."""
        return self.local("work", self.sampling.workspace)

    def _bias(self, arrays: dict[str, np.ndarray], rows: int | None = None) -> np.ndarray:
        """``arrays["emb_b"]``, or without the bias table a per-process zero column the kernels
        read as a constant 0 bias (its rate is 0, so it stays 0): the vocabulary's, or ``rows`` of
        a gradient column the kernels write and nobody reads. The two are kept apart even when
        ``rows`` equals the vocabulary (a small one): a shared column would feed one batch's
        bias gradient to the next batch as its bias."""
        if self.bias:
            return arrays[EMB_B]
        key, n = ("no_bias", self.vocab_size) if rows is None else ("no_bias_grad", rows)
        return self.local(key, lambda: np.zeros((max(n, 1), 1), np.float32))

    def _no_marks(self) -> np.ndarray:
        """Dirty marks the kernels write for the absent bias table: per process, never read."""
        return self.local("no_bias_marks", lambda: np.zeros(self.vocab_size, np.uint8))
