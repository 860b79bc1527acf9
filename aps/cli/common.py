"""Pieces shared by the command-line programs: logging flags, the event loop, signals."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import Any, NoReturn

from ..errors import ApsError, ConfigError
from ..log import setup_logging


def add_logging_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("logging")
    group.add_argument("--log-json", action="store_true", help="one JSON object per log line (for machines)")
    group.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"], help="default: info")


def add_token_flags(parser: argparse.ArgumentParser | argparse._ArgumentGroup, who: str) -> None:
    """--token-file PATH (preferred) or --token SECRET (visible in ps); APS_TOKEN otherwise."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--token-file", metavar="PATH",
                       help=f"read the shared secret {who} from PATH (its trailing newline dropped); or APS_TOKEN")
    group.add_argument("--token", metavar="SECRET",
                       help="the shared secret on the command line: every user of this machine sees it in ps; "
                            "prefer --token-file or APS_TOKEN")


TOKEN_ON_ARGV = "--token is visible to every user of this machine in ps; prefer --token-file or APS_TOKEN"


def read_token_file(path: str) -> str:
    """The token in ``path``, read once, without its trailing newline; ConfigError when the file
    is missing, unreadable or empty."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise ConfigError(f"--token-file {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--token-file {path}: cannot read it: {getattr(exc, 'strerror', None) or exc}") from None
    token = text.rstrip("\r\n")
    if not token:
        raise ConfigError(f"--token-file {path}: the file is empty")
    return token


def token_from_args(args: argparse.Namespace, env_token: str | None, warn: Callable[[str], None]) -> str | None:
    """The token: --token-file, else --token (with a warning through ``warn``), else APS_TOKEN."""
    if getattr(args, "token_file", None) is not None:
        return read_token_file(args.token_file)
    if args.token is not None:
        warn(TOKEN_ON_ARGV)
        return str(args.token)
    return env_token or None


def run_main(main: Coroutine[Any, Any, int]) -> int:
    """Run the program's coroutine on uvloop when available (chosen here, at the program edge)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency, but keep the CLI usable
        return asyncio.run(main)
    return uvloop.run(main)


def exit_at_once(code: int) -> NoReturn:
    """End a program whose work is done without the interpreter's teardown.

    For the programs that close everything of theirs before they return (aps-trainer: shared
    arrays, files, sinks, connections, workers; aps-local: its children reaped): what is left is
    finalizing modules, about 0.9 s once torch is imported and 0.3 s for numba and aps alone, on the
    path from the end of training to the launcher's exit. Not for aps-server (its disk tables'
    files are removed by finalizers) nor for ``main()`` called from Python."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a reader gone, or a stream already closed
            stream.flush()
    os._exit(code)


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
