"""Table, initializer and optimizer specifications.

Specs are plain frozen dataclasses: a trainer builds them, the client sends them to every pserver
(as JSON on the control path, never pickle), and a checkpoint manifest stores them. Two specs are
"the same table" exactly when their dicts are equal, which is what makes ``create_table``
idempotent across trainers.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar, Union

from .errors import ConfigError

_NAME_RE = re.compile(r"^[A-Za-z0-9_.:@/-]{1,200}$")
#: ids travel as int64, so a table has fewer rows than this; a dense table fewer elements
_MAX_ROWS = (1 << 63) - 1
#: generous bounds that keep size arithmetic and the wire's u64 shapes sane
_MAX_DIM = (1 << 31) - 1
_MAX_SEED = (1 << 63) - 1


# ---------------------------------------------------------------- field checks
#
# Specs arrive as JSON from any client (CREATE_TABLE) and from checkpoint manifests, so every
# field is checked for its type, not only its range: ``rows: 10.5`` or ``rows: true`` are
# refused, never truncated or taken as 1. Numbers are normalised to plain int / float (a numpy
# integer from a user's script becomes an int, so the spec still serialises to JSON).


def _int(owner: str, name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigError(f"{owner}: {name} must be an integer, got {value!r}")
    value = int(value)
    if not low <= value <= high:
        raise ConfigError(f"{owner}: {name} must be in [{low}, {high}], got {value}")
    return value


def _real(owner: str, name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(f"{owner}: {name} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ConfigError(f"{owner}: {name} must be finite, got {value}")
    return value


def _set_numbers(obj: Any, **kinds: str) -> None:
    """Check and normalise the numeric fields of a frozen spec in place ("real" or "bool")."""
    owner = type(obj).__name__
    for name, kind in kinds.items():
        value = getattr(obj, name)
        if kind == "bool":
            if not isinstance(value, bool):
                raise ConfigError(f"{owner}: {name} must be true or false, got {value!r}")
            continue
        object.__setattr__(obj, name, _real(owner, name, value))


# ---------------------------------------------------------------- initializers


@dataclass(frozen=True)
class Uniform:
    """Values drawn uniformly from [low, high)."""

    low: float = -0.01
    high: float = 0.01

    def __post_init__(self) -> None:
        _set_numbers(self, low="real", high="real")
        if self.high < self.low:
            raise ConfigError(f"Uniform needs finite low <= high, got ({self.low}, {self.high})")


@dataclass(frozen=True)
class Constant:
    """Every value equal to ``value`` (zeros by default)."""

    value: float = 0.0

    def __post_init__(self) -> None:
        _set_numbers(self, value="real")


@dataclass(frozen=True)
class Normal:
    """Values drawn from a normal distribution N(mean, std^2)."""

    mean: float = 0.0
    std: float = 0.01

    def __post_init__(self) -> None:
        _set_numbers(self, mean="real", std="real")
        if self.std < 0:
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
        object.__setattr__(self, "decay_steps", _int("ExponentialDecay", "decay_steps", self.decay_steps, 1, _MAX_ROWS))
        _set_numbers(self, decay_rate="real", staircase="bool")
        if self.decay_rate <= 0:
            raise ConfigError(f"ExponentialDecay needs decay_steps > 0 and decay_rate > 0, got {self}")

    def factor(self, step: int) -> float:
        """Multiplier of the base learning rate after ``step`` optimizer applications."""
        exponent = step / self.decay_steps
        if self.staircase:
            exponent = math.floor(exponent)
        return float(self.decay_rate**exponent)


# ---------------------------------------------------------------- optimizers
#
# Every optimizer takes two more fields, applied by the pserver to each gradient it receives,
# after duplicate ids are summed and the push's scale (sync: 1 / trainers) is applied:
#
# * ``clip_norm`` (None: off): each sparse row's gradient g (one id or key) is scaled to
#   ``g * clip_norm / max(|g|, clip_norm)``; the norm is a row's, so it does not depend on how
#   many other rows the push carries nor on which pserver holds the row. A dense table's
#   gradient is spread over pservers in blocks, where no one server sees its norm: an optimizer
#   with clip_norm is refused on a dense table (docs/concepts.md, "Regularisation and clipping").
# * ``l2`` (0: off): the penalty ``l2 / 2 * |w|^2``, the reference's L2Decay: ``g += l2 * w``
#   after clipping and before the update, on the rows a push touches only (lazy, as the
#   reference's sparse regularisation); every element of a dense block at each push. FTRL puts
#   its l2 in its closed-form update instead, the same penalty.


def _check_optimizer(opt: Any, **kinds: str) -> None:
    _set_numbers(opt, lr="real", l2="real", **kinds)
    if opt.lr <= 0:
        raise ConfigError(f"learning rate must be a positive finite number, got {opt.lr}")
    if opt.decay is not None and not isinstance(opt.decay, ExponentialDecay):
        raise ConfigError(f"{type(opt).__name__}: decay must be ExponentialDecay or null, got {opt.decay!r}")
    for name in ("epsilon", "initial_accumulator"):
        if name in kinds and getattr(opt, name) < 0:
            raise ConfigError(f"{type(opt).__name__}: {name} must be >= 0, got {getattr(opt, name)}")
    _check_regularisation(opt)


def _check_regularisation(opt: Any) -> None:
    """``l2 >= 0``; ``clip_norm`` None (no clipping) or a positive number."""
    owner = type(opt).__name__
    if opt.l2 < 0:
        raise ConfigError(f"{owner}: l2 must be >= 0, got {opt.l2}")
    if opt.clip_norm is not None:
        object.__setattr__(opt, "clip_norm", _real(owner, "clip_norm", opt.clip_norm))
        if opt.clip_norm <= 0:
            raise ConfigError(f"{owner}: clip_norm must be a positive number or null, got {opt.clip_norm}")


@dataclass(frozen=True)
class SGD:
    """param -= lr * grad."""

    lr: float = 0.01
    decay: ExponentialDecay | None = None
    l2: float = 0.0
    clip_norm: float | None = None

    def __post_init__(self) -> None:
        _check_optimizer(self)


@dataclass(frozen=True)
class Adagrad:
    """acc += g*g; param -= lr * g / (sqrt(acc) + epsilon)  (Paddle's adagrad).

    ``rowwise=True`` (sparse and hash tables): one accumulator a row instead of one a coordinate,
    taking the mean of the row's squared gradient, ``acc += mean(g*g)``, and one step size for the
    whole row, ``param -= lr * g / (sqrt(acc) + epsilon)``: the embedding default of FBGEMM and
    TorchRec. The state is 4 bytes a row instead of 4 x dim (dim 16: 4 bytes against 64)."""

    lr: float = 0.01
    epsilon: float = 1e-6
    initial_accumulator: float = 0.0
    decay: ExponentialDecay | None = None
    l2: float = 0.0
    clip_norm: float | None = None
    rowwise: bool = False

    def __post_init__(self) -> None:
        _check_optimizer(self, epsilon="real", initial_accumulator="real")
        if not isinstance(self.rowwise, bool):
            raise ConfigError(f"Adagrad: rowwise must be true or false, got {self.rowwise!r}")


#: how a sparse table's Adam corrects its bias (docs/modes.md, "Sparse Adam")
BIAS_CORRECTIONS = ("row", "step")


@dataclass(frozen=True)
class Adam:
    """Adam with bias correction. Dense tables count steps per block. Sparse tables update only
    the pushed rows (lazy), and ``bias_correction`` says with which count: ``"row"`` (each row's
    own count of updates, eps added to the corrected ``sqrt(v_hat)``) or ``"step"`` (the table's
    count of applications for every row, eps added to the raw ``sqrt(v)``: PyTorch's SparseAdam)."""

    lr: float = 0.001
    beta1: float = 0.9
    beta2: float = 0.999
    epsilon: float = 1e-8
    decay: ExponentialDecay | None = None
    bias_correction: str = "row"
    l2: float = 0.0
    clip_norm: float | None = None

    def __post_init__(self) -> None:
        _check_optimizer(self, beta1="real", beta2="real", epsilon="real")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise ConfigError(f"Adam betas must be in [0, 1), got {self.beta1}, {self.beta2}")
        if self.bias_correction not in BIAS_CORRECTIONS:
            raise ConfigError(f"Adam bias_correction must be one of {', '.join(BIAS_CORRECTIONS)}, got {self.bias_correction!r}")


@dataclass(frozen=True)
class Ftrl:
    """FTRL-Proximal (McMahan et al. 2013, "Ad Click Prediction"), per coordinate, with state
    ``z`` and ``n``::

        sigma = (sqrt(n + g^2) - sqrt(n)) / alpha;  z += g - sigma * w;  n += g^2
        w = 0 if |z| <= l1 else -(z - sign(z) l1) / ((beta + sqrt(n)) / alpha + l2)

    Sparse tables update the pushed rows only. ``l1`` makes weights exactly zero (a sparse wide
    part); ``l2`` is the same penalty as the other optimizers' but inside the closed form. The
    weight is a function of (z, n) once a coordinate is updated, so tables start at zero
    (``Constant(0)``) as in the paper. No decay: the schedule is ``alpha / (beta + sqrt(n))``."""

    alpha: float = 0.05
    beta: float = 1.0
    l1: float = 0.0
    l2: float = 0.0
    clip_norm: float | None = None

    def __post_init__(self) -> None:
        _set_numbers(self, alpha="real", beta="real", l1="real", l2="real")
        if self.alpha <= 0:
            raise ConfigError(f"Ftrl: alpha must be a positive finite number, got {self.alpha}")
        for name in ("beta", "l1"):
            if getattr(self, name) < 0:
                raise ConfigError(f"Ftrl: {name} must be >= 0, got {getattr(self, name)}")
        _check_regularisation(self)


Optimizer = Union[SGD, Adagrad, Adam, Ftrl]

# ---------------------------------------------------------------- tables
#
# Callers never ask a table spec what class it is: each kind says what they need as class-level
# facts and small methods (``by_ids``, ``keyed``, ``values_shape``, ``entries``), so that a new
# kind of spec is one class (here, or in a user's code) and nothing else asks what it is. What a
# kind *does* on a store (the pserver's kinds, the checkpoints' formats, aps-serve's served
# tables, the storage shards) is looked up by the spec's class in one table per place
# (aps/storage/table_classes.py); what reads a spec back from JSON is handed the classes it
# may build (``spec_from_dict(data, specs)``), so a kind defined outside aps crosses the wire.


@dataclass(frozen=True)
class SparseTable:
    """``rows`` x ``dim`` float32 rows addressed by int64 id, spread over the pservers by id
    (aps/sharding.py)."""

    #: rows are addressed by ids: pushes and pulls carry ids (PULL_SPARSE, PUSH_SPARSE_*), and a
    #: model's batches name the rows they read; else the table is pulled and pushed whole, in blocks
    by_ids: ClassVar[bool] = True
    #: ids are 64-bit hash keys, not row numbers: unbounded, admitted on push, with shows and
    #: clicks, shrunk, exported as deltas; else every id is a row in ``[0, rows)``
    keyed: ClassVar[bool] = False

    name: str
    rows: int
    dim: int
    init: Initializer = field(default_factory=lambda: Uniform(-0.01, 0.01))
    optimizer: Optimizer = field(default_factory=SGD)
    seed: int = 0

    def __post_init__(self) -> None:
        _check_name(self.name)
        owner = f"table {self.name!r}"
        object.__setattr__(self, "rows", _int(owner, "rows", self.rows, 1, _MAX_ROWS))
        object.__setattr__(self, "dim", _int(owner, "dim", self.dim, 1, _MAX_DIM))
        object.__setattr__(self, "seed", _int(owner, "seed", self.seed, -_MAX_SEED, _MAX_SEED))
        _check_parts(self.name, self.init, self.optimizer)

    @property
    def kind(self) -> str:
        return "sparse"

    def values_shape(self, keys: int) -> tuple[int, ...]:
        """The shape of an array holding this table's values (a trainer's replica, an
        evaluator's parameters, an export's table): every row, whatever ``keys`` is."""
        return (self.rows, self.dim)

    def entries(self, keys: int) -> int:
        """How many ids such an array holds (what an export counts as its keys): every row."""
        return self.rows


@dataclass(frozen=True)
class DenseTable:
    """A dense float32 tensor, flattened and cut into blocks spread over the pservers."""

    #: pulled and pushed whole, in blocks, never by ids (see SparseTable)
    by_ids: ClassVar[bool] = False
    keyed: ClassVar[bool] = False

    name: str
    shape: tuple[int, ...]
    init: Initializer = field(default_factory=Constant)
    optimizer: Optimizer = field(default_factory=SGD)
    seed: int = 0

    def __post_init__(self) -> None:
        _check_name(self.name)
        owner = f"table {self.name!r}"
        if isinstance(self.shape, (str, bytes)) or not isinstance(self.shape, (tuple, list)) or not 1 <= len(self.shape) <= 8:
            raise ConfigError(f"{owner}: shape must be a list of 1 to 8 positive integers, got {self.shape!r}")
        shape = tuple(_int(owner, "shape entry", s, 1, _MAX_ROWS) for s in self.shape)
        if math.prod(shape) > _MAX_ROWS:
            raise ConfigError(f"{owner}: shape {list(shape)} has more than 2**63 - 1 elements")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "seed", _int(owner, "seed", self.seed, -_MAX_SEED, _MAX_SEED))
        _check_parts(self.name, self.init, self.optimizer)
        if self.optimizer.clip_norm is not None:
            raise ConfigError(
                f"{owner}: clip_norm clips each row of a sparse table on the pserver that holds it; a dense "
                "table's gradient is split in blocks over the pservers, none of which sees its norm: give "
                "this table an optimizer without clip_norm"
            )
        if isinstance(self.optimizer, Adagrad) and self.optimizer.rowwise:
            raise ConfigError(
                f"{owner}: rowwise Adagrad keeps one accumulator per row of a sparse or hash table; a dense "
                "table has no rows (its blocks are split over the pservers): give it Adagrad(rowwise=False)"
            )

    @property
    def kind(self) -> str:
        return "dense"

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def values_shape(self, keys: int) -> tuple[int, ...]:
        """The tensor's shape, whatever ``keys`` is (see SparseTable.values_shape)."""
        return self.shape

    def entries(self, keys: int) -> int:
        """Its elements, whatever ``keys`` is (see SparseTable.entries)."""
        return self.size


# A hash-keyed sparse table (any int64 key; keys admitted on push, evicted by score). The fixed
# kind (SparseTable) stays the right choice for dense id spaces such as a word2vec vocabulary;
# this kind is for sparse feature signs (CTR), where the key space is 2^64 and most keys are rare.

#: slab rows one hash table shard can address (int32 rows in its index)
MAX_KEYS = (1 << 31) - 2
#: the most days a hash table's ttl_days and one shrink's day tick may be (a key's last day is int32)
MAX_DAYS = 1 << 20


#: how a hash table's values may be stored (HashTable.dtype)
VALUE_DTYPES = ("float32", "float16", "bfloat16")
#: how a hash table's optimizer state may be stored (HashTable.state_dtype): not float16, whose
#: range does not hold Adam's second moments (aps/storage/hash/compact.py)
STATE_DTYPES = ("float32", "bfloat16")
#: how a hash table keeps each key's statistics (HashTable.stats): all of them (24 bytes), or
#: what the CTR accessor needs (16 bytes; aps/storage/hash/stats.py)
STATS_LAYOUTS = ("full", "compact")
#: the most days a compact-statistics table's ttl_days and one shrink's day tick may be (a key's
#: last day is 16 bits, counted modulo 2^16)
MAX_COMPACT_DAYS = (1 << 15) - 1
#: the least RAM a disk table's shard may be given (its caches and a few thousand hot rows)
MIN_DISK_RAM = 4 << 20


@dataclass(frozen=True)
class Disk:
    """A hash table's cold rows kept on the pserver's local disk (``HashTable(disk=Disk(...))``).

    ``ram_bytes``: what one pserver's shard may hold in memory: the hot rows with their index,
    optimizer state and statistics, and the disk store's caches and write buffers; the disk
    store's bloom filters and block indexes come on top, about 2 bytes a key on disk (measured:
    a 256 MiB table holding 36.7M keys on disk reported 280 MiB). A pull or
    push of a key on disk brings its row in; past the budget, the rows least recently pulled or
    pushed go out to disk with their optimizer state and statistics. The files live under the
    pserver's ``--data-dir`` (default: ``aps-disk`` inside its checkpoint root); a checkpoint
    holds every row, so a restarted pserver rebuilds them from its checkpoint."""

    ram_bytes: int = 256 << 20

    def __post_init__(self) -> None:
        object.__setattr__(self, "ram_bytes", _int("Disk", "ram_bytes", self.ram_bytes, MIN_DISK_RAM, 1 << 50))


@dataclass(frozen=True)
class HashTable:
    """``dim`` float32 values per int64 key, created on push and evicted by score.

    ``admit_probability`` p: a key not held yet is admitted by a push with probability
    ``1 - (1 - p)^count`` (count: its occurrences in that push). ``admit_count`` n: only once it
    was pushed n times (an exact counter for up to ``pending_keys`` keys not admitted yet).
    ``max_keys``: a cap per pserver shard (None: unbounded); past it the lowest-score keys go.
    ``base_threshold`` and ``delta_threshold`` (Paddle's defaults): a ``base`` save writes the
    keys whose score is at least the first, a ``delta`` save those whose delta score is at
    least the second (docs/operations.md). ``ttl_days``: a shrink deletes the keys no push
    reached for more than this many days (the reference's unseen days, counted by the ``days``
    a shrink is given; None: never by age).
    ``dtype``: how the pservers store the values, ``"float32"``, ``"float16"`` or ``"bfloat16"``
    (half the bytes; pulls convert to float32 and the optimizer computes in float32, writing back
    rounded to nearest, saturating at the largest finite value; see docs/concepts.md, "Compact
    rows"). ``state_dtype``: how they store the optimizer's float state (Adam's moments,
    Adagrad's sums): ``"float32"`` or ``"bfloat16"``, computed in float32 the same way.
    ``disk``: keep the cold rows on the pservers' disks (:class:`Disk`; docs/concepts.md, "Disk
    tables"). ``stats``: ``"full"`` keeps each key's show, click, delta score, last day and last
    step (24 bytes); ``"compact"`` what the CTR accessor needs, 16 bytes: no last step, so a
    shrink's ``ttl`` in steps is refused, and days in 16 bits, so ``ttl_days`` and a shrink's
    ``days`` are at most 32,767 (docs/concepts.md, "Compact rows").
    """

    #: pulled and pushed by ids, which are keys (see SparseTable)
    by_ids: ClassVar[bool] = True
    keyed: ClassVar[bool] = True

    name: str
    dim: int
    init: Initializer = field(default_factory=lambda: Uniform(-0.01, 0.01))
    optimizer: Optimizer = field(default_factory=SGD)
    seed: int = 0
    admit_probability: float = 1.0
    admit_count: int = 1
    max_keys: int | None = None
    pending_keys: int = 1 << 20
    base_threshold: float = 1.5
    delta_threshold: float = 0.25
    ttl_days: int | None = None
    dtype: str = "float32"
    disk: Disk | None = None
    state_dtype: str = "float32"
    stats: str = "full"

    def __post_init__(self) -> None:
        _check_name(self.name)
        owner = f"table {self.name!r}"
        object.__setattr__(self, "dim", _int(owner, "dim", self.dim, 1, _MAX_DIM))
        if self.dtype not in VALUE_DTYPES:
            raise ConfigError(f"{owner}: dtype must be one of {', '.join(VALUE_DTYPES)}, got {self.dtype!r}")
        if self.state_dtype not in STATE_DTYPES:
            raise ConfigError(f"{owner}: state_dtype must be one of {', '.join(STATE_DTYPES)}, got {self.state_dtype!r}")
        if self.disk is not None:
            _check_disk(owner, self)
        if self.stats not in STATS_LAYOUTS:
            raise ConfigError(f"{owner}: stats must be one of {', '.join(STATS_LAYOUTS)}, got {self.stats!r}")
        if self.ttl_days is not None:
            most = MAX_COMPACT_DAYS if self.stats == "compact" else MAX_DAYS
            object.__setattr__(self, "ttl_days", _int(owner, "ttl_days", self.ttl_days, 0, most))
        object.__setattr__(self, "seed", _int(owner, "seed", self.seed, -_MAX_SEED, _MAX_SEED))
        p = _real(owner, "admit_probability", self.admit_probability)
        if not 0.0 < p <= 1.0:
            raise ConfigError(f"{owner}: admit_probability must be in (0, 1], got {p}")
        object.__setattr__(self, "admit_probability", p)
        object.__setattr__(self, "admit_count", _int(owner, "admit_count", self.admit_count, 1, 1 << 31))
        if self.max_keys is not None:
            object.__setattr__(self, "max_keys", _int(owner, "max_keys", self.max_keys, 1, MAX_KEYS))
        object.__setattr__(self, "pending_keys", _int(owner, "pending_keys", self.pending_keys, 1, MAX_KEYS))
        for name in ("base_threshold", "delta_threshold"):
            object.__setattr__(self, name, _real(owner, name, getattr(self, name)))
        _check_parts(self.name, self.init, self.optimizer)

    @property
    def kind(self) -> str:
        return "hash"

    @property
    def tier(self) -> str | None:
        """Where the shards keep cold rows: ``"disk"`` (:class:`Disk`) or None (all in RAM); the
        pserver serves a disk table with a kind of its own."""
        return "disk" if self.disk is not None else None

    def values_shape(self, keys: int) -> tuple[int, ...]:
        """``keys`` rows: a table of unbounded keys is held a part at a time (a trainer's slot
        areas or cache, the keys an export wrote; see SparseTable.values_shape)."""
        return (keys, self.dim)

    def entries(self, keys: int) -> int:
        """``keys`` (see SparseTable.entries)."""
        return keys


TableSpec = Union[SparseTable, DenseTable, HashTable]
#: the kinds of table spec this package defines: what a reader of specs builds unless it is
#: handed others (a kind defined outside aps is handed to the pserver, the checkpoint formats,
#: aps-serve and the client, never added here)
TABLE_SPECS: tuple[type[TableSpec], ...] = (SparseTable, DenseTable, HashTable)


def is_table_spec(obj: object, specs: Iterable[type[Any]] = TABLE_SPECS) -> bool:
    """Whether ``obj`` is a table spec of one of the kinds ``specs`` (what a client may create)."""
    return isinstance(obj, tuple(specs))


def _check_disk(owner: str, spec: HashTable) -> None:
    if not isinstance(spec.disk, Disk):
        raise ConfigError(f"{owner}: disk must be a Disk, got {spec.disk!r}")


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ConfigError(f"table name must match {_NAME_RE.pattern}, got {name!r}")


def _check_parts(name: str, init: Any, optimizer: Any) -> None:
    if not isinstance(init, (Uniform, Constant, Normal)):
        raise ConfigError(f"table {name!r}: init must be Uniform, Constant or Normal, got {init!r}")
    if not isinstance(optimizer, (SGD, Adagrad, Adam, Ftrl)):
        raise ConfigError(f"table {name!r}: optimizer must be SGD, Adagrad, Adam or Ftrl, got {optimizer!r}")


# ---------------------------------------------------------------- (de)serialisation

#: what a table spec is made of: its initializer, its optimizer and the optimizer's decay
_PARTS: tuple[type, ...] = (Uniform, Constant, Normal, ExponentialDecay, SGD, Adagrad, Adam, Ftrl, Disk)


def _classes(specs: Iterable[type[Any]]) -> dict[str, type]:
    """The classes a dict's ``type`` may name, by name: the parts of a spec and the table
    ``specs`` the reader was given."""
    return {cls.__name__: cls for cls in (*_PARTS, *specs)}


#: the classes this package's own specs are built of (what :func:`spec_to_dict` nests, and
#: what :func:`spec_from_dict` builds unless handed other table specs)
_CLASSES: dict[str, type] = _classes(TABLE_SPECS)


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


#: nested specs go at most this deep (a table, its optimizer, its decay)
_MAX_DEPTH = 4


def spec_from_dict(data: dict[str, Any], specs: Iterable[type[Any]] = TABLE_SPECS) -> Any:
    """Inverse of :func:`spec_to_dict`; raises :class:`ConfigError` on unknown types or fields,
    and on a field of the wrong type (every check a spec's constructor makes applies).

    ``specs``: the table spec classes the reader may build (the package's three unless it is
    handed others): the pserver's come from its table kinds, a checkpoint reader's from its
    formats, aps-serve's from its served tables, so a kind of spec defined outside aps is read
    back wherever it was handed, and is no spec to any other reader."""
    classes = _CLASSES if specs is TABLE_SPECS else _classes(specs)
    return _from_dict(data, classes, 0)


def _from_dict(data: dict[str, Any], classes: dict[str, type], depth: int) -> Any:
    kind = data.get("type") if isinstance(data, dict) else None
    if not isinstance(kind, str):
        raise ConfigError(f"not a spec: {_short(data)}")
    if kind not in classes:  # named first: a manifest sorts its keys, so "type" may be cut from the dict shown
        raise ConfigError(f"not a spec: unknown type {kind!r} (known here: {', '.join(classes)}): {_short(data)}")
    if depth >= _MAX_DEPTH:
        raise ConfigError(f"spec nested more than {_MAX_DEPTH} levels deep")
    cls = classes[kind]
    known = {f.name for f in fields(cls)}
    unknown = sorted(str(key) for key in data if key != "type" and key not in known)
    if unknown:
        raise ConfigError(f"{cls.__name__} has no field {', '.join(map(repr, unknown))} (fields: {', '.join(sorted(known))})")
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key == "type":
            continue
        kwargs[key] = _from_dict(value, classes, depth + 1) if isinstance(value, dict) else value
    if issubclass(cls, DenseTable) and isinstance(kwargs.get("shape"), list):
        kwargs["shape"] = tuple(kwargs["shape"])
    try:
        return cls(**kwargs)
    except TypeError as exc:  # a required field missing
        raise ConfigError(f"bad fields for {cls.__name__}: {exc}") from exc


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "..."
