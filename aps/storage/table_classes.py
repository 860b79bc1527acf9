"""One lookup by table class: what a server or a checkpoint has for a store, or for a spec.

The server's table kinds (``aps.server.kinds.TableKinds``) and the checkpoint formats
(``aps.checkpoints.kinds.TableFormats``) each answer "which of mine serves this store, or
tables of this spec?" by class, never ``isinstance``; this is that lookup, written once. It sits
on the storage floor because stores are what it keys and both the checkpoint formats and the
server stand on this floor.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Generic, Protocol, TypeVar

from ..specs import TableSpec


class TableClasses(Protocol):
    """What an entry says it is for: the spec class of its tables and the class of their stores."""

    @property
    def spec_type(self) -> type[TableSpec]: ...

    @property
    def store_type(self) -> type: ...


T = TypeVar("T", bound=TableClasses)


class ByTableClass(Generic[T]):
    """Entries (a server's kinds, a checkpoint's formats) looked up by the class of a store or
    of a spec; a later entry for the same class replaces an earlier one."""

    def __init__(self, entries: Iterable[T]) -> None:
        self._by_store: dict[type, T] = {}
        self._by_spec: dict[type, T] = {}
        for entry in entries:
            self._by_store[entry.store_type] = entry
            self._by_spec[entry.spec_type] = entry

    def of(self, store: object) -> T:
        """The entry for ``store`` (KeyError: none is for its class)."""
        return self._by_store[type(store)]

    def for_spec(self, spec: TableSpec) -> T | None:
        """The entry for tables of ``spec`` (None: none is)."""
        return self._by_spec.get(type(spec))
