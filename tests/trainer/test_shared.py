"""Shared arrays leave nothing in /dev/shm, even when their trainer is SIGKILLed.

The files go as soon as the last expected process has mapped them (the memory then lives only
in the mappings); a directory whose owner died earlier is removed by the next trainer, judged by
the owner's flock. Real processes and real SIGKILLs throughout.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from aps.errors import ApsError
from aps.trainer.shared import Attached, SharedArrays, remove_orphans, shm_base
from examples.linreg.model import LinReg, make_data
from tests.conftest import ROOT, Processes
from tests.faults.cluster import Cluster, wait_for

pytestmark = pytest.mark.timeout(120)


def segments_of(pid: int) -> list[str]:
    return sorted(name for name in os.listdir(shm_base()) if name.startswith(f"aps-{pid}-"))


def test_the_last_attach_removes_the_files_and_the_mappings_stay_shared() -> None:
    shared = SharedArrays(LinReg(features=20), 1, with_mailboxes=True)
    try:
        owner = Attached(shared.layout)
        assert os.path.isdir(shared.root)  # the worker has not attached yet
        worker = Attached(shared.layout)  # the 2nd of 2 expected: the files go
        assert not os.path.exists(shared.root)
        name = next(iter(owner.params))
        worker.params[name][3] = 7.5
        owner.stats[0, 1] = 42.0
        assert np.all(owner.params[name][3] == 7.5) and worker.stats[0, 1] == 42.0  # one memory, still
        with pytest.raises(ApsError, match="all 2 processes they were made for have attached"):
            Attached(shared.layout)
    finally:
        shared.close()
    shared.close()  # idempotent


def test_a_trainer_starting_beside_another_never_removes_its_directory_before_it_is_locked(monkeypatch) -> None:
    """Two trainers start at once: the second's sweep runs between the first's making its
    directory and locking it (forced here, by sweeping inside the first's lock call). The sweep
    must not take it: in a 2x2 aps-local run it did, and the first trainer failed to create its
    arrays (FileNotFoundError in /dev/shm)."""
    real_flock = fcntl.flock
    swept: list[list[str]] = []

    def sweep_then_lock(fd: int, operation: int) -> None:
        if operation == fcntl.LOCK_EX and not swept:  # the owner's blocking lock, the first time
            swept.append(remove_orphans())
        real_flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", sweep_then_lock)
    shared = SharedArrays(LinReg(features=20), 1, with_mailboxes=False)
    try:
        assert swept == [[]] and os.path.isdir(shared.root)
        assert os.path.basename(shared.root).startswith(f"aps-{os.getpid()}-")
        assert shared.root not in remove_orphans()  # locked under its own name
        Attached(shared.layout)
    finally:
        shared.close()


HOLDER = textwrap.dedent(
    """
    import sys, time
    from aps.trainer.shared import Attached, SharedArrays
    from examples.linreg.model import LinReg
    shared = SharedArrays(LinReg(features=20), 2, with_mailboxes=True)
    Attached(shared.layout)  # the trainer's own attach; its 2 workers never come
    print(shared.root, flush=True)
    time.sleep(300)
    """
)


def start_holder() -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.stdout is not None
    root = proc.stdout.readline().strip()
    assert root and os.path.isdir(root), root
    return proc, root


@pytest.mark.slow
def test_a_dead_owners_directory_is_removed_by_the_next_trainer_and_a_live_ones_is_not() -> None:
    """A trainer SIGKILLed before its workers attached leaves its directory; creating shared
    arrays anywhere on the machine removes it (its flock is free) but not a live trainer's."""
    dead, dead_root = start_holder()
    live, live_root = start_holder()
    try:
        dead.send_signal(signal.SIGKILL)
        dead.wait(timeout=10)
        assert os.path.isdir(dead_root)  # nothing of the dead process could clean up
        assert dead_root in remove_orphans()
        assert not os.path.exists(dead_root)
        assert os.path.isdir(live_root)  # its owner holds the lock
        shared = SharedArrays(LinReg(features=20), 1, with_mailboxes=False)  # sweeps again on creation
        shared.close()
        assert os.path.isdir(live_root)
    finally:
        for proc in (dead, live):
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
    assert live_root in remove_orphans()  # dead now as well


@pytest.mark.slow
def test_a_sigkilled_trainer_leaves_nothing_in_dev_shm(processes: Processes, tmp_path: Path) -> None:
    """A real aps-trainer with 2 compute workers, SIGKILLed mid-training: no aps-<pid>-*
    directory of it is left (nor is there one while it trains: every process had mapped the
    arrays, so the files were already gone) and its workers die with it."""
    data = tmp_path / "data"
    make_data(data, files=2, lines_per_file=4000)
    (tmp_path / "job").mkdir()
    cluster = Cluster(processes, tmp_path / "job", 1, 1)
    trainer = cluster.start_trainer(0, data, "async", "--epochs", "50", pause=0.01, workers=2)
    wait_for(lambda: cluster.examples(0) >= 200, 90, "training started")
    helpers = [int(p) for p in Path(f"/proc/{trainer.pid}/task/{trainer.pid}/children").read_text().split()]
    # the workers are children of the trainer's fork server (one of its helpers)
    workers = [int(p) for h in helpers for p in Path(f"/proc/{h}/task/{h}/children").read_text().split()]
    assert len(workers) >= 2, workers
    workers += helpers
    assert segments_of(trainer.pid) == []
    trainer.send_signal(signal.SIGKILL)
    assert trainer.wait(timeout=10) == -signal.SIGKILL
    wait_for(lambda: not any(Path(f"/proc/{w}").exists() and "zombie" not in _state(w) for w in workers), 10,
             "the workers died with their trainer")
    assert segments_of(trainer.pid) == []


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split("\n")[0].lower()
    except (FileNotFoundError, IndexError):
        return "zombie"  # gone meanwhile
