"""Two real pserver processes driven through the public API, checked against numpy, then a
checkpoint written by 2 servers warm-starts 3 servers with identical rows."""

from __future__ import annotations

import asyncio
import signal

import numpy as np
import pytest

import aps

DIM = 8
ROWS = 5000


def sgd_ref(p: np.ndarray, g: np.ndarray, state: dict, lr: float) -> None:
    p -= lr * g


def adagrad_ref(p: np.ndarray, g: np.ndarray, state: dict, lr: float, eps: float = 1e-6) -> None:
    acc = state.setdefault("acc", np.zeros_like(p))
    acc += g * g
    p -= lr * g / (np.sqrt(acc) + eps)


def adam_ref(p: np.ndarray, g: np.ndarray, state: dict, lr: float, b1=0.9, b2=0.999, eps=1e-8) -> None:
    m = state.setdefault("m", np.zeros_like(p))
    v = state.setdefault("v", np.zeros_like(p))
    state["t"] = t = state.get("t", 0) + 1
    m[:] = b1 * m + (1 - b1) * g
    v[:] = b2 * v + (1 - b2) * g * g
    lr_t = lr * np.sqrt(1 - b2**t) / (1 - b1**t)
    p -= lr_t * m / (np.sqrt(v) + eps * np.sqrt(1 - b2**t))


OPTIMIZERS = {
    "sgd": (aps.SGD(lr=0.1), sgd_ref, 0.1),
    "adagrad": (aps.Adagrad(lr=0.05), adagrad_ref, 0.05),
    "adam": (aps.Adam(lr=0.01), adam_ref, 0.01),
}


async def drive(addresses: list[str], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Train sparse and dense tables with each optimizer; compare every step with numpy."""
    expected: dict[str, np.ndarray] = {}
    async with aps.connect(addresses, timeout=60) as ps:
        for name, (opt, ref, lr) in OPTIMIZERS.items():
            sparse = f"{name}.emb"
            await ps.create_table(aps.SparseTable(sparse, rows=ROWS, dim=DIM, init=aps.Uniform(-0.5, 0.5), optimizer=opt))
            # the sparse reference follows only the touched rows (row-wise state, lazy Adam)
            touched = np.array([3, 17, 18, 4999, 2500, 1, 0], dtype=np.int64)
            rows = (await ps.pull_sparse(sparse, touched)).astype(np.float64)
            states = [dict() for _ in touched]
            for _ in range(5):
                ids = np.concatenate([touched, touched[:3]])  # duplicates: summed gradient
                grads = rng.normal(size=(len(ids), DIM)).astype(np.float32)
                await ps.push_sparse_grad(sparse, ids, grads)
                summed = np.zeros((len(touched), DIM))
                np.add.at(summed, np.concatenate([np.arange(len(touched)), np.arange(3)]), grads)
                for i in range(len(touched)):
                    ref(rows[i : i + 1], summed[i : i + 1], states[i], lr)
            got = await ps.pull_sparse(sparse, touched)
            np.testing.assert_allclose(got, rows, atol=1e-6, rtol=1e-5)

            dense = f"{name}.w"
            await ps.create_table(aps.DenseTable(dense, shape=(130, 150), init=aps.Normal(0.0, 0.05), optimizer=opt))
            w = (await ps.pull_dense(dense)).astype(np.float64)
            assert w.shape == (130, 150) and abs(w.std() - 0.05) < 0.003
            state: dict = {}
            for _ in range(5):
                g = rng.normal(size=w.shape).astype(np.float32)
                await ps.push_dense_grad(dense, g)
                ref(w, g.astype(np.float64), state, lr)
            np.testing.assert_allclose(await ps.pull_dense(dense), w, atol=1e-6, rtol=1e-5)
            expected[sparse] = await ps.pull_sparse(sparse, np.arange(ROWS))
            expected[dense] = await ps.pull_dense(dense)
        stats = await ps.stats()
        assert len(stats) == 2 and all(s["ops"]["PushSparseGrad"]["count"] > 0 for s in stats.values())
        await ps.save("ckpt")
    return expected


@pytest.mark.slow
def test_two_pservers_then_warm_start_three(processes, tmp_path) -> None:
    rng = np.random.default_rng(0)
    addresses = _start(processes, tmp_path, 2)
    expected = asyncio.run(drive(addresses, rng))
    for proc in processes.procs:
        proc.send_signal(signal.SIGTERM)
    assert [proc.wait(timeout=30) for proc in processes.procs] == [0, 0]
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["shard-00000-of-00002", "shard-00001-of-00002"]

    addresses = _start(processes, tmp_path, 3, "--init-model", str(tmp_path / "ckpt"))

    async def read_back() -> None:
        async with aps.connect(addresses, trainer_id=0) as ps:
            for name, value in expected.items():
                if name.endswith(".emb"):
                    got = await ps.pull_sparse(name, np.arange(ROWS))
                else:
                    got = await ps.pull_dense(name)
                assert got.tobytes() == value.tobytes(), name
            await ps.worker_done()

    asyncio.run(read_back())
    # worker_done from the only trainer makes every pserver exit by itself, cleanly
    assert [proc.wait(timeout=30) for proc in processes.procs[-3:]] == [0, 0, 0]


def _start(processes, tmp_path, n: int, *extra: str) -> list[str]:
    from tests.conftest import free_ports, wait_port_file

    ports = free_ports(n)
    addresses = [f"127.0.0.1:{p}" for p in ports]
    started = []
    for k, port in enumerate(ports):
        pf = tmp_path / f"port-{n}-{k}"
        proc = processes.start(
            "aps-server", "--port", str(port), "--pservers", ",".join(addresses), "--trainers", "1",
            "--port-file", str(pf), *extra, log_name=f"pserver-{n}-{k}.log", cwd=tmp_path,
        )
        started.append((pf, proc))
    for pf, proc in started:
        wait_port_file(pf, proc)
    return addresses
