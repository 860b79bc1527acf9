"""What aps-local prints while a cluster runs: a status line (rewritten in place on a terminal,
periodic otherwise) built from each role's state and the last line of its log."""

from __future__ import annotations

import re
import shutil
from typing import Any, TextIO

from ..launcher.local import LaunchResult
from ..launcher.roles import Role, describe_exit, last_lines

TTY_REFRESH = 0.5  # seconds between rewrites of the status line on a terminal


# ------------------------------------------------------------------------------------ terminal


class Board:
    """Everything aps-local prints. On a TTY one status line is kept at the bottom, rewritten in
    place; other lines are printed above it. Not on a TTY, status lines are plain and periodic."""

    def __init__(self, out: TextIO, err: TextIO, interval: float = 10.0) -> None:
        self.out, self.err = out, err
        self.tty = out.isatty()
        self.interval = interval  # seconds between plain status lines (not a TTY); 0 = none
        self._status_shown = False

    def status_period(self) -> float:
        return TTY_REFRESH if self.tty else self.interval

    def _write(self, stream: TextIO, text: str) -> None:
        # A closed terminal or pipe (`aps-local ... | head`) must not stop aps-local from
        # supervising and stopping its children: output is lost, the cluster is still managed.
        try:
            stream.write(text)
            stream.flush()
        except (BrokenPipeError, ValueError):
            pass

    def _clear(self) -> None:
        if self._status_shown:
            self._write(self.out, "\r\x1b[K")
            self._status_shown = False

    def line(self, text: str, error: bool = False) -> None:
        self._clear()
        self._write(self.err if error else self.out, text + "\n")

    def status(self, roles: list[Role], elapsed: float) -> None:
        if self.tty:
            width = shutil.get_terminal_size((100, 20)).columns - 1
            self._write(self.out, "\r" + tty_status(roles, elapsed, width) + "\x1b[K")
            self._status_shown = True
        else:
            self.line(plain_status(roles, elapsed))

    def close(self) -> None:
        self._clear()


def summary_rows(result: LaunchResult) -> list[str]:
    """The summary table: one row per role, trainers with their last epoch's numbers (blank
    without one), and the log path last."""
    with_auc = any(r.last_epoch is not None and r.last_epoch.get("auc") is not None for r in result.roles)
    head = ("role", "pid", "exit status", "duration", "examples/s", "loss") + (("auc",) if with_auc else ())
    rows = [(*head, "log")]
    for r in result.roles:
        seconds = "-" if r.seconds is None else f"{r.seconds:.1f} s"
        pid = "-" if r.pid is None else str(r.pid)
        rows.append((r.name, pid, r.state, seconds, *epoch_cells(r.last_epoch, with_auc), str(r.log_path)))
    widths = [max(len(row[c]) for row in rows) for c in range(len(head))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1] for row in rows]


def epoch_cells(record: dict[str, Any] | None, with_auc: bool) -> tuple[str, ...]:
    """examples/s, loss (and AUC) of an "epoch" metrics record as summary cells; blanks for None."""
    def num(key: str, fmt: str) -> str:
        value = None if record is None else record.get(key)
        return "" if value is None else format(value, fmt)

    cells = (num("examples_per_s", ",.0f"), num("loss", ".4g"))
    return cells + ((num("auc", ".4f"),) if with_auc else ())


def _short(role: Role) -> str:
    if role.returncode is None:
        return "run" if role.proc is not None else "-"
    if role.returncode == 0:
        return "ok"
    return describe_exit(role.returncode).replace("killed by ", "")  # "exit 3" / "SIGKILL"


_STAMP = re.compile(r"^\[?\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d[.,\d]*(Z|[+-]\d\d:?\d\d)?\]?\s*")


def log_tail(role: Role) -> str:
    """The last line of a role's log, compacted for a status line: no leading timestamp (the
    status has its own clock), runs of spaces (structlog's column padding) collapsed."""
    if role.proc is None:
        return ""
    line = (last_lines(role.log_path, 1) or [""])[0]
    return " ".join(_STAMP.sub("", line.strip()).split())


def tty_status(roles: list[Role], elapsed: float, width: int) -> str:
    """``[12s] ps0 run ps1 run | t0 run: <last log line> | t1 ok: <...>`` cut to ``width``."""
    servers = " ".join(f"ps{r.index} {_short(r)}" for r in roles if r.kind == "pserver")
    trainers = [r for r in roles if r.kind == "trainer"]
    head = f"[{elapsed:.0f}s] {servers}"
    heads = [f"t{r.index} {_short(r)}" for r in trainers]
    room = (width - len(head) - sum(len(h) + 5 for h in heads)) // max(1, len(trainers))
    parts = [head]
    for r, h in zip(trainers, heads):
        tail = log_tail(r) if room >= 8 else ""
        parts.append(f"{h}: {_cut(tail, room)}" if tail else h)
    return _cut(" | ".join(parts), width)


def plain_status(roles: list[Role], elapsed: float) -> str:
    items = []
    for r in roles:
        item = f"{r.name} {r.state()}"
        tail = log_tail(r) if r.kind == "trainer" else ""
        item += f" [{_cut(tail, 70)}]" if tail else ""
        items.append(item)
    return f"aps-local [{elapsed:.0f}s] " + ", ".join(items)


def _cut(text: str, width: int) -> str:
    if width <= 0:
        return ""
    return text if len(text) <= width else text[: max(0, width - 3)] + "..."
