"""aps-trainer as a real process: failures are loud and leave no process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import BIN, ROOT
from examples.linreg.model import make_data


def children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_gone(pids: list[int], timeout: float = 15.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [p for p in pids if alive(p)]
        if not left:
            return []
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def start_trainer(processes, tmp_path: Path, model: str, workers: int = 2) -> subprocess.Popen:
    data = tmp_path / "data"
    make_data(data, files=4, lines_per_file=4000)
    addresses = processes.start_servers(1, trainers=1)
    env = {"PYTHONPATH": str(ROOT)}
    log = open(tmp_path / "trainer.log", "wb")
    proc = subprocess.Popen(
        [
            sys.executable, str(BIN / "aps-trainer"), "--pservers", addresses[0], "--model", model,
            "--data", str(data), "--workers", str(workers), "--mode", "async", "--no-save",
            "--metrics", str(tmp_path / "metrics.jsonl"), "--print-period", "1",
        ],
        stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, **env), cwd=tmp_path,
    )
    processes.procs.append(proc)
    return proc


def wait_workers(proc: subprocess.Popen, count: int, timeout: float = 60.0) -> list[int]:
    """The trainer's compute workers, once ``count`` run, with every other process under the
    trainer (the workers are forked by its fork server, a child of the trainer, as is
    multiprocessing's resource tracker): all of them must go when the trainer goes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        helpers = [p for p in children(proc.pid) if alive(p)]
        workers = [w for h in helpers for w in children(h) if alive(w)]
        if len(workers) >= count:
            return workers + helpers
        assert proc.poll() is None, "trainer exited early"
        time.sleep(0.1)
    raise TimeoutError("workers did not start")


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_trainer_and_workers(processes, tmp_path: Path, sig: signal.Signals) -> None:
    proc = start_trainer(processes, tmp_path, "tests.trainer.fault_models:SlowLinReg")
    kids = wait_workers(proc, 2)
    time.sleep(3.0)  # inside the epoch
    proc.send_signal(sig)
    assert proc.wait(timeout=30) == 128 + int(sig)
    assert wait_gone(kids) == []


@pytest.mark.slow
def test_worker_crash_fails_trainer_without_orphans(processes, tmp_path: Path) -> None:
    proc = start_trainer(processes, tmp_path, "tests.trainer.fault_models:CrashingLinReg")
    kids = wait_workers(proc, 2)
    assert proc.wait(timeout=60) == 1
    log = (tmp_path / "trainer.log").read_text()
    assert "compute worker 0 died (killed by SIGKILL)" in log
    assert wait_gone(kids) == []


@pytest.mark.slow
def test_sigkill_of_trainer_takes_workers_down(processes, tmp_path: Path) -> None:
    proc = start_trainer(processes, tmp_path, "tests.trainer.fault_models:SlowLinReg")
    kids = wait_workers(proc, 2)
    proc.kill()
    proc.wait(timeout=10)
    assert wait_gone(kids) == []
