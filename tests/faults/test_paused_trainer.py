"""A trainer stopped (SIGSTOP) for longer than --trainer-timeout, then resumed (SIGCONT), as a GC
pause, a swap storm or a VM migration does: in async mode it rejoins and both trainers finish;
in sync mode both fail at once, each naming the cause."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import Processes
from tests.faults.cluster import Cluster, wait_for
from examples.linreg.model import make_data

#: the pservers' --trainer-timeout: short, for a fast test
TIMEOUT = 3.0
#: longer in sync mode, where a trainer's stall while it spawns its workers (over 2 s was seen
#: on a busy machine) would end the job, and long enough to tell "told at once" from "waited"
SYNC_TIMEOUT = 5.0


def epochs_done(cluster: Cluster, trainer: int) -> int:
    """Epochs trainer ``trainer`` has reported finished (its metrics' epoch records)."""
    path = cluster.metrics(trainer)
    if not path.exists():
        return 0
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return sum(1 for r in records if r["event"] == "epoch")


def start(processes: Processes, tmp: Path, mode: str, epochs: int, timeout: float = TIMEOUT) -> Cluster:
    data = tmp / "data"
    make_data(data, files=2, lines_per_file=400)
    cluster = Cluster(processes, tmp, 1, 2, "--trainer-timeout", str(timeout))
    for trainer in (0, 1):
        cluster.start_trainer(trainer, data, mode, "--epochs", str(epochs), pause=0.02)
    wait_for(lambda: min(epochs_done(cluster, 0), epochs_done(cluster, 1)) >= 1, 60, "both trainers training")
    return cluster


def pause_past_the_timeout(cluster: Cluster, until: Callable[[], bool] = lambda: True) -> float:
    """SIGSTOP trainer 1 until the pserver has declared it gone and ``until()`` holds, then
    SIGCONT it; return the time of the resume."""
    victim = cluster.trainers_started[1]
    victim.send_signal(signal.SIGSTOP)
    try:
        wait_for(lambda: "trainer gone" in cluster.server_log(0).read_text(), 30, "trainer 1 declared gone")
        wait_for(until, 30, "the moment to resume trainer 1")
    finally:
        victim.send_signal(signal.SIGCONT)
    return time.monotonic()


@pytest.mark.slow
def test_async_paused_trainer_rejoins_and_both_finish(processes: Processes, tmp_path: Path) -> None:
    epochs = 12
    cluster = start(processes, tmp_path, "async", epochs)
    paused_at = epochs_done(cluster, 1)
    # trainer 0 passes epoch barriers without trainer 1, which must later pass them at once
    pause_past_the_timeout(cluster, until=lambda: epochs_done(cluster, 0) >= paused_at + 3)
    assert epochs_done(cluster, 0) < epochs, "trainer 0 finished before the resume: the test proves nothing"
    survivor, paused = cluster.trainers_started
    assert survivor.wait(timeout=60) == 0, cluster.trainer_log(0).read_text()[-3000:]
    assert paused.wait(timeout=60) == 0, cluster.trainer_log(1).read_text()[-3000:]
    last = tmp_path / "model" / f"epoch_{epochs - 1}"
    assert (last / "MANIFEST.json").exists() or any(last.iterdir()), f"the last epoch was not saved: {last}"
    assert epochs_done(cluster, 1) == epochs
    server_log = cluster.server_log(0).read_text()
    assert "trainer back" in server_log and "trainer=1" in server_log, server_log[-2000:]
    assert cluster.servers[0].wait(timeout=30) == 0


@pytest.mark.slow
def test_sync_paused_trainer_is_told_it_was_dropped(processes: Processes, tmp_path: Path) -> None:
    cluster = start(processes, tmp_path, "sync", epochs=200, timeout=SYNC_TIMEOUT)
    survivor, paused = cluster.trainers_started
    # resumed once the survivor has failed, before the pserver counts the survivor out too
    resumed = pause_past_the_timeout(cluster, until=lambda: survivor.poll() is not None)
    for trainer, proc in ((0, survivor), (1, paused)):
        try:
            code = proc.wait(timeout=max(0.1, resumed + 5.0 - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"trainer {trainer} still runs 5 s after the resume: {cluster.trainer_log(trainer).read_text()[-2000:]}"
            ) from None
        assert code == 1, code
    survivor_log, paused_log = cluster.trainer_log(0).read_text(), cluster.trainer_log(1).read_text()
    assert "trainer 1 is gone" in survivor_log, survivor_log[-2000:]
    # the paused trainer's last line says it was dropped, by whom and why
    last = paused_log.strip().splitlines()[-1]
    assert "trainer 1 was dropped" in last and cluster.addresses[0] in last and "--trainer-timeout" in last, paused_log[-2000:]
