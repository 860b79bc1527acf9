"""word2vec's sampling modes, one class each: how a chunk's pairs become batches with their
negatives, and how a batch is stepped (gradients to push, or geo's local SGD).

:class:`WindowSampling` is ``negatives="window"`` (negatives per target, shared by its
contexts); :class:`PairSampling` the reference's modes, ``"batch"`` (negatives shared by a
batch of pairs) and ``"pair"`` (negatives per pair). :mod:`.model` says what each means and
keeps what they share: the settings, the tables, the parsing and windows, the negative sampler
and the learning-rate schedule. A sampling mode holds only settings (it pickles with the model);
its per-process buffers are a :class:`Workspace` the model keeps with ``Model.local``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from functools import cached_property
from typing import NamedTuple

import numpy as np

from ...trainer.model import Batch
from . import batching as B
from . import step as S

EMB = "emb"
EMB_W = "emb_w"
EMB_B = "emb_b"


class Settings(NamedTuple):
    """The model's settings that a sampling mode reads."""

    vocab: int
    dim: int
    window: int
    neg_num: int
    batch_size: int
    bias: bool


class Windows(NamedTuple):
    """A chunk's pairs laid out by target (:mod:`.batching`'s layout: target ``t`` is
    ``target[t]``, its contexts ``context[ctx_off[t]:ctx_off[t + 1]]``) and ``done[t]``, the
    fraction of the run trained at the end of target ``t``."""

    target: np.ndarray
    ctx_off: np.ndarray
    context: np.ndarray
    done: np.ndarray


class PairBatch(NamedTuple):
    """``Batch.data`` of the reference modes (``negatives="batch"`` / ``"pair"``).

    ``inv_centre[p]`` is the position of pair ``p``'s centre in ``batch.sparse_ids["emb"]``;
    ``inv_context[p]`` and ``inv_negatives`` are positions in ``batch.sparse_ids["emb_w"]`` (the
    same list as ``["emb_b"]``): ``[neg_num]`` shared by the batch, or ``[pairs, neg_num]`` with
    ``negatives="pair"``. ``centre`` / ``context`` / ``negatives`` are the global ids (for
    inspection and tests; the kernels use the positions). ``progress`` is the fraction of the run
    this worker will have trained at the end of the batch (the linear schedule's clock). All arrays
    are views of per-chunk arrays, so a batch stays valid after the next one is made.
    """

    inv_centre: np.ndarray
    inv_context: np.ndarray
    inv_negatives: np.ndarray
    centre: np.ndarray
    context: np.ndarray
    negatives: np.ndarray
    progress: float


class WindowBatch(NamedTuple):
    """``Batch.data`` of ``negatives="window"``: whole targets with their contexts.

    Target ``t`` of the batch is ``target[t]``; its contexts are
    ``context[ctx_off[t] - ctx_off[0]:ctx_off[t + 1] - ctx_off[0]]`` and its ``neg_num``
    negatives ``negatives[t]``, shared by those contexts. ``inv_*`` are the same in positions of
    ``batch.sparse_ids`` (contexts in ``["emb"]``, targets and negatives in ``["emb_w"]``), used
    by :meth:`WindowSampling.compute`; the geo step uses the global ids, so a geo worker's batches
    (``WorkerContext.local_sgd``) have empty ``inv_*`` and ``sparse_ids``: finding a batch's unique
    ids was 70% of batching time there, for nothing. ``progress`` as in :class:`PairBatch`.
    """

    inv_context: np.ndarray
    inv_target: np.ndarray
    inv_negatives: np.ndarray
    ctx_off: np.ndarray
    context: np.ndarray
    target: np.ndarray
    negatives: np.ndarray
    progress: float


class Workspace:
    """One process's buffers for a sampling mode, each made on first use: the indexer's
    vocabulary-sized marks, a batch's gathered rows (``gather``) and the fused geo step's
    gradients (``grad``) at the largest batch, and window mode's per-target buffers."""

    def __init__(self, settings: Settings, inputs: int, outputs: int) -> None:
        self.settings = settings
        self.inputs = inputs
        self.outputs = outputs

    @cached_property
    def mark(self) -> np.ndarray:
        return np.full(self.settings.vocab, -1, dtype=np.int32)

    def _rows(self) -> S.Tables:
        dim = self.settings.dim
        return S.Tables(np.zeros((self.inputs, dim), np.float32), np.zeros((self.outputs, dim), np.float32),
                        np.zeros((self.outputs, 1), np.float32))

    @cached_property
    def gather(self) -> S.Tables:
        return self._rows()

    @cached_property
    def grad(self) -> S.Tables:
        return self._rows()

    @cached_property
    def window(self) -> S.WindowScratch:
        width, dim = 1 + self.settings.neg_num, self.settings.dim
        return S.WindowScratch(
            np.zeros(width, np.int64), np.zeros((width, dim), np.float32), np.zeros(width, np.float32),
            np.zeros((width, dim), np.float32), np.zeros((2 * self.settings.window, dim), np.float32),
            np.zeros(width, np.float32), np.zeros(width, np.float32),
        )


#: draws ``n`` negative ids (int32) from the model's unigram^0.75 sampler and the worker's stream
Draw = Callable[[int], np.ndarray]


class Sampling(ABC):
    """A sampling mode: its batches, their gradients (:meth:`compute`) and geo's local step."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    @property
    @abstractmethod
    def max_pairs(self) -> int:
        """Pairs a batch may hold."""

    @abstractmethod
    def max_outputs(self) -> int:
        """Distinct output (``emb_w`` / ``emb_b``) rows a batch may read, before the vocabulary
        bounds it."""

    def max_batch_ids(self, table: str) -> int:
        """Distinct rows of ``table`` a batch may read, never more than the vocabulary."""
        s = self.settings
        if table == EMB:
            return min(self.max_pairs, s.vocab)
        if table == EMB_W or (table == EMB_B and s.bias):
            return min(self.max_outputs(), s.vocab)
        raise KeyError(table)

    def workspace(self) -> Workspace:
        """This mode's per-process buffers (made once per process by the model)."""
        return Workspace(self.settings, self.max_batch_ids(EMB), self.max_batch_ids(EMB_W))

    def geo_rate_scale(self, trainers: int) -> int:
        """What geo's local learning rates are multiplied by, with ``trainers`` trainers."""
        return 1

    @abstractmethod
    def batches(self, windows: Windows, draw: Draw, work: Workspace, local_sgd: bool) -> Iterator[Batch]:
        """The chunk's batches, with their negatives drawn by ``draw``."""

    @abstractmethod
    def compute(self, batch: Batch, full: S.Tables, grads: S.Tables, factor: float, work: Workspace) -> float:
        """``factor`` times the batch's gradients into ``grads`` (rows in ``batch.sparse_ids``
        order); returns the loss summed over pairs (unscaled)."""

    @abstractmethod
    def local_sgd(self, batch: Batch, full: S.Tables, lr: S.Rates, marks: S.Marks, work: Workspace) -> float:
        """Geo's step on the replica ``full`` at rates ``lr``, marking written rows; returns the
        loss summed over pairs."""

    def _ids(self, emb: np.ndarray, emb_w: np.ndarray) -> dict[str, np.ndarray]:
        """A batch's ``sparse_ids``: the output biases share the output vectors' rows."""
        return {EMB: emb, EMB_W: emb_w, EMB_B: emb_w} if self.settings.bias else {EMB: emb, EMB_W: emb_w}


class WindowSampling(Sampling):
    """``negatives="window"``: batches of whole targets (about ``batch_size`` pairs), ``neg_num``
    negatives per target shared by its contexts; geo steps the replica in place."""

    @property
    def max_pairs(self) -> int:
        """A batch is whole targets: at most ``batch_size - 1 + 2 * window`` pairs."""
        return self.settings.batch_size - 1 + 2 * self.settings.window

    def max_outputs(self) -> int:
        """At most one target and ``neg_num`` negatives per pair."""
        return self.max_pairs * (1 + self.settings.neg_num)

    def geo_rate_scale(self, trainers: int) -> int:
        """The number of trainers: geo's exchange adds each trainer's delta divided by it (the
        reference's rule), so with T trainers every pair would move the shared model by only
        ``lr / T``; scaled, a pair's step stays ``lr`` (gensim's) whatever the cluster shape.
        Measured: ``make demo`` (2 trainers) went from 8.5% to 10.4% analogy accuracy, gensim's
        being 10.3-10.4% on the same corpus."""
        return trainers

    def batches(self, windows: Windows, draw: Draw, work: Workspace, local_sgd: bool) -> Iterator[Batch]:
        tgt, ctx_off, ctx_ids, done = windows
        k = self.settings.neg_num
        tb = B.batch_bounds(ctx_off, self.settings.batch_size)
        negs = draw(tgt.shape[0] * k)
        negs2 = negs.reshape(-1, k)
        pb = ctx_off[tb]
        tb_l, pb_l = tb.tolist(), pb.tolist()
        if local_sgd:
            # geo: the in-place step works on global ids, so no batch needs its unique ids
            none = np.zeros(0, np.int32)
            for i in range(tb.shape[0] - 1):
                t0, t1, p0, p1 = tb_l[i], tb_l[i + 1], pb_l[i], pb_l[i + 1]
                data = WindowBatch(none, none, none, ctx_off[t0 : t1 + 1], ctx_ids[p0:p1], tgt[t0:t1], negs2[t0:t1],
                                   float(done[t1 - 1]))
                yield Batch({}, p1 - p0, data)
            return
        ix = B.index_rows(B.BatchRows(ctx_ids, pb, tgt, tb, negs, tb * k), work.mark)
        inv_neg2 = ix.inv_neg.reshape(-1, k)
        ui, uo = ix.u_in_off.tolist(), ix.u_out_off.tolist()
        for i in range(tb.shape[0] - 1):
            t0, t1, p0, p1 = tb_l[i], tb_l[i + 1], pb_l[i], pb_l[i + 1]
            data = WindowBatch(ix.inv_in[p0:p1], ix.inv_pos[t0:t1], inv_neg2[t0:t1], ctx_off[t0 : t1 + 1],
                               ctx_ids[p0:p1], tgt[t0:t1], negs2[t0:t1], float(done[t1 - 1]))
            yield Batch(self._ids(ix.u_in[ui[i] : ui[i + 1]], ix.u_out[uo[i] : uo[i + 1]]), p1 - p0, data)

    def compute(self, batch: Batch, full: S.Tables, grads: S.Tables, factor: float, work: Workspace) -> float:
        """The summed loss's gradient at the start of the batch."""
        d: WindowBatch = batch.data
        ids = batch.sparse_ids
        return float(S.window_grad(full, ids[EMB], ids[EMB_W], d.inv_context, d.ctx_off, d.inv_target,
                                   d.inv_negatives.reshape(-1), work.gather, grads, work.window, factor))

    def local_sgd(self, batch: Batch, full: S.Tables, lr: S.Rates, marks: S.Marks, work: Workspace) -> float:
        """In place, target by target, with global ids (no gathered copy, no gradient buffer)."""
        d: WindowBatch = batch.data
        return float(S.window_sgd(full, d.context, d.ctx_off, d.target, d.negatives.reshape(-1), lr, work.window,
                                  marks))


class PairSampling(Sampling):
    """The reference modes: ``batch_size`` consecutive (centre, context) pairs per batch, with
    ``neg_num`` negatives shared by the batch (``negatives="batch"``) or drawn for every pair
    (``per_pair``, ``negatives="pair"``); the loss the batch mean."""

    def __init__(self, settings: Settings, per_pair: bool) -> None:
        super().__init__(settings)
        self.per_pair = per_pair

    @property
    def max_pairs(self) -> int:
        return self.settings.batch_size

    def max_outputs(self) -> int:
        """One context per pair plus ``neg_num`` shared negatives, or ``neg_num`` per pair."""
        s = self.settings
        return s.batch_size * (1 + s.neg_num) if self.per_pair else s.batch_size + s.neg_num

    def batches(self, windows: Windows, draw: Draw, work: Workspace, local_sgd: bool) -> Iterator[Batch]:
        tgt, ctx_off, ctx_ids, done = windows
        npairs = ctx_ids.shape[0]
        k = self.settings.neg_num
        cen = np.repeat(tgt, np.diff(ctx_off))
        pb = np.append(np.arange(0, npairs, self.settings.batch_size, dtype=np.int64), npairs)
        nb = pb.shape[0] - 1
        per_pair = self.per_pair
        rows = npairs if per_pair else nb
        negs = draw(rows * k)
        neg_b = pb * k if per_pair else np.arange(nb + 1, dtype=np.int64) * k
        ix = B.index_rows(B.BatchRows(cen, pb, ctx_ids, pb, negs, neg_b), work.mark)
        negs2 = negs.reshape(rows, k)
        inv_neg2 = ix.inv_neg.reshape(rows, k)
        last_target = np.searchsorted(ctx_off, pb[1:] - 1, side="right") - 1
        pb_l, ui, uo = pb.tolist(), ix.u_in_off.tolist(), ix.u_out_off.tolist()
        for i in range(nb):
            p0, p1 = pb_l[i], pb_l[i + 1]
            n0, n1 = (p0, p1) if per_pair else (i, i + 1)
            neg_rows = negs2[n0:n1] if per_pair else negs2[i]
            inv_rows = inv_neg2[n0:n1] if per_pair else inv_neg2[i]
            data = PairBatch(ix.inv_in[p0:p1], ix.inv_pos[p0:p1], inv_rows, cen[p0:p1], ctx_ids[p0:p1], neg_rows,
                             float(done[last_target[i]]))
            yield Batch(self._ids(ix.u_in[ui[i] : ui[i + 1]], ix.u_out[uo[i] : uo[i + 1]]), p1 - p0, data)

    def compute(self, batch: Batch, full: S.Tables, grads: S.Tables, factor: float, work: Workspace) -> float:
        """The batch-mean loss's gradient, on the batch's gathered rows."""
        d: PairBatch = batch.data
        ids = batch.sparse_ids
        return float(S.batch_grad(full, ids[EMB], ids[EMB_W], d.inv_centre, d.inv_context, d.inv_negatives.reshape(-1),
                                  self.per_pair, work.gather, grads, factor))

    def local_sgd(self, batch: Batch, full: S.Tables, lr: S.Rates, marks: S.Marks, work: Workspace) -> float:
        """:meth:`compute`'s gradient into per-process scratch, then SGD, in one kernel call."""
        d: PairBatch = batch.data
        ids = batch.sparse_ids
        return float(S.local_step(full, ids[EMB], ids[EMB_W], d.inv_centre, d.inv_context, d.inv_negatives.reshape(-1),
                                  self.per_pair, lr, work.gather, work.grad, marks))


def sampling_for(negatives: str, settings: Settings) -> Sampling:
    """The sampling mode named by word2vec's ``negatives`` argument (checked by the model)."""
    if negatives == "window":
        return WindowSampling(settings)
    return PairSampling(settings, per_pair=negatives == "pair")
