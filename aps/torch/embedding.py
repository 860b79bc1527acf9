"""``aps.torch.Embedding``: a torch module whose rows live in an aps table on the pservers.

The module holds no parameter. At each step :class:`~aps.torch.TorchModel` hands it the rows of
the batch's ids (pulled by the runtime) as one leaf tensor; ``forward`` looks them up by the
positions in :attr:`Features.slots <aps.torch.Features.slots>`, and autograd leaves the
gradient of exactly those rows in the runtime's sparse gradient buffer. No copy of a table is
ever made in the worker, whatever its size.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ..errors import ConfigError
from ..specs import SGD, HashTable, Initializer, Optimizer, SparseTable, Uniform
from .features import ListFeature

#: ``kind=``: a fixed array of ``rows`` rows (ids hashed modulo the data's buckets) or a hash
#: table (any 64-bit key, admitted and evicted on the pservers; docs/concepts.md, "Fixed or hash")
KINDS = ("hash", "fixed")

#: the rows' init when none is given: CTR-DNN's measured default (docs/concepts.md)
DEFAULT_INIT = Uniform(-0.05, 0.05)


def pooled(embedded: torch.Tensor, values: ListFeature, mode: str) -> torch.Tensor:
    """``embedded`` [B, max_len, dim] (padding embedded as zeros) summed or averaged over each
    example's values."""
    x = embedded.sum(1)
    if mode == "sum":
        return x
    if mode == "mean":
        return x / values.lengths.clamp(min=1).unsqueeze(1).to(x.dtype)
    raise ConfigError(f"pool mode must be 'sum' or 'mean', got {mode!r}")


class Embedding(torch.nn.Module):
    """``dim`` values per sparse feature, in the aps table ``name``.

    ``kind``: ``"hash"`` (the default: any key, shows and clicks pushed for the pservers'
    shrink; ``admit_probability``, ``admit_count``, ``max_keys`` as :class:`aps.HashTable`) or
    ``"fixed"`` (``rows`` rows; the data's ``buckets`` when not given, and they must agree).
    ``init``: the rows' initialiser on the pservers (default ``Uniform(-0.05, 0.05)``);
    ``optimizer``: this table's own (default: the :class:`~aps.torch.TorchModel`'s).

    ``forward(slots)`` takes :attr:`aps.torch.Features.slots` (or columns of it, or a list
    column's ``ids``) and returns ``[*slots.shape, dim]``; :meth:`pool` sums or averages a list
    column's."""

    def __init__(
        self, name: str, dim: int, kind: str = "hash", rows: int | None = None, init: Initializer | None = None,
        optimizer: Optimizer | None = None, **hash_options: Any,
    ) -> None:
        super().__init__()
        if kind not in KINDS:
            raise ConfigError(f"Embedding {name!r}: kind must be one of {', '.join(KINDS)}, got {kind!r}")
        if kind == "fixed" and hash_options:
            raise ConfigError(f"Embedding {name!r}: {', '.join(sorted(hash_options))} apply to kind='hash' only")
        self.table_name = name
        self.dim = dim
        self.kind = kind
        self.rows = rows
        self.init = DEFAULT_INIT if init is None else init
        self.optimizer = optimizer
        self.hash_options = dict(hash_options)
        # checks name, dim, init, optimizer and the hash options now, where the user wrote them
        self.spec(rows or 1, SGD(), 0)
        #: the batch's rows, set by TorchModel before each forward pass
        self.batch_rows: torch.Tensor | None = None

    def spec(self, buckets: int, optimizer: Optimizer, seed: int) -> SparseTable | HashTable:
        """The aps table behind this module (``buckets``: the data's, for a fixed table;
        ``optimizer``: the model's, used unless the module names its own)."""
        opt = self.optimizer or optimizer
        if self.kind == "fixed":
            if self.rows is not None and self.rows != buckets:
                raise ConfigError(
                    f"Embedding {self.table_name!r}: rows={self.rows} but the data's meta.json hashes ids into "
                    f"{buckets} buckets: leave rows out or make them equal"
                )
            return SparseTable(self.table_name, buckets, self.dim, self.init, opt, seed=seed)
        try:
            return HashTable(self.table_name, self.dim, self.init, opt, seed=seed, **self.hash_options)
        except TypeError as exc:
            raise ConfigError(f"Embedding {self.table_name!r}: {exc}") from None

    def forward(self, slots: torch.Tensor) -> torch.Tensor:
        rows = self.batch_rows
        if rows is None:
            raise ConfigError(
                f"Embedding {self.table_name!r} was called outside a training or scoring step: its rows live on "
                "the pservers and are handed to it by aps.torch.TorchModel"
            )
        return F.embedding(slots, rows)

    def pool(self, values: ListFeature, mode: str = "sum") -> torch.Tensor:
        """A list column's embeddings pooled over each example's values, ``[B, dim]``: their
        ``"sum"`` or ``"mean"`` (an empty list gives zeros)."""
        return pooled(self(values.ids), values, mode)

    def extra_repr(self) -> str:
        return f"{self.table_name!r}, dim={self.dim}, kind={self.kind!r}"
