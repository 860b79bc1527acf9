"""Pieces shared by the command-line programs: logging flags, the event loop, signals."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from ..errors import ApsError, ConfigError
from ..log import setup_logging


def add_logging_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("logging")
    group.add_argument("--log-json", action="store_true", help="one JSON object per log line (for machines)")
    group.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"], help="default: info")


def run_main(main: Coroutine[Any, Any, int]) -> int:
    """Run the program's coroutine on uvloop when available (chosen here, at the program edge)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency, but keep the CLI usable
        return asyncio.run(main)
    return uvloop.run(main)


def on_signals(callback: Callable[[signal.Signals], None], *signals: signal.Signals) -> None:
    loop = asyncio.get_running_loop()
    for sig in signals or (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, callback, sig)


def cli_main(
    prog: str, role: str, parser: argparse.ArgumentParser, amain: Callable[[argparse.Namespace], Coroutine[Any, Any, int]],
    argv: list[str] | None,
) -> int:
    """Parse flags, set up logging, run; a ConfigError exits 2, any other ApsError 1, each as
    one line on stderr instead of a traceback."""
    args = parser.parse_args(argv)
    setup_logging(json=args.log_json, level=args.log_level, role=role)
    try:
        return run_main(amain(args))
    except ConfigError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except ApsError as exc:
        print(f"{prog}: failed: {exc}", file=sys.stderr)
        return 1
