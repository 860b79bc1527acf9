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
APS_TRAINER_ID            PADDLE_TRAINER_ID             PADDLE_TRAINER_ID            PADDLE_INIT_TRAINER_ID            this trainer's index (last: JOB_COMPLETION_INDEX)
APS_PORTS_NUM             -                             -                            PADDLE_INIT_PORTS_NUM             dense ports per pserver
APS_PORTS_NUM_FOR_SPARSE  -                             -                            PADDLE_INIT_PORTS_NUM_FOR_SPARSE  sparse ports per pserver
APS_TOKEN                 -                             -                            -                                 shared secret for the handshake
========================  ============================  ===========================  ================================  ===============================

v2's ``num_gradient_servers`` is the number of trainers (the processes that send gradients), on
the pserver as on the trainers; its ``PADDLE_INIT_TRAINER_COUNT`` is the number of compute
threads of one trainer, read as aps's workers (aps/trainer/strategy.py).

Role values are case-insensitive: ``PSERVER`` / ``TRAINER`` as Paddle writes them.

Kubernetes: an Indexed Job sets ``JOB_COMPLETION_INDEX`` in each pod; it is read as the trainer
id when no other name gives one, so the Job's pods need no script to turn it into
``PADDLE_TRAINER_ID``.

Slurm and MPI give every process a rank instead of a role. With ``APS_NUM_PSERVERS=N`` set,
:func:`rank_env` maps the rank (``SLURM_PROCID`` of ``SLURM_NTASKS``, else
``OMPI_COMM_WORLD_RANK`` of ``OMPI_COMM_WORLD_SIZE``) onto the names above:

- ranks ``0 .. N-1`` are pservers: index = rank, listening on all interfaces at
  ``APS_BASE_PORT + rank`` (base 7164 by default, so pservers sharing a node do not collide);
- ranks ``N .. size-1`` are trainers: id = rank - N, and there are size - N of them;
- under Slurm the pserver list is derived: the host of rank k is found by expanding
  ``SLURM_STEP_NODELIST`` (else ``SLURM_JOB_NODELIST``, e.g. ``node[01-03,07]``) and laying the
  ranks out block-wise over ``SLURM_STEP_TASKS_PER_NODE`` (else ``SLURM_TASKS_PER_NODE``, e.g.
  ``2(x3),1``), Slurm's default distribution (another ``SLURM_DISTRIBUTION`` is refused);
- under plain MPI nothing says where the other ranks run, so the pserver list must be given
  (``APS_PSERVERS`` or a Paddle name, ``host:APS_BASE_PORT+k`` for pserver k).

Names that are set explicitly win over what the rank implies.
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
    "trainer_id": ("APS_TRAINER_ID", "PADDLE_TRAINER_ID", "PADDLE_INIT_TRAINER_ID", "JOB_COMPLETION_INDEX"),
    "ports_num": ("APS_PORTS_NUM", "PADDLE_INIT_PORTS_NUM"),
    "ports_num_for_sparse": ("APS_PORTS_NUM_FOR_SPARSE", "PADDLE_INIT_PORTS_NUM_FOR_SPARSE"),
    "token": ("APS_TOKEN",),
}

#: what aps-local tells a user's script (read by aps.fleet): where a pserver writes its bound
#: port once it listens, where a trainer appends its metrics records, and its metrics port
PORT_FILE_ENV, METRICS_FILE_ENV, METRICS_PORT_ENV = "APS_PORT_FILE", "APS_METRICS_FILE", "APS_METRICS_PORT"
#: ... and the directory a trainer writes its TensorBoard scalars into (aps-local --tensorboard)
TENSORBOARD_ENV = "APS_TENSORBOARD_DIR"

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
    """Cluster spec plus this process's own settings (role, host, port, indexes, token) from env.

    Under Slurm or MPI with ``APS_NUM_PSERVERS`` set, the rank's role and index (and, from
    Slurm's node list, the pserver list) fill in whatever the names above leave unset."""
    env = os.environ if env is None else env
    env = {**rank_env(env), **{k: v for k, v in env.items() if v}}
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


#: how many of the ranks (the first ones) are pservers; the first pserver's port
NUM_PSERVERS_ENV, BASE_PORT_ENV = "APS_NUM_PSERVERS", "APS_BASE_PORT"
DEFAULT_BASE_PORT = 7164
#: (rank, size) variables of each launcher, in the order they are looked for
RANK_NAMES = (("SLURM_PROCID", "SLURM_NTASKS"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"))


def _split_top(text: str) -> list[str]:
    """Split a Slurm host list at the commas that are not inside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ConfigError(f"Slurm node list {text!r}: ']' without '['")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ConfigError(f"Slurm node list {text!r}: '[' without ']'")
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _expand_range(text: str, spec: str) -> list[str]:
    """``01-03,07`` -> ``01 02 03 07`` (zero padding kept, as Slurm writes it)."""
    out: list[str] = []
    for item in spec.split(","):
        lo, sep, hi = item.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ConfigError(f"Slurm node list {text!r}: bad range {item!r}")
        if not sep:
            out.append(lo)
            continue
        if int(hi) < int(lo):
            raise ConfigError(f"Slurm node list {text!r}: range {item!r} runs backwards")
        out.extend(str(n).zfill(len(lo)) for n in range(int(lo), int(hi) + 1))
    return out


def expand_nodelist(text: str) -> list[str]:
    """Slurm's compressed host list in order: ``node[01-03,07],gpu1`` -> node01, node02, node03,
    node07, gpu1; several bracket groups in one name give every combination, first group
    outermost (``r[1-2]n[1-2]`` -> r1n1 r1n2 r2n1 r2n2), as ``scontrol show hostnames`` does."""
    hosts: list[str] = []
    for part in _split_top(text):
        names = [""]
        rest = part
        while rest:
            head, bracket, tail = rest.partition("[")
            if not bracket:
                names = [n + head for n in names]
                break
            spec, _, rest = tail.partition("]")
            names = [n + head + v for n in names for v in _expand_range(text, spec)]
        hosts.extend(names)
    return hosts


def expand_tasks_per_node(text: str) -> list[int]:
    """Slurm's tasks per node, ``2(x3),1`` -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for item in text.split(","):
        count, _, times = item.strip().partition("(x")
        if not count.isdigit() or (times and not (times.endswith(")") and times[:-1].isdigit())):
            raise ConfigError(f"Slurm tasks per node {text!r}: bad item {item!r}")
        counts.extend([int(count)] * (int(times[:-1]) if times else 1))
    return counts


def _rank_and_size(env: Mapping[str, str]) -> tuple[int, int, str] | None:
    for rank_name, size_name in RANK_NAMES:
        if env.get(rank_name) and env.get(size_name):
            rank = _int(env[rank_name], rank_name)
            size = _int(env[size_name], size_name)
            assert rank is not None and size is not None
            if not 0 <= rank < size:
                raise ConfigError(f"{rank_name}={rank} is not below {size_name}={size}")
            return rank, size, rank_name
    return None


def slurm_rank_hosts(env: Mapping[str, str], size: int) -> list[str]:
    """The host of every rank of this Slurm step, ranks laid out block-wise over the nodes."""
    distribution = env.get("SLURM_DISTRIBUTION", "block")
    if not distribution.startswith("block"):
        raise ConfigError(f"SLURM_DISTRIBUTION={distribution}: aps maps ranks to nodes block-wise "
                          f"(Slurm's default); run srun with --distribution=block")
    nodes = expand_nodelist(env.get("SLURM_STEP_NODELIST") or env["SLURM_JOB_NODELIST"])
    per_node_text = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    per_node = expand_tasks_per_node(per_node_text) if per_node_text else [1] * len(nodes)
    if len(per_node) != len(nodes) or sum(per_node) != size:
        raise ConfigError(f"Slurm's {len(nodes)} nodes with tasks per node {per_node_text or 'unset (1 each)'} "
                          f"do not hold the {size} tasks of this step")
    return [node for node, count in zip(nodes, per_node) for _ in range(count)]


def rank_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The aps names a Slurm / MPI rank implies (see the module's docstring for the mapping);
    empty when ``APS_NUM_PSERVERS`` is not set. Raises ConfigError when it is set but no rank is
    known, or when it leaves no trainer."""
    env = os.environ if env is None else env
    if not env.get(NUM_PSERVERS_ENV):
        return {}
    servers = _int(env[NUM_PSERVERS_ENV], NUM_PSERVERS_ENV)
    base = _int(env.get(BASE_PORT_ENV) or None, BASE_PORT_ENV, DEFAULT_BASE_PORT)
    assert servers is not None and base is not None
    found = _rank_and_size(env)
    if found is None:
        names = " or ".join(f"{r} / {s}" for r, s in RANK_NAMES)
        raise ConfigError(f"{NUM_PSERVERS_ENV} is set but no rank is: expected {names} (run under srun or mpirun)")
    rank, size, rank_name = found
    if not 1 <= servers < size:
        raise ConfigError(f"{NUM_PSERVERS_ENV}={servers} must be at least 1 and leave a trainer among the {size} ranks")
    if not (0 < base and base + servers - 1 < 65536):
        raise ConfigError(f"{BASE_PORT_ENV}={base}: the pservers' ports {base}..{base + servers - 1} are not valid")
    out = {"APS_TRAINERS": str(size - servers)}
    if rank < servers:
        out.update(APS_ROLE="pserver", APS_SERVER_INDEX=str(rank), APS_HOST="0.0.0.0", APS_PORT=str(base + rank))
    else:
        out.update(APS_ROLE="trainer", APS_TRAINER_ID=str(rank - servers))
    if rank_name == "SLURM_PROCID" and (env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")):
        hosts = slurm_rank_hosts(env, size)
        out["APS_PSERVERS"] = ",".join(f"{hosts[k]}:{base + k}" for k in range(servers))
    return out
