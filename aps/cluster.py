"""Who is in the cluster and who am I: from CLI flags or environment variables.

Both aps's own variables and PaddlePaddle's names are read, so launch scripts written for Fleet
keep working: the Fleet names (``TRAINING_ROLE``, ``PADDLE_PSERVERS_IP_PORT_LIST``, ...), the
older transpiler contract (``PADDLE_TRAINING_ROLE``, ``PADDLE_PSERVER_IPS`` + one
``PADDLE_PSERVER_PORT`` shared by every pserver, ``PADDLE_TRAINERS``, ``PADDLE_CURRENT_IP``) and
the v2 launch parameters (``PADDLE_INIT_PSERVERS`` + ``PADDLE_INIT_PORT``,
``PADDLE_INIT_PORTS_NUM``, ...). Where several are set, the first column wins, then the second,
then the third, then the fourth. Environment is read only when :func:`cluster_from_env` is
called, never at import.

========================  ============================  ===========================  ================================  ===============================
aps                       Paddle (Fleet)                Paddle (older)               Paddle (v2)                       meaning
========================  ============================  ===========================  ================================  ===============================
APS_ROLE                  TRAINING_ROLE                 PADDLE_TRAINING_ROLE         -                                 ``pserver`` or ``trainer``
APS_PSERVERS              PADDLE_PSERVERS_IP_PORT_LIST  PADDLE_PSERVER_IPS + PORT    PADDLE_INIT_PSERVERS + PORT       host:port of every pserver
APS_HOST                  POD_IP                        PADDLE_CURRENT_IP            -                                 this pserver's host
APS_PORT                  PADDLE_PORT                   PADDLE_PSERVER_PORT          PADDLE_INIT_PORT                  this pserver's (first) port
APS_SERVER_INDEX          (position of POD_IP:PORT)     (position of the IP)         (position of the IP)              this pserver's index
APS_TRAINERS              PADDLE_TRAINERS_NUM           PADDLE_TRAINERS              PADDLE_INIT_NUM_GRADIENT_SERVERS  number of trainers
APS_TRAINER_ID            PADDLE_TRAINER_ID             PADDLE_TRAINER_ID            PADDLE_INIT_TRAINER_ID            this trainer's index
APS_PORTS_NUM             -                             -                            PADDLE_INIT_PORTS_NUM             dense ports per pserver
APS_PORTS_NUM_FOR_SPARSE  -                             -                            PADDLE_INIT_PORTS_NUM_FOR_SPARSE  sparse ports per pserver
APS_TOKEN                 -                             -                            -                                 shared secret for the handshake
========================  ============================  ===========================  ================================  ===============================

v2's ``num_gradient_servers`` is the number of trainers (the processes that send gradients), on
the pserver as on the trainers; its ``PADDLE_INIT_TRAINER_COUNT`` is the number of compute
threads of one trainer, read as aps's workers (aps/trainer/strategy.py).

Role values are case-insensitive: ``PSERVER`` / ``TRAINER`` as Paddle writes them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from .errors import ConfigError

ENV_NAMES: dict[str, tuple[str, ...]] = {
    "role": ("APS_ROLE", "TRAINING_ROLE", "PADDLE_TRAINING_ROLE"),
    "pservers": ("APS_PSERVERS", "PADDLE_PSERVERS_IP_PORT_LIST"),
    "host": ("APS_HOST", "POD_IP", "PADDLE_CURRENT_IP"),
    "port": ("APS_PORT", "PADDLE_PORT", "PADDLE_PSERVER_PORT", "PADDLE_INIT_PORT"),
    "server_index": ("APS_SERVER_INDEX",),
    "trainers": ("APS_TRAINERS", "PADDLE_TRAINERS_NUM", "PADDLE_TRAINERS", "PADDLE_INIT_NUM_GRADIENT_SERVERS"),
    "trainer_id": ("APS_TRAINER_ID", "PADDLE_TRAINER_ID", "PADDLE_INIT_TRAINER_ID"),
    "ports_num": ("APS_PORTS_NUM", "PADDLE_INIT_PORTS_NUM"),
    "ports_num_for_sparse": ("APS_PORTS_NUM_FOR_SPARSE", "PADDLE_INIT_PORTS_NUM_FOR_SPARSE"),
    "token": ("APS_TOKEN",),
}

#: what aps-local tells a user's script (read by aps.fleet): where a pserver writes its bound
#: port once it listens, where a trainer appends its metrics records, and its metrics port
PORT_FILE_ENV, METRICS_FILE_ENV, METRICS_PORT_ENV = "APS_PORT_FILE", "APS_METRICS_FILE", "APS_METRICS_PORT"

#: the older contract's pserver list: these IPs, each with the one port below
OLD_PSERVER_IPS, OLD_PSERVER_PORT = "PADDLE_PSERVER_IPS", "PADDLE_PSERVER_PORT"
#: the v2 launch parameters' pserver list: these IPs, each with its first port below
V2_PSERVER_IPS, V2_PSERVER_PORT = "PADDLE_INIT_PSERVERS", "PADDLE_INIT_PORT"


def env_value(key: str, env: Mapping[str, str] | None = None) -> str | None:
    """The first of the aps / Paddle variables for ``key`` that is set and non-empty."""
    env = os.environ if env is None else env
    for name in ENV_NAMES[key]:
        value = env.get(name)
        if value:
            return value
    return None


def parse_addresses(text: str) -> list[str]:
    addresses = [a.strip() for a in text.split(",") if a.strip()]
    for address in addresses:
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"pserver address must be host:port, got {address!r}")
    return addresses


@dataclass(frozen=True)
class ClusterSpec:
    """The pservers (in index order), the number of trainers, and the ports of each pserver:
    ``ports_num`` dense ports from its address, then ``ports_num_for_sparse`` sparse ones."""

    pservers: list[str] = field(default_factory=list)
    num_trainers: int = 1
    ports_num: int = 1
    ports_num_for_sparse: int = 0

    def __post_init__(self) -> None:
        if self.num_trainers < 1:
            raise ConfigError(f"number of trainers must be >= 1, got {self.num_trainers}")
        if self.ports_num < 1 or self.ports_num_for_sparse < 0:
            raise ConfigError(f"ports per pserver must be >= 1 dense and >= 0 sparse, got {self.ports_num} and "
                              f"{self.ports_num_for_sparse}")

    @property
    def num_servers(self) -> int:
        return len(self.pservers)

    def server_index_of(self, host: str, port: int) -> int:
        """Index of ``host:port`` in the pserver list (Paddle derives it the same way)."""
        wanted = f"{host}:{port}"
        if wanted not in self.pservers:
            raise ConfigError(f"{wanted} is not in the pserver list {','.join(self.pservers)}")
        return self.pservers.index(wanted)


def _int(value: str | None, what: str, default: int | None = None) -> int | None:
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{what} must be an integer, got {value!r}") from None


def pservers_from_env(env: Mapping[str, str] | None = None) -> list[str]:
    """The pserver list: APS_PSERVERS / PADDLE_PSERVERS_IP_PORT_LIST, else the older
    PADDLE_PSERVER_IPS (comma-separated hosts) with the PADDLE_PSERVER_PORT they all listen on,
    else v2's PADDLE_INIT_PSERVERS with PADDLE_INIT_PORT (the first port of each)."""
    env = os.environ if env is None else env
    listed = env_value("pservers", env)
    if listed:
        return parse_addresses(listed)
    for ips_name, port_name in ((OLD_PSERVER_IPS, OLD_PSERVER_PORT), (V2_PSERVER_IPS, V2_PSERVER_PORT)):
        ips = [ip.strip() for ip in (env.get(ips_name) or "").split(",") if ip.strip()]
        if ips:
            return _ips_with_port(env, ips, ips_name, port_name)
    return []


def _ips_with_port(env: Mapping[str, str], ips: list[str], ips_name: str, port_name: str) -> list[str]:
    """``ip:port`` for each IP of ``ips_name``, all with the one port of ``port_name``."""
    port = env.get(port_name)
    if not port:
        raise ConfigError(f"{ips_name} is set but {port_name} is not: the pservers' port is missing")
    if len(set(ips)) != len(ips):
        raise ConfigError(f"{ips_name} names a host twice ({env[ips_name]}), but every pserver "
                          f"listens on the one {port_name}: give each pserver its own address")
    return parse_addresses(",".join(f"{ip}:{port.strip()}" for ip in ips))


def cluster_from_env(env: Mapping[str, str] | None = None) -> tuple[ClusterSpec, dict[str, object]]:
    """Cluster spec plus this process's own settings (role, host, port, indexes, token) from env."""
    pservers = pservers_from_env(env)
    trainers = _int(env_value("trainers", env), "number of trainers", 1)
    ports_num = _int(env_value("ports_num", env), "ports per pserver (PADDLE_INIT_PORTS_NUM)", 1)
    sparse = _int(env_value("ports_num_for_sparse", env), "sparse ports per pserver (PADDLE_INIT_PORTS_NUM_FOR_SPARSE)", 0)
    assert trainers is not None and ports_num is not None and sparse is not None
    role = (env_value("role", env) or "").lower() or None
    if role not in (None, "pserver", "trainer"):
        raise ConfigError(f"role must be pserver or trainer, got {role!r}")
    own = {
        "role": role,
        "host": env_value("host", env),
        "port": _int(env_value("port", env), "port"),
        "server_index": _int(env_value("server_index", env), "server index"),
        "trainer_id": _int(env_value("trainer_id", env), "trainer id"),
        "token": env_value("token", env),
    }
    return ClusterSpec(pservers, trainers, ports_num, sparse), own
