"""Table, initializer and optimizer specifications.

Specs are plain frozen dataclasses: a trainer builds them, the client sends them to every pserver
(as JSON on the control path, never pickle), and a checkpoint manifest stores them. Two specs are
"the same table" exactly when their dicts are equal, which is what makes ``create_table``
idempotent across trainers.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Union

from .errors import ConfigError

_NAME_RE = re.compile(r"^[A-Za-z0-9_.:@/-]{1,200}$")


# ---------------------------------------------------------------- initializers


@dataclass(frozen=True)
class Uniform:
    """Values drawn uniformly from [low, high)."""

    low: float = -0.01
    high: float = 0.01

    def __post_init__(self) -> None:
        if not (math.isfinite(self.low) and math.isfinite(self.high)) or self.high < self.low:
            raise ConfigError(f"Uniform needs finite low <= high, got ({self.low}, {self.high})")


@dataclass(frozen=True)
class Constant:
    """Every value equal to ``value`` (zeros by default)."""

    value: float = 0.0

    def __post_init__(self) -> None:
        if not math.isfinite(self.value):
            raise ConfigError(f"Constant value must be finite, got {self.value}")


@dataclass(frozen=True)
class Normal:
    """Values drawn from a normal distribution N(mean, std^2)."""

    mean: float = 0.0
    std: float = 0.01

    def __post_init__(self) -> None:
        if not (math.isfinite(self.mean) and math.isfinite(self.std)) or self.std < 0:
            raise ConfigError(f"Normal needs finite mean and std >= 0, got ({self.mean}, {self.std})")


Initializer = Union[Uniform, Constant, Normal]

# ---------------------------------------------------------------- learning-rate schedule


@dataclass(frozen=True)
class ExponentialDecay:
    """lr * decay_rate ** (step / decay_steps), floored when ``staircase`` (Paddle's default)."""

    decay_steps: int
    decay_rate: float
    staircase: bool = True

    def __post_init__(self) -> None:
        if self.decay_steps <= 0 or not (math.isfinite(self.decay_rate) and self.decay_rate > 0):
            raise ConfigError(f"ExponentialDecay needs decay_steps > 0 and decay_rate > 0, got {self}")

    def factor(self, step: int) -> float:
        """Multiplier of the base learning rate after ``step`` optimizer applications."""
        exponent = step / self.decay_steps
        if self.staircase:
            exponent = math.floor(exponent)
        return float(self.decay_rate**exponent)


# ---------------------------------------------------------------- optimizers


def _check_lr(lr: float) -> None:
    if not (math.isfinite(lr) and lr > 0):
        raise ConfigError(f"learning rate must be a positive finite number, got {lr}")


@dataclass(frozen=True)
class SGD:
    """param -= lr * grad."""

    lr: float = 0.01
    decay: ExponentialDecay | None = None

    def __post_init__(self) -> None:
        _check_lr(self.lr)


@dataclass(frozen=True)
class Adagrad:
    """acc += g*g; param -= lr * g / (sqrt(acc) + epsilon)  (Paddle's adagrad)."""

    lr: float = 0.01
    epsilon: float = 1e-6
    initial_accumulator: float = 0.0
    decay: ExponentialDecay | None = None

    def __post_init__(self) -> None:
        _check_lr(self.lr)


@dataclass(frozen=True)
class Adam:
    """Adam with bias correction; sparse tables keep a step count per row (lazy Adam)."""

    lr: float = 0.001
    beta1: float = 0.9
    beta2: float = 0.999
    epsilon: float = 1e-8
    decay: ExponentialDecay | None = None

    def __post_init__(self) -> None:
        _check_lr(self.lr)
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise ConfigError(f"Adam betas must be in [0, 1), got {self.beta1}, {self.beta2}")


Optimizer = Union[SGD, Adagrad, Adam]

# ---------------------------------------------------------------- tables


@dataclass(frozen=True)
class SparseTable:
    """``rows`` x ``dim`` float32 rows addressed by int64 id; row r lives on pserver r % n."""

    name: str
    rows: int
    dim: int
    init: Initializer = field(default_factory=lambda: Uniform(-0.01, 0.01))
    optimizer: Optimizer = field(default_factory=SGD)
    seed: int = 0

    def __post_init__(self) -> None:
        _check_name(self.name)
        if self.rows <= 0 or self.dim <= 0:
            raise ConfigError(f"table {self.name!r}: rows and dim must be positive, got {self.rows} x {self.dim}")
        _check_parts(self.name, self.init, self.optimizer)

    @property
    def kind(self) -> str:
        return "sparse"


@dataclass(frozen=True)
class DenseTable:
    """A dense float32 tensor, flattened and cut into blocks spread over the pservers."""

    name: str
    shape: tuple[int, ...]
    init: Initializer = field(default_factory=Constant)
    optimizer: Optimizer = field(default_factory=SGD)
    seed: int = 0

    def __post_init__(self) -> None:
        _check_name(self.name)
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        if not self.shape or any(s <= 0 for s in self.shape):
            raise ConfigError(f"table {self.name!r}: shape must be non-empty and positive, got {self.shape}")
        _check_parts(self.name, self.init, self.optimizer)

    @property
    def kind(self) -> str:
        return "dense"

    @property
    def size(self) -> int:
        return math.prod(self.shape)


TableSpec = Union[SparseTable, DenseTable]


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ConfigError(f"table name must match {_NAME_RE.pattern}, got {name!r}")


def _check_parts(name: str, init: Any, optimizer: Any) -> None:
    if not isinstance(init, (Uniform, Constant, Normal)):
        raise ConfigError(f"table {name!r}: init must be Uniform, Constant or Normal, got {init!r}")
    if not isinstance(optimizer, (SGD, Adagrad, Adam)):
        raise ConfigError(f"table {name!r}: optimizer must be SGD, Adagrad or Adam, got {optimizer!r}")


# ---------------------------------------------------------------- (de)serialisation

_CLASSES: dict[str, type] = {
    cls.__name__: cls
    for cls in (Uniform, Constant, Normal, ExponentialDecay, SGD, Adagrad, Adam, SparseTable, DenseTable)
}


def spec_to_dict(obj: Any) -> dict[str, Any]:
    """A JSON-ready dict with a ``type`` key at every level, so it round-trips exactly."""
    out: dict[str, Any] = {"type": type(obj).__name__}
    for key, value in asdict(obj).items():
        attr = getattr(obj, key)
        if type(attr).__name__ in _CLASSES:
            out[key] = spec_to_dict(attr)
        elif isinstance(value, tuple):
            out[key] = list(value)
        else:
            out[key] = value
    return out


def spec_from_dict(data: dict[str, Any]) -> Any:
    """Inverse of :func:`spec_to_dict`; raises :class:`ConfigError` on unknown types or fields."""
    if not isinstance(data, dict) or data.get("type") not in _CLASSES:
        raise ConfigError(f"not a spec: {data!r}")
    cls = _CLASSES[data["type"]]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key == "type":
            continue
        kwargs[key] = spec_from_dict(value) if isinstance(value, dict) else value
    if cls is DenseTable and "shape" in kwargs:
        kwargs["shape"] = tuple(kwargs["shape"])
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"bad fields for {cls.__name__}: {exc}") from exc
