"""A trainer killed with SIGKILL outside any launcher: in sync mode the survivor fails within a
stated bound naming it; in async mode the survivor finishes; either way the pserver exits."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from tests.conftest import Processes
from tests.faults.cluster import Cluster, wait_for
from examples.linreg.model import make_data

#: short, for a fast test, yet above how long a trainer's event loop may stall while it spawns
#: its workers on a busy machine (over 2 s was seen): a stalled trainer sends no heartbeat
TIMEOUT = 5.0
#: the survivor's failure (sync) and the pserver's exit come within the trainer timeout plus the
#: lease check period (at most 1 s) plus the time a process takes to report and exit
BOUND = TIMEOUT + 1.0 + 3.0


def start(processes: Processes, tmp: Path, mode: str) -> Cluster:
    data = tmp / "data"
    make_data(data, files=4, lines_per_file=1000)
    cluster = Cluster(processes, tmp, 1, 2, "--trainer-timeout", str(TIMEOUT))
    for trainer in (0, 1):
        cluster.start_trainer(trainer, data, mode, "--epochs", "3", "--no-save", pause=0.01)
    wait_for(lambda: min(cluster.examples(0), cluster.examples(1)) >= 300, 60, "both trainers training")
    return cluster


@pytest.mark.slow
def test_sync_survivor_fails_naming_the_dead_trainer(processes: Processes, tmp_path: Path) -> None:
    cluster = start(processes, tmp_path, "sync")
    survivor, victim = cluster.trainers_started
    victim.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    assert survivor.wait(timeout=BOUND + 10) != 0
    failed_after = time.monotonic() - killed
    log = cluster.trainer_log(0).read_text()
    assert "trainer 1 is gone" in log, log[-2000:]
    print(f"survivor failed {failed_after:.2f} s after the kill")
    assert failed_after < BOUND, failed_after
    # the survivor has gone too: the pserver stops waiting for both and exits by itself
    assert cluster.servers[0].wait(timeout=BOUND + 10) == 0
    server_log = cluster.server_log(0).read_text()
    assert "trainer gone" in server_log and "trainer=1" in server_log


@pytest.mark.slow
def test_async_survivor_finishes_and_pserver_exits(processes: Processes, tmp_path: Path) -> None:
    cluster = start(processes, tmp_path, "async")
    survivor, victim = cluster.trainers_started
    victim.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    assert survivor.wait(timeout=60) == 0, cluster.trainer_log(0).read_text()[-2000:]
    assert cluster.servers[0].wait(timeout=BOUND + 10) == 0
    assert time.monotonic() - killed < 60
    server_log = cluster.server_log(0).read_text()
    gone = [line for line in server_log.splitlines() if "trainer gone" in line]
    assert len(gone) == 1 and "trainer=1" in gone[0], server_log[-2000:]
    assert "worker done" in server_log and "trainer=0" in server_log
