"""The spec of a hash-keyed sparse table (any int64 key; keys admitted on push, evicted by score).

A frozen dataclass checked field by field like every spec in :mod:`aps.specs` (it reuses their
checks), so it can travel as JSON and sit in a checkpoint manifest. The fixed kind
(:class:`~aps.specs.SparseTable`) stays the right choice for dense id spaces such as a word2vec
vocabulary; this kind is for sparse feature signs (CTR), where the key space is 2^64 and most
keys are rare.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import ConfigError
from .specs import SGD, Initializer, Optimizer, Uniform, _check_name, _check_parts, _int, _MAX_DIM, _MAX_SEED, _real

#: slab rows one shard can address (int32 rows in the index)
MAX_KEYS = (1 << 31) - 2


@dataclass(frozen=True)
class HashTable:
    """``dim`` float32 values per int64 key, created on push and evicted by score.

    ``admit_probability`` p: a key not held yet is admitted by a push with probability
    ``1 - (1 - p)^count`` (count: its occurrences in that push). ``admit_count`` n: only once it
    was pushed n times (an exact counter for up to ``pending_keys`` keys not admitted yet).
    ``max_keys``: a cap per pserver shard (None: unbounded); past it the lowest-score keys go.
    """

    name: str
    dim: int
    init: Initializer = field(default_factory=lambda: Uniform(-0.01, 0.01))
    optimizer: Optimizer = field(default_factory=SGD)
    seed: int = 0
    admit_probability: float = 1.0
    admit_count: int = 1
    max_keys: int | None = None
    pending_keys: int = 1 << 20

    def __post_init__(self) -> None:
        _check_name(self.name)
        owner = f"table {self.name!r}"
        object.__setattr__(self, "dim", _int(owner, "dim", self.dim, 1, _MAX_DIM))
        object.__setattr__(self, "seed", _int(owner, "seed", self.seed, -_MAX_SEED, _MAX_SEED))
        p = _real(owner, "admit_probability", self.admit_probability)
        if not 0.0 < p <= 1.0:
            raise ConfigError(f"{owner}: admit_probability must be in (0, 1], got {p}")
        object.__setattr__(self, "admit_probability", p)
        object.__setattr__(self, "admit_count", _int(owner, "admit_count", self.admit_count, 1, 1 << 31))
        if self.max_keys is not None:
            object.__setattr__(self, "max_keys", _int(owner, "max_keys", self.max_keys, 1, MAX_KEYS))
        object.__setattr__(self, "pending_keys", _int(owner, "pending_keys", self.pending_keys, 1, MAX_KEYS))
        _check_parts(self.name, self.init, self.optimizer)

    @property
    def kind(self) -> str:
        return "hash"
