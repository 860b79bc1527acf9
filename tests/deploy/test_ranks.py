"""Slurm / MPI ranks and Kubernetes indexes as aps roles: the documented mapping (first
APS_NUM_PSERVERS ranks are pservers), Slurm's node-list and tasks-per-node syntax, and the
examples/slurm dispatcher run as a real process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from aps.cluster import cluster_from_env, expand_nodelist, expand_tasks_per_node, rank_env
from aps.errors import ConfigError
from tests.conftest import ROOT

SLURM = {"APS_NUM_PSERVERS": "2", "SLURM_NTASKS": "6", "SLURM_JOB_NODELIST": "node[01-02,07]",
         "SLURM_TASKS_PER_NODE": "2(x2),2"}


@pytest.mark.parametrize("text, hosts", [
    ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
    ("a1,b[9-11],c", ["a1", "b9", "b10", "b11", "c"]),
    ("gpu[008-010]", ["gpu008", "gpu009", "gpu010"]),
    ("r[1-2]n[3,5]", ["r1n3", "r1n5", "r2n3", "r2n5"]),
    ("x[2],y[0-1]", ["x2", "y0", "y1"]),
])
def test_nodelist_expands_like_scontrol(text: str, hosts: list[str]) -> None:
    assert expand_nodelist(text) == hosts


@pytest.mark.parametrize("text", ["n[1-3", "n1-3]", "n[3-1]", "n[a-b]"])
def test_bad_nodelist_is_a_config_error(text: str) -> None:
    with pytest.raises(ConfigError, match="Slurm node list"):
        expand_nodelist(text)


def test_tasks_per_node() -> None:
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert expand_tasks_per_node("4") == [4]
    with pytest.raises(ConfigError, match="tasks per node"):
        expand_tasks_per_node("2(x3")


def test_slurm_ranks_map_to_roles_block_wise() -> None:
    roles = [rank_env({**SLURM, "SLURM_PROCID": str(r)}) for r in range(6)]
    pservers = "node01:7164,node01:7165"  # ranks 0 and 1 both land on the first node (2 tasks there)
    assert roles[0] == {"APS_TRAINERS": "4", "APS_ROLE": "pserver", "APS_SERVER_INDEX": "0", "APS_HOST": "0.0.0.0",
                        "APS_PORT": "7164", "APS_PSERVERS": pservers}
    assert roles[1]["APS_SERVER_INDEX"] == "1" and roles[1]["APS_PORT"] == "7165"
    assert [r["APS_ROLE"] for r in roles] == ["pserver"] * 2 + ["trainer"] * 4
    assert [r.get("APS_TRAINER_ID") for r in roles] == [None, None, "0", "1", "2", "3"]
    assert {r["APS_PSERVERS"] for r in roles} == {pservers}


def test_one_task_per_node_spreads_pservers_and_step_names_win() -> None:
    env = {**SLURM, "SLURM_PROCID": "4", "APS_BASE_PORT": "9000", "SLURM_STEP_NODELIST": "c[1-5]",
           "SLURM_STEP_TASKS_PER_NODE": "1(x5)", "SLURM_NTASKS": "5"}
    spec, own = cluster_from_env(env)
    assert spec.pservers == ["c1:9000", "c2:9001"] and spec.num_trainers == 3
    assert own["role"] == "trainer" and own["trainer_id"] == 2


def test_explicit_names_win_over_the_rank() -> None:
    env = {**SLURM, "SLURM_PROCID": "0", "APS_PSERVERS": "ps-a:1,ps-b:2", "APS_HOST": "10.0.0.5"}
    spec, own = cluster_from_env(env)
    assert spec.pservers == ["ps-a:1", "ps-b:2"]
    assert own == {"role": "pserver", "host": "10.0.0.5", "port": 7164, "server_index": 0, "trainer_id": None,
                   "token": None}


def test_mpi_ranks_need_a_given_pserver_list() -> None:
    env = {"APS_NUM_PSERVERS": "1", "OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "3"}
    assert rank_env(env) == {"APS_TRAINERS": "2", "APS_ROLE": "trainer", "APS_TRAINER_ID": "1"}
    spec, own = cluster_from_env({**env, "APS_PSERVERS": "h1:7164"})
    assert spec.pservers == ["h1:7164"] and spec.num_trainers == 2 and own["trainer_id"] == 1
    spec, own = cluster_from_env({**env, "OMPI_COMM_WORLD_RANK": "0"})
    assert own["role"] == "pserver" and own["port"] == 7164 and own["server_index"] == 0 and spec.pservers == []


@pytest.mark.parametrize("env, message", [
    ({"APS_NUM_PSERVERS": "1"}, "no rank is"),
    ({"APS_NUM_PSERVERS": "3", "SLURM_PROCID": "0", "SLURM_NTASKS": "3"}, "leave a trainer"),
    ({"APS_NUM_PSERVERS": "0", "SLURM_PROCID": "0", "SLURM_NTASKS": "3"}, "at least 1"),
    ({"APS_NUM_PSERVERS": "1", "SLURM_PROCID": "3", "SLURM_NTASKS": "3"}, "not below"),
    ({"APS_NUM_PSERVERS": "2", "SLURM_PROCID": "0", "SLURM_NTASKS": "3", "APS_BASE_PORT": "65535"}, "not valid"),
    ({**SLURM, "SLURM_PROCID": "0", "SLURM_DISTRIBUTION": "cyclic"}, "block-wise"),
    ({**SLURM, "SLURM_PROCID": "0", "SLURM_TASKS_PER_NODE": "1(x3)"}, "do not hold"),
])
def test_bad_rank_settings_are_config_errors(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        rank_env(env)


def test_no_num_pservers_means_no_rank_mapping() -> None:
    assert rank_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "4"}) == {}


def test_job_completion_index_is_the_trainer_id_last() -> None:
    assert cluster_from_env({"JOB_COMPLETION_INDEX": "3"})[1]["trainer_id"] == 3
    assert cluster_from_env({"JOB_COMPLETION_INDEX": "3", "PADDLE_TRAINER_ID": "1"})[1]["trainer_id"] == 1


def _run_rank(rank: int, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "APS_", "PADDLE_"))}
    env.update(SLURM, SLURM_PROCID=str(rank), PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, str(ROOT / "examples/slurm/run_rank.py"), *args], env=env,
                          capture_output=True, text=True, timeout=60)


def test_run_rank_becomes_the_rank_s_program() -> None:
    server = _run_rank(1, "--server-args=--help", "--", "--model", "x")
    assert server.returncode == 0 and server.stdout.startswith("usage: aps-server"), server.stderr
    trainer = _run_rank(2, "--server-args=--bogus", "--", "--help")
    assert trainer.returncode == 0 and trainer.stdout.startswith("usage: aps-trainer"), trainer.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "APS_"))}
    lost = subprocess.run([sys.executable, str(ROOT / "examples/slurm/run_rank.py"), "--", "--help"],
                          env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=60)
    assert lost.returncode == 2 and "no role" in lost.stderr
