"""The reference's role API for a user's own training script (Paddle's ``fleet``).

One script runs in every role; the environment says which (``aps-local NxM -- python train.py``
and ``aps-launch`` set it, as do the reference's launchers and ``local_cluster.sh`` scripts)::

    from aps.fleet import DistributedStrategy, Fleet

    fleet = Fleet()
    fleet.init()                                   # role from the environment
    strategy = DistributedStrategy()
    strategy.a_sync = True                         # async; False: sync
    strategy.a_sync_configs = {"k_steps": 100}     # k_steps > 0: geo
    if fleet.is_server():
        fleet.init_server(model_path)              # warm start from a checkpoint, or None
        fleet.run_server()                         # returns once every trainer has stopped
    else:
        worker = fleet.init_worker(model, strategy)    # model: an aps.trainer.Model plug-in
        for epoch in range(epochs):
            for batch in worker.batches(my_reader()):  # lines in the model's input format
                loss = worker.step(batch)              # this step's mean loss
            worker.end_epoch()
        if fleet.is_first_worker():
            worker.save("model/final")
        fleet.stop_worker()

``Fleet`` is an object rather than module state, so two fleets (tests, an application that
embeds one) never share a role. What runs where in a worker: see :mod:`aps.trainer.stepwise` (the
model's step in the script's own thread, the communicator on a background thread, no worker
processes). The pserver role runs the ordinary :class:`~aps.server.PServer` in the script's process.

Environment read by :func:`PaddleCloudRoleMaker` (only when called): every name of
:mod:`aps.cluster` (aps's, Paddle Fleet's and the older transpiler contract), plus three that
``aps-local`` sets for scripts: ``APS_PORT_FILE`` (a pserver writes its bound port there once it
listens), ``APS_METRICS_FILE`` (a trainer appends its metrics records there) and
``APS_METRICS_PORT`` (serve Prometheus metrics on that port).
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import IntEnum
from typing import Any

import structlog

from .cluster import (METRICS_FILE_ENV, METRICS_PORT_ENV, PORT_FILE_ENV, TENSORBOARD_ENV, ClusterSpec, cluster_from_env,
                      parse_addresses)
from .errors import ApsError, CloseReason, ConfigError, ConnectionLost
from .server import PServer, ServerConfig
from .trainer.files import split_files
from .trainer.model import Model
from .trainer.stepwise import StepTrainer
from .trainer.strategy import Strategy
from .trainer.trainer import TrainOptions

log = structlog.get_logger("aps.fleet")



class Role(IntEnum):
    """What this process is (Paddle's ``role_maker.Role``)."""

    WORKER = 1
    SERVER = 2


@dataclass(frozen=True)
class RoleMaker:
    """This process's place in the cluster: its role, its index among its kind, the number of
    workers and every pserver's address (Paddle's role makers carry the same facts)."""

    role: Role
    current_id: int
    worker_num: int
    server_endpoints: tuple[str, ...]
    #: a pserver's own address (defaults to ``server_endpoints[current_id]``)
    host: str | None = None
    port: int | None = None
    token: str | None = None
    #: set by aps-local: where a pserver writes its port, where a trainer writes its metrics
    #: (records, port, TensorBoard scalars)
    port_file: str | None = None
    metrics_file: str | None = None
    metrics_port: int | None = None
    tensorboard: str | None = None
    #: ports of each pserver (v2's PADDLE_INIT_PORTS_NUM / _FOR_SPARSE; aps/client/lanes.py)
    ports_num: int = 1
    ports_num_for_sparse: int = 0

    def __post_init__(self) -> None:
        if self.worker_num < 1:
            raise ConfigError(f"worker_num must be >= 1, got {self.worker_num}")
        if not self.server_endpoints:
            raise ConfigError("no pserver endpoints: a parameter-server job needs at least one pserver")
        parse_addresses(",".join(self.server_endpoints))
        if self.role == Role.SERVER:
            if not 0 <= self.current_id < len(self.server_endpoints):
                raise ConfigError(f"server index {self.current_id} not in [0, {len(self.server_endpoints)})")
            host, _, port = self.server_endpoints[self.current_id].rpartition(":")
            if self.host is None:
                object.__setattr__(self, "host", host)
            if self.port is None:
                object.__setattr__(self, "port", int(port))
        elif not 0 <= self.current_id < self.worker_num:
            raise ConfigError(f"trainer id {self.current_id} not in [0, {self.worker_num})")

    def is_worker(self) -> bool:
        return self.role == Role.WORKER

    def is_server(self) -> bool:
        return self.role == Role.SERVER

    def is_first_worker(self) -> bool:
        return self.is_worker() and self.current_id == 0

    def worker_index(self) -> int:
        return self.current_id if self.is_worker() else -1

    def server_index(self) -> int:
        return self.current_id if self.is_server() else -1

    def server_num(self) -> int:
        return len(self.server_endpoints)

    def cluster(self) -> ClusterSpec:
        return ClusterSpec(list(self.server_endpoints), self.worker_num, self.ports_num, self.ports_num_for_sparse)


def PaddleCloudRoleMaker(is_collective: bool = False, env: Mapping[str, str] | None = None) -> RoleMaker:  # noqa: N802
    """The role from the environment, as Paddle's ``PaddleCloudRoleMaker`` reads it.

    Missing facts are errors naming the variables that give them: a script never silently
    trains alone without its pservers."""
    if is_collective:
        raise ConfigError("collective training has no parameter servers; aps runs pservers and trainers "
                          "(use is_collective=False)")
    env = os.environ if env is None else env
    cluster, own = cluster_from_env(env)
    if own["role"] is None:
        raise ConfigError("no role in the environment: set TRAINING_ROLE (PSERVER or TRAINER), "
                          "PADDLE_TRAINING_ROLE or APS_ROLE; `aps-local NxM -- python script.py` sets it")
    if not cluster.pservers:
        raise ConfigError("no pservers in the environment: set PADDLE_PSERVERS_IP_PORT_LIST (host:port,...), "
                          "PADDLE_PSERVER_IPS with PADDLE_PSERVER_PORT, or APS_PSERVERS")
    common: dict[str, Any] = dict(
        worker_num=cluster.num_trainers, server_endpoints=tuple(cluster.pservers), token=own["token"],
        metrics_port=_env_int(env, METRICS_PORT_ENV), ports_num=cluster.ports_num,
        ports_num_for_sparse=cluster.ports_num_for_sparse,
    )
    if own["role"] == "pserver":
        host = None if own["host"] is None else str(own["host"])
        port = _optional_int(own["port"])
        index = _optional_int(own["server_index"])
        if index is None:
            if host is None or port is None:
                raise ConfigError("a pserver needs its own address: POD_IP and PADDLE_PORT (or PADDLE_CURRENT_IP "
                                  "and PADDLE_PSERVER_PORT, or APS_HOST and APS_PORT), or APS_SERVER_INDEX")
            index = cluster.server_index_of(host, port)
        return RoleMaker(Role.SERVER, index, host=host, port=port, port_file=env.get(PORT_FILE_ENV) or None, **common)
    trainer_id = _optional_int(own["trainer_id"])
    if trainer_id is None:
        raise ConfigError("a trainer needs its index: set PADDLE_TRAINER_ID (or APS_TRAINER_ID)")
    return RoleMaker(Role.WORKER, trainer_id, metrics_file=env.get(METRICS_FILE_ENV) or None,
                     tensorboard=env.get(TENSORBOARD_ENV) or None, **common)


def _optional_int(value: object) -> int | None:
    """cluster_from_env's integers (already checked there), typed."""
    return None if value is None else int(str(value))


def UserDefinedRoleMaker(  # noqa: N802
    current_id: int = 0,
    role: Role = Role.WORKER,
    worker_num: int = 1,
    server_endpoints: Sequence[str] | None = None,
    **options: Any,
) -> RoleMaker:
    """A role given in code (Paddle's ``UserDefinedRoleMaker``); ``options`` are the other
    :class:`RoleMaker` fields (``token``, ``host``, ``port``, ...)."""
    return RoleMaker(Role(role), current_id, worker_num, tuple(server_endpoints or ()), **options)


def _env_int(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be an integer, got {raw!r}") from None


# ------------------------------------------------------------------------------------ strategy

#: a_sync_configs keys and the aps Strategy field each one sets (None: aps's default)
A_SYNC_KEYS = ("k_steps", "max_merge_var_num", "send_queue_size", "min_send_grad_num_before_recv", "thread_pool_size")
#: a reference key about how the reference sends (send ops or its communicator), not what it
#: computes: aps always sends through its communicator, so either value trains the same
NO_EFFECT = ("runtime_split_send_recv",)


@dataclass
class DistributedStrategy:
    """Paddle's ``fleet.DistributedStrategy`` for parameter-server training, mapped onto aps's
    modes exactly as the reference maps them:

    ==========================================  ============
    ``a_sync = False``                          sync
    ``a_sync = True`` (the default)             async
    ``a_sync = True`` and ``k_steps > 0``       geo, pushing every ``k_steps`` steps
    ``half_async = True`` (StrategyFactory)     half_async
    ==========================================  ============

    Setting ``a_sync`` resets ``k_steps`` to 0, as in the reference; set ``a_sync_configs``
    after it. ``a_sync_configs`` takes ``k_steps`` and the communicator knobs
    ``max_merge_var_num``, ``send_queue_size``, ``min_send_grad_num_before_recv`` and
    ``thread_pool_size``; unset knobs come from the ``FLAGS_communicator_*`` environment
    variables, then aps's defaults (docs/modes.md). ``launch_barrier`` (default True) makes
    ``init_worker`` wait until every pserver listens; ``runtime_split_send_recv`` is accepted and
    changes nothing (see :data:`NO_EFFECT`). Any other key is an error naming it.
    """

    _a_sync: bool = True
    _configs: dict[str, Any] = field(default_factory=lambda: {"k_steps": 0})
    half_async: bool = False
    rpc_timeout: float | None = None

    @property
    def a_sync(self) -> bool:
        return self._a_sync

    @a_sync.setter
    def a_sync(self, flag: bool) -> None:
        if not isinstance(flag, bool):
            raise ConfigError(f"a_sync must be True or False, got {flag!r}")
        self._a_sync = flag
        self._configs["k_steps"] = 0

    @property
    def a_sync_configs(self) -> dict[str, Any]:
        return dict(self._configs)

    @a_sync_configs.setter
    def a_sync_configs(self, configs: Mapping[str, Any]) -> None:
        for key, value in configs.items():
            if key in NO_EFFECT:
                if not isinstance(value, bool):
                    raise ConfigError(f"a_sync_configs[{key!r}] must be True or False, got {value!r}")
                continue
            if key == "launch_barrier":
                if not isinstance(value, bool):
                    raise ConfigError(f"a_sync_configs['launch_barrier'] must be True or False, got {value!r}")
                self._configs[key] = value
                continue
            if key not in A_SYNC_KEYS:
                known = ", ".join((*A_SYNC_KEYS, "launch_barrier", *NO_EFFECT))
                raise ConfigError(f"a_sync_configs has no key {key!r} in aps; known: {known}")
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise ConfigError(f"a_sync_configs[{key!r}] must be an integer, got {value!r}")
            self._configs[key] = value

    @property
    def launch_barrier(self) -> bool:
        """Whether init_worker first waits until every pserver accepts connections (default
        True, as the reference: a trainer started with its pservers must not fail on a race)."""
        return bool(self._configs.get("launch_barrier", True))

    @property
    def mode(self) -> str:
        k_steps = self._configs.get("k_steps") or 0
        if not self._a_sync:
            if k_steps > 0 or self.half_async:
                raise ConfigError("a_sync=False is sync mode; k_steps > 0 (geo) and half_async need a_sync=True")
            return "sync"
        if k_steps > 0:
            if self.half_async:
                raise ConfigError("half_async and k_steps > 0 (geo) are two different modes; choose one")
            return "geo"
        return "half_async" if self.half_async else "async"

    def to_strategy(self, env: Mapping[str, str] | None = None) -> Strategy:
        """The aps :class:`Strategy` of one step-wise trainer (one compute worker: the script)."""
        knobs = {k: self._configs.get(k) for k in A_SYNC_KEYS if k != "k_steps"}
        mode = self.mode
        k_steps = self._configs.get("k_steps") if mode == "geo" else None
        return Strategy.from_env(env, mode=mode, k_steps=k_steps, workers=1, rpc_timeout=self.rpc_timeout, **knobs)


@dataclass
class DistributeTranspilerConfig:
    """The older Fleet's strategy object (``sync_mode``, ``geo_sgd_mode``, ...), same mapping."""

    sync_mode: bool = True
    half_async: bool = False
    geo_sgd_mode: bool = False
    geo_sgd_need_push_nums: int = 100
    #: how the reference sends (send ops or its communicator); aps always uses its communicator
    runtime_split_send_recv: bool = False

    def to_strategy(self, env: Mapping[str, str] | None = None) -> Strategy:
        out = DistributedStrategy()
        out.a_sync = not self.sync_mode or self.geo_sgd_mode or self.half_async
        out.half_async = self.half_async
        if self.geo_sgd_mode:
            out.a_sync_configs = {"k_steps": self.geo_sgd_need_push_nums}
        return out.to_strategy(env)


class StrategyFactory:
    """The reference's ready-made strategies (``StrategyFactory.create_*_strategy()``)."""

    @staticmethod
    def create_sync_strategy() -> DistributedStrategy:
        out = DistributedStrategy()
        out.a_sync = False
        return out

    @staticmethod
    def create_half_async_strategy() -> DistributedStrategy:
        out = DistributedStrategy()
        out.half_async = True
        return out

    @staticmethod
    def create_async_strategy() -> DistributedStrategy:
        return DistributedStrategy()

    @staticmethod
    def create_geo_strategy(k_steps: int) -> DistributedStrategy:
        if k_steps < 1:
            raise ConfigError(f"geo strategy needs k_steps >= 1, got {k_steps}")
        out = DistributedStrategy()
        out.a_sync_configs = {"k_steps": k_steps}
        return out


AnyStrategy = DistributedStrategy | DistributeTranspilerConfig | Strategy


def as_strategy(strategy: AnyStrategy | None) -> Strategy:
    """An aps Strategy from any of the strategy objects a script may hold (None: the default
    DistributedStrategy, i.e. async)."""
    if strategy is None:
        strategy = DistributedStrategy()
    if isinstance(strategy, Strategy):
        return strategy
    if isinstance(strategy, (DistributedStrategy, DistributeTranspilerConfig)):
        return strategy.to_strategy()
    raise ConfigError(f"strategy must be a DistributedStrategy, DistributeTranspilerConfig or aps.Strategy, "
                      f"got {type(strategy).__name__}")


def wait_for_pservers(endpoints: Sequence[str], timeout: float, poll: float = 0.1) -> None:
    """Wait until every pserver accepts a TCP connection (the reference's launch barrier): a
    trainer that a script launcher starts together with its pservers must not fail because it
    came up first. Gives up with ConnectionLost naming the pservers that never listened."""
    deadline = time.monotonic() + timeout
    waiting = list(endpoints)
    while waiting:
        host, _, port = waiting[0].rpartition(":")
        try:
            with socket.create_connection((host, int(port)), timeout=max(0.1, min(5.0, deadline - time.monotonic()))):
                pass
            waiting.pop(0)
            continue
        except OSError:
            if time.monotonic() >= deadline:
                raise ConnectionLost(
                    f"pserver(s) {', '.join(waiting)} did not accept connections within {timeout:g} s", CloseReason.CONNECT_FAILED
                ) from None
        time.sleep(poll)


# ------------------------------------------------------------------------------------ fleet


class Fleet:
    """The role API of one process: who it is, and the calls that run its role."""

    def __init__(self) -> None:
        self._role: RoleMaker | None = None
        self._strategy: AnyStrategy | None = None
        self._server_config: ServerConfig | None = None
        self._worker: StepTrainer | None = None

    # -- who am I

    def init(self, role_maker: RoleMaker | None = None, is_collective: bool = False,
             strategy: AnyStrategy | None = None) -> Fleet:
        """Take the role from ``role_maker``, or from the environment (PaddleCloudRoleMaker)."""
        if is_collective:
            raise ConfigError("collective training has no parameter servers; aps runs pservers and trainers")
        self._role = role_maker if role_maker is not None else PaddleCloudRoleMaker()
        self._strategy = strategy
        log.info("fleet role", role=self._role.role.name.lower(), index=self._role.current_id,
                 workers=self._role.worker_num, servers=self._role.server_num())
        return self

    @property
    def role(self) -> RoleMaker:
        if self._role is None:
            raise ApsError("call fleet.init() first")
        return self._role

    def is_server(self) -> bool:
        return self.role.is_server()

    def is_worker(self) -> bool:
        return self.role.is_worker()

    def is_first_worker(self) -> bool:
        return self.role.is_first_worker()

    def worker_index(self) -> int:
        return self.role.worker_index()

    def server_index(self) -> int:
        return self.role.server_index()

    def worker_num(self) -> int:
        return self.role.worker_num

    def server_num(self) -> int:
        return self.role.server_num()

    def server_endpoints(self, to_string: bool = False) -> list[str] | str:
        endpoints = list(self.role.server_endpoints)
        return ",".join(endpoints) if to_string else endpoints

    def split_files(self, files: Sequence[str]) -> list[str]:
        """This worker's share of ``files``: contiguous blocks of the sorted list, disjoint
        between workers, sizes differing by at most one (see aps.trainer.files.split_files)."""
        role = self._need(Role.WORKER, "split_files")
        return split_files(files, role.current_id, role.worker_num)

    # -- the pserver role

    def init_server(self, model_path: str | None = None, **options: Any) -> None:
        """Configure this pserver; ``model_path`` warm-starts it from a checkpoint saved by any
        number of pservers. ``options`` are :class:`ServerConfig` fields (``max_frame``, ...)."""
        role = self._need(Role.SERVER, "init_server")
        if model_path is not None and not os.path.isdir(model_path):
            raise ConfigError(f"init_server: no checkpoint directory {model_path!r}")
        if role.metrics_port is not None:
            options.setdefault("metrics_port", role.metrics_port)
        options.setdefault("exit_when_done", True)  # run_server returns once every trainer stopped
        self._server_config = ServerConfig(
            host=str(role.host), port=int(role.port or 0), server_index=role.current_id,
            num_servers=role.server_num(), num_trainers=role.worker_num, token=role.token,
            init_model=model_path, ports_num=role.ports_num, ports_num_for_sparse=role.ports_num_for_sparse, **options,
        )

    def run_server(self) -> None:
        """Serve until every trainer has called stop_worker (or SIGTERM / Ctrl-C: a graceful
        stop with a last checkpoint when ``checkpoint_dir`` is set, as aps-server's), then return."""
        self._need(Role.SERVER, "run_server")
        if self._server_config is None:
            raise ApsError("call fleet.init_server() before fleet.run_server()")
        asyncio.run(self._serve(self._server_config))

    async def _serve(self, config: ServerConfig) -> None:
        await PServer(config).serve_until_signalled(self.role.port_file)

    # -- the worker role

    def init_worker(self, model: Model, strategy: AnyStrategy | None = None,
                    options: TrainOptions | None = None) -> StepTrainer:
        """Connect this trainer in the strategy's mode (the one given here, else the one given
        to :meth:`init`, else the model's preferred mode, else async), create the model's tables, fill the local replica; returns
        the :class:`StepTrainer` whose ``step(batch)`` trains one batch."""
        role = self._need(Role.WORKER, "init_worker")
        if self._worker is not None:
            raise ApsError("init_worker() was already called")
        if not isinstance(model, Model):
            raise ConfigError(f"init_worker needs an aps.trainer.Model plug-in, got {type(model).__name__}")
        given = strategy if strategy is not None else self._strategy
        chosen = as_strategy(given)
        if given is None:  # the model's preferred mode, as aps-trainer without --mode
            chosen = replace(chosen, mode=None)
        if not isinstance(given, DistributedStrategy) or given.launch_barrier:
            wait_for_pservers(role.server_endpoints, chosen.rpc_timeout)
        if options is None:
            options = TrainOptions(save_dir=None, token=role.token, metrics_path=role.metrics_file,
                                   metrics_port=role.metrics_port, tensorboard=role.tensorboard)
        self._worker = StepTrainer(model, chosen, role.cluster(), role.current_id, options).start()
        return self._worker

    @property
    def worker(self) -> StepTrainer:
        if self._worker is None:
            raise ApsError("call fleet.init_worker(model) first")
        return self._worker

    def barrier_worker(self) -> None:
        """Wait until every trainer reached this call (the n-th call meets the others' n-th)."""
        self.worker.barrier()

    def save_persistables(self, dirname: str) -> None:
        """Every pserver saves its shard of every table under ``dirname`` (call on one trainer)."""
        self.worker.save(dirname)

    def stop_worker(self) -> dict[str, Any]:
        """End training on this trainer and tell the pservers (they exit after the last one)."""
        return self.worker.stop()

    def _need(self, kind: Role, call: str) -> RoleMaker:
        role = self.role
        if role.role != kind:
            other = "init_server/run_server" if role.is_server() else "init_worker/stop_worker"
            raise ApsError(f"{call}() on a {role.role.name.lower()} process; this role calls {other}")
        return role
