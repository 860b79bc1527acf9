"""Evaluation metrics: bucketed AUC (global and sliding, as Paddle's ``fluid.layers.auc``) and log loss.

AUC follows Paddle's ``auc`` op so numbers are comparable with the reference trainer:

* a prediction ``p`` (probability of the positive class) falls into bucket
  ``int(p * num_thresholds)``, clipped to ``[0, num_thresholds]`` (``num_thresholds + 1`` buckets);
  a label ``> 0`` counts as positive, ``== 0`` as negative, anything else (negative, NaN) is
  skipped, as Paddle skips it; a NaN prediction is skipped too (Paddle's cast would be undefined);
* the AUC of bucket counts walks the buckets from the highest down, accumulating true and false
  positives, sums trapezoids and divides by ``total_pos * total_neg``; it is 0.5 when either
  class is empty (Paddle would print 0, which reads like a perfectly wrong model);
* the *global* AUC covers every batch since the last :meth:`Auc.reset`, the *sliding* AUC the
  last ``slide_steps`` batches (all of them while fewer have been seen).

Several worker processes each own one :class:`Auc`, and a monitor process sums their counts
(:func:`merged_auc`). So the counts live in one float64 array of shape :func:`auc_state_shape`
that the caller may provide -- typically a view into shared memory -- and that the object
writes in place. The counts are whole numbers held in float64: exact up to 2**53 examples, and
the monitor can sum them without converting.

The window must forget the oldest batch. Keeping one dense ``[2, B]`` count array per ring slot
would cost a 2 x 4097 subtraction (and a zeroing) per batch whatever the batch size; instead each
ring slot keeps the *codes* (``2 * bucket + is_negative``) of the examples its batch added, and
retiring the slot subtracts exactly those, one by one. A batch of n examples therefore costs
O(n_new + n_oldest) in one compiled call and the ring holds ``slide_steps * max_batch`` int32.

An :class:`Auc` is not thread-safe: one owner updates it (the kernels release the GIL so that
owner's other threads are not held up, not so that several threads can share one object).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .errors import ConfigError

NUM_THRESHOLDS = 4096
SLIDE_STEPS = 20

_LOG_EPS = 1e-7
_MIN_RING_CAPACITY = 1024


def auc_state_shape(num_thresholds: int = NUM_THRESHOLDS) -> tuple[int, int, int]:
    """Shape of one AUC state, ``(2, 2, num_thresholds + 1)``.

    Axis 0 is ``[global | window]``, axis 1 ``[positives | negatives]``, axis 2 the bucket. Fixed
    so that a shared-memory block can be sized before any :class:`Auc` exists.
    """
    return (2, 2, int(num_thresholds) + 1)


# ---------------------------------------------------------------- kernels


@njit(cache=True, nogil=True)
def _auc_kernel(pos: np.ndarray, neg: np.ndarray) -> float:
    # Paddle's calcAuc: from the highest bucket down, trapezoid between consecutive ROC points.
    tot_pos = 0.0
    tot_neg = 0.0
    area = 0.0
    for idx in range(pos.shape[0] - 1, -1, -1):
        prev_pos = tot_pos
        prev_neg = tot_neg
        tot_pos += pos[idx]
        tot_neg += neg[idx]
        area += abs(tot_neg - prev_neg) * (tot_pos + prev_pos) * 0.5
    if tot_pos > 0.0 and tot_neg > 0.0:
        return area / tot_pos / tot_neg
    return 0.5


@njit(cache=True, nogil=True)
def _update_kernel(
    probs: np.ndarray,
    labels: np.ndarray,
    state: np.ndarray,
    ring: np.ndarray,
    ring_len: np.ndarray,
    slot: int,
    num_thresholds: int,
) -> int:
    """Retire ring slot ``slot`` from the window, then add one batch to global, window and slot.

    Returns how many examples were skipped (NaN prediction, or a label neither > 0 nor == 0).
    """
    window = state[1]
    glob = state[0]
    codes = ring[slot]
    for i in range(ring_len[slot]):
        c = codes[i]
        window[c & 1, c >> 1] -= 1.0
    scale = np.float64(num_thresholds)
    m = 0
    skipped = 0
    for i in range(probs.shape[0]):
        lab = labels[i]
        p = np.float64(probs[i])
        # Rarely taken, so well predicted; the class below is a select, not a branch: with
        # random labels a branch on the class mispredicts often (it cost ~40% of the kernel).
        if not (lab >= 0) or p != p:
            skipped += 1
            continue
        k = np.int64(lab == 0)
        b = np.int64(min(max(p * scale, 0.0), scale))
        glob[k, b] += 1.0
        window[k, b] += 1.0
        codes[m] = 2 * b + k
        m += 1
    ring_len[slot] = m
    return skipped


# ---------------------------------------------------------------- public API


def auc_from_counts(pos: np.ndarray, neg: np.ndarray) -> float:
    """AUC of bucketed counts (float64 or int64 arrays of equal length); 0.5 if a class is empty."""
    pos = np.asarray(pos)
    neg = np.asarray(neg)
    if pos.ndim != 1 or pos.shape != neg.shape:
        raise ValueError(f"pos and neg must be 1-D of equal length, got {pos.shape} and {neg.shape}")
    return float(_auc_kernel(pos, neg))


class Auc:
    """One process's AUC state. ``state`` (shape auc_state_shape(), float64) may be a shared view
    that other processes read; the window's per-batch ring is private to this object.

    A provided ``state`` is zeroed: the window half must equal what the (empty) ring holds, or the
    counts of batches this object never saw could never slide out. Pass the same view to a fresh
    object only to start over.
    """

    def __init__(
        self,
        num_thresholds: int = NUM_THRESHOLDS,
        slide_steps: int = SLIDE_STEPS,
        state: np.ndarray | None = None,
    ) -> None:
        num_thresholds = int(num_thresholds)
        slide_steps = int(slide_steps)
        # Codes are 2 * bucket + 1 in int32.
        if not 1 <= num_thresholds < 2**30:
            raise ConfigError(f"num_thresholds must be in [1, 2**30), got {num_thresholds}")
        if slide_steps < 1:
            raise ConfigError(f"slide_steps must be >= 1, got {slide_steps}")
        shape = auc_state_shape(num_thresholds)
        if state is None:
            state = np.zeros(shape, dtype=np.float64)
        else:
            if not isinstance(state, np.ndarray) or state.shape != shape or state.dtype != np.float64:
                got = (getattr(state, "shape", None), getattr(state, "dtype", None))
                raise ConfigError(f"state must be a float64 array of shape {shape}, got {got}")
            if not state.flags.writeable:
                raise ConfigError("state must be writeable")
        self._num_thresholds = num_thresholds
        self._slide_steps = slide_steps
        self._state = state
        self._ring = np.zeros((slide_steps, _MIN_RING_CAPACITY), dtype=np.int32)
        self._ring_len = np.zeros(slide_steps, dtype=np.int64)
        self._slot = 0
        self._skipped = 0
        self.reset()

    @property
    def state(self) -> np.ndarray:
        """The counts array, ``[global | window][positives | negatives][bucket]`` (written in place)."""
        return self._state

    @property
    def num_thresholds(self) -> int:
        return self._num_thresholds

    @property
    def slide_steps(self) -> int:
        return self._slide_steps

    @property
    def skipped(self) -> int:
        """Examples ignored since the last reset (NaN prediction, or label neither > 0 nor == 0)."""
        return self._skipped

    def update(self, probs: np.ndarray, labels: np.ndarray) -> None:
        """Add one batch: probs float32/float64 [n] in [0,1], labels [n] (0/1, any numeric dtype).
        Updates global counts, and the window: the ring slot of the oldest batch is subtracted
        from state[1] and replaced by this batch's counts (a numba kernel, no Python per example).
        """
        if probs.dtype != np.float32 and probs.dtype != np.float64:
            probs = probs.astype(np.float64)
        if labels.dtype == np.bool_:
            labels = labels.view(np.uint8)
        n = probs.shape[0]
        if probs.ndim != 1 or labels.shape != probs.shape:
            raise ValueError(f"probs and labels must be 1-D of equal length, got {probs.shape} and {labels.shape}")
        if n > self._ring.shape[1]:
            self._grow_ring(n)
        slot = self._slot
        self._skipped += _update_kernel(
            probs, labels, self._state, self._ring, self._ring_len, slot, self._num_thresholds
        )
        self._slot = slot + 1 if slot + 1 < self._slide_steps else 0

    def _grow_ring(self, n: int) -> None:
        # Rare (only for a batch larger than any before); doubling keeps it amortised.
        cap = max(n, 2 * self._ring.shape[1])
        ring = np.zeros((self._slide_steps, cap), dtype=np.int32)
        ring[:, : self._ring.shape[1]] = self._ring
        self._ring = ring

    def reset(self) -> None:
        """Zero all counts and forget the window (Paddle's ``set_zero`` of the AUC states)."""
        self._state[...] = 0.0
        self._ring_len[:] = 0
        self._slot = 0
        self._skipped = 0

    def global_auc(self) -> float:
        """AUC of every batch since the last reset."""
        return float(_auc_kernel(self._state[0, 0], self._state[0, 1]))

    def sliding_auc(self) -> float:
        """AUC of the last ``slide_steps`` batches (all of them while fewer were seen)."""
        return float(_auc_kernel(self._state[1, 0], self._state[1, 1]))


def merged_auc(states: np.ndarray) -> tuple[float, float]:
    """states: [workers, 2, 2, B] -> (global AUC, sliding AUC) of the summed counts.

    The monitor reads live shared views without locking: a worker may be mid-batch, so a result
    can include part of a batch; the next read is consistent again. Acceptable for a progress line.
    """
    states = np.asarray(states, dtype=np.float64)
    if states.ndim != 4 or states.shape[1:3] != (2, 2):
        raise ValueError(f"states must have shape [workers, 2, 2, buckets], got {states.shape}")
    total = states.sum(axis=0)
    return float(_auc_kernel(total[0, 0], total[0, 1])), float(_auc_kernel(total[1, 0], total[1, 1]))


def logloss(probs: np.ndarray, labels: np.ndarray) -> float:
    """Mean binary cross-entropy, probabilities clipped to [1e-7, 1 - 1e-7] so a confident miss
    costs a large finite loss instead of inf."""
    p = np.clip(np.asarray(probs, dtype=np.float64), _LOG_EPS, 1.0 - _LOG_EPS)
    y = np.asarray(labels, dtype=np.float64)
    if p.shape != y.shape:
        raise ValueError(f"probs and labels must have equal shape, got {p.shape} and {y.shape}")
    if p.size == 0:
        raise ValueError("logloss of an empty batch")
    return float(-np.mean(y * np.log(p) + (1.0 - y) * np.log1p(-p)))
