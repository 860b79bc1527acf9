"""Two pservers and two trainers on four "hosts": separate Linux network namespaces on a private
bridge, addresses in 198.18.X.0/24 that exist only inside them. Every role is started with
aps-server / aps-trainer and Paddle's Fleet environment names only (TRAINING_ROLE,
PADDLE_PSERVERS_IP_PORT_LIST, POD_IP, PADDLE_PORT, PADDLE_TRAINERS_NUM, PADDLE_TRAINER_ID), and
the linreg model trains to completion. Both pservers listen on the same port number, each on its
own host, and the trainers can reach them only through those addresses: a bind to, or an
endpoint built from, 127.0.0.1 anywhere would fail the run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from examples.linreg.model import make_data
from tests.conftest import BIN, ROOT
from tests.deploy.netns import NetnsNetwork, unavailable

pytestmark = pytest.mark.timeout(240)

PORT = 7164  # the same on every pserver host: only the addresses tell them apart


def _start(net: NetnsNetwork, host: int, program: str, args: list[str], env: dict[str, str], log: Path,
           procs: list[subprocess.Popen]) -> subprocess.Popen:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("APS_", "PADDLE_", "TRAINING_ROLE", "POD_IP"))}
    with open(log, "wb") as out:
        proc = subprocess.Popen(net.argv(host, sys.executable, str(BIN / program), *args), stdout=out,
                                stderr=subprocess.STDOUT, env={**base, "PYTHONPATH": str(ROOT), **env}, cwd=log.parent)
    procs.append(proc)
    return proc


def _wait_listening(port_file: Path, proc: subprocess.Popen, timeout: float = 90.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if port_file.exists():
            return int(port_file.read_text())
        assert proc.poll() is None, f"pserver exited with {proc.returncode} before listening"
        time.sleep(0.05)
    raise TimeoutError(f"{port_file} not written in {timeout} s")


@pytest.mark.slow
def test_two_pservers_two_trainers_on_four_hosts(tmp_path: Path) -> None:
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    make_data(tmp_path / "data", files=4, lines_per_file=1000)
    procs: list[subprocess.Popen] = []
    with NetnsNetwork(4) as net:
        try:
            pservers = ",".join(f"{net.address(k)}:{PORT}" for k in range(2))
            fleet = {"PADDLE_PSERVERS_IP_PORT_LIST": pservers, "PADDLE_TRAINERS_NUM": "2", "CPU_NUM": "1"}
            servers = []
            for k in range(2):
                env = {**fleet, "TRAINING_ROLE": "PSERVER", "POD_IP": net.address(k), "PADDLE_PORT": str(PORT)}
                port_file = tmp_path / f"ps.{k}.port"
                servers.append(_start(net, k, "aps-server", ["--port-file", str(port_file)], env,
                                      tmp_path / f"pserver.{k}.log", procs))
                assert _wait_listening(port_file, servers[-1]) == PORT
            trainers = [
                _start(net, 2 + k, "aps-trainer", [
                    "--model", "examples.linreg.model:LinReg", "--model-arg", "lr=0.2", "--mode", "async",
                    "--data", str(tmp_path / "data"), "--epochs", "6", "--no-save",
                    "--metrics", str(tmp_path / f"trainer.{k}.jsonl")],
                    {**fleet, "TRAINING_ROLE": "TRAINER", "PADDLE_TRAINER_ID": str(k), "POD_IP": net.address(2 + k)},
                    tmp_path / f"trainer.{k}.log", procs)
                for k in range(2)
            ]
            names = [f"trainer.{k}" for k in range(2)] + [f"pserver.{k}" for k in range(2)]
            for name, proc in zip(names, trainers + servers):  # pservers exit once both trainers are done
                code = proc.wait(timeout=180)
                assert code == 0, f"{name} exited {code}:\n" + (tmp_path / f"{name}.log").read_text()[-3000:]
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    for k in range(2):  # each pserver served its own shard, found from its POD_IP:PADDLE_PORT
        log = (tmp_path / f"pserver.{k}.log").read_text()
        assert f"pserver listening              address={net.address(k)}:{PORT} index={k} " in log, log[-2000:]
    for k in range(2):
        epochs = [r for r in map(json.loads, (tmp_path / f"trainer.{k}.jsonl").read_text().splitlines())
                  if r["event"] == "epoch"]
        assert [r["epoch"] for r in epochs] == list(range(6))
        first, last = epochs[0]["loss"], epochs[-1]["loss"]
        print(f"trainer {k}: loss {first:.4f} -> {last:.4f}")
        assert last < 0.25 * first and last < 0.05, (first, last)
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert net.tag not in listed, listed  # the namespaces are gone
