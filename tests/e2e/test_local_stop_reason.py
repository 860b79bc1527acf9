"""What aps-local's summary says of a pserver it stopped before it listened: that it was
stopped, and why, not that it failed to start."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from aps.cli.local import Board, Launcher, parse_args
from tests.conftest import BIN
from tests.e2e.test_local_launcher import assert_all_gone, summary

pytestmark = pytest.mark.timeout(60)


async def test_a_pserver_stopped_before_it_listened_is_reported_as_stopped(tmp_path: Path) -> None:
    """A trainer (aps-trainer, started with the pservers) fails at once on a model that does not
    exist, while its pserver (the real aps-server, its start held back 30 s) has not listened."""
    out, err = io.StringIO(), io.StringIO()
    opts, trainer_args = parse_args(["1x1", "--log-dir", str(tmp_path / "log"), "--status-interval", "0",
                                     "--", "--model", "no_such_module:Model", "--data", str(tmp_path)])
    launcher = Launcher(opts, trainer_args, Board(out, err))
    slow_server = ["sh", "-c", 'sleep 30; exec "$@"', "sh", sys.executable, str(BIN / "aps-server")]
    launcher.plan(slow_server, None, tmp_path)
    assert launcher.trainers[0].waits_for_pservers
    assert await launcher.run() == 1
    text = out.getvalue() + err.getvalue()
    assert "did not start listening" not in text
    assert "FAILED: trainer.0 exit 2" in err.getvalue()
    table = summary(out.getvalue())
    assert table["trainer.0"][1] == "exit 2"
    assert table["pserver.0"][1] == "killed by SIGTERM (aps-local sent SIGTERM before it listened: trainer.0 failed)"
    assert_all_gone([pid for pid, _ in table.values()])
