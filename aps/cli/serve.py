"""aps-serve: a read-only store that serves the newest model of an export root."""

from __future__ import annotations

import argparse
import os
import sys

import structlog

from ..errors import ConfigError
from ..server.config import ServerConfig
from ..serving.rows_option import DEFAULT_ROWS, ROWS
from ..serving.server import DEFAULT_POLL, ServingServer
from ..wire import DEFAULT_MAX_FRAME
from .common import add_logging_flags, add_token_flags, cli_main, token_from_args

DESCRIPTION = """\
Serve the newest model of EXPORT_DIR (written by ps.export(root, kind="base"|"delta")) over the
aps protocol, read-only: aps.connect(["HOST:PORT"]).pull_sparse / pull_dense / table_info work
against it as against a cluster of one pserver; pushes and every other write are refused
(READ_ONLY). It loads the newest complete base, applies the deltas after it in version order
as their done markers appear (looking every --poll seconds), checks every file's SHA-256, and
never reads an export without its done marker. Replies say which model version they come from.
Several aps-serve processes may serve one EXPORT_DIR.

--rows int8 holds each hash table's rows as int8 codes with one float32 scale a row (scale =
max|row| / 127), quantized as each base or delta is loaded and read back as float32 on lookup:
dim + 4 bytes a row instead of 4 x dim (dim 16: 20 instead of 64; the index comes on top), each
coordinate within scale / 2 of the row exported, a zero row exactly zero. Fixed and dense tables,
and keys not held (their initial row), are served as without it. An export written with int8 rows
(ps.export(..., rows="int8"), aps-trainer --export-rows int8) is served alike either way: its
codes are held as written, or read back as code x scale.

environment:
  token         APS_TOKEN (optional; as aps-server)

example:
  aps-serve /data/exports --port 7200 --poll 0.2
  aps-serve /data/exports --port 7200 --rows int8
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aps-serve", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("export_dir", metavar="EXPORT_DIR", help="the export root (a directory of <version>-<kind> exports)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (default: 0, any free one)")
    parser.add_argument("--port-file", metavar="PATH", help="write the bound port to PATH once listening (for launchers)")
    parser.add_argument("--poll", type=float, default=DEFAULT_POLL, help=f"seconds between looks at EXPORT_DIR (default: {DEFAULT_POLL})")
    parser.add_argument(
        "--rows", default=DEFAULT_ROWS, metavar="{" + ",".join(ROWS) + "}",
        help=f"what hash tables' rows are held as: {ROWS[0]} (float32, as exported; the default) or int8 (int8 "
             "codes and a float32 scale a row: dim + 4 bytes instead of 4 x dim, see above)",
    )
    parser.add_argument("--max-frame", type=int, default=DEFAULT_MAX_FRAME, help="largest frame in bytes (default: 64 MiB)")
    parser.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus metrics on this port (0: any)")
    add_token_flags(parser, "clients must prove (HMAC challenge)")
    add_logging_flags(parser)
    return parser


async def _amain(args: argparse.Namespace) -> int:
    log = structlog.get_logger("aps.serving")
    if args.rows not in ROWS:
        raise ConfigError(f"--rows {args.rows}: not one of {', '.join(ROWS)}")
    if not os.path.isdir(args.export_dir):
        raise ConfigError(f"EXPORT_DIR {args.export_dir}: no such directory")
    if args.port_file and not os.path.isdir(os.path.dirname(os.path.abspath(args.port_file))):
        raise ConfigError(f"--port-file {args.port_file}: its directory does not exist")
    token = token_from_args(args, os.environ.get("APS_TOKEN"), log.warning)
    config = ServerConfig(
        host=args.host, port=args.port, token=token, max_frame=args.max_frame, metrics_port=args.metrics_port,
        exit_when_done=False, trainer_timeout=0.0,
    )
    await ServingServer(args.export_dir, config, args.poll, rows=args.rows).serve_until_signalled(args.port_file)
    return 0


def main(argv: list[str] | None = None) -> int:
    return cli_main("aps-serve", "serve", build_parser(), _amain, argv)


if __name__ == "__main__":
    sys.exit(main())
