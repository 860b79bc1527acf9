"""The v2 launch parameters' environment names (PADDLE_INIT_*) and flags, each read where it
belongs: the cluster spec, aps-server's settings, the trainer's workers, aps.fleet's role, and
aps-server --help naming every generation of Paddle's names."""

from __future__ import annotations

import pytest

from aps.cli.server import DESCRIPTION, build_parser, config_from_args
from aps.cluster import cluster_from_env
from aps.errors import ConfigError
from aps.fleet import PaddleCloudRoleMaker
from aps.trainer.strategy import Strategy

V2 = {
    "PADDLE_INIT_PORT": "7164",
    "PADDLE_INIT_PORTS_NUM": "2",
    "PADDLE_INIT_PORTS_NUM_FOR_SPARSE": "3",
    "PADDLE_INIT_NUM_GRADIENT_SERVERS": "4",
    "PADDLE_INIT_TRAINER_ID": "2",
    "PADDLE_INIT_PSERVERS": "10.0.0.1, 10.0.0.2",
    "PADDLE_INIT_TRAINER_COUNT": "3",
}


def test_cluster_from_v2_names() -> None:
    cluster, own = cluster_from_env(V2)
    assert cluster.pservers == ["10.0.0.1:7164", "10.0.0.2:7164"]
    assert (cluster.num_trainers, cluster.ports_num, cluster.ports_num_for_sparse) == (4, 2, 3)
    assert own["trainer_id"] == 2 and own["port"] == 7164
    # the newer names win over v2's where both are set
    cluster, own = cluster_from_env({**V2, "PADDLE_TRAINERS_NUM": "6", "PADDLE_TRAINER_ID": "5",
                                     "PADDLE_PSERVERS_IP_PORT_LIST": "127.0.0.1:6000"})
    assert (cluster.pservers, cluster.num_trainers, own["trainer_id"]) == (["127.0.0.1:6000"], 6, 5)
    # and nothing set means one dense port per pserver, no sparse ones
    cluster, _ = cluster_from_env({})
    assert (cluster.ports_num, cluster.ports_num_for_sparse) == (1, 0)


@pytest.mark.parametrize(
    "env,match",
    [
        ({"PADDLE_INIT_PSERVERS": "10.0.0.1"}, "PADDLE_INIT_PORT is not"),
        ({"PADDLE_INIT_PSERVERS": "10.0.0.1,10.0.0.1", "PADDLE_INIT_PORT": "7164"}, "names a host twice"),
        ({"PADDLE_INIT_PORTS_NUM": "two"}, "PADDLE_INIT_PORTS_NUM"),
        ({"PADDLE_INIT_PORTS_NUM": "0"}, "ports per pserver"),
        ({"PADDLE_INIT_PORTS_NUM_FOR_SPARSE": "-1"}, "ports per pserver"),
    ],
)
def test_bad_v2_values_are_config_errors(env: dict[str, str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        cluster_from_env(env)


def test_aps_server_settings_from_v2_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in V2.items():
        monkeypatch.setenv(name, value)
    config = config_from_args(build_parser().parse_args(["--host", "10.0.0.2", "--async_lagged_grad_discard_ratio", "1.6"]))
    assert (config.port, config.server_index, config.num_servers, config.num_trainers) == (7164, 1, 2, 4)
    assert (config.ports_num, config.ports_num_for_sparse, config.num_ports) == (2, 3, 5)
    assert config.async_lagged_grad_discard_ratio == 1.6 and config.lag_limit == pytest.approx(6.4)
    # flags win, in Paddle's spelling as in aps's
    args = build_parser().parse_args(["--host", "10.0.0.1", "--ports_num", "1", "--ports-num-for-sparse", "0",
                                      "--num_gradient_servers", "2"])
    config = config_from_args(args)
    assert (config.server_index, config.ports_num, config.ports_num_for_sparse, config.num_trainers) == (0, 1, 0, 2)


def test_trainer_count_is_the_number_of_workers() -> None:
    assert Strategy.from_env({"PADDLE_INIT_TRAINER_COUNT": "3"}).workers == 3
    assert Strategy.from_env({"PADDLE_INIT_TRAINER_COUNT": "3", "CPU_NUM": "5"}).workers == 5


def test_fleet_role_carries_the_ports() -> None:
    role = PaddleCloudRoleMaker(env={**V2, "TRAINING_ROLE": "TRAINER"})
    cluster = role.cluster()
    assert role.worker_index() == 2 and role.worker_num == 4
    assert (cluster.pservers, cluster.ports_num, cluster.ports_num_for_sparse) == (["10.0.0.1:7164", "10.0.0.2:7164"], 2, 3)


def test_help_lists_every_generation_of_names() -> None:
    names = [
        "POD_IP", "PADDLE_PORT", "PADDLE_PSERVERS_IP_PORT_LIST", "PADDLE_TRAINERS_NUM",
        "PADDLE_TRAINING_ROLE", "PADDLE_PSERVER_IPS", "PADDLE_PSERVER_PORT", "PADDLE_TRAINERS", "PADDLE_CURRENT_IP",
        *V2,
    ]
    text = " ".join(DESCRIPTION.split())
    for name in names:
        assert name in text, name
    help_text = build_parser().format_help()
    for flag in ("--ports-num", "--ports-num-for-sparse", "--num-gradient-servers", "--async-lagged-grad-discard-ratio"):
        assert flag in help_text
