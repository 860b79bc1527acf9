"""structlog configuration for the command-line programs (the library never configures logging)."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog


def setup_logging(json: bool = False, level: str = "info", stream: TextIO | None = None, role: str | None = None) -> None:
    """Console output for people, or one JSON object per line for machines (``--log-json``)."""
    out = stream or sys.stderr
    processors: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso" if json else "%Y-%m-%d %H:%M:%S"),
    ]
    if role:
        processors.insert(0, _add_role(role))
    if json:
        processors += [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    else:
        processors.append(structlog.dev.ConsoleRenderer(colors=out.isatty()))
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper(), logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=True,
    )


def _add_role(role: str) -> structlog.types.Processor:
    def add(_: object, __: str, event: dict[str, object]) -> dict[str, object]:
        event.setdefault("role", role)
        return event

    return add
