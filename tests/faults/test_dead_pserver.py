"""A pserver SIGKILLed and never restarted: the trainer says so at once and every few seconds
(which address, since when, what waits for it) in its log and its metrics records, and fails at
its deadline with an error naming the address and the last connect error."""

from __future__ import annotations

import json
import signal
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import Processes
from tests.faults.cluster import Cluster, wait_for
from examples.linreg.model import make_data

#: the trainer's --rpc-timeout and --rpc-deadline, equal as their defaults are (120 s each)
DEADLINE = 8.0


@pytest.mark.slow
def test_a_pserver_that_stays_dead_is_named_at_once_and_in_the_final_error(processes: Processes, tmp_path: Path) -> None:
    data = tmp_path / "data"
    make_data(data, files=2, lines_per_file=400)
    cluster = Cluster(processes, tmp_path, 2, 1)
    port_file = tmp_path / "metrics.port"
    trainer = cluster.start_trainer(
        0, data, "async", "--epochs", "1000", "--rpc-timeout", str(DEADLINE), "--rpc-deadline", str(DEADLINE),
        "--metrics-port", "0", "--metrics-port-file", str(port_file), pause=0.02,
    )
    wait_for(lambda: cluster.examples(0) >= 100, 60, "the trainer training")
    dead = cluster.addresses[1]
    cluster.servers[1].send_signal(signal.SIGKILL)
    killed = time.monotonic()
    log = cluster.trainer_log(0)

    def said(text: str) -> bool:
        return any(text in line and dead in line for line in log.read_text().splitlines())

    named_after = wait_for(lambda: said("pserver unreachable"), 5, f"the trainer's log naming {dead} unreachable")
    # and again every few seconds, each line saying since when and what waits for it
    wait_for(lambda: sum("pserver unreachable" in line for line in log.read_text().splitlines()) >= 2, 10, "a second report")
    scrape = urllib.request.urlopen(f"http://127.0.0.1:{port_file.read_text().strip()}/metrics", timeout=5).read().decode()
    gauge = [line for line in scrape.splitlines() if line.startswith("aps_trainer_pserver_unreachable_seconds{")]
    assert len(gauge) == 1 and f'pserver="{dead}"' in gauge[0] and float(gauge[0].split()[-1]) > 0, gauge
    reports = [line for line in log.read_text().splitlines() if "pserver unreachable" in line]
    assert all("since=" in line and "waiting=" in line and "last_error=" in line for line in reports), reports
    assert trainer.wait(timeout=DEADLINE + 30) == 1
    failed_after = time.monotonic() - killed
    last = log.read_text().strip().splitlines()[-1]
    assert f"cannot connect to pserver {dead}" in last, last
    records = [json.loads(line) for line in cluster.metrics(0).read_text().splitlines() if line.strip()]
    out = [r["unreachable"] for r in records if r["event"] == "progress" and r.get("unreachable")]
    assert out and all(o[0]["address"] == dead for o in out), records[-3:]
    print(f"named {named_after:.2f} s after the kill; failed {failed_after:.1f} s after it: {last}")
