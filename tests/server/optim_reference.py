"""For the optimizer tests: pservers on port 0, and the pserver optimizers in plain numpy, one
row at a time: SGD, Adagrad, Adam (bias corrected per row or per step), FTRL-Proximal, each with
the spec's ``clip_norm`` (per row) and ``l2`` (L2 decay ``g += l2 * w``; FTRL's in its closed
form).

Values and state are kept in float32 between steps, as the server stores them; each step
computes in float64."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np

import aps
from aps.specs import SGD, Adagrad, Adam, Ftrl, Optimizer


@contextlib.asynccontextmanager
async def cluster(n: int, root: Path | None = None) -> AsyncIterator[tuple[list[aps.PServer], aps.PSClient]]:
    """``n`` pservers in this process on port 0 (checkpoints under ``root``) and a client."""
    servers = []
    try:
        for k in range(n):
            servers.append(await aps.serve(server_index=k, num_servers=n, checkpoint_root=str(root) if root else None))
        async with aps.connect([s.address for s in servers]) as ps:
            yield servers, ps
    finally:
        for s in servers:
            await s.aclose()


def shaped(opt: Optimizer, g: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The gradient an update uses: clipped to the row's norm ``clip_norm``, then ``+ l2 * w``."""
    g = g.astype(np.float64)
    if opt.clip_norm is not None:
        norm = float(np.sqrt((g * g).sum()))
        if norm > opt.clip_norm:
            g = g * (opt.clip_norm / norm)
    if not isinstance(opt, Ftrl) and opt.l2:
        g = g + opt.l2 * w.astype(np.float64)
    return g


def fresh_state(opt: Optimizer, dim: int) -> dict[str, np.ndarray]:
    names = {SGD: (), Adagrad: ("acc",), Adam: ("m", "v"), Ftrl: ("z", "n")}[type(opt)]
    fill = opt.initial_accumulator if isinstance(opt, Adagrad) else 0.0
    return {name: np.full(dim, fill, np.float32) for name in names}


def update(opt: Optimizer, w: np.ndarray, state: dict[str, np.ndarray], g: np.ndarray, t: int, dense: bool = False) -> np.ndarray:
    """One optimizer step of the row ``w`` with gradient ``g`` (already scaled); ``t``: Adam's
    count for this update (a dense block's eps is always corrected: bias_correction is sparse
    Adam's). Returns the new row; ``state`` is updated in place."""
    g = shaped(opt, g, w)
    w64 = w.astype(np.float64)
    if isinstance(opt, SGD):
        out = w64 - opt.lr * g
    elif isinstance(opt, Adagrad):
        acc = state["acc"] + g * g
        state["acc"][:] = acc
        out = w64 - opt.lr * g / (np.sqrt(acc) + opt.epsilon)
    elif isinstance(opt, Adam):
        m = opt.beta1 * state["m"] + (1 - opt.beta1) * g
        v = opt.beta2 * state["v"] + (1 - opt.beta2) * g * g
        state["m"][:], state["v"][:] = m, v
        corr2 = np.sqrt(1 - opt.beta2**t)
        eps = opt.epsilon * corr2 if dense or opt.bias_correction == "row" else opt.epsilon
        out = w64 - opt.lr * corr2 / (1 - opt.beta1**t) * m / (np.sqrt(v) + eps)
    else:
        n = state["n"].astype(np.float64)
        n_new = n + g * g
        z = state["z"] + g - (np.sqrt(n_new) - np.sqrt(n)) / opt.alpha * w64
        state["z"][:], state["n"][:] = z, n_new
        out = np.where(
            np.abs(z) <= opt.l1, 0.0,
            -(z - np.sign(z) * opt.l1) / ((opt.beta + np.sqrt(n_new)) / opt.alpha + opt.l2),
        )
    return out.astype(np.float32)


class SparseReference:
    """A sparse table's rows by id, updated lazily: only the rows a push touches."""

    def __init__(self, opt: Optimizer, ids: np.ndarray, initial: np.ndarray) -> None:
        self.opt = opt
        self.initial = initial.astype(np.float32).copy()
        self.rows = {int(i): r.astype(np.float32).copy() for i, r in zip(ids, initial)}
        self.state = {int(i): fresh_state(opt, initial.shape[1]) for i in ids}
        self.t = dict.fromkeys(self.rows, 0)
        self.step = 0

    def push(self, ids: np.ndarray, grads: np.ndarray, scale: float = 1.0) -> None:
        """One push: repeated ids summed (float64, in push order), each distinct row updated once."""
        sums: dict[int, np.ndarray] = {}
        for i, g in zip(ids.tolist(), grads.astype(np.float64)):
            sums[i] = sums.get(i, 0.0) + g
        self.step += 1
        for i in sorted(sums):
            self.t[i] += 1
            t = self.t[i] if isinstance(self.opt, Adam) and self.opt.bias_correction == "row" else self.step
            self.rows[i] = update(self.opt, self.rows[i], self.state[i], sums[i] * scale, t)

    def values(self, ids: np.ndarray) -> np.ndarray:
        return np.stack([self.rows[int(i)] for i in ids])

    def state_of(self, name: str, ids: np.ndarray) -> np.ndarray:
        return np.stack([self.state[int(i)][name] for i in ids])


class DenseReference:
    """A dense table as one flat vector: every element updated at every push."""

    def __init__(self, opt: Optimizer, initial: np.ndarray) -> None:
        self.opt = opt
        self.values = initial.astype(np.float32).ravel().copy()
        self.state = fresh_state(opt, self.values.size)
        self.step = 0

    def push(self, grad: np.ndarray, scale: float = 1.0) -> None:
        self.step += 1
        self.values = update(self.opt, self.values, self.state, grad.astype(np.float64).ravel() * scale, self.step, dense=True)
