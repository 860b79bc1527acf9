"""aps-server and a fleet script's ``run_server`` serve through one loop,
``PServer.serve_until_signalled``: the bound port in the port file, and SIGTERM a graceful stop
that writes a last checkpoint of what was acknowledged, the same in both programs (real
processes, real signals)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import aps
from aps.checkpoints.latest import latest_checkpoint
from tests.conftest import BIN, Processes, free_port, wait_port_file

#: a fleet script whose role (a pserver) comes from the environment, as under aps-local
FLEET_SERVER = """
import sys
from aps.fleet import Fleet
fleet = Fleet().init()
fleet.init_server(checkpoint_dir=sys.argv[1])
fleet.run_server()
"""

TABLE = aps.SparseTable("t", rows=4, dim=2, init=aps.Constant(0.0), optimizer=aps.SGD(lr=1.0))


def start(program: str, tmp_path: Path, ckpt: Path, port_file: Path) -> subprocess.Popen:
    port = free_port()
    log = open(tmp_path / f"{program}.log", "wb")
    if program == "aps-server":
        argv = [sys.executable, str(BIN / "aps-server"), "--port", str(port), "--trainers", "1",
                "--checkpoint-dir", str(ckpt), "--port-file", str(port_file)]
        env = {}
    else:
        argv = [sys.executable, "-c", FLEET_SERVER, str(ckpt)]
        env = {"TRAINING_ROLE": "PSERVER", "PADDLE_PSERVERS_IP_PORT_LIST": f"127.0.0.1:{port}", "POD_IP": "127.0.0.1",
               "PADDLE_PORT": str(port), "PADDLE_TRAINERS_NUM": "1", "APS_PORT_FILE": str(port_file)}
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, **env))


async def push(address: str) -> None:
    async with aps.connect([address]) as ps:
        await ps.create_table(TABLE)
        await ps.push_sparse_delta("t", [3], [[2.5, 0.0]])


@pytest.mark.slow
@pytest.mark.parametrize("program", ["aps-server", "fleet"])
def test_sigterm_stops_gracefully_with_a_last_checkpoint(program: str, tmp_path: Path, processes: Processes) -> None:
    ckpt, port_file = tmp_path / "ckpt", tmp_path / "port"
    proc = start(program, tmp_path, ckpt, port_file)
    processes.procs.append(proc)  # killed after the test if still running
    port = wait_port_file(port_file, proc)
    asyncio.run(push(f"127.0.0.1:{port}"))
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    log = (tmp_path / f"{program}.log").read_text()
    assert "signal received, stopping" in log and "reason=shutdown" in log, log[-2000:]
    found = latest_checkpoint(ckpt, 0, 1)
    assert found is not None, f"no checkpoint written on SIGTERM by {program}"
    srv_path = found[0]
    assert (srv_path / "manifest.json").is_file()

    async def row() -> float:
        srv = await aps.serve(init_model=str(srv_path.parent))
        try:
            async with aps.connect([srv.address]) as ps:
                return float((await ps.pull_sparse("t", [3]))[0, 0])
        finally:
            await srv.aclose()

    assert asyncio.run(row()) == 2.5  # the push acknowledged before the signal is in it
