"""How a trainer talks to the pservers: the mode and Paddle's communicator knobs.

Semantics of the modes are in docs/modes.md. Defaults follow Paddle: the merge/queue/recv knobs
default to the number of compute workers, geo pushes every 400 trainer steps, RPC retries 3.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError

if TYPE_CHECKING:
    from .model import Model

#: the mode of a model that states no preference (the reference's default, ``a_sync = True``)
DEFAULT_MODE = "async"
MODES = ("sync", "async", "half_async", "geo", "hybrid")
MERGES = ("auto", "sum", "average")

#: environment variables accepted for each field (aps name first, then Paddle's FLAGS_* name)
ENV: dict[str, tuple[str, ...]] = {
    "mode": ("APS_MODE",),
    "k_steps": ("APS_K_STEPS", "FLAGS_geo_sgd_need_push_nums"),
    "max_merge_var_num": ("APS_MAX_MERGE_VAR_NUM", "FLAGS_communicator_max_merge_var_num"),
    "send_queue_size": ("APS_SEND_QUEUE_SIZE", "FLAGS_communicator_send_queue_size"),
    "min_send_grad_num_before_recv": ("APS_MIN_SEND_GRAD_NUM_BEFORE_RECV", "FLAGS_communicator_min_send_grad_num_before_recv"),
    "thread_pool_size": ("APS_THREAD_POOL_SIZE", "FLAGS_communicator_thread_pool_size"),
    "merge": ("APS_MERGE",),
    "max_staleness": ("APS_MAX_STALENESS",),  # Paddle has no such bound, so no FLAGS_* name
    "rpc_retry_times": ("APS_RPC_RETRY_TIMES", "FLAGS_rpc_retry_times"),
    "rpc_timeout": ("APS_RPC_TIMEOUT",),
    "rpc_deadline": ("APS_RPC_DEADLINE",),
    "geo_cache_rows": ("APS_GEO_CACHE_ROWS",),
    "dense_lag": ("APS_DENSE_LAG",),
    "workers": ("APS_WORKERS", "CPU_NUM", "PADDLE_INIT_TRAINER_COUNT"),  # v2: a trainer's compute threads
}


@dataclass(frozen=True)
class Strategy:
    """Mode and communicator settings of a trainer. ``None`` knobs mean "Paddle's default"."""

    #: None: the model's preferred mode (:attr:`Model.preferred_mode`; the CTR models': hybrid),
    #: else async, made concrete by :meth:`for_model` when a trainer is built, so that
    #: aps-trainer, aps-local, aps.Trainer and the fleet step loop all pick the same one
    mode: str | None = None
    k_steps: int = 400
    max_merge_var_num: int | None = None
    send_queue_size: int | None = None
    min_send_grad_num_before_recv: int | None = None
    thread_pool_size: int = 5
    merge: str = "auto"
    rpc_retry_times: int = 3
    rpc_timeout: float = 120.0
    #: seconds a lost pserver is retried (reconnecting) before a call fails: long enough for a
    #: pserver restarted with --resume (docs/operations.md)
    rpc_deadline: float = 120.0
    workers: int | None = None
    #: async: ask for the next batch's rows while the current one computes (off only to measure)
    prefetch: bool = True
    #: a worker computes only with sparse rows that lack the gradients of at most this many of
    #: this trainer's batches (docs/modes.md, "Staleness"); None: no bound
    max_staleness: int | None = None
    #: geo: the rows of each hash table's local cache (docs/modes.md, "geo"); None: the keys its
    #: pservers may hold (``max_keys`` x pservers), at most 2^20
    geo_cache_rows: int | None = None
    #: hybrid: the rounds a worker's dense parameters may lag behind (docs/modes.md, "hybrid"):
    #: 0, each step waits for the previous step's dense round; 1, that round runs while the next
    #: step computes. None: the mode's default (``HybridRounds.default_dense_lag``)
    dense_lag: int | None = None

    def __post_init__(self) -> None:
        if self.mode is not None and self.mode not in MODES:
            raise ConfigError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.merge not in MERGES:
            raise ConfigError(f"merge must be one of {', '.join(MERGES)}, got {self.merge!r}")
        for name in ("k_steps", "max_merge_var_num", "send_queue_size", "min_send_grad_num_before_recv", "thread_pool_size", "workers", "geo_cache_rows"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{name} must be >= 1, got {value}")
        if self.max_staleness is not None and self.max_staleness < 0:
            raise ConfigError(f"max_staleness must be >= 0 (or None: no bound), got {self.max_staleness}")
        if self.dense_lag not in (None, 0, 1):
            raise ConfigError(f"dense_lag must be 0 or 1 (or None: the mode's default), got {self.dense_lag}")
        if self.rpc_retry_times < 0 or self.rpc_timeout <= 0 or self.rpc_deadline <= 0:
            raise ConfigError("rpc_retry_times must be >= 0, rpc_timeout and rpc_deadline > 0")

    def resolved(self, cpu_count: int | None = None) -> Strategy:
        """A copy with every ``None`` knob replaced by its default (which depends on workers)."""
        workers = self.workers or cpu_count or os.cpu_count() or 1
        return replace(
            self,
            workers=workers,
            max_merge_var_num=self.max_merge_var_num or workers,
            send_queue_size=self.send_queue_size or workers,
            min_send_grad_num_before_recv=self.min_send_grad_num_before_recv or workers,
        )

    def for_model(self, model: Model) -> Strategy:
        """This strategy with its mode made concrete for ``model``: the mode given, else the
        model's preferred mode, else :data:`DEFAULT_MODE` (the reference's async)."""
        if self.mode is not None:
            return self
        return replace(self, mode=model.preferred_mode or DEFAULT_MODE)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Strategy:
        """Fields from APS_* / Paddle FLAGS_* variables, then ``overrides`` (non-None) on top."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        types = {f.name: f.type for f in fields(cls)}
        for name, names in ENV.items():
            for var in names:
                raw = env.get(var)
                if raw:
                    values[name] = _convert(name, raw, str(types[name]))
                    break
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


def _convert(name: str, raw: str, type_name: str) -> Any:
    try:
        if "int" in type_name:
            return int(raw)
        if "float" in type_name:
            return float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number, got {raw!r}") from None
    return raw
