"""aps-serve's ``rows`` option (``--rows``): what a served hash table holds its rows as.

``exported`` (the default): float32, as exported (a float16 table's values widened). ``int8``:
int8 codes and a float32 scale a row (int8_rows.py). Fixed and dense tables are served as
exported either way: a hash table is where a model's rows grow with its keys (the memory the
option is for), a fixed table's rows are as many as its spec says, and a dense table is a
network's weights, whose every coordinate enters every score.
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from ..storage.table_classes import BySpecClass
from .int8_rows import ServedInt8Hash
from .model import SERVED_TABLES, ServedDense, ServedFixed, ServedHash

#: each value of the option, and the class a hash table is served with
HASH_TABLES: dict[str, type[ServedHash]] = {"exported": ServedHash, "int8": ServedInt8Hash}
#: the option's values
ROWS = tuple(HASH_TABLES)
DEFAULT_ROWS = "exported"


def check_rows(rows: str) -> str:
    """``rows`` when it is a value of the option, else a ConfigError that lists them."""
    if rows not in HASH_TABLES:
        raise ConfigError(f"rows {rows!r}: not one of {', '.join(ROWS)}")
    return rows


def served_tables(rows: str = DEFAULT_ROWS, served: BySpecClass[Any] | None = None) -> BySpecClass[Any]:
    """The class each kind of spec is served with: ``served`` when given (a caller's own set,
    so only with the default ``rows``: both would choose the hash tables' class), else aps's
    with the hash table class of ``rows``."""
    check_rows(rows)
    if served is not None:
        if rows != DEFAULT_ROWS:
            raise ConfigError(f"rows {rows!r} and served= each choose the class hash tables are served with: pass one")
        return served
    if rows == DEFAULT_ROWS:
        return SERVED_TABLES
    return BySpecClass([HASH_TABLES[rows], ServedFixed, ServedDense])
