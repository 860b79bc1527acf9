"""Exactly once across a SIGKILL, with real processes: aps-trainer over pass folders, and over a
Redis stream, is killed in the middle of a pass, started again with --resume, and every record
ends up trained exactly once (the pserver counts: CountingLR pushes -1 per record into row
RECORD_ID of table seen)."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import aps
from tests.conftest import ROOT, Processes
from tests.faults.cluster import wait_for

from .passdata import write_pass

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

MODEL = "tests.online.models:CountingLR"
PER_PASS = 240


def counts(address: str, n: int) -> np.ndarray:
    async def pull() -> np.ndarray:
        async with aps.connect(address) as ps:
            return (await ps.pull_sparse("seen", np.arange(n)))[:, 0]

    return asyncio.run(pull())


def start_trainer(processes: Processes, tmp: Path, address: str, *extra: str) -> subprocess.Popen:
    source = extra if "--data-stream" in extra else ("--data-passes", str(tmp / "passes"), "--pass-wait", "20", *extra)
    return processes.start(
        "aps-trainer", "--pservers", address, "--model", MODEL, "--model-arg", "pause=0.03", "--workers", "2",
        "--mode", "async", "--save-dir", str(tmp / "online"), "--metrics", str(tmp / "metrics.jsonl"),
        "--print-period", "0", *source, env={"PYTHONPATH": str(ROOT)},
    )


def alive(proc: subprocess.Popen, check: Callable[[], bool]) -> Callable[[], bool]:
    """``check``, failing at once if ``proc`` exited meanwhile."""

    def both() -> bool:
        assert proc.poll() is None, f"the trainer exited with {proc.returncode}"
        return check()

    return both


def test_a_trainer_killed_mid_pass_resumes_without_losing_or_repeating_a_record(processes: Processes, tmp_path: Path) -> None:
    (address,) = processes.start_servers(1, 1, "--checkpoint-root", str(tmp_path), "--no-exit-when-done")
    sizes = [PER_PASS, PER_PASS, 4 * PER_PASS, PER_PASS]  # the third pass long enough to be struck in
    starts = np.cumsum([0, *sizes])
    total = int(starts[-1])
    for k in range(3):
        write_pass(tmp_path / "passes", f"20261126/{k + 1:04d}", int(starts[k]), sizes[k])
    victim = start_trainer(processes, tmp_path, address)
    checkpoint = tmp_path / "online" / "pass-000001" / "shard-00000-of-00001" / "manifest.json"
    wait_for(alive(victim, checkpoint.exists), 90, "the checkpoint after pass 2")
    third = slice(int(starts[2]), int(starts[3]))
    # in the middle of pass 3: some of its records reached the pserver, not all
    wait_for(alive(victim, lambda: counts(address, total)[third].sum() > 0), 30, "pass 3 trained on", 0.01)
    victim.send_signal(signal.SIGKILL)
    assert victim.wait(10) == -signal.SIGKILL
    assert 0 < counts(address, total)[third].sum() < sizes[2]  # the kill left a partial pass behind
    write_pass(tmp_path / "passes", "20261126/0004", int(starts[3]), sizes[3])
    (tmp_path / "passes" / "_SUCCESS").write_text("")  # no pass after these
    again = start_trainer(processes, tmp_path, address, "--resume")
    assert again.wait(120) == 0
    seen = counts(address, total + 100)
    assert seen[:total].tolist() == [1.0] * total and not seen[total:].any()  # none lost, none twice
    log = (tmp_path / f"aps-trainer.{len(processes.procs) - 1}.log").read_text()
    assert "resumed from a pass checkpoint" in log and "pass-000001" in log
    assert "online training stopped" in log and "end marker" in log
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    passes = [r["pass"] for r in records if r["event"] == "epoch"]
    assert passes == ["20261126/0001", "20261126/0002", "20261126/0003", "20261126/0004"]


def test_a_stream_trainer_killed_mid_pass_rereads_its_pending_entries_once(
    processes: Processes, tmp_path: Path, redis_url: str
) -> None:
    import redis

    (address,) = processes.start_servers(1, 1, "--checkpoint-root", str(tmp_path), "--no-exit-when-done")
    n, total = 2 * PER_PASS, 8 * PER_PASS  # four passes of n entries
    r = redis.Redis.from_url(redis_url)
    for i in range(total):
        r.xadd("clicks", {"line": f"{i} {1 - i % 2} {i % 2}"})
    stream = ("--data-stream", f"{redis_url}/clicks", "--pass-records", str(n), "--pass-wait", "2")
    victim = start_trainer(processes, tmp_path, address, *stream)
    checkpoint = tmp_path / "online" / "pass-000001" / "shard-00000-of-00001" / "manifest.json"
    wait_for(alive(victim, checkpoint.exists), 90, "the checkpoint after pass 2")
    third = slice(2 * n, 3 * n)
    wait_for(alive(victim, lambda: counts(address, total)[third].sum() > 0), 30, "pass 3 trained on", 0.01)
    victim.send_signal(signal.SIGKILL)
    assert victim.wait(10) == -signal.SIGKILL
    assert 0 < counts(address, total)[third].sum() < n  # the kill left a partial pass behind
    assert r.xpending("clicks", "aps:clicks")["pending"] >= n  # pass 3 read, never acknowledged
    again = start_trainer(processes, tmp_path, address, *stream, "--resume")
    assert again.wait(120) == 0
    seen = counts(address, total + 100)
    assert seen[:total].tolist() == [1.0] * total and not seen[total:].any()  # none lost, none twice
    assert r.xpending("clicks", "aps:clicks")["pending"] == 0
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    resumed = [rec for rec in records if rec["event"] == "epoch"][2:]  # the passes of the second run
    assert resumed[0]["epoch"] == 2 and resumed[0]["reread"] == n and sum(rec["examples"] for rec in resumed) == 2 * n
