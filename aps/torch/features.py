"""What a user's network is given: the data set's shape (:class:`Meta`) once, when it is built,
and a batch's features (:class:`Features`) at every step."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..models.criteo import CriteoFormat


@dataclass(frozen=True)
class Meta:
    """The columns of the data set, read from its ``meta.json`` (the Criteo layout's fields:
    ``dense``, ``slots``, ``cont_min``, ``cont_diff``, optionally ``buckets``), handed to the
    function that builds the network so that its layer widths follow the data."""

    #: categorical columns, each looked up in the network's :class:`~aps.torch.Embedding` tables
    slots: int
    #: numeric columns, normalised to [0, 1] by ``cont_min`` / ``cont_diff``
    dense: int
    #: rows of a fixed embedding table (ids are hashed modulo this); hash tables ignore it
    buckets: int
    #: the file it was read from
    path: str

    @classmethod
    def of(cls, fmt: CriteoFormat, path: str | Path) -> Meta:
        return cls(slots=fmt.slots, dense=fmt.dense, buckets=fmt.buckets, path=str(path))


@dataclass(frozen=True)
class Features:
    """One batch as the network's ``forward`` sees it (``B`` examples).

    ``slots[i, s]`` names the row of example ``i``'s slot ``s``: pass it to an
    :class:`~aps.torch.Embedding` as it is (its values are positions among the batch's rows,
    not the raw ids, so they mean nothing else). ``dense`` holds the normalised numeric columns;
    ``labels`` the 0/1 labels, for a network that wants them (the loss is computed outside)."""

    slots: torch.Tensor
    dense: torch.Tensor
    labels: torch.Tensor

    @property
    def batch_size(self) -> int:
        return int(self.dense.shape[0])
