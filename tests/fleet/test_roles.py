"""aps.fleet's role makers and strategies: every Paddle environment name (both generations),
the mode each strategy object maps to, and the errors a misconfigured script gets."""

from __future__ import annotations

import pytest

from aps.cluster import cluster_from_env
from aps.errors import ApsError, ConfigError
from aps.fleet import (
    DistributedStrategy,
    DistributeTranspilerConfig,
    Fleet,
    PaddleCloudRoleMaker,
    Role,
    StrategyFactory,
    UserDefinedRoleMaker,
    as_strategy,
)

ENDPOINTS = "10.0.0.1:36011,10.0.0.2:36012"

# ----------------------------------------------------------------------------- Fleet generation


def test_fleet_names_trainer() -> None:
    env = {"TRAINING_ROLE": "TRAINER", "PADDLE_PSERVERS_IP_PORT_LIST": ENDPOINTS,
           "PADDLE_TRAINERS_NUM": "3", "PADDLE_TRAINER_ID": "2"}
    role = PaddleCloudRoleMaker(env=env)
    assert role.role == Role.WORKER and role.is_worker() and not role.is_server()
    assert role.worker_index() == 2 and role.worker_num == 3 and not role.is_first_worker()
    assert role.server_endpoints == ("10.0.0.1:36011", "10.0.0.2:36012") and role.server_num() == 2
    assert role.server_index() == -1


def test_fleet_names_pserver_index_from_pod_ip_and_port() -> None:
    env = {"TRAINING_ROLE": "PSERVER", "PADDLE_PSERVERS_IP_PORT_LIST": ENDPOINTS,
           "PADDLE_TRAINERS_NUM": "2", "POD_IP": "10.0.0.2", "PADDLE_PORT": "36012"}
    role = PaddleCloudRoleMaker(env=env)
    assert role.is_server() and role.server_index() == 1 and role.worker_index() == -1
    assert (role.host, role.port) == ("10.0.0.2", 36012) and role.worker_num == 2


def test_pserver_whose_address_is_not_listed_is_an_error() -> None:
    env = {"TRAINING_ROLE": "PSERVER", "PADDLE_PSERVERS_IP_PORT_LIST": ENDPOINTS, "POD_IP": "10.0.0.3",
           "PADDLE_PORT": "36011"}
    with pytest.raises(ConfigError, match="10.0.0.3:36011 is not in the pserver list"):
        PaddleCloudRoleMaker(env=env)


# ----------------------------------------------------------------------------- older generation


def test_older_names_trainer() -> None:
    env = {"PADDLE_TRAINING_ROLE": "TRAINER", "PADDLE_PSERVER_IPS": "10.0.0.1,10.0.0.2",
           "PADDLE_PSERVER_PORT": "6174", "PADDLE_TRAINERS": "2", "PADDLE_TRAINER_ID": "0"}
    role = PaddleCloudRoleMaker(env=env)
    assert role.is_first_worker() and role.worker_num == 2
    assert role.server_endpoints == ("10.0.0.1:6174", "10.0.0.2:6174")


def test_older_names_pserver_index_from_current_ip() -> None:
    env = {"PADDLE_TRAINING_ROLE": "PSERVER", "PADDLE_PSERVER_IPS": "10.0.0.1,10.0.0.2",
           "PADDLE_PSERVER_PORT": "6174", "PADDLE_TRAINERS": "4", "PADDLE_CURRENT_IP": "10.0.0.2"}
    role = PaddleCloudRoleMaker(env=env)
    assert role.is_server() and role.server_index() == 1 and role.port == 6174 and role.worker_num == 4


def test_older_names_reach_aps_server_and_aps_trainer_too() -> None:
    """cluster_from_env is what aps-server and aps-trainer read: the older names work there."""
    cluster, own = cluster_from_env({"PADDLE_TRAINING_ROLE": "pserver", "PADDLE_PSERVER_IPS": "127.0.0.1",
                                     "PADDLE_PSERVER_PORT": "7164", "PADDLE_TRAINERS": "3",
                                     "PADDLE_CURRENT_IP": "127.0.0.1"})
    assert cluster.pservers == ["127.0.0.1:7164"] and cluster.num_trainers == 3
    assert own["role"] == "pserver" and own["host"] == "127.0.0.1" and own["port"] == 7164


def test_older_ips_without_port_or_with_a_repeated_host_are_errors() -> None:
    with pytest.raises(ConfigError, match="PADDLE_PSERVER_PORT is not"):
        PaddleCloudRoleMaker(env={"PADDLE_TRAINING_ROLE": "TRAINER", "PADDLE_PSERVER_IPS": "10.0.0.1",
                                  "PADDLE_TRAINER_ID": "0"})
    with pytest.raises(ConfigError, match="names a host twice"):
        PaddleCloudRoleMaker(env={"PADDLE_TRAINING_ROLE": "TRAINER", "PADDLE_PSERVER_IPS": "10.0.0.1,10.0.0.1",
                                  "PADDLE_PSERVER_PORT": "1", "PADDLE_TRAINER_ID": "0"})


def test_fleet_names_win_over_older_ones_and_aps_names_over_both() -> None:
    env = {"APS_ROLE": "trainer", "TRAINING_ROLE": "PSERVER", "PADDLE_TRAINING_ROLE": "PSERVER",
           "PADDLE_PSERVERS_IP_PORT_LIST": "10.0.0.9:1", "PADDLE_PSERVER_IPS": "10.0.0.1", "PADDLE_PSERVER_PORT": "2",
           "PADDLE_TRAINERS_NUM": "5", "PADDLE_TRAINERS": "7", "PADDLE_TRAINER_ID": "4"}
    role = PaddleCloudRoleMaker(env=env)
    assert role.is_worker() and role.server_endpoints == ("10.0.0.9:1",) and role.worker_num == 5


# ----------------------------------------------------------------------------- missing facts


@pytest.mark.parametrize("env,message", [
    ({"PADDLE_PSERVERS_IP_PORT_LIST": ENDPOINTS}, "no role in the environment"),
    ({"TRAINING_ROLE": "TRAINER", "PADDLE_TRAINER_ID": "0"}, "no pservers in the environment"),
    ({"TRAINING_ROLE": "TRAINER", "PADDLE_PSERVERS_IP_PORT_LIST": ENDPOINTS}, "PADDLE_TRAINER_ID"),
    ({"TRAINING_ROLE": "PSERVER", "PADDLE_PSERVERS_IP_PORT_LIST": ENDPOINTS}, "POD_IP and PADDLE_PORT"),
    ({"TRAINING_ROLE": "HETER_TRAINER", "PADDLE_PSERVERS_IP_PORT_LIST": ENDPOINTS}, "role must be pserver or trainer"),
    ({"TRAINING_ROLE": "TRAINER", "PADDLE_PSERVERS_IP_PORT_LIST": ENDPOINTS, "PADDLE_TRAINERS_NUM": "2",
      "PADDLE_TRAINER_ID": "2"}, r"trainer id 2 not in \[0, 2\)"),
    ({"TRAINING_ROLE": "TRAINER", "PADDLE_PSERVERS_IP_PORT_LIST": "nohostport", "PADDLE_TRAINER_ID": "0"},
     "host:port"),
])
def test_a_script_never_runs_without_its_cluster(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        PaddleCloudRoleMaker(env=env)


def test_collective_mode_is_refused() -> None:
    with pytest.raises(ConfigError, match="collective"):
        PaddleCloudRoleMaker(is_collective=True, env={})


def test_user_defined_role_maker_and_fleet_queries() -> None:
    fleet = Fleet().init(UserDefinedRoleMaker(current_id=1, role=Role.WORKER, worker_num=3,
                                              server_endpoints=["127.0.0.1:1", "127.0.0.1:2"]))
    assert fleet.is_worker() and fleet.worker_index() == 1 and fleet.worker_num() == 3 and fleet.server_num() == 2
    assert fleet.server_endpoints() == ["127.0.0.1:1", "127.0.0.1:2"]
    assert fleet.server_endpoints(to_string=True) == "127.0.0.1:1,127.0.0.1:2"
    files = [f"part-{k}" for k in range(7)]
    shares = [Fleet().init(UserDefinedRoleMaker(current_id=i, worker_num=3, server_endpoints=["h:1"])).split_files(files)
              for i in range(3)]
    assert fleet.split_files(files) == shares[1]
    assert shares == [["part-0", "part-1", "part-2"], ["part-3", "part-4"], ["part-5", "part-6"]]
    with pytest.raises(ApsError, match="init_server\\(\\) on a worker process"):
        fleet.init_server()
    with pytest.raises(ApsError, match="init_worker\\(model\\) first"):
        fleet.stop_worker()


def test_server_role_calls_are_checked() -> None:
    fleet = Fleet().init(UserDefinedRoleMaker(current_id=0, role=Role.SERVER, worker_num=1,
                                              server_endpoints=["127.0.0.1:7164"]))
    assert fleet.is_server() and fleet.server_index() == 0 and fleet.role.port == 7164
    with pytest.raises(ApsError, match="split_files\\(\\) on a server process"):
        fleet.split_files(["a"])
    with pytest.raises(ApsError, match="init_server\\(\\) before"):
        fleet.run_server()
    with pytest.raises(ConfigError, match="no checkpoint directory"):
        fleet.init_server("/nonexistent/model")
    with pytest.raises(ApsError, match="fleet.init\\(\\) first"):
        Fleet().is_server()


# ----------------------------------------------------------------------------- strategies


def test_distributed_strategy_maps_onto_the_modes_as_the_reference() -> None:
    strategy = DistributedStrategy()
    assert strategy.a_sync and strategy.mode == "async"  # the reference's default
    strategy.a_sync = False
    assert strategy.mode == "sync"
    strategy.a_sync = True
    strategy.a_sync_configs = {"k_steps": 100}
    assert strategy.mode == "geo" and as_strategy(strategy).k_steps == 100
    strategy.a_sync = True  # setting a_sync resets k_steps, as in the reference
    assert strategy.a_sync_configs["k_steps"] == 0 and strategy.mode == "async"
    assert StrategyFactory.create_half_async_strategy().mode == "half_async"
    assert StrategyFactory.create_sync_strategy().mode == "sync"
    assert StrategyFactory.create_async_strategy().mode == "async"
    assert as_strategy(StrategyFactory.create_geo_strategy(400)).k_steps == 400
    assert as_strategy(None).mode == "async"


def test_communicator_knobs_pass_through_and_flags_fill_the_rest() -> None:
    strategy = DistributedStrategy()
    strategy.a_sync_configs = {"max_merge_var_num": 4, "send_queue_size": 8, "runtime_split_send_recv": True}
    out = strategy.to_strategy(env={"FLAGS_communicator_thread_pool_size": "3", "FLAGS_communicator_max_merge_var_num": "9",
                                    "CPU_NUM": "8"})
    assert (out.mode, out.max_merge_var_num, out.send_queue_size, out.thread_pool_size) == ("async", 4, 8, 3)
    assert out.workers == 1  # the script's thread is the one compute worker, whatever CPU_NUM says


@pytest.mark.parametrize("configs,message", [
    ({"use_ps_gpu": True}, "no key 'use_ps_gpu'"),
    ({"k_steps": "100"}, "must be an integer"),
    ({"launch_barrier": 1}, "True or False"),
])
def test_unknown_or_bad_configs_are_errors(configs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        DistributedStrategy().a_sync_configs = configs


def test_contradictory_strategies_are_errors() -> None:
    strategy = DistributedStrategy()
    strategy.a_sync = False
    strategy.a_sync_configs = {"k_steps": 10}
    with pytest.raises(ConfigError, match="need a_sync=True"):
        strategy.to_strategy(env={})
    both = StrategyFactory.create_half_async_strategy()
    both.a_sync_configs = {"k_steps": 5}
    with pytest.raises(ConfigError, match="choose one"):
        both.to_strategy(env={})
    with pytest.raises(ConfigError, match="strategy must be"):
        as_strategy("async")  # type: ignore[arg-type]


@pytest.mark.parametrize("config,mode,k_steps", [
    (DistributeTranspilerConfig(), "sync", None),
    (DistributeTranspilerConfig(sync_mode=False), "async", None),
    (DistributeTranspilerConfig(sync_mode=False, half_async=True), "half_async", None),
    (DistributeTranspilerConfig(sync_mode=False, geo_sgd_mode=True, geo_sgd_need_push_nums=400), "geo", 400),
])
def test_older_transpiler_config_maps_the_same_way(config: DistributeTranspilerConfig, mode: str,
                                                   k_steps: int | None) -> None:
    out = config.to_strategy(env={})
    assert out.mode == mode
    if k_steps is not None:
        assert out.k_steps == k_steps
