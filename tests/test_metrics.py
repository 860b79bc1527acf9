"""Bucketed AUC (global, sliding, merged across workers) and log loss.

The reference for the global and merged AUC is sklearn's exact ``roc_auc_score``; 4096 buckets
put the bucketed value within 1e-3 of it for continuous scores. The sliding window is checked
exactly against bucket counts rebuilt from scratch in NumPy, with an AUC written here
independently of the module's kernel (vectorised trapezoids instead of a loop).
"""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from aps.errors import ConfigError
from aps.metrics import (
    NUM_THRESHOLDS,
    SLIDE_STEPS,
    Auc,
    auc_from_counts,
    auc_state_shape,
    logloss,
    merged_auc,
)

B = NUM_THRESHOLDS + 1


def make_problem(
    rng: np.random.Generator, n: int, pos_rate: float, kind: str
) -> tuple[np.ndarray, np.ndarray]:
    """Random scores in [0, 1] and 0/1 labels; ``kind`` sets how separable they are."""
    labels = (rng.random(n) < pos_rate).astype(np.int64)
    if kind == "separated":  # AUC ~ 0.99
        probs = np.where(labels == 1, rng.beta(8, 2, n), rng.beta(2, 8, n))
    elif kind == "random":  # AUC ~ 0.5
        probs = rng.random(n)
    elif kind == "logistic":  # a typical CTR model: small probabilities, moderate AUC
        logits = rng.normal(-2.0, 1.0, n) + 1.2 * labels
        probs = 1.0 / (1.0 + np.exp(-logits))
    else:
        raise ValueError(kind)
    return probs.astype(np.float32), labels


def split(rng: np.random.Generator, n: int, batches: int) -> list[slice]:
    cuts = np.sort(rng.choice(np.arange(1, n), size=batches - 1, replace=False))
    edges = [0, *cuts.tolist(), n]
    return [slice(a, b) for a, b in zip(edges[:-1], edges[1:])]


def bucket_counts(probs: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    b = np.clip((probs.astype(np.float64) * NUM_THRESHOLDS).astype(np.int64), 0, NUM_THRESHOLDS)
    pos = np.bincount(b[labels > 0], minlength=B).astype(np.float64)
    neg = np.bincount(b[labels == 0], minlength=B).astype(np.float64)
    return pos, neg


def reference_auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """ROC area from bucket counts, thresholds from the top bucket down (trapezoids)."""
    tp = np.concatenate([[0.0], np.cumsum(pos[::-1])])
    fp = np.concatenate([[0.0], np.cumsum(neg[::-1])])
    if tp[-1] == 0 or fp[-1] == 0:
        return 0.5
    return float(np.sum(np.diff(fp) * (tp[1:] + tp[:-1]) / 2) / (tp[-1] * fp[-1]))


# ---------------------------------------------------------------- global AUC vs sklearn


@pytest.mark.parametrize(
    ("n", "pos_rate", "kind", "batches"),
    [
        (3_000, 0.5, "random", 3),
        (5_000, 0.5, "separated", 7),
        (20_000, 0.05, "logistic", 20),
        (50_000, 0.3, "separated", 40),
        (200_000, 0.2, "logistic", 57),
        (100_000, 0.9, "random", 25),
    ],
)
def test_global_auc_matches_sklearn(n: int, pos_rate: float, kind: str, batches: int) -> None:
    rng = np.random.default_rng(n + batches)
    probs, labels = make_problem(rng, n, pos_rate, kind)
    auc = Auc()
    for s in split(rng, n, batches):
        auc.update(probs[s], labels[s])
    assert auc.global_auc() == pytest.approx(roc_auc_score(labels, probs), abs=1e-3)
    pos, neg = bucket_counts(probs, labels)
    np.testing.assert_array_equal(auc.state[0, 0], pos)
    np.testing.assert_array_equal(auc.state[0, 1], neg)
    assert auc.global_auc() == pytest.approx(reference_auc(pos, neg), abs=1e-12)


def test_auc_from_counts_matches_reference_and_accepts_int64() -> None:
    rng = np.random.default_rng(1)
    pos = rng.integers(0, 50, B)
    neg = rng.integers(0, 50, B)
    expected = reference_auc(pos.astype(np.float64), neg.astype(np.float64))
    assert auc_from_counts(pos, neg) == pytest.approx(expected, abs=1e-12)
    assert auc_from_counts(pos.astype(np.float64), neg.astype(np.float64)) == pytest.approx(expected, abs=1e-12)
    with pytest.raises(ValueError):
        auc_from_counts(pos, neg[:-1])


@pytest.mark.parametrize("label_dtype", [np.int64, np.int32, np.uint8, np.float32, np.float64, np.bool_])
@pytest.mark.parametrize("prob_dtype", [np.float32, np.float64])
def test_label_and_prob_dtypes(label_dtype: type, prob_dtype: type) -> None:
    rng = np.random.default_rng(2)
    probs, labels = make_problem(rng, 4_000, 0.4, "logistic")
    auc = Auc()
    auc.update(probs.astype(prob_dtype), labels.astype(label_dtype))
    assert auc.global_auc() == pytest.approx(roc_auc_score(labels, probs), abs=1e-3)


# ---------------------------------------------------------------- sliding window


def test_sliding_auc_covers_exactly_the_last_slide_steps_batches() -> None:
    rng = np.random.default_rng(3)
    auc = Auc()
    seen: list[tuple[np.ndarray, np.ndarray]] = []
    # Sizes vary (including 1 and batches larger than the ring's initial capacity) and the score
    # distribution drifts, so forgetting the wrong batches would change the AUC.
    sizes = rng.integers(1, 3_000, 57)
    sizes[[0, 5, 30]] = [1, 5_000, 2]
    for i, n in enumerate(sizes):
        labels = (rng.random(n) < 0.3).astype(np.int64)
        drift = 2.0 * np.sin(i / 5.0)
        probs = (1.0 / (1.0 + np.exp(-(rng.normal(-1.0, 1.0, n) + drift * labels)))).astype(np.float32)
        auc.update(probs, labels)
        seen.append((probs, labels))

        window = seen[-SLIDE_STEPS:]
        pos, neg = bucket_counts(np.concatenate([p for p, _ in window]), np.concatenate([lb for _, lb in window]))
        np.testing.assert_array_equal(auc.state[1, 0], pos)
        np.testing.assert_array_equal(auc.state[1, 1], neg)
        assert auc.sliding_auc() == pytest.approx(reference_auc(pos, neg), abs=1e-12)
        if len(seen) <= SLIDE_STEPS:
            assert auc.sliding_auc() == auc.global_auc()
    assert len(seen) == 57
    assert auc.sliding_auc() != pytest.approx(auc.global_auc(), abs=1e-6)


def test_sliding_window_of_custom_length() -> None:
    rng = np.random.default_rng(4)
    auc = Auc(num_thresholds=100, slide_steps=3)
    assert auc.state.shape == auc_state_shape(100) == (2, 2, 101)
    batches = [make_problem(rng, 500, 0.5, "separated") for _ in range(7)]
    for p, lb in batches:
        auc.update(p, lb)
    p = np.concatenate([b[0] for b in batches[-3:]]).astype(np.float64)
    lb = np.concatenate([b[1] for b in batches[-3:]])
    bucket = np.clip((p * 100).astype(np.int64), 0, 100)
    pos = np.bincount(bucket[lb == 1], minlength=101)
    neg = np.bincount(bucket[lb == 0], minlength=101)
    np.testing.assert_array_equal(auc.state[1, 0], pos)
    np.testing.assert_array_equal(auc.state[1, 1], neg)
    assert auc.sliding_auc() == pytest.approx(reference_auc(pos, neg), abs=1e-12)


# ---------------------------------------------------------------- merging workers


def test_merged_auc_equals_auc_of_all_data() -> None:
    rng = np.random.default_rng(5)
    workers = 4
    shared = np.zeros((workers, *auc_state_shape()), dtype=np.float64)
    aucs = [Auc(state=shared[w]) for w in range(workers)]
    all_p, all_l = [], []
    for w, auc in enumerate(aucs):
        # Workers see differently distributed data, so per-worker AUCs differ from the merged one.
        probs, labels = make_problem(rng, 10_000 * (w + 1), 0.1 + 0.2 * w, ("logistic", "separated")[w % 2])
        for s in split(rng, probs.shape[0], 30):
            auc.update(probs[s], labels[s])
        all_p.append(probs)
        all_l.append(labels)
    global_auc, sliding_auc = merged_auc(shared)
    assert global_auc == pytest.approx(roc_auc_score(np.concatenate(all_l), np.concatenate(all_p)), abs=1e-3)
    pos, neg = sum(a.state[1, 0] for a in aucs), sum(a.state[1, 1] for a in aucs)
    assert sliding_auc == pytest.approx(reference_auc(pos, neg), abs=1e-12)
    # Stacking separate arrays (what a monitor does with per-worker blocks) gives the same.
    assert merged_auc(np.stack([a.state for a in aucs])) == (global_auc, sliding_auc)
    with pytest.raises(ValueError):
        merged_auc(shared[0])


# ---------------------------------------------------------------- edge cases


@pytest.mark.parametrize("label", [0, 1])
def test_single_class_gives_half(label: int) -> None:
    rng = np.random.default_rng(6)
    auc = Auc()
    auc.update(rng.random(1_000), np.full(1_000, label))
    assert auc.global_auc() == 0.5
    assert auc.sliding_auc() == 0.5
    assert merged_auc(auc.state[None]) == (0.5, 0.5)
    assert Auc().global_auc() == 0.5  # nothing seen at all


def test_probabilities_at_the_ends_and_out_of_range() -> None:
    auc = Auc()
    probs = np.array([0.0, 1.0, 0.0, 1.0, -0.5, 1.5, np.inf], dtype=np.float64)
    labels = np.array([0, 1, 1, 0, 0, 1, 1])
    auc.update(probs, labels)
    pos, neg = auc.state[0, 0], auc.state[0, 1]
    assert pos[NUM_THRESHOLDS] == 3 and pos[0] == 1 and pos.sum() == 4
    assert neg[0] == 2 and neg[NUM_THRESHOLDS] == 1 and neg.sum() == 3
    clipped = np.clip(probs, 0.0, 1.0)
    assert auc.global_auc() == pytest.approx(roc_auc_score(labels, clipped), abs=1e-12)

    perfect = Auc()
    perfect.update(np.array([0.0, 0.0, 1.0]), np.array([0, 0, 1]))
    assert perfect.global_auc() == 1.0
    inverted = Auc()
    inverted.update(np.array([1.0, 0.0]), np.array([0, 1]))
    assert inverted.global_auc() == 0.0


def test_nan_predictions_and_invalid_labels_are_skipped() -> None:
    auc = Auc()
    auc.update(np.array([np.nan, 0.9, 0.2, 0.5, 0.5]), np.array([1.0, 1.0, 0.0, -1.0, np.nan]))
    assert auc.skipped == 3
    assert auc.state[0].sum() == 2 and auc.state[1].sum() == 2
    assert auc.global_auc() == 1.0
    for _ in range(SLIDE_STEPS):  # the skipped examples must not be "retired" either
        auc.update(np.array([0.3]), np.array([1]))
    assert auc.state[1, 0].sum() == SLIDE_STEPS and auc.state[1, 1].sum() == 0


def test_reset_zeroes_everything() -> None:
    rng = np.random.default_rng(7)
    auc = Auc()
    for _ in range(25):
        auc.update(*make_problem(rng, 300, 0.5, "separated"))
    assert auc.state.sum() > 0
    auc.reset()
    assert not auc.state.any()
    assert auc.global_auc() == auc.sliding_auc() == 0.5
    # The ring is forgotten too: new batches retire nothing left over from before the reset.
    probs, labels = make_problem(rng, 1_000, 0.5, "separated")
    for i in range(SLIDE_STEPS + 3):
        auc.update(probs[i * 40:(i + 1) * 40], labels[i * 40:(i + 1) * 40])
    pos, neg = bucket_counts(probs[120:920], labels[120:920])
    np.testing.assert_array_equal(auc.state[1, 0], pos)
    np.testing.assert_array_equal(auc.state[1, 1], neg)
    assert auc.state[1].min() >= 0


def test_external_state_is_written_in_place() -> None:
    rng = np.random.default_rng(8)
    block = np.full((3, *auc_state_shape()), 7.0)  # as a shared-memory block with stale content
    auc = Auc(state=block[1])
    assert np.shares_memory(auc.state, block)
    assert not block[1].any()  # taken over: zeroed so the window matches the empty ring
    assert (block[0] == 7.0).all() and (block[2] == 7.0).all()
    probs, labels = make_problem(rng, 2_000, 0.3, "logistic")
    auc.update(probs, labels)
    pos, neg = bucket_counts(probs, labels)
    np.testing.assert_array_equal(block[1, 0, 0], pos)
    np.testing.assert_array_equal(block[1, 1, 1], neg)
    assert auc_from_counts(block[1, 0, 0], block[1, 0, 1]) == auc.global_auc()
    auc.reset()
    assert not block[1].any() and (block[0] == 7.0).all()


def test_bad_arguments() -> None:
    with pytest.raises(ConfigError):
        Auc(state=np.zeros(auc_state_shape(), dtype=np.float32))
    with pytest.raises(ConfigError):
        Auc(state=np.zeros((2, 2, 100)))
    with pytest.raises(ConfigError):
        Auc(slide_steps=0)
    with pytest.raises(ConfigError):
        Auc(num_thresholds=0)
    ro = np.zeros(auc_state_shape())
    ro.flags.writeable = False
    with pytest.raises(ConfigError):
        Auc(state=ro)
    with pytest.raises(ValueError):
        Auc().update(np.zeros(3), np.zeros(4))
    with pytest.raises(ValueError):
        Auc().update(np.zeros((3, 2)), np.zeros((3, 2)))


# ---------------------------------------------------------------- log loss


def test_logloss() -> None:
    probs = np.array([0.9, 0.2, 0.6, 0.5])
    labels = np.array([1, 0, 0, 1])
    expected = -np.mean([np.log(0.9), np.log(0.8), np.log(0.4), np.log(0.5)])
    assert logloss(probs, labels) == pytest.approx(expected, rel=1e-12)
    # Confident misses are clipped to a finite loss; confident hits cost ~0.
    assert logloss(np.array([0.0, 1.0]), np.array([1, 0])) == pytest.approx(-np.log(1e-7), rel=1e-6)
    assert logloss(np.array([0.0, 1.0], dtype=np.float32), np.array([0, 1])) == pytest.approx(1e-7, abs=1e-9)
    with pytest.raises(ValueError):
        logloss(np.zeros(0), np.zeros(0))
    with pytest.raises(ValueError):
        logloss(np.zeros(2), np.zeros(3))
