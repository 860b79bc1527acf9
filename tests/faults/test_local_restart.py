"""The decisions behind aps-local --restart-failed (aps/cli/local_restart.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

import aps
from aps.errors import ConfigError
from aps.cli.local_restart import Restarts, add_restart_flags
from aps.launcher_roles import Role
from aps.server.checkpoint import save_shard
from aps.server.tables import make_shard


def options(tmp: Path, *argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_restart_flags(parser)
    opts = parser.parse_args(list(argv))
    opts.log_dir, opts.layout, opts.mode = str(tmp / "log"), (2, 1), "async"
    return opts


def dead_pserver(index: int, returncode: int = -9) -> Role:
    role = Role("pserver", index, ["aps-server", "--port", "7164"], {}, Path("pserver.log"))
    role.returncode, role.listening = returncode, True
    return role


def checkpoint(directory: Path, shard: int) -> None:
    spec = aps.SparseTable("t", rows=4, dim=1)
    save_shard(directory / f"auto-0000000000001-shard-0000{shard}-of-00002", {"t": make_shard(spec, shard, 2)}, shard, 2, {})


def test_off_by_default_and_no_extra_server_args(tmp_path: Path) -> None:
    restarts = Restarts(options(tmp_path))
    assert restarts.server_args() == []
    assert restarts.take(dead_pserver(0)) is None


def test_restarts_a_dead_pserver_with_resume_up_to_n_times(tmp_path: Path) -> None:
    restarts = Restarts(options(tmp_path, "--restart-failed", "2", "--checkpoint-every", "5"))
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
    opts = options(tmp_path, "--restart-failed", "1", "--checkpoint-dir", str(tmp_path / "ck"))
    checkpoint(tmp_path / "ck", 0)
    role = dead_pserver(0)
    change(role, opts)
    assert Restarts(opts).refusal(role) == reason


def test_bad_settings_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--checkpoint-every must be > 0"):
        Restarts(options(tmp_path, "--restart-failed", "1", "--checkpoint-every", "0"))
    with pytest.raises(ConfigError, match="--restart-failed must be >= 0"):
        Restarts(options(tmp_path, "--restart-failed", "-1"))
