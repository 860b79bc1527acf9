"""Building blocks of the CTR models: embedding gather/scatter, the output losses, and a
fully connected ReLU stack whose forward and backward run on pre-allocated buffers.

Matrix products go through numpy's ``matmul`` with ``out=`` (BLAS sgemm, float32), everything
elementwise through small numba kernels, so a batch costs a fixed handful of calls and no Python
per example. Compute workers pin BLAS to one thread each (see :mod:`aps.trainer.worker`), so
``--workers N`` uses N cores and BLAS never oversubscribes them.

Gradient convention: every kernel here is linear in the upstream gradient it is given; the
models decide the scale (they pass the gradient of the batch *mean* loss).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numba import njit

from ..specs import Constant, DenseTable, Normal, Optimizer

# ---------------------------------------------------------------- embeddings


@njit(cache=True, nogil=True)
def gather_slots(table: np.ndarray, ids: np.ndarray, dense: np.ndarray, out: np.ndarray) -> None:
    """``out[i] = [table[ids[i, 0]], ..., table[ids[i, S-1]], dense[i]]``: the concatenated
    input of the first layer, read straight from the full (replica) table by global id."""
    n, slots = ids.shape
    dim = table.shape[1]
    nd = dense.shape[1]
    for i in range(n):
        for s in range(slots):
            r = ids[i, s]
            base = s * dim
            for d in range(dim):
                out[i, base + d] = table[r, d]
        base = slots * dim
        for d in range(nd):
            out[i, base + d] = dense[i, d]


@njit(cache=True, nogil=True)
def scatter_slots(d_input: np.ndarray, inverse: np.ndarray, slots: int, dim: int, grad_rows: np.ndarray) -> None:
    """Add each example's slot gradients (the first ``slots * dim`` columns of ``d_input``) to
    the gradient row of its unique id: ``grad_rows[inverse[i*slots+s]] += d_input[i, s*dim:...]``."""
    n = d_input.shape[0]
    for i in range(n):
        for s in range(slots):
            k = inverse[i * slots + s]
            base = s * dim
            for d in range(dim):
                grad_rows[k, d] += d_input[i, base + d]


@njit(cache=True, nogil=True)
def sum_slots(table: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """``out[i] = sum_s table[ids[i, s], 0]``: a wide (dim-1) sparse weight summed over slots."""
    n, slots = ids.shape
    out = np.zeros(n, np.float32)
    for i in range(n):
        acc = np.float32(0.0)
        for s in range(slots):
            acc += table[ids[i, s], 0]
        out[i] = acc
    return out


@njit(cache=True, nogil=True)
def scatter_sum_slots(d_out: np.ndarray, inverse: np.ndarray, slots: int, grad_rows: np.ndarray) -> None:
    """Backward of :func:`sum_slots`: every slot's row gets the example's output gradient."""
    for i in range(d_out.shape[0]):
        g = d_out[i]
        for s in range(slots):
            grad_rows[inverse[i * slots + s], 0] += g


# ---------------------------------------------------------------- output losses


@njit(cache=True, nogil=True, inline="always")
def _logistic(z: float, y: float) -> tuple[float, float]:
    """(sigmoid(z), -log P(y)) computed without overflow for any z."""
    e = math.exp(-abs(z))
    p = 1.0 / (1.0 + e) if z >= 0 else e / (1.0 + e)
    t = -z if y > 0.5 else z
    return p, max(t, 0.0) + math.log1p(e)


@njit(cache=True, nogil=True)
def softmax2_xent(logits: np.ndarray, labels: np.ndarray, probs: np.ndarray, d_logits: np.ndarray) -> float:
    """Two-class softmax cross-entropy (the reference's ``fc(size=2, act="softmax")`` +
    ``cross_entropy``; P(click) = sigmoid(l1 - l0)). Writes P(click) into ``probs`` and the
    gradient of the batch *mean* loss into ``d_logits``; returns the summed loss."""
    n = logits.shape[0]
    loss = 0.0
    for i in range(n):
        p, li = _logistic(logits[i, 1] - logits[i, 0], labels[i])
        probs[i] = p
        loss += li
        g = (p - labels[i]) / n
        d_logits[i, 1] = g
        d_logits[i, 0] = -g
    return loss


@njit(cache=True, nogil=True)
def sigmoid_xent(logits: np.ndarray, labels: np.ndarray, probs: np.ndarray, d_logits: np.ndarray) -> float:
    """Sigmoid cross-entropy of one logit per example; as :func:`softmax2_xent` otherwise."""
    n = logits.shape[0]
    loss = 0.0
    for i in range(n):
        p, li = _logistic(logits[i], labels[i])
        probs[i] = p
        loss += li
        d_logits[i] = (p - labels[i]) / n
    return loss


# ---------------------------------------------------------------- fully connected stack


@njit(cache=True, nogil=True)
def _bias_relu(h: np.ndarray, bias: np.ndarray, relu: bool) -> None:
    n, m = h.shape
    for i in range(n):
        for j in range(m):
            v = h[i, j] + bias[j]
            h[i, j] = v if (v > 0.0 or not relu) else 0.0


@njit(cache=True, nogil=True)
def _relu_backward_and_bias(dh: np.ndarray, h: np.ndarray, dbias: np.ndarray) -> None:
    """Zero ``dh`` where the ReLU output ``h`` was 0, and add its column sums to ``dbias``."""
    n, m = dh.shape
    for i in range(n):
        for j in range(m):
            if h[i, j] <= 0.0:
                dh[i, j] = 0.0
            dbias[j] += dh[i, j]


@njit(cache=True, nogil=True)
def _bias_grad(dh: np.ndarray, dbias: np.ndarray) -> None:
    n, m = dh.shape
    for i in range(n):
        for j in range(m):
            dbias[j] += dh[i, j]


@dataclass(frozen=True)
class Dense:
    """One fully connected layer ``y = x @ W + b`` (ReLU unless ``relu`` is False), stored as two
    dense tables ``{name}.w`` (fan_in x fan_out) and ``{name}.b`` (fan_out)."""

    name: str
    fan_in: int
    fan_out: int
    relu: bool = True

    @property
    def weight(self) -> str:
        return f"{self.name}.w"

    @property
    def bias(self) -> str:
        return f"{self.name}.b"

    def tables(self, optimizer: Optimizer, seed: int) -> list[DenseTable]:
        """The reference's FC init: weights Normal(0, 1/sqrt(fan_in)), biases zero."""
        return [
            DenseTable(self.weight, (self.fan_in, self.fan_out), Normal(0.0, 1.0 / math.sqrt(self.fan_in)), optimizer, seed),
            DenseTable(self.bias, (self.fan_out,), Constant(0.0), optimizer, seed),
        ]


def stack(prefix: str, fan_in: int, hidden: tuple[int, ...], out: int) -> list[Dense]:
    """ReLU layers of the ``hidden`` widths, then a linear output layer of ``out`` units."""
    layers = []
    width = fan_in
    for k, h in enumerate(hidden, 1):
        layers.append(Dense(f"{prefix}{k}", width, h, relu=True))
        width = h
    layers.append(Dense(f"{prefix}{len(hidden) + 1}", width, out, relu=False))
    return layers


class MLP:
    """Forward and backward of a :func:`stack` for batches of up to ``max_batch`` rows.

    Buffers (activations and their gradients) are allocated once per process; ``forward``
    returns a view of the output activations, valid until the next call.
    """

    def __init__(self, layers: list[Dense], max_batch: int) -> None:
        self.layers = layers
        self.acts = [np.zeros((max_batch, layer.fan_out), np.float32) for layer in layers]
        self.grads = [np.zeros((max_batch, layer.fan_out), np.float32) for layer in layers]
        self.d_input = np.zeros((max_batch, layers[0].fan_in), np.float32)

    def forward(self, x: np.ndarray, dense: dict[str, np.ndarray]) -> np.ndarray:
        n = x.shape[0]
        h = x
        for layer, buf in zip(self.layers, self.acts):
            out = buf[:n]
            np.matmul(h, dense[layer.weight], out=out)
            _bias_relu(out, dense[layer.bias], layer.relu)
            h = out
        return h

    def backward(self, x: np.ndarray, d_out: np.ndarray, dense: dict[str, np.ndarray], grads: dict[str, np.ndarray]) -> np.ndarray:
        """Given dLoss/dOutput, write every weight's gradient into ``grads`` (overwriting), add
        every bias's (the runtime zeroes them) and return dLoss/dInput (a view of a buffer)."""
        n = x.shape[0]
        top = len(self.layers) - 1
        self.grads[top][:n] = d_out
        for k in range(top, -1, -1):
            layer = self.layers[k]
            dh = self.grads[k][:n]
            if layer.relu:
                _relu_backward_and_bias(dh, self.acts[k][:n], grads[layer.bias])
            else:
                _bias_grad(dh, grads[layer.bias])
            below = x if k == 0 else self.acts[k - 1][:n]
            np.matmul(below.T, dh, out=grads[layer.weight])
            d_below = self.d_input[:n] if k == 0 else self.grads[k - 1][:n]
            np.matmul(dh, dense[layer.weight].T, out=d_below)
        return self.d_input[:n]

