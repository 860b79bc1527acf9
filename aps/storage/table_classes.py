"""One lookup by table class: what a server or a checkpoint has for a store, or for a spec.

The server's table kinds (``aps.server.kinds.TableKinds``) and the checkpoint formats
(``aps.checkpoints.kinds.TableFormats``) each answer "which of mine serves this store, or
tables of this spec?" by class, never ``isinstance``; this is that lookup, written once
(:class:`ByTableClass`). The storage shards of a spec (``aps.storage.tables``) and aps-serve's
served tables (``aps.serving.model``) are looked up by spec alone (:class:`BySpecClass`). It
sits on the storage floor because stores are what it keys and the storage shards, the
checkpoint formats, the server and aps-serve all stand on or above this floor.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Generic, Protocol, TypeVar

from ..specs import TableSpec


class SpecClassed(Protocol):
    """What an entry looked up by spec says it is for: the spec class of its tables."""

    @property
    def spec_type(self) -> type[TableSpec]: ...


class TableClasses(SpecClassed, Protocol):
    """What an entry says it is for: the spec class of its tables and the class of their stores."""

    @property
    def store_type(self) -> type: ...


S = TypeVar("S", bound=SpecClassed)
T = TypeVar("T", bound=TableClasses)


class BySpecClass(Generic[S]):
    """Entries looked up by the class of a spec (a later entry for the same class replaces an
    earlier one): what a place that acts on tables has for each kind of spec, so that it never
    asks a spec ``isinstance`` and a new kind of spec is one more entry. An entry may be a class
    whose ``spec_type`` is a class attribute (the storage shards, aps-serve's served tables)."""

    def __init__(self, entries: Iterable[S]) -> None:
        self._by_spec: dict[tuple[type, str | None], S] = {
            (entry.spec_type, getattr(entry, "spec_tier", None)): entry for entry in entries
        }

    def for_spec(self, spec: TableSpec) -> S | None:
        """The entry for tables of ``spec`` (None: none is). A spec with a storage tier (a hash
        table's ``disk``) takes the entry for that tier where there is one, else its class's:
        a place that reads rows alike from every tier (aps-serve) needs no entry of its own."""
        tier = getattr(spec, "tier", None)
        found = self._by_spec.get((type(spec), tier)) if tier is not None else None
        return found if found is not None else self._by_spec.get((type(spec), None))

    def spec_types(self) -> tuple[type[TableSpec], ...]:
        """The spec classes there is an entry for: the only ones a place that reads specs back
        (``spec_from_dict``: a CREATE_TABLE, a manifest) should build, since it could act on no
        other."""
        return tuple(dict.fromkeys(spec_type for spec_type, _ in self._by_spec))


class ByTableClass(BySpecClass[T]):
    """Entries (a server's kinds, a checkpoint's formats) looked up by the class of a store or
    of a spec; a later entry for the same class replaces an earlier one."""

    def __init__(self, entries: Iterable[T]) -> None:
        entries = list(entries)
        super().__init__(entries)
        self._by_store: dict[type, T] = {entry.store_type: entry for entry in entries}

    def of(self, store: object) -> T:
        """The entry for ``store`` (KeyError: none is for its class)."""
        return self._by_store[type(store)]
