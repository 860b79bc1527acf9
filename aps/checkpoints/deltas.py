"""Loading a base save and the delta saves after it: ``ps.load(base, deltas=[d1, d2, ...])``.

A delta save (hash_files.py) holds a hash table's keys whose delta score passed its
threshold since the save before it, the keys deleted since then (a shrink, an eviction, a TTL)
whose rows it does not hold, and fixed and dense tables whole: no table to load alone, but put
over its base, in order, it gives each pserver the rows the saving pservers held at the last
delta for every key a save wrote, without the keys they deleted since the base (as aps-serve
does; a delta written before deletions were recorded lists none). Each delta's pserver count may
differ from the base's and from the loading cluster's: its files move by logical shard like a
base's.

The chain is checked, never assumed: the base must be a ``base`` save, each delta must name it
as its base (``base_save_id``), and every shard of each delta must name the save just before it
in the list (``previous_save_id``), so a delta missing from the list, deltas out of order, or
a delta of another base is refused, naming which.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..specs import spec_from_dict
from .kinds import DEFAULT_FORMATS, TableFormats
from .shards import Shard, _check_consistent, _find_shards, load_shards


def load_with_deltas(
    path: str | os.PathLike[str], deltas: list[str], shard: int, num_shards: int, max_table_bytes: int = 0,
    formats: TableFormats = DEFAULT_FORMATS, data_dir: Path | None = None,
) -> tuple[dict[str, Shard], dict[str, Any]]:
    """Server ``shard`` of ``num_shards``'s tables from base save ``path`` with ``deltas``
    applied in order; returns ``(tables by name, extra)``, the extra of the last delta. The
    chain is checked from the manifests before any table file is read."""
    chain = _delta_chain(Path(path), deltas) if deltas else []
    tables, extra = load_shards(path, shard, num_shards, max_table_bytes, formats=formats, data_dir=data_dir)
    for root, n, old in chain:
        manifest = old[0].manifest
        if sorted(manifest["tables"]) != sorted(tables):
            raise ConfigError(f"delta {root} has tables {sorted(manifest['tables'])}, its base {sorted(tables)}")
        for name, entry in manifest["tables"].items():
            spec = spec_from_dict(entry["spec"], formats.spec_types())
            if spec != tables[name].spec:
                raise ConfigError(f"delta {root}: table {name!r} has another spec than in its base")
            tables[name] = formats.of(tables[name]).apply_delta(tables[name], spec, old, shard, num_shards)
        extra = manifest.get("extra", {})
    return tables, extra


def _delta_chain(base: Path, deltas: list[str]) -> list[tuple[Path, int, list[Any]]]:
    """(root, saved servers, saved shards) of each delta, once the chain is checked (the
    module's note)."""
    _, shards = _find_shards(base)
    mode = shards[0].manifest.get("mode", "full")
    if mode != "base":
        raise ConfigError(f"checkpoint {base} is a {mode} save: deltas apply onto a base save")
    base_id = previous = shards[0].manifest.get("save_id")
    before, chain = base, []
    for delta in deltas:
        root = Path(delta)
        n, old = _find_shards(root)
        _check_consistent(root, old)
        manifest = old[0].manifest
        if manifest.get("mode") != "delta":
            raise ConfigError(f"checkpoint {delta} is a {manifest.get('mode', 'full')} save, not a delta")
        if manifest.get("base_save_id") != base_id:
            raise ConfigError(f"delta {delta} follows base save {manifest.get('base_save_id')!r}, not {base} ({base_id!r})")
        for o in old:
            if o.manifest.get("previous_save_id") != previous:
                raise ConfigError(
                    f"delta {delta}: shard {o.index} follows save {o.manifest.get('previous_save_id')!r}, not {before} "
                    f"({previous!r}): a delta is missing from the list or they are out of order"
                )
        chain.append((root, n, old))
        previous, before = manifest.get("save_id"), root
    return chain
