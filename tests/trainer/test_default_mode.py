"""The mode a trainer uses when nothing names one is the model's preferred mode (hybrid for the
CTR models, async for the others), in aps-trainer (and so aps-local, which passes --mode only
when given) and in aps.fleet; --mode, APS_MODE and a fleet strategy still win."""

from __future__ import annotations

from pathlib import Path

import pytest

from aps.cli.trainer import build_parser, make_trainer
from aps.fleet import DistributedStrategy, Fleet, Role, UserDefinedRoleMaker
from aps.models.ctr_dnn.model import CtrDnn
from aps.trainer import Strategy
from tests.conftest import Processes
from tests.models.test_ctr_step_equality import write_meta


def trainer_mode(argv: list[str]) -> str:
    args = build_parser().parse_args(["--pservers", "127.0.0.1:1", "--data", "x", "--no-save", *argv])
    return make_trainer(args).strategy.mode


@pytest.mark.parametrize("model,mode", [("ctr_dnn", "hybrid"), ("wide_deep", "hybrid"),
                                        ("examples.linreg.model:LinReg", "async")])
def test_aps_trainer_takes_the_models_preferred_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     model: str, mode: str) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("APS_MODE", raising=False)
    assert trainer_mode(["--model", model]) == mode
    assert trainer_mode(["--model", model, "--mode", "sync"]) == "sync"
    monkeypatch.setenv("APS_MODE", "half_async")
    assert trainer_mode(["--model", model]) == "half_async"
    assert trainer_mode(["--model", model, "--mode", "async"]) == "async"


def test_strategy_leaves_the_mode_to_the_model_unless_one_is_named(tmp_path: Path) -> None:
    """Strategy() names no mode: every trainer kind makes it the model's preferred one (else
    async), so aps.Trainer agrees with aps-trainer, aps-local and the fleet step loop."""
    from aps.cluster import ClusterSpec
    from aps.trainer import Trainer
    from examples.linreg.model import LinReg

    ctr = CtrDnn(meta=write_meta(tmp_path / "meta.json"), hidden="5,4", embedding_size=3, batch_size=8)
    assert Strategy().mode is None and Strategy.from_env({}).mode is None
    assert Strategy().for_model(ctr).mode == "hybrid" and Strategy().for_model(LinReg()).mode == "async"
    assert Strategy.from_env({"APS_MODE": "sync"}).for_model(ctr).mode == "sync"
    assert Strategy(mode="async").for_model(ctr).mode == "async"
    cluster = ClusterSpec(["127.0.0.1:1"], 1)
    assert Trainer(ctr, Strategy(workers=1), cluster, 0).strategy.mode == "hybrid"
    assert Trainer(LinReg(), Strategy(workers=1), cluster, 0).strategy.mode == "async"


@pytest.mark.timeout(60)
def test_fleet_init_worker_takes_the_models_preferred_mode(tmp_path: Path, processes: Processes) -> None:
    servers = processes.start_servers(1, trainers=1)
    model = CtrDnn(meta=write_meta(tmp_path / "meta.json"), hidden="5,4", embedding_size=3, batch_size=8)
    for strategy, mode in ((None, "hybrid"), (DistributedStrategy(), "async")):
        fleet = Fleet().init(UserDefinedRoleMaker(current_id=0, role=Role.WORKER, worker_num=1,
                                                  server_endpoints=servers))
        worker = fleet.init_worker(model, strategy)
        try:
            assert worker.strategy.mode == mode
        finally:
            worker.close()
