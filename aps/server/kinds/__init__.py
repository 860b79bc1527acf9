"""The table kinds a pserver serves, and the registry that says which is which.

:meth:`TableKinds.of` (a shard's kind) and :meth:`TableKinds.for_spec` (a new table's) are
the only places that ask what kind a table is, by its class (the lookup the checkpoint formats
share, :class:`~aps.storage.table_classes.ByTableClass`); the core and its handlers then call
the kind's methods (:class:`~aps.server.kinds.base.TableKind`). A new
table kind is one :class:`TableKind` subclass, added to the kinds a core is built with
(``ServerCore(config, kinds=(*DEFAULT_KINDS, MyKind))``); there is no module-level registry to
mutate.
"""

from __future__ import annotations

from pathlib import Path

from ...storage.table_classes import ByTableClass
from .base import Accepted, TableKind
from .dense import DenseKind
from .disk import DiskKind
from .fixed import FixedKind
from .hash import HashKind


class TableKinds(ByTableClass[TableKind]):
    """The kinds registered, each built once for one server's place (server ``index`` of ``servers``)."""

    def __init__(self, index: int, servers: int, kinds: tuple[type[TableKind], ...], data_dir: Path | None = None) -> None:
        super().__init__(cls(index, servers, data_dir) for cls in kinds)


#: the kinds every pserver serves
DEFAULT_KINDS: tuple[type[TableKind], ...] = (FixedKind, HashKind, DiskKind, DenseKind)

__all__ = ["Accepted", "DEFAULT_KINDS", "DenseKind", "DiskKind", "FixedKind", "HashKind", "TableKind", "TableKinds"]
