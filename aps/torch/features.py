"""What a user's network is given: the data set's shape (:class:`Meta`) once, when it is built,
and a batch's features (:class:`Features`) at every step."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..models.tabular import TabularFormat


@dataclass(frozen=True)
class Meta:
    """The columns of the data set, read from its ``meta.json`` (:mod:`aps.models.tabular`: the
    Criteo layout's fields, plus ``labels`` and ``lists``), handed to the function that builds
    the network so that its widths follow the data."""

    #: categorical columns of one value each, looked up in the network's :class:`~aps.torch.Embedding` tables
    slots: int
    #: numeric columns, normalised to [0, 1] by ``cont_min`` / ``cont_diff``
    dense: int
    #: rows of a fixed embedding table (ids are hashed modulo this); hash tables ignore it
    buckets: int
    #: the file it was read from
    path: str
    #: label columns (tasks): the network returns one logit per example and task
    labels: int = 1
    #: list columns by name: their ``max_len`` (the width of :attr:`ListFeature.ids`)
    lists: dict[str, int] = field(default_factory=dict)
    #: list columns holding a slot's values (``shares``): name -> slot index
    shares: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, fmt: TabularFormat, path: str | Path) -> Meta:
        return cls(slots=fmt.slots, dense=fmt.dense, buckets=fmt.buckets, path=str(path), labels=fmt.labels,
                   lists={c.name: c.max_len for c in fmt.lists},
                   shares={c.name: c.shares for c in fmt.lists if c.shares is not None})


@dataclass(frozen=True)
class ListFeature:
    """One list column of a batch: ``ids`` [B, max_len] (pass to an Embedding: padding embeds as
    zeros), ``mask`` bool [B, max_len] (True where a value is), ``lengths`` int64 [B]."""

    ids: torch.Tensor
    mask: torch.Tensor
    lengths: torch.Tensor


@dataclass(frozen=True)
class Features:
    """One batch as the network's ``forward`` sees it (``B`` examples).

    ``slots[i, s]`` names the row of example ``i``'s slot ``s``: pass it to an
    :class:`~aps.torch.Embedding` as it is (its values are positions among the batch's rows,
    not the raw ids, so they mean nothing else). ``dense`` holds the normalised numeric columns;
    ``labels`` the 0/1 labels ([B], or [B, tasks] with several), for a network that wants them
    (the loss is computed outside); ``lists`` the list columns by name."""

    slots: torch.Tensor
    dense: torch.Tensor
    labels: torch.Tensor
    lists: dict[str, ListFeature] = field(default_factory=dict)

    @property
    def batch_size(self) -> int:
        return int(self.dense.shape[0])
