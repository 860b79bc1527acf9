"""Two aps-trainer processes read one Redis stream in one consumer group: every entry is trained
by exactly one of them (the pserver counts: CountingLR pushes -1 per record into row RECORD_ID of
table seen), each trains a share, and the group has nothing pending at the end, also when the
stream ends with fewer entries than one pass of one trainer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ROOT, Processes

from .test_exactly_once import MODEL, counts

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def test_two_trainers_in_one_group_train_every_entry_exactly_once(processes: Processes, tmp_path: Path, redis_url: str) -> None:
    import redis

    (address,) = processes.start_servers(1, 2, "--checkpoint-root", str(tmp_path), "--no-exit-when-done")
    # 4 passes of 50 entries for each trainer, then 20 for one of them: the other trains an empty
    # pass with it, and both stop once neither gets any
    per_pass, total = 50, 420
    r = redis.Redis.from_url(redis_url)
    pipe = r.pipeline()
    for i in range(total):
        pipe.xadd("clicks", {"line": f"{i} {1 - i % 2} {i % 2}"})
    pipe.execute()
    trainers = [
        processes.start(
            "aps-trainer", "--pservers", address, "--trainers", "2", "--trainer-id", str(k), "--model", MODEL,
            "--workers", "1", "--mode", "async", "--data-stream", f"{redis_url}/clicks", "--pass-records", str(per_pass),
            "--pass-wait", "2", "--save-dir", str(tmp_path / "online"), "--metrics", str(tmp_path / f"metrics.{k}.jsonl"),
            "--print-period", "0", env={"PYTHONPATH": str(ROOT)},
        )
        for k in range(2)
    ]
    assert [t.wait(90) for t in trainers] == [0, 0]
    seen = counts(address, total + 50)
    assert seen[:total].tolist() == [1.0] * total and not seen[total:].any()  # each entry once, by one trainer
    consumers = {c["name"].decode(): c["pending"] for c in r.xinfo_consumers("clicks", "aps:clicks")}
    assert consumers == {"trainer-0": 0, "trainer-1": 0}  # both read, everything acknowledged
    passes = [[rec for line in (tmp_path / f"metrics.{k}.jsonl").read_text().splitlines()
               if (rec := json.loads(line))["event"] == "epoch"] for k in range(2)]
    assert [len(p) for p in passes] == [5, 5]  # the same passes, in lockstep
    assert sorted(p[4]["examples"] for p in passes) == [0, 20]  # the last one empty for one of them
    assert np.count_nonzero(seen) == total
