"""The v2 launch parameters with real processes: one aps-server and two aps-trainers started with
only Paddle's PADDLE_INIT_* environment names, trained to completion in async mode with
lagged-gradient discard on, and the server's stats showing each of its three ports carrying its
kind of traffic (two dense ports, one sparse port)."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
from pathlib import Path

import pytest

import aps
from examples.linreg.model import make_data
from tests.conftest import ROOT, Processes, free_port, wait_port_file

pytestmark = pytest.mark.timeout(300)

DENSE_OPS = {"PULL_DENSE", "PUSH_DENSE_GRAD"}
SPARSE_OPS = {"PULL_SPARSE", "PUSH_SPARSE_GRAD"}


def free_run(count: int) -> int:
    """The first of ``count`` consecutive ports that are free now."""
    for _ in range(100):
        first = free_port()
        socks = []
        try:
            for i in range(count):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", first + i))
            return first
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {count} consecutive free ports")


async def server_stats(address: str) -> dict:
    async with aps.connect([address], timeout=30) as ps:
        return (await ps.stats())[address]


@pytest.mark.slow
def test_pserver_and_trainers_from_v2_names(tmp_path: Path, processes: Processes) -> None:
    make_data(tmp_path / "data", files=4, lines_per_file=1500)
    port = free_run(3)
    v2 = {
        "PADDLE_INIT_PORT": str(port),
        "PADDLE_INIT_PORTS_NUM": "2",
        "PADDLE_INIT_PORTS_NUM_FOR_SPARSE": "1",
        "PADDLE_INIT_NUM_GRADIENT_SERVERS": "2",
        "PADDLE_INIT_PSERVERS": "127.0.0.1",
        "PADDLE_INIT_TRAINER_COUNT": "1",
        "PYTHONPATH": str(ROOT),
    }
    port_file = tmp_path / "ps.port"
    server = processes.start(
        "aps-server", "--no-exit-when-done", "--port-file", str(port_file), "--async-lagged-grad-discard-ratio", "4",
        env=v2, log_name="pserver.log", cwd=tmp_path,
    )
    assert wait_port_file(port_file, server) == port
    trainers = [
        processes.start(
            "aps-trainer", "--model", "examples.linreg.model:LinReg", "--model-arg", "lr=0.1", "--mode", "async",
            "--data", str(tmp_path / "data"), "--epochs", "6", "--no-save",
            "--metrics", str(tmp_path / f"trainer.{k}.jsonl"),
            env={**v2, "PADDLE_INIT_TRAINER_ID": str(k)}, log_name=f"trainer.{k}.log", cwd=tmp_path,
        )
        for k in range(2)
    ]
    for k, trainer in enumerate(trainers):
        assert trainer.wait(timeout=240) == 0, (tmp_path / f"trainer.{k}.log").read_text()[-3000:]

    stats = asyncio.run(server_stats(f"127.0.0.1:{port}"))
    server.send_signal(signal.SIGTERM)
    assert server.wait(timeout=60) == 0
    log = (tmp_path / "pserver.log").read_text()
    assert "pserver stopped" in log and f"ports={port}-{port + 2}" in log

    ports = stats["ports"]
    assert [(p["port"], p["kind"]) for p in ports] == [(port, "dense"), (port + 1, "dense"), (port + 2, "sparse")]
    for p in ports:
        # each trainer (and the stats client above, on the first port) connected to every port
        assert p["connections_total"] >= 2, p
    for p in ports[:2]:  # both dense ports carried dense-table traffic and no sparse-table traffic
        assert set(p["ops"]) & DENSE_OPS and not set(p["ops"]) & SPARSE_OPS, p
    assert set(ports[2]["ops"]) - {"HELLO", "PING"} <= SPARSE_OPS | {"PULL_SPARSE_CHANGED"}
    assert ports[2]["ops"]["PUSH_SPARSE_GRAD"] > 10 and ports[2]["ops"]["PULL_SPARSE"] > 10, ports[2]
    assert ports[0]["ops"]["CREATE_TABLE"] == 4  # 2 tables x 2 trainers: control on the first port
    lag = stats["lagged_grads"]
    assert lag["limit"] == 8.0 and lag["dropped"] >= 0
    print("ports:", json.dumps([{k: p[k] for k in ("port", "kind", "frames", "bytes_in")} for p in ports]))
    print("lagged gradients dropped:", lag)

    for k in range(2):
        records = [json.loads(line) for line in (tmp_path / f"trainer.{k}.jsonl").read_text().splitlines()]
        epochs = [r for r in records if r["event"] == "epoch"]
        assert [r["epoch"] for r in epochs] == list(range(6)) and epochs[0]["mode"] == "async"
        first, last = epochs[0]["loss"], epochs[-1]["loss"]
        print(f"trainer {k}: loss {first:.4f} -> {last:.4f}")
        assert last < 0.2 * first and last < 0.05, (first, last)
