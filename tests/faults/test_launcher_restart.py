"""aps-local --restart-failed: the restart rules (aps/launcher/restart.py) and a real run in which
a pserver is SIGKILLed and started again by the launcher."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import aps
from aps.checkpoints.shards import save_shard
from aps.errors import ConfigError
from aps.launcher.restart import Restarts
from aps.launcher.roles import Role
from aps.storage.tables import make_shard


def rules(tmp: Path, limit: int = 0, every: float = 60.0, directory: Path | None = None,
          mode: str = "async") -> Restarts:
    return Restarts(limit, every, directory or tmp / "log" / "checkpoints", mode, 2)


def dead_pserver(index: int, returncode: int = -9) -> Role:
    role = Role("pserver", index, ["aps-server", "--port", "7164"], {}, Path("pserver.log"))
    role.returncode, role.listening = returncode, True
    return role


def checkpoint(directory: Path, shard: int) -> None:
    spec = aps.SparseTable("t", rows=4, dim=1)
    save_shard(directory / f"auto-0000000000001-shard-0000{shard}-of-00002", {"t": make_shard(spec, shard, 2)}, shard, 2, {})


def test_off_by_default_and_no_extra_server_args(tmp_path: Path) -> None:
    restarts = rules(tmp_path)
    assert restarts.server_args() == []
    assert restarts.take(dead_pserver(0)) is None


def test_restarts_a_dead_pserver_with_resume_up_to_n_times(tmp_path: Path) -> None:
    restarts = rules(tmp_path, limit=2, every=5)
    directory = tmp_path / "log" / "checkpoints"
    assert restarts.server_args() == [
        "--checkpoint-dir", str(directory), "--checkpoint-every", "5", "--trainer-timeout", "10"
    ]
    role = dead_pserver(1)
    directory.mkdir(parents=True)
    assert restarts.refusal(role) == f"it died before its first checkpoint in {directory}"
    checkpoint(directory, 1)
    line = restarts.take(role)
    assert line is not None and "pserver.1 killed by SIGKILL" in line and "(1 of 2)" in line
    assert role.argv[-2:] == ["--resume", str(directory)] and role.returncode is None and role.proc is None
    role.returncode, role.listening = 1, True
    assert restarts.take(role) is not None and role.argv.count("--resume") == 1
    role.returncode = 1
    assert restarts.refusal(role) == "restarted 2 time(s) already (--restart-failed 2)"


@pytest.mark.parametrize(
    "change, reason",
    [
        (lambda r, o: setattr(r, "sent", "SIGTERM"), "not a pserver that died by itself"),
        (lambda r, o: setattr(r, "returncode", 0), "not a pserver that died by itself"),
        (lambda r, o: setattr(r, "kind", "trainer"), "not a pserver that died by itself"),
        (lambda r, o: setattr(r, "listening", False), "it died before listening"),
        (lambda r, o: setattr(o, "mode", "sync"), "sync mode cannot resume one shard alone"),
    ],
)
def test_not_restarted(tmp_path: Path, change, reason: str) -> None:
    restarts = rules(tmp_path, limit=1, directory=tmp_path / "ck")
    checkpoint(tmp_path / "ck", 0)
    role = dead_pserver(0)
    change(role, restarts)
    assert restarts.refusal(role) == reason


def test_bad_settings_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--checkpoint-every must be > 0"):
        rules(tmp_path, limit=1, every=0)
    with pytest.raises(ConfigError, match="--restart-failed must be >= 0"):
        rules(tmp_path, limit=-1)


def pserver_pid(index: int, launcher: int) -> int | None:
    """The pid of the pserver with this index that ``launcher`` started (its port-file flag names it)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if parent == launcher and any(a.endswith(f"pserver.{index}.port".encode()) for a in argv):
            return int(entry.name)
    return None


@pytest.mark.slow
def test_aps_local_restarts_a_killed_pserver_and_the_job_finishes(tmp_path: Path) -> None:
    """SIGKILL pserver 1 of an async 2x1 job mid-training: aps-local starts it again from its
    checkpoint and every role exits 0."""
    from examples.linreg.model import make_data
    from tests.conftest import ROOT
    from tests.faults.cluster import MODEL, wait_for

    data = tmp_path / "data"
    make_data(data, files=2, lines_per_file=1000)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    local = subprocess.Popen(
        [sys.executable, str(ROOT / "bin" / "aps-local"), "2x1", "--mode", "async", "--log-dir", "log",
         "--status-interval", "0", "--restart-failed", "1", "--checkpoint-every", "0.3",
         "--model", MODEL, "--model-arg", "pause=0.01", "--data", str(data), "--epochs", "3", "--workers", "1"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        saved = tmp_path / "log" / "checkpoints"
        wait_for(lambda: any(saved.glob("auto-*-shard-00001-of-00002/shard-00001-of-00002/manifest.json")), 60,
                 "pserver 1's first checkpoint")
        pid = pserver_pid(1, local.pid)
        assert pid is not None, "pserver 1 not found among aps-local's children"
        os.kill(pid, signal.SIGKILL)
        out, _ = local.communicate(timeout=150)
    finally:
        if local.poll() is None:
            local.kill()
            local.wait()
    assert local.returncode == 0, out[-3000:]
    assert "pserver.1 killed by SIGKILL; restarting it from its last checkpoint" in out, out[-3000:]
    assert "(1 of 1)" in out
