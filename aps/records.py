"""The trainers' metrics records: one JSON object per line, a "progress" record every report
period and an "epoch" record at the end of each epoch (``LOG_DIR/trainer.K.metrics.jsonl``).

The writer (:func:`append_record`, called by aps/trainer/monitor.py) and the readers (aps-plot's
strict one, the launchers' lenient one for their closing summaries) live together here, at the
bottom of the package: the format is one thing, and a launcher that reads a trainer's last epoch
must not import the command line's plot tool to do so.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from .errors import ConfigError, DataError

METRICS_GLOB = "trainer.*.metrics.jsonl"
_FILE_NAME = re.compile(r"trainer\.(\d+)\.metrics\.jsonl")

Record = dict[str, Any]


def append_record(path: Path, record: Record) -> None:
    """Append ``record`` as one line (opened per record, so a reader or a crash sees whole lines
    up to the last one written)."""
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def metrics_files(log_dir: Path) -> dict[int, Path]:
    """trainer index -> its metrics file, for every ``trainer.K.metrics.jsonl`` in ``log_dir``."""
    if not log_dir.is_dir():
        raise ConfigError(f"{log_dir}: no such directory")
    found = {}
    for path in log_dir.glob(METRICS_GLOB):
        match = _FILE_NAME.fullmatch(path.name)
        if match:
            found[int(match[1])] = path
    if not found:
        raise ConfigError(f"{log_dir}: no metrics files ({METRICS_GLOB}) in it")
    return dict(sorted(found.items()))


def parse_record(line: str) -> Record:
    """One metrics line -> its record; ValueError says what is wrong with it."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg})") from None
    if not isinstance(record, dict):
        raise ValueError("not a JSON object")
    if record.get("event") not in ("progress", "epoch"):
        raise ValueError(f"no \"event\": \"progress\" or \"epoch\" (got {record.get('event')!r})")
    if not _is_number(record.get("time")):
        raise ValueError("no numeric \"time\"")
    for key in ("loss", "auc", "batch_auc", "examples_per_s", "online_auc"):
        if record.get(key) is not None and not _is_number(record[key]):
            raise ValueError(f"{key!r} is not a number: {record[key]!r}")
    return record


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def read_records(path: Path) -> list[Record]:
    """Every record of a metrics file; the first malformed line is a DataError naming FILE:LINE
    (a plot of half-understood data would mislead more than no plot). Blank lines are skipped."""
    records = []
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"cannot read: {exc}", str(path)) from exc
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(parse_record(line))
        except ValueError as exc:
            raise DataError(str(exc), str(path), number) from None
    return records


def last_epoch_record(path: Path, trainer: int | None = None, since: float | None = None) -> Record | None:
    """The last "epoch" record in a metrics file, or None (no file, no such record).

    Lenient, for summaries printed after a run: unparsable lines are skipped, because a trainer
    killed mid-write leaves a partial last line, and that must not hide its earlier epochs.
    ``trainer`` keeps only that trainer's records (several trainers may share one file when a user
    passes them all the same --metrics); ``since`` (unix seconds) drops records of earlier runs
    appended to the same file."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            record = parse_record(line)
        except ValueError:
            continue
        if record["event"] != "epoch":
            continue
        if trainer is not None and record.get("trainer", trainer) != trainer:
            continue
        if since is not None and record["time"] < since:
            return None  # records are appended in time order: everything above is older still
        return record
    return None



def read_metrics(log_dir: str | Path) -> dict[int, list[Record]]:
    """trainer index -> its records, for every metrics file in ``log_dir`` that has any.

    Raises ConfigError (no directory / no files / no records), DataError (a malformed line)."""
    log_dir = Path(log_dir)
    by_trainer = {k: read_records(path) for k, path in metrics_files(log_dir).items()}
    by_trainer = {k: records for k, records in by_trainer.items() if records}
    if not by_trainer:
        raise ConfigError(f"{log_dir}: the metrics files are empty (did a trainer finish a progress period?)")
    return by_trainer
