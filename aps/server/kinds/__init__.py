"""The table kinds a pserver serves, and the registry that says which is which.

:meth:`TableKinds.of` (a shard's kind) and :meth:`TableKinds.for_spec` (a new table's) are
the only places that ask what kind a table is, by its class looked up in a dict; the core and
its handlers then call the kind's methods (:class:`~aps.server.kinds.base.TableKind`). A new
table kind is one :class:`TableKind` subclass, added to the kinds a core is built with
(``ServerCore(config, kinds=(*DEFAULT_KINDS, MyKind))``); there is no module-level registry to
mutate.
"""

from __future__ import annotations

from typing import Any

from ...specs import TableSpec
from .base import Accepted, TableKind
from .dense import DenseKind
from .fixed import FixedKind
from .hash import HashKind


class TableKinds:
    """The kinds registered, each built once for one server's place (server ``index`` of ``servers``)."""

    def __init__(self, index: int, servers: int, kinds: tuple[type[TableKind], ...]) -> None:
        self._by_store: dict[type, TableKind] = {}
        self._by_spec: dict[type, TableKind] = {}
        for cls in kinds:
            kind = cls(index, servers)
            self._by_store[cls.store_type] = kind
            self._by_spec[cls.spec_type] = kind

    def of(self, store: Any) -> TableKind:
        """The kind of a shard this server holds."""
        return self._by_store[type(store)]

    def for_spec(self, spec: TableSpec) -> TableKind | None:
        """The kind that serves tables of ``spec`` (None: no kind does)."""
        return self._by_spec.get(type(spec))


#: the kinds every pserver serves
DEFAULT_KINDS: tuple[type[TableKind], ...] = (FixedKind, HashKind, DenseKind)

__all__ = ["Accepted", "DEFAULT_KINDS", "DenseKind", "FixedKind", "HashKind", "TableKind", "TableKinds"]
