"""examples/online/run.py end to end, as a user runs it (real processes): the drifting stream is
trained pass by pass with a capped hash table, every pass's export is served by aps-serve and
scored from it, and every process it started is gone at the end and after Ctrl-C."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.e2e.test_trainer_faults import alive, children

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

RUN = ROOT / "examples" / "online" / "run.py"


def test_the_example_trains_exports_serves_and_scores_every_pass(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [sys.executable, str(RUN), "--days", "2", "--passes-per-day", "2", "--lines", "3000", "--max-keys", "3000",
         "--workdir", str(tmp_path / "work"), "--json", str(out)],
        capture_output=True, text=True, timeout=200,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    rows = result["passes"]
    assert [r["pass"] for r in rows] == ["20261126/0001", "20261126/0002", "20261127/0001", "20261127/0002"]
    assert [(r["export"], r["export_kind"]) for r in rows] == [(1, "base"), (2, "delta"), (3, "base"), (4, "delta")]
    assert all(r["freshness_s"] is not None and 0 <= r["freshness_s"] < 10 for r in rows)  # every export served
    assert all(0 < r["keys"] <= 3000 for r in rows)  # the cap holds on a stream of more ids than it
    assert rows[0]["online_auc"] < 0.56 and all(r["online_auc"] > 0.6 for r in rows[2:])  # it learns as it goes
    for served, nxt in zip(rows, rows[1:]):  # the served model scores the next pass as the trainer did
        assert served["served_auc_next_pass"] == pytest.approx(nxt["online_auc"], abs=0.02)
    assert not any(alive(pid) for pid in result["pids"]) and len(result["pids"]) == 3
    assert rows[0]["pass"] in proc.stdout and "online AUC" in proc.stdout


def test_ctrl_c_stops_every_process_the_example_started(tmp_path: Path) -> None:
    work = tmp_path / "work"
    proc = subprocess.Popen(
        [sys.executable, str(RUN), "--days", "1", "--passes-per-day", "20", "--lines", "1000", "--workdir", str(work)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not (work / "trainer.metrics.jsonl").exists():  # all three started, training
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.05)
        started = children(proc.pid)
        assert len(started) == 3
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 130
        assert "interrupted" in (proc.stderr.read() if proc.stderr else "")
        assert not any(alive(pid) for pid in started)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
