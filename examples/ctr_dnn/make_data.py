"""Synthetic Criteo-format CTR data drawn from a known model, so the best possible AUC is known.

Real Criteo data cannot be fetched here, and on real data nobody knows how close a trained model
is to the best achievable. This script writes lines in Criteo's layout (``label \\t I1..I13 \\t
C1..C26``, PaddlePaddle's ``train_data/part-*`` and ``test_data/part-*``) whose labels are drawn
from a logistic model we keep: the AUC of the true click probabilities on the test labels (the
Bayes-optimal AUC) is the ceiling a model can reach, and is written to ``meta.json``.

What makes it Criteo-like:
  * 26 categorical slots with Zipf-like value frequencies, from 3 to 10^6 distinct values
    (``--scale full``, Criteo's own cardinalities capped) or at most 3,000 with steeper power laws
    (``--scale small``, for tests and demos: learnable from 50k-100k lines); values are
    8-hex-digit strings; some slots are mostly missing (C22), most rarely;
  * 13 dense integer counts, heavy-tailed (I5 in the tens of thousands, I2 down to -3), with
    Criteo's missing rates, so the reference normalisation ``(x - cont_min) / cont_diff`` puts
    most of them in [0, 1] and a tail above.

The label model: ``logit = bias + sum_slot w_slot[value] + f(dense)``. Each value's weight is drawn
with a spread that shrinks with its frequency (``p / (p + p0)``): most of the signal is in the head
of each distribution, which a model sees often enough to learn, and the long tail is near-noise, as
in real click logs. ``f`` is linear in the clipped normalised dense values plus a bump and an
interaction, so a DNN has something to learn beyond the wide features. The categorical and dense
parts are scaled to fixed spreads and the bias to a positive rate of about 17%, using a pilot sample,
so the Bayes AUC is about 0.80 for every seed and both scales.

Everything is a function of ``--seed``, ``--scale``, ``--shape`` (and ``--labels``, ``--history``)
only: rows come in fixed chunks of 65,536 with their own random streams, so the same seed gives
byte-identical files, and the model
(and the test set) does not change with ``--train-lines`` or the number of files (``--shape drift``
aside: its clock is the position in the training set, so the test set, drawn at the end of that
clock, is the same for any number of files but not for any number of lines).

``--shape`` (default ``default``, the data above, byte for byte) makes two harder data sets, so a
setting tuned on one shape can be checked on others:
  * ``longtail``: flatter power laws (a longer tail of rare values), rare values that carry more
    of the signal, and slot x slot interaction terms in the true logit (a dot product of per-value
    vectors for PAIRS pairs of slots, as factorisation machines model Criteo's crosses);
  * ``drift``: the training files are in time order and the id distribution drifts over them:
    a share of each big slot's draws, growing from 0 at the first line to DRIFT_NEW at the last
    (and in the test set), takes new values instead of old ones (new ids appear, old ones fade),
    and the dense part of the click model moves by DRIFT_DENSE of its spread.

Two options widen the lines for multi-task and sequence networks (aps/models/tabular.py's layout:
label fields first, then dense, then slots, then list columns); without them nothing changes, byte
for byte. They work with every shape, and their draws come from own random streams ((seed, 6),
(seed, 7), (seed, 8) for the model, (seed, split, block, 9) for the rows), so with either one the
dense and categorical fields are the ones written without it (and with ``--labels 2`` alone the
click labels too):
  * ``--labels 2``: a second label, written second, a "conversion" task with its own logistic
    model: ``logit2 = bias2 + c * (logit1 - bias1) + own weights on TASK2_SLOTS slots``, the shared
    part scaled to TASK2_SHARED_STD, the own part to TASK2_OWN_STD, bias2 fitted to TASK2_RATE (5%);
    drawn independently of the click given the features. The click labels are unchanged.
    meta.json: ``"labels": 2``, ``bayes_auc_tasks`` (click, second task on the test set), their
    logloss and positive rates (``bayes_auc_test`` stays the click's).
  * ``--history L``: a behaviour sequence, written last: 0..L (uniform) values of HISTORY_SLOT (C3,
    the biggest slot) joined by ``,``, written with that slot's hex codes, so hashed as that slot's
    field (meta.json's ``"lists": [{"name": "history", "max_len": L, "shares": 2, "separator": ","}]``)
    a history item and the same candidate item find the same embedding row. Items fall into
    HIST_TOPICS topics; a line's user has a main topic (the candidate's with chance HIST_MATCH, else
    a random item's) and each history item comes from it with chance HIST_FOCUS (the slot's own
    frequencies within the topic), else from the whole slot (``--shape drift``: an item is a new id
    as often as the slot's own values are; new id k + r has rank r's topic). Each item has a vector
    ``v = [one-hot topic, HIST_NOISE * N(0, I_4)]`` and the click logit gets ``mean over the history
    of <v_candidate, v_item>`` (0 for an empty history or a missing candidate) scaled to HIST_STD on
    the pilot sample, while the categorical part is scaled to ``sqrt(CAT_STD^2 - HIST_STD^2)``: the
    logit's spread, and so the Bayes AUC, stays about the same, and the sequence carries a real
    share of it. meta.json's ``bayes_auc_test_without_history`` is the AUC of the click
    probabilities without that term (--scale small, seed 0, 100k test lines, L = 8: 0.820 with it,
    0.760 without; 0.812 for the data without --history; the second task's Bayes AUC 0.822).

    python examples/ctr_dnn/make_data.py --out data/ctr --scale small --train-lines 100000
    python examples/ctr_dnn/make_data.py --out data/ctr2 --scale small --labels 2 --history 50
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

GENERATOR = "aps make_data v1"
CHUNK = 1 << 16          # rows per random stream: output does not depend on file counts
PILOT_ROWS = 200_000     # rows used to scale the weights and fit the bias
TARGET_RATE = 0.17       # positive rate the bias is fitted to
CAT_STD = 1.25           # spread of the categorical part of the logit (after scaling)
DENSE_STD = 0.65         # spread of the dense part (linear + bump + interaction)
BUMP, INTERACTION = 1.0, 1.0   # sizes of the non-linear dense terms before scaling (linear ones ~ N(0, 1))
P0 = 0.03                # a value with frequency p gets weight spread ~ p / (p + P0)
SMALL_CAP = 3000         # --scale small: most distinct values per slot
SMALL_STEEPER = 0.5      # --scale small: added to every Zipf exponent, so fewer mid-frequency values
                         # to estimate: a model trained on 60k lines gets within ~0.007 of the Bayes AUC

# The reference's normalisation constants (PaddleRec's criteo reader).
CONT_MIN = np.array([0, -3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], dtype=np.int64)
CONT_DIFF = np.array([20, 603, 100, 50, 64000, 500, 100, 50, 500, 10, 10, 10, 50], dtype=np.int64)

# Dense features: median count and missing rate (Criteo's rates); the 95th percentile is cont_diff.
DENSE_MEDIAN = np.array([2, 25, 10, 6, 5000, 40, 8, 6, 50, 1, 1, 0, 5], dtype=np.float64)
DENSE_MISSING = np.array([0.45, 0.0, 0.21, 0.22, 0.026, 0.22, 0.043, 0.0005, 0.043, 0.45, 0.043, 0.77, 0.22])
I2_NEGATIVE = 0.04       # share of I2 values replaced by -1, -2 or -3, as in Criteo

# Categorical slots: Criteo (Kaggle) cardinality, Zipf exponent, missing rate.
SLOT_CARD = [1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
             27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572]
SLOT_ZIPF = [1.1, 1.2, 0.95, 1.0, 1.3, 1.5, 1.1, 1.2, 1.5, 1.05, 1.1, 0.95, 1.1,
             1.4, 1.05, 0.95, 1.4, 1.1, 1.1, 1.5, 0.95, 1.4, 1.4, 1.0, 1.2, 1.0]
SLOT_MISSING = [0.0, 0.0, 0.034, 0.034, 0.0, 0.12, 0.0, 0.0, 0.0, 0.0, 0.0, 0.034, 0.0,
                0.0, 0.0, 0.034, 0.0, 0.0, 0.44, 0.44, 0.034, 0.76, 0.0, 0.034, 0.44, 0.44]
FULL_CAP = 1_000_000     # --scale full: bigger Criteo slots are capped here (memory of the model)
NOISE_SLOTS = 4          # slots whose values carry no signal at all
SHAPES = ("default", "longtail", "drift")
LONGTAIL_FLATTER = 0.15  # longtail: subtracted from every Zipf exponent (heavier tail)
LONGTAIL_P0 = 0.005      # longtail: P0 of the weight spread (rarer values still carry signal)
PAIRS, PAIR_DIM = 8, 4   # longtail: interacting slot pairs, size of the per-value vectors
PAIR_SHARE = 0.6         # longtail: spread of the interaction part / spread of the per-value part
DRIFT_MIN_CARD = 50      # drift: slots with at least this many values drift
DRIFT_NEW = 0.6          # drift: share of such slots' draws that take new values at the end
DRIFT_DENSE = 0.5        # drift: the dense weights move by this times their spread over the file
# --labels 2: a second task ("conversion") sharing part of the click model's signal
TASK2_RATE = 0.05        # positive rate its bias is fitted to
TASK2_SLOTS = 3          # slots with their own weights in its logit
TASK2_SHARED_STD = 1.0   # spread of its shared part: a multiple of the click logit (bias aside)
TASK2_OWN_STD = 0.9      # spread of its own part (weights on TASK2_SLOTS slots)
# --history L: a behaviour sequence of values of HISTORY_SLOT and a click term relating it to the candidate
HISTORY_SLOT = 2         # C3, the biggest slot: its values are the "items" of the sequence
MAX_HISTORY = 256        # most values --history may ask for
HIST_TOPICS = 24         # items fall into this many topics (balanced in count)
HIST_MATCH = 0.5         # chance that a line's user's main topic is the candidate item's
HIST_FOCUS = 0.75        # chance that a history item comes from the main topic (else: any item)
HIST_LATENT, HIST_NOISE = 4, 0.5   # per-item latent vector: one-hot topic, then HIST_NOISE * N(0, I_4)
HIST_STD = 0.8           # spread of the history term; the categorical part keeps sqrt(CAT_STD^2 - HIST_STD^2)


@dataclass
class Model:
    """The label model and the sampling distributions; everything a chunk of rows needs."""

    scale: str
    cdfs: list[np.ndarray]          # per slot: cumulative Zipf probabilities over its values
    weights: list[np.ndarray]       # per slot: logit weight of each value
    missing_weight: np.ndarray      # per slot: logit weight of a missing value
    code_keys: np.ndarray           # per slot: key that turns value ranks into hex strings
    dense_mu: np.ndarray            # lognormal parameters of the dense counts
    dense_sigma: np.ndarray
    dense_linear: np.ndarray        # logit weight of each clipped normalised dense value
    dense_missing: np.ndarray       # logit weight of a missing dense value
    bump: float                     # weight of a bump on I6 (non-linear)
    interaction: float              # weight of "I2 and I8 both above their medians" (non-linear)
    bias: float = 0.0
    shape: str = "default"
    pairs: list[tuple[int, int, np.ndarray, np.ndarray]] | None = None  # longtail: (slot a, slot b, vectors a, b)
    pair_scale: float = 0.0         # longtail: weight of the interaction part
    drift_slots: list[int] | None = None  # drift: slots whose values drift (their weights cover 2 x k ids)
    dense_shift: np.ndarray | None = None  # drift: change of dense_linear from the first line to the last
    labels: int = 1                 # label fields per line (2: also the second task)
    task2_slots: list[int] | None = None       # --labels 2: slots with own weights in the second task's logit
    task2_weights: list[np.ndarray] | None = None
    task2_shared: float = 0.0       # --labels 2: its logit's multiple of the click logit (bias aside)
    bias2: float = 0.0
    history_len: int = 0            # --history: most values of a line's sequence (0: no sequence)
    topics: np.ndarray | None = None       # --history: topic of each rank of HISTORY_SLOT (ids: id % size)
    topic_order: np.ndarray | None = None  # --history: ranks sorted by (topic, rank)
    topic_cdf: np.ndarray | None = None    # --history: t + cumulative in-topic probability, in that order
    topic_start: np.ndarray | None = None  # --history: where each topic's ranks start in topic_order (+ end)
    latent: np.ndarray | None = None       # --history: HIST_NOISE-scaled latent part of each id's vector, [4, ids]
    hist_scale: float = 0.0         # --history: weight of the history term


# ----------------------------------------------------------------------------- building the model

def cardinalities(scale: str) -> list[int]:
    """Distinct values per slot: Criteo's, capped (full), or shrunk to at most SMALL_CAP (small)."""
    if scale == "full":
        return [min(c, FULL_CAP) for c in SLOT_CARD]
    # small: keep the order of magnitude ranking but compress big slots into [1000, SMALL_CAP]
    return [c if c <= 1000 else int(min(SMALL_CAP, 1000 + 250 * np.log10(c / 1000) ** 2)) for c in SLOT_CARD]


def zipf_probs(k: int, exponent: float) -> np.ndarray:
    """Power-law frequencies p_r ∝ (r + 2)^-s over ranks r = 0..k-1 (the +2 flattens the very top)."""
    p = (np.arange(k, dtype=np.float64) + 2.0) ** -exponent
    return p / p.sum()


def slot_weights(rng: np.random.Generator, probs: np.ndarray, spread: float, p0: float = P0) -> np.ndarray:
    """Weights whose spread shrinks with frequency: the head carries the learnable signal."""
    return spread * probs / (probs + p0) * rng.standard_normal(probs.size)


def build_model(seed: int, scale: str, shape: str = "default", labels: int = 1, history: int = 0) -> Model:
    """Draw the label model for (seed, scale, shape), then scale it to fixed spreads and positive
    rate. The default shape's draws come first and unchanged; the other shapes' from own streams,
    and so do the second task's (``labels`` 2) and the history term's (``history`` > 0)."""
    rng = np.random.default_rng([seed, 0])
    cdfs, weights = [], []
    spreads = rng.lognormal(0.0, 0.6, len(SLOT_CARD))
    spreads[rng.choice(len(SLOT_CARD), NOISE_SLOTS, replace=False)] = 0.0
    steeper = SMALL_STEEPER if scale == "small" else 0.0
    if shape == "longtail":
        steeper -= LONGTAIL_FLATTER
    p0 = LONGTAIL_P0 if shape == "longtail" else P0
    for k, s, spread in zip(cardinalities(scale), SLOT_ZIPF, spreads):
        probs = zipf_probs(k, s + steeper)
        cdfs.append(np.cumsum(probs))
        weights.append(slot_weights(rng, probs, spread, p0))
    mu = np.log1p(DENSE_MEDIAN)
    sigma = (np.log1p(CONT_DIFF.astype(np.float64)) - mu) / 1.645
    model = Model(
        scale=scale, cdfs=cdfs, weights=weights,
        missing_weight=0.5 * spreads * rng.standard_normal(len(SLOT_CARD)),
        code_keys=rng.integers(0, 1 << 32, len(SLOT_CARD), dtype=np.uint64).astype(np.uint32),
        dense_mu=mu, dense_sigma=sigma,
        dense_linear=rng.normal(0.0, 1.0, CONT_DIFF.size),
        dense_missing=rng.normal(0.0, 0.3, CONT_DIFF.size),
        bump=float(rng.choice([-1.0, 1.0])) * BUMP, interaction=float(rng.choice([-1.0, 1.0])) * INTERACTION,
        shape=shape,
    )
    if shape == "longtail":
        add_pairs(model, np.random.default_rng([seed, 4]), p0)
    elif shape == "drift":
        add_drift(model, np.random.default_rng([seed, 5]), spreads)
    if history:
        add_history(model, np.random.default_rng([seed, 6]), history)
    if labels == 2:
        add_task2(model, np.random.default_rng([seed, 7]), p0)
    calibrate(model, np.random.default_rng([seed, 3]), np.random.default_rng([seed, 8]))
    return model


def add_pairs(model: Model, rng: np.random.Generator, p0: float) -> None:
    """PAIRS interacting pairs among the slots with at least 100 values: the logit gets the dot
    product of a vector per value of each, whose spread shrinks with frequency as the weights'."""
    big = [j for j, cdf in enumerate(model.cdfs) if cdf.size >= 100]
    model.pairs = []
    for _ in range(PAIRS):
        a, b = (int(j) for j in rng.choice(big, 2, replace=False))
        vectors = []
        for j in (a, b):
            probs = np.diff(model.cdfs[j], prepend=0.0)
            vectors.append(np.sqrt(probs / (probs + p0))[:, None] * rng.standard_normal((probs.size, PAIR_DIM)))
        model.pairs.append((a, b, vectors[0], vectors[1]))


def add_drift(model: Model, rng: np.random.Generator, spreads: np.ndarray) -> None:
    """New values for every slot with at least DRIFT_MIN_CARD values (ids k..2k-1, weights drawn
    as the old ones'), and the dense weights' change over the file."""
    model.drift_slots = [j for j, cdf in enumerate(model.cdfs) if cdf.size >= DRIFT_MIN_CARD]
    for j in model.drift_slots:
        probs = np.diff(model.cdfs[j], prepend=0.0)
        model.weights[j] = np.concatenate([model.weights[j], slot_weights(rng, probs, spreads[j])])
    model.dense_shift = DRIFT_DENSE * rng.standard_normal(CONT_DIFF.size)


def add_history(model: Model, rng: np.random.Generator, length: int) -> None:
    """The items of HISTORY_SLOT in HIST_TOPICS balanced topics (a random permutation dealt round),
    the tables that draw an item of a given topic with the slot's own frequencies, and each id's
    latent part (a drifted slot's new id k + r shares rank r's topic but has its own latent part)."""
    k = model.cdfs[HISTORY_SLOT].size
    model.history_len = length
    model.topics = np.empty(k, dtype=np.int8)
    model.topics[rng.permutation(k)] = np.arange(k) % HIST_TOPICS
    probs = np.diff(model.cdfs[HISTORY_SLOT], prepend=0.0)
    order = np.lexsort((np.arange(k), model.topics))
    sorted_topics = model.topics[order]
    start = np.searchsorted(sorted_topics, np.arange(HIST_TOPICS + 1))
    cum = np.cumsum(probs[order])
    before = np.r_[0.0, cum][start[:-1]]                     # mass of the topics before each topic
    mass = np.r_[0.0, cum][start[1:]] - before
    model.topic_order, model.topic_start = order, start
    model.topic_cdf = sorted_topics + (cum - before[sorted_topics]) / np.maximum(mass[sorted_topics], 1e-300)
    ids = model.weights[HISTORY_SLOT].size                   # 2k for a drifted slot
    model.latent = (HIST_NOISE * rng.standard_normal((HIST_LATENT, ids))).astype(np.float32)


def add_task2(model: Model, rng: np.random.Generator, p0: float) -> None:
    """The second task's own weights: TASK2_SLOTS slots with at least 10 values, weights drawn as
    the click model's (spread shrinking with frequency; a drifted slot's new ids get their own)."""
    model.labels = 2
    eligible = [j for j, cdf in enumerate(model.cdfs) if cdf.size >= 10]
    model.task2_slots = sorted(int(j) for j in rng.choice(eligible, TASK2_SLOTS, replace=False))
    model.task2_weights = []
    for j in model.task2_slots:
        probs = np.diff(model.cdfs[j], prepend=0.0)
        w = slot_weights(rng, probs, 1.0, p0)
        while w.size < model.weights[j].size:
            w = np.concatenate([w, slot_weights(rng, probs, 1.0, p0)])
        model.task2_weights.append(w)


def calibrate(model: Model, rng: np.random.Generator, history_rng: np.random.Generator | None = None) -> None:
    """Scale both parts of the logit to CAT_STD / DENSE_STD and fit the bias to TARGET_RATE.

    With a history, its term is scaled to HIST_STD and the categorical part to
    sqrt(CAT_STD^2 - HIST_STD^2), so the logit's spread (and the Bayes AUC) stays about the same.
    The second task's shared and own parts are scaled to TASK2_SHARED_STD / TASK2_OWN_STD and its
    bias fitted to TASK2_RATE. Done on a pilot sample from own streams (``history_rng``: the pilot's
    sequences), so the model is the same whatever is written.
    """
    cats, dense = sample_features(model, rng, PILOT_ROWS)
    cat_part, dense_part = categorical_logit(model, cats), dense_logit(model, dense)
    if model.pairs:
        pair_part = pair_logit(model.pairs, cats)
        model.pair_scale = PAIR_SHARE * cat_part.std() / max(pair_part.std(), 1e-12)
        cat_part = cat_part + model.pair_scale * pair_part
    cat_std, hist_part = CAT_STD, None
    if model.history_len:
        hist_part = np.concatenate([history_term(model, cats[i:i + CHUNK],
                                                 sample_history(model, history_rng, cats[i:i + CHUNK]))
                                    for i in range(0, PILOT_ROWS, CHUNK)])
        model.hist_scale = HIST_STD / max(hist_part.std(), 1e-12)
        cat_std = float(np.sqrt(CAT_STD ** 2 - HIST_STD ** 2))
    a, b = cat_std / max(cat_part.std(), 1e-12), DENSE_STD / max(dense_part.std(), 1e-12)
    model.weights = [w * a for w in model.weights]
    model.missing_weight = model.missing_weight * a
    model.pair_scale *= a
    model.dense_linear, model.dense_missing = model.dense_linear * b, model.dense_missing * b
    if model.dense_shift is not None:
        model.dense_shift = model.dense_shift * b
    model.bump, model.interaction = model.bump * b, model.interaction * b
    logits = a * cat_part + b * dense_part
    if hist_part is not None:
        logits = logits + model.hist_scale * hist_part
    model.bias = fit_bias(logits, TARGET_RATE)
    if model.labels == 2:
        own = task2_logit(model, cats)
        model.task2_shared = TASK2_SHARED_STD / max(logits.std(), 1e-12)
        c = TASK2_OWN_STD / max(own.std(), 1e-12)
        model.task2_weights = [w * c for w in model.task2_weights]
        model.bias2 = fit_bias(model.task2_shared * logits + c * own, TASK2_RATE)


def fit_bias(logits: np.ndarray, rate: float) -> float:
    """The bias that makes the mean probability equal ``rate`` (bisection: the mean is monotone)."""
    lo, hi = -20.0, 20.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if sigmoid(logits + mid).mean() < rate else (lo, mid)
    return 0.5 * (lo + hi)


# ----------------------------------------------------------------------------- sampling rows

def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def sample_features(model: Model, rng: np.random.Generator, n: int, clock: np.ndarray | None = None
                    ) -> tuple[np.ndarray, np.ndarray]:
    """n rows: value ids per slot (-1 = missing) and dense counts (a masked int64 array).

    An id is the value's rank, or rank + k for a drifted slot's new values (``--shape drift``: a
    row at ``clock`` t in [0, 1] takes a new value with probability DRIFT_NEW * t)."""
    cats = np.empty((n, len(model.cdfs)), dtype=np.int64)
    for j, cdf in enumerate(model.cdfs):
        ranks = np.minimum(np.searchsorted(cdf, rng.random(n) * cdf[-1], side="right"), cdf.size - 1)
        ranks[rng.random(n) < SLOT_MISSING[j]] = -1
        cats[:, j] = ranks
    z = rng.standard_normal((n, CONT_DIFF.size))
    counts = np.floor(np.exp(model.dense_mu + model.dense_sigma * z)).astype(np.int64) - 1
    counts = np.maximum(counts, 0)
    negative = rng.random(n) < I2_NEGATIVE
    counts[negative, 1] = -rng.choice(3, int(negative.sum()), p=[0.8, 0.15, 0.05]) - 1
    missing = rng.random((n, CONT_DIFF.size)) < DENSE_MISSING
    if model.drift_slots and clock is not None:
        for j in model.drift_slots:
            new = (rng.random(n) < DRIFT_NEW * clock) & (cats[:, j] >= 0)
            cats[new, j] += model.cdfs[j].size
    return cats, np.ma.masked_array(counts, mask=missing)


def draw_ranks(cdf: np.ndarray, rng: np.random.Generator, size) -> np.ndarray:
    """Value ranks drawn with the frequencies whose cumulative sums are ``cdf``."""
    return np.minimum(np.searchsorted(cdf, rng.random(size) * cdf[-1], side="right"), cdf.size - 1)


def sample_history(model: Model, rng: np.random.Generator, cats: np.ndarray, clock: np.ndarray | None = None
                   ) -> np.ndarray:
    """Each row's sequence: ids of HISTORY_SLOT, int64 [n, history_len], -1 after its length.

    A length uniform in 0..history_len; a main topic: the candidate's (the row's value in
    HISTORY_SLOT) with chance HIST_MATCH, else the topic of an item drawn from the slot's
    frequencies; each item from the main topic (its items with the slot's frequencies) with chance
    HIST_FOCUS, else any item. ``--shape drift``: each item is a new id as the slot's draws are."""
    n, length = cats.shape[0], model.history_len
    k = model.topics.size
    cdf = model.cdfs[HISTORY_SLOT]
    lengths = rng.integers(0, length + 1, n)
    candidate = cats[:, HISTORY_SLOT]
    match = (rng.random(n) < HIST_MATCH) & (candidate >= 0)
    main = model.topics[np.where(match, np.maximum(candidate, 0) % k, draw_ranks(cdf, rng, n))]
    valid = np.arange(length)[None, :] < lengths[:, None]
    owner = np.repeat(np.arange(n), lengths)                 # the row of each item, in the order of valid's cells
    focus = rng.random(owner.size) < HIST_FOCUS
    items = np.empty(owner.size, dtype=np.int64)
    topic = main[owner[focus]]
    pos = np.searchsorted(model.topic_cdf, topic + rng.random(topic.size), side="right")
    items[focus] = model.topic_order[np.clip(pos, model.topic_start[topic], model.topic_start[topic + 1] - 1)]
    items[~focus] = draw_ranks(cdf, rng, owner.size - topic.size)
    if model.drift_slots and HISTORY_SLOT in model.drift_slots and clock is not None:
        items[rng.random(owner.size) < DRIFT_NEW * clock[owner]] += k
    hist = np.full((n, length), -1, dtype=np.int64)
    hist[valid] = items
    return hist


def history_term(model: Model, cats: np.ndarray, hist: np.ndarray) -> np.ndarray:
    """Mean over each row's sequence of <v_candidate, v_item> (0 for an empty one or a missing
    candidate), v = [one-hot topic, latent part]: the share of the history in the candidate's
    topic, plus item-level noise. Computed over the sequences' values only (not the padding)."""
    k = model.topics.size
    valid = hist >= 0
    owner = np.nonzero(valid)[0]
    items = hist[valid]
    candidate = np.maximum(cats[:, HISTORY_SLOT], 0)
    dots = (model.topics[candidate % k][owner] == model.topics[items % k]).astype(np.float64)
    for column in model.latent:                               # one gather per coordinate: faster than rows
        dots += column[candidate][owner] * column[items].astype(np.float64)
    count = valid.sum(axis=1)
    term = np.bincount(owner, weights=dots, minlength=hist.shape[0]) / np.maximum(count, 1)
    return np.where(cats[:, HISTORY_SLOT] >= 0, term, 0.0)


def task2_logit(model: Model, cats: np.ndarray) -> np.ndarray:
    """The second task's own part: its slots' weights (0 for a missing value)."""
    total = np.zeros(cats.shape[0])
    for j, w in zip(model.task2_slots, model.task2_weights):
        ranks = cats[:, j]
        total += np.where(ranks >= 0, w[np.maximum(ranks, 0)], 0.0)
    return total


def categorical_logit(model: Model, cats: np.ndarray) -> np.ndarray:
    """Sum of the weights of each row's (slot, value) pairs; a missing value has its own weight."""
    total = np.zeros(cats.shape[0])
    for j, w in enumerate(model.weights):
        ranks = cats[:, j]
        total += np.where(ranks >= 0, w[np.maximum(ranks, 0)], model.missing_weight[j])
    return total


def pair_logit(pairs: list[tuple[int, int, np.ndarray, np.ndarray]], cats: np.ndarray) -> np.ndarray:
    """Sum over the pairs of the dot product of both values' vectors (0 when either is missing)."""
    total = np.zeros(cats.shape[0])
    for a, b, va, vb in pairs:
        ra, rb = cats[:, a], cats[:, b]
        both = (ra >= 0) & (rb >= 0)
        total += np.where(both, np.einsum("ij,ij->i", va[np.maximum(ra, 0)], vb[np.maximum(rb, 0)]), 0.0)
    return total


def dense_logit(model: Model, dense: np.ma.MaskedArray, clock: np.ndarray | None = None) -> np.ndarray:
    """Linear part on the clipped normalised values, plus a bump on I6 and an I2 x I8 interaction.

    The interaction is a soft AND of "I2 above its median" and "I8 above its median": it lives in
    the bulk of the data (not in the heavy tails), so a DNN can learn it from a modest sample, and
    a wide model cannot represent it.
    """
    v = np.clip((dense.data - CONT_MIN) / CONT_DIFF, 0.0, 1.5)
    v[dense.mask] = 0.0
    linear = v @ model.dense_linear + dense.mask.astype(np.float64) @ model.dense_missing
    if model.dense_shift is not None and clock is not None:
        linear += clock * (v @ model.dense_shift)
    bump = model.bump * np.exp(-0.5 * ((v[:, 5] - 0.12) / 0.06) ** 2)
    interaction = model.interaction * sigmoid((v[:, 1] - 0.04) / 0.012) * sigmoid((v[:, 7] - 0.1) / 0.03)
    return linear + bump + interaction


@dataclass
class Rows:
    """A block of labelled rows; the fields after ``dense`` are set by --labels 2 / --history."""

    labels: np.ndarray              # int8 [n]: the click label
    prob: np.ndarray                # its true probability
    cats: np.ndarray                # value ids per slot (-1 = missing)
    dense: np.ma.MaskedArray        # dense counts
    labels2: np.ndarray | None = None          # the second task's label
    prob2: np.ndarray | None = None
    history: np.ndarray | None = None          # ids of HISTORY_SLOT [n, history_len], -1 after a row's length
    prob_no_history: np.ndarray | None = None  # the click probability without the history term


def sample_rows(model: Model, rng: np.random.Generator, n: int, clock: np.ndarray | None = None,
                extra_rng: np.random.Generator | None = None) -> Rows:
    """n labelled rows at ``clock`` (drift only). ``rng`` draws the features and the click labels
    exactly as without the new options; ``extra_rng`` the sequences and the second task's labels."""
    cats, dense = sample_features(model, rng, n, clock)
    logit = model.bias + categorical_logit(model, cats) + dense_logit(model, dense, clock)
    if model.pairs:
        logit += model.pair_scale * pair_logit(model.pairs, cats)
    rows = Rows(np.empty(0, np.int8), np.empty(0), cats, dense)
    if model.history_len:
        rows.history = sample_history(model, extra_rng, cats, clock)
        rows.prob_no_history = sigmoid(logit)
        logit = logit + model.hist_scale * history_term(model, cats, rows.history)
    rows.prob = sigmoid(logit)
    rows.labels = (rng.random(n) < rows.prob).astype(np.int8)
    if model.labels == 2:
        own = task2_logit(model, cats)
        rows.prob2 = sigmoid(model.bias2 + model.task2_shared * (logit - model.bias) + own)
        rows.labels2 = (extra_rng.random(n) < rows.prob2).astype(np.int8)
    return rows


def sample_chunk(model: Model, rng: np.random.Generator, n: int, clock: np.ndarray | None = None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ma.MaskedArray]:
    """n labelled rows at ``clock`` (drift only): (labels, true probabilities, value ids, dense counts).
    Without --labels 2 / --history (use :func:`sample_rows` for those)."""
    rows = sample_rows(model, rng, n, clock)
    return rows.labels, rows.prob, rows.cats, rows.dense


# ----------------------------------------------------------------------------- text

def hex_codes(ranks: np.ndarray, key: np.uint32) -> np.ndarray:
    """8-hex-digit strings for value ranks: a bijection of 32-bit ints, so distinct ranks never collide."""
    x = ranks.astype(np.uint32) ^ key
    x ^= x >> np.uint32(16)
    x *= np.uint32(0x7FEB352D)
    x ^= x >> np.uint32(15)
    x *= np.uint32(0x846CA68B)
    x ^= x >> np.uint32(16)
    return np.frombuffer(x.astype(">u4").tobytes().hex().encode("ascii"), dtype="S8").copy()


def format_rows(model: Model, labels: np.ndarray, cats: np.ndarray, dense: np.ma.MaskedArray,
                labels2: np.ndarray | None = None, history: np.ndarray | None = None) -> list[bytes]:
    """One bytes line (no newline) per row; columns are built with numpy, joined by C-level map/zip.
    ``labels2`` is written second, ``history`` (ids of HISTORY_SLOT, -1 = none) last, as that slot's values."""
    columns = [np.where(labels == 1, b"1", b"0").tolist()]
    if labels2 is not None:
        columns.append(np.where(labels2 == 1, b"1", b"0").tolist())
    for j in range(dense.shape[1]):
        text = dense.data[:, j].astype("S20")
        text[dense.mask[:, j]] = b""
        columns.append(text.tolist())
    for j in range(cats.shape[1]):
        text = hex_codes(cats[:, j], model.code_keys[j])
        text[cats[:, j] < 0] = b""
        columns.append(text.tolist())
    if history is not None:
        columns.append(join_values(hex_codes(history, model.code_keys[HISTORY_SLOT]).reshape(history.shape),
                                   (history >= 0).sum(axis=1)))
    return list(map(b"\t".join, zip(*columns)))


def join_values(codes: np.ndarray, lengths: np.ndarray, separator: bytes = b",") -> list[bytes]:
    """Per row, its first ``lengths`` 8-byte codes joined by ``separator``, without a Python loop:
    a fixed-width byte matrix whose unused tail is NUL, which numpy's bytes type strips."""
    n, width = codes.shape
    buf = np.empty((n, width, 9), dtype=np.uint8)
    buf[:, :, :8] = codes.view(np.uint8).reshape(n, width, 8)
    buf[:, :, 8] = ord(separator)
    buf = buf.reshape(n, width * 9)
    buf[np.arange(width * 9)[None, :] >= (9 * lengths - 1)[:, None]] = 0
    return buf.view(f"S{width * 9}").ravel().tolist()


# ----------------------------------------------------------------------------- metrics

def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Exact ROC AUC by ranks (ties get their average rank); NaN when one class is absent."""
    labels = labels.astype(bool)
    n_pos = int(labels.sum())
    n_neg = labels.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    starts = np.flatnonzero(np.r_[True, sorted_scores[1:] != sorted_scores[:-1]])
    ends = np.r_[starts[1:], scores.size]
    avg_rank = (starts + ends + 1) / 2.0          # 1-based average rank of each tie group
    ranks = np.empty(scores.size)
    ranks[order] = np.repeat(avg_rank, ends - starts)
    return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def logloss(prob: np.ndarray, labels: np.ndarray) -> float:
    p = np.clip(prob, 1e-15, 1 - 1e-15)
    return float(-np.mean(np.where(labels == 1, np.log(p), np.log1p(-p))))


# ----------------------------------------------------------------------------- writing

@dataclass
class Split:
    """What generate() reports of a written split: labels and true probabilities per task, per-file lines."""

    labels: np.ndarray
    probs: np.ndarray
    files: list[int]
    labels2: np.ndarray | None = None
    probs2: np.ndarray | None = None
    probs_no_history: np.ndarray | None = None


def write_split(model: Model, seed: int, split_id: int, directory: Path, lines: int, files: int,
                progress: Callable[[int], object] | None = None) -> Split:
    """Write ``lines`` rows over ``files`` part files. ``progress(n)`` is called after each block of
    n rows is written.

    Rows come in CHUNK-sized blocks, each from stream (seed, split_id, block) (the sequences and
    the second labels from stream (seed, split_id, block, 9)), and are dealt to the files in order,
    so the bytes do not depend on how many files there are. The drift clock runs from 0 to 1 over
    the training lines and stays at 1 for the test lines.
    """
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("part-*"):
        stale.unlink()
    bounds = [i * lines // files for i in range(files + 1)]
    per_file = [b - a for a, b in zip(bounds, bounds[1:])]
    out = Split(np.empty(lines, dtype=np.int8), np.empty(lines), per_file)
    if model.labels == 2:
        out.labels2, out.probs2 = np.empty(lines, dtype=np.int8), np.empty(lines)
    if model.history_len:
        out.probs_no_history = np.empty(lines)
    handles = [open(directory / f"part-{i:05d}", "wb") for i in range(files)]
    try:
        for block, start in enumerate(range(0, lines, CHUNK)):
            n = min(CHUNK, lines - start)
            clock = None
            if model.shape == "drift":
                clock = (start + np.arange(n)) / lines if split_id == 1 else np.ones(n)
            extra = None if model.labels == 1 and not model.history_len else \
                np.random.default_rng([seed, split_id, block, 9])
            rows = sample_rows(model, np.random.default_rng([seed, split_id, block]), n, clock, extra)
            part = slice(start, start + n)
            out.labels[part], out.probs[part] = rows.labels, rows.prob
            if rows.labels2 is not None:
                out.labels2[part], out.probs2[part] = rows.labels2, rows.prob2
            if rows.prob_no_history is not None:
                out.probs_no_history[part] = rows.prob_no_history
            deal(format_rows(model, rows.labels, rows.cats, rows.dense, rows.labels2, rows.history),
                 start, bounds, handles)
            if progress is not None:
                progress(n)
    finally:
        for h in handles:
            h.close()
    return out


def deal(rows: list[bytes], start: int, bounds: list[int], handles: list) -> None:
    """Append rows numbered start.. to the files whose line ranges [bounds[i], bounds[i+1]) hold them."""
    end = start + len(rows)
    for i, handle in enumerate(handles):
        lo, hi = max(bounds[i], start), min(bounds[i + 1], end)
        if lo < hi:
            handle.write(b"\n".join(rows[lo - start:hi - start]) + b"\n")


def generate(out: Path, *, train_lines: int, test_lines: int, train_files: int, test_files: int,
             seed: int, scale: str, shape: str = "default", labels: int = 1, history: int = 0, log=print) -> dict:
    """Write the data set and meta.json under ``out``; returns the meta dict."""
    if labels not in (1, 2):
        raise ValueError(f"labels must be 1 or 2, got {labels!r}")
    if not 0 <= history <= MAX_HISTORY:
        raise ValueError(f"history must be in 0..{MAX_HISTORY}, got {history!r}")
    t0 = time.perf_counter()
    model = build_model(seed, scale, shape, labels, history)
    t_model = time.perf_counter() - t0
    # a bar only on a terminal: tests and logs capture stderr and must stay clean
    with tqdm(total=train_lines + test_lines, unit=" lines", unit_scale=True, desc="writing",
              disable=not sys.stderr.isatty()) as bar:
        train = write_split(model, seed, 1, out / "train_data", train_lines, train_files, bar.update)
        test = write_split(model, seed, 2, out / "test_data", test_lines, test_files, bar.update)
    y_tr, p_tr, files_tr = train.labels, train.probs, train.files
    y_te, p_te, files_te = test.labels, test.probs, test.files
    elapsed = time.perf_counter() - t0
    meta = {
        "generator": GENERATOR, "seed": seed, "scale": scale, **({} if shape == "default" else {"shape": shape}),
        "train_lines": train_lines, "test_lines": test_lines,
        "train_files": files_tr, "test_files": files_te,
        "positive_rate_train": float(y_tr.mean()), "positive_rate_test": float(y_te.mean()),
        "bayes_auc_test": nan_to_none(auc(p_te, y_te)), "bayes_logloss_test": logloss(p_te, y_te),
        "bayes_auc_train": nan_to_none(auc(p_tr, y_tr)), "bayes_logloss_train": logloss(p_tr, y_tr),
        "dense": int(CONT_DIFF.size), "slots": len(SLOT_CARD), "buckets": 1000001,
        "cont_min": CONT_MIN.tolist(), "cont_diff": CONT_DIFF.tolist(),
        "slot_cardinality": [int(w.size) for w in model.weights],
        "seconds": round(elapsed, 2), "seconds_model": round(t_model, 2),
    }
    if labels == 2:
        meta["labels"] = 2
        meta["bayes_auc_tasks"] = [meta["bayes_auc_test"], nan_to_none(auc(test.probs2, test.labels2))]
        meta["bayes_logloss_tasks"] = [meta["bayes_logloss_test"], logloss(test.probs2, test.labels2)]
        meta["positive_rate_train_tasks"] = [meta["positive_rate_train"], float(train.labels2.mean())]
        meta["positive_rate_test_tasks"] = [meta["positive_rate_test"], float(test.labels2.mean())]
        meta["task2"] = {"target_rate": TASK2_RATE, "own_slots": model.task2_slots,
                         "shared_std": TASK2_SHARED_STD, "own_std": TASK2_OWN_STD}
    if history:
        meta["lists"] = [{"name": "history", "max_len": history, "shares": HISTORY_SLOT, "separator": ","}]
        meta["bayes_auc_test_without_history"] = nan_to_none(auc(test.probs_no_history, y_te))
        meta["history"] = {"slot": HISTORY_SLOT, "topics": HIST_TOPICS, "match": HIST_MATCH, "focus": HIST_FOCUS,
                           "term_std": HIST_STD}
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    log(summary(out, meta))
    return meta


def nan_to_none(x: float) -> float | None:
    return None if np.isnan(x) else x


def summary(out: Path, meta: dict) -> str:
    rate = (meta["train_lines"] + meta["test_lines"]) / max(meta["seconds"], 1e-9)
    auc_text = "n/a (one class only)" if meta["bayes_auc_test"] is None else f"{meta['bayes_auc_test']:.4f}"
    return "\n".join([
        f"wrote {out}/train_data: {meta['train_lines']:,} lines in {len(meta['train_files'])} files, "
        f"{out}/test_data: {meta['test_lines']:,} lines in {len(meta['test_files'])} files "
        f"({meta['seconds']:.1f} s, {rate:,.0f} lines/s)",
        f"scale {meta['scale']}{', shape ' + meta['shape'] if 'shape' in meta else ''}, seed {meta['seed']}; slot cardinalities {min(meta['slot_cardinality'])}"
        f"..{max(meta['slot_cardinality']):,}",
        f"positive rate: train {meta['positive_rate_train']:.4f}, test {meta['positive_rate_test']:.4f}",
        f"Bayes-optimal on test (true probabilities): AUC {auc_text}, logloss {meta['bayes_logloss_test']:.4f}",
        *extra_summary(meta),
        f"meta: {out}/meta.json",
    ])


def extra_summary(meta: dict) -> list[str]:
    """Lines about the second task and the history, when there are any."""
    lines = []
    if meta.get("labels", 1) == 2:
        auc2 = meta["bayes_auc_tasks"][1]
        lines.append(f"second task: positive rate train {meta['positive_rate_train_tasks'][1]:.4f}, test "
                     f"{meta['positive_rate_test_tasks'][1]:.4f}; Bayes-optimal AUC "
                     + ("n/a (one class only)" if auc2 is None else f"{auc2:.4f}"))
    if "lists" in meta:
        without = meta["bayes_auc_test_without_history"]
        slot = meta['lists'][0]['shares']
        lines.append(f"history: up to {meta['lists'][0]['max_len']} values of slot C{slot + 1} (index {slot}) "
                     f"(last field); click AUC without the history term "
                     + ("n/a" if without is None else f"{without:.4f}"))
    return lines


# ----------------------------------------------------------------------------- command line

def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Write synthetic Criteo-format CTR data (label, I1..I13, C1..C26; tab-separated) "
                    "drawn from a known logistic model, and report the Bayes-optimal test AUC.",
        epilog="Layout: OUT/train_data/part-00000.., OUT/test_data/part-00000.., OUT/meta.json "
               "(existing part files there are replaced). The same --seed and --scale give "
               "byte-identical files. --labels 2 adds a field after the label, --history a last field "
               "(aps.models.tabular's layout, described in meta.json's labels and lists).")
    parser.add_argument("--out", required=True, type=Path, help="output directory")
    parser.add_argument("--train-lines", type=positive_int, default=1_000_000, help="default: %(default)s")
    parser.add_argument("--test-lines", type=positive_int, default=100_000, help="default: %(default)s")
    parser.add_argument("--train-files", type=positive_int, default=8, help="default: %(default)s")
    parser.add_argument("--test-files", type=positive_int, default=1, help="default: %(default)s")
    parser.add_argument("--seed", type=int, default=0, help="seed of the model and the rows (default: %(default)s)")
    parser.add_argument("--scale", choices=["full", "small"], default="full",
                        help="full: Criteo-like slot sizes (3 to 10^6 values); small: at most "
                             f"{SMALL_CAP} values per slot, learnable from ~50k lines (default: %(default)s)")
    parser.add_argument("--labels", type=int, choices=[1, 2], default=1,
                        help="2: a second label per line (the second field), a 'conversion' task whose logit "
                             f"shares part of the click logit, positive rate about {TASK2_RATE} (default: %(default)s)")
    parser.add_argument("--history", type=int, default=0, metavar="L",
                        help="a behaviour sequence per line (the last field): 0..L values of slot "
                             f"C{HISTORY_SLOT + 1}, comma-separated, written as that slot's; the click model "
                             f"gets a term relating it to the line's C{HISTORY_SLOT + 1} (0: none; at most "
                             f"{MAX_HISTORY}; default: %(default)s)")
    parser.add_argument("--shape", choices=SHAPES, default="default",
                        help="longtail: a longer tail of rare values and slot x slot interactions; drift: the "
                             "id distribution and the click model drift over the training files' order "
                             "(default: %(default)s)")
    args = parser.parse_args(argv)
    if args.seed < 0:
        parser.error("--seed must be >= 0")
    if not 0 <= args.history <= MAX_HISTORY:
        parser.error(f"--history must be in 0..{MAX_HISTORY}, got {args.history}")
    for split in ("train", "test"):
        files, lines = getattr(args, f"{split}_files"), getattr(args, f"{split}_lines")
        if files > lines:
            parser.error(f"--{split}-files {files} is more than --{split}-lines {lines}: every file needs a line")
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"--out {args.out} is a file, not a directory")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        generate(args.out, train_lines=args.train_lines, test_lines=args.test_lines, train_files=args.train_files,
                 test_files=args.test_files, seed=args.seed, scale=args.scale, shape=args.shape,
                 labels=args.labels, history=args.history)
    except OSError as exc:
        print(f"make_data.py: error: cannot write under {args.out}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
