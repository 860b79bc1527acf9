"""The trainer's reconnect deadline (--rpc-deadline / APS_RPC_DEADLINE) reaches its client, and a
trainer whose pserver is gone fails once it has passed, naming it."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from aps.cli.trainer import _strategy, build_parser
from aps.cluster import ClusterSpec
from aps.errors import ConfigError
from aps.trainer.strategy import Strategy
from aps.trainer.options import TrainOptions
from aps.trainer.runtime import open_client
from examples.linreg.model import make_data
from tests.conftest import Processes
from tests.faults.cluster import Cluster, wait_for


def test_default_rides_through_a_restart_and_flags_and_env_set_it() -> None:
    assert Strategy().rpc_deadline == 120.0
    assert Strategy.from_env({"APS_RPC_DEADLINE": "7.5"}).rpc_deadline == 7.5
    args = build_parser().parse_args(["--pservers", "127.0.0.1:1", "--model", "linreg", "--data", "x", "--rpc-deadline", "3"])
    strategy = _strategy(args)
    assert strategy.rpc_deadline == 3.0
    client = open_client(strategy, ClusterSpec(["127.0.0.1:1"]), 0, TrainOptions())
    assert client.deadline == 3.0


@pytest.mark.parametrize("value", [0.0, -1.0])
def test_a_deadline_that_is_not_positive_is_refused(value: float) -> None:
    with pytest.raises(ConfigError, match="rpc_deadline"):
        Strategy(rpc_deadline=value)


@pytest.mark.slow
def test_a_trainer_whose_pserver_dies_fails_after_the_deadline(processes: Processes, tmp_path: Path) -> None:
    """The only pserver is SIGKILLed mid-training and never comes back: the trainer keeps trying
    for --rpc-deadline seconds, then exits 1 with an error that names the deadline (no hang)."""
    data = tmp_path / "data"
    make_data(data, files=1, lines_per_file=4000)
    (tmp_path / "job").mkdir()
    cluster = Cluster(processes, tmp_path / "job", 1, 1)
    trainer = cluster.start_trainer(0, data, "async", "--epochs", "50", "--rpc-deadline", "2", pause=0.01)
    wait_for(lambda: cluster.examples(0) >= 200, 60, "training started")
    cluster.servers[0].send_signal(signal.SIGKILL)
    killed = time.monotonic()
    assert trainer.wait(timeout=60) == 1
    took = time.monotonic() - killed
    log = cluster.trainer_log(0).read_text()
    assert "rpc deadline 2 s" in log, log[-2000:]
    assert 2.0 <= took < 30, took
