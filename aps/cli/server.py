"""aps-server: run one parameter server."""

from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import resource
import sys

import structlog

from ..cluster import cluster_from_env, parse_addresses
from ..errors import ConfigError
from ..server import PServer, ServerConfig
from ..server.config import TABLES_SHARE_OF_MEMORY
from ..wire import DEFAULT_MAX_FRAME
from .common import add_logging_flags, add_token_flags, cli_main, token_from_args

DESCRIPTION = """\
Run one aps parameter server (pserver). It owns shard INDEX of every table, applies the
optimizers, and exits by itself once every trainer has sent worker_done. SIGTERM or Ctrl-C stop
it gracefully (stop accepting, finish in-flight requests, write a last checkpoint when
--checkpoint-dir is set, exit 0).

Settings come from flags or from the environment (flags win; of several names the first set
wins). Environment names, aps's first, then Paddle's (Fleet, then the older transpiler
contract, then the v2 launch parameters):
  host          APS_HOST, POD_IP, PADDLE_CURRENT_IP
  port          APS_PORT, PADDLE_PORT, PADDLE_PSERVER_PORT, PADDLE_INIT_PORT
  pservers      APS_PSERVERS, PADDLE_PSERVERS_IP_PORT_LIST (host:port,...), else
                PADDLE_PSERVER_IPS with PADDLE_PSERVER_PORT, else PADDLE_INIT_PSERVERS with
                PADDLE_INIT_PORT (IPs sharing one port); this server's position in the list
                (its host:port) gives its index
  index         APS_SERVER_INDEX
  trainers      APS_TRAINERS, PADDLE_TRAINERS_NUM, PADDLE_TRAINERS, PADDLE_INIT_NUM_GRADIENT_SERVERS
  ports         APS_PORTS_NUM, PADDLE_INIT_PORTS_NUM; APS_PORTS_NUM_FOR_SPARSE,
                PADDLE_INIT_PORTS_NUM_FOR_SPARSE
  token         APS_TOKEN
PADDLE_TRAINING_ROLE / TRAINING_ROLE / APS_ROLE, PADDLE_TRAINER_ID / PADDLE_INIT_TRAINER_ID and
PADDLE_INIT_TRAINER_COUNT are the trainers' (aps-trainer, aps.fleet) and not read here.

v2 launch parameters: with --ports-num N --ports-num-for-sparse M the server listens on N+M
consecutive ports from --port: N for dense tables and control requests, then M for sparse
tables. Every port serves every request; trainers given the same numbers spread dense traffic
over the dense ports and sparse traffic over the sparse ones (docs/protocol.md, "Ports"); the
stats op reports frames per port. --num-gradient-servers is v2's name of --trainers.

Security: with a token (--token-file, or APS_TOKEN) only clients that prove it are served, and
failed proofs are answered slowly; save and load paths clients name must lie under
--checkpoint-root (default: the working directory); --tls-cert and --tls-key encrypt the traffic.

With --metrics-port it also serves Prometheus metrics (text format) at http://HOST:PORT/metrics,
on --host unless --metrics-host says otherwise: requests, bytes and latency per op, rows and
bytes per table, connected clients, trainers done, process memory. Names start with aps_.
"""

EPILOG = """\
examples:
  aps-server --port 7164 --trainers 2 --pservers 127.0.0.1:7164,127.0.0.1:7165
  aps-server --port 7165 --index 1 --servers 2 --trainers 2 --init-model model/epoch_3
  aps-server --port 7164 --trainers 2 --metrics-port 9164      # then: curl HOST:9164/metrics
  aps-server --port 0 --port-file ps.port --metrics-port 0 --metrics-port-file ps.metrics.port
  aps-server --port 7164 --trainers 2 --checkpoint-dir ckpt --checkpoint-every 300 --keep-checkpoints 3
  aps-server --port 7164 --trainers 2 --resume ckpt --checkpoint-every 300    # after a crash: same index
  aps-server --port 7164 --ports-num 2 --ports-num-for-sparse 2 --num-gradient-servers 4 --async-lagged-grad-discard-ratio 1.6
  aps-server --port 7164 --token-file ~/.aps-token --checkpoint-root /data/ckpt --tls-cert ps.pem --tls-key ps.key
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aps-server", description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--host", help="address to listen on (default 127.0.0.1, or POD_IP)")
    parser.add_argument("--port", type=int, help="port to listen on; 0 picks a free one (default 0, or PADDLE_PORT)")
    parser.add_argument("--pservers", help="host:port of every pserver, comma-separated, in index order")
    parser.add_argument("--index", type=int, help="this server's index (default: its position in --pservers, else 0)")
    parser.add_argument("--servers", type=int, help="number of pservers (default: length of --pservers, else 1)")
    parser.add_argument("--trainers", "--num-gradient-servers", "--num_gradient_servers", type=int,
                        help="number of trainers that will connect (default 1); v2 calls them gradient servers")
    v2 = parser.add_argument_group("v2 launch parameters (Paddle's paddle pserver flags; underscores work too)")
    v2.add_argument("--ports-num", "--ports_num", type=int, metavar="N",
                    help="dense ports: listen on N consecutive ports from --port (default 1, or PADDLE_INIT_PORTS_NUM)")
    v2.add_argument("--ports-num-for-sparse", "--ports_num_for_sparse", type=int, metavar="M",
                    help="sparse ports: M more ports after the dense ones, for sparse-table traffic "
                         "(default 0: sparse tables on the dense ports, or PADDLE_INIT_PORTS_NUM_FOR_SPARSE)")
    v2.add_argument("--async-lagged-grad-discard-ratio", "--async_lagged_grad_discard_ratio", type=float, metavar="R",
                    default=0.0, help="async mode: drop a gradient computed from parameters more than R x trainers "
                    "updates old, counted in stats (default 0: keep all)")
    add_token_flags(parser, "clients must prove (HMAC challenge)")
    parser.add_argument("--init-model", metavar="PATH", help="warm start from a checkpoint saved by any number of pservers "
                        "(not confined to --checkpoint-root: it is the operator's own choice)")
    parser.add_argument("--checkpoint-root", metavar="DIR",
                        help="save and load paths clients name must lie in DIR (symlinks and .. resolved); relative "
                             "ones are taken from DIR (default: the working directory)")
    parser.add_argument("--data-dir", metavar="DIR",
                        help="where disk tables (HashTable(disk=aps.Disk(...))) keep their cold rows, a directory per "
                             "table made at its creation (default: aps-disk/server-INDEX under --checkpoint-root, else "
                             "under the working directory)")
    parser.add_argument("--tls-cert", metavar="PATH", help="serve over TLS with this PEM certificate (chain); needs --tls-key")
    parser.add_argument("--tls-key", metavar="PATH", help="the PEM private key of --tls-cert")
    parser.add_argument("--max-frame", type=int, default=DEFAULT_MAX_FRAME, help="largest frame in bytes (default 64 MiB)")
    parser.add_argument("--no-exit-when-done", action="store_true", help="keep serving after every trainer sent worker_done")
    parser.add_argument("--port-file", metavar="PATH", help="write the bound port to PATH once listening (for launchers)")
    parser.add_argument("--shrink-every", type=float, default=ServerConfig.shrink_every, metavar="SECONDS",
                        help="shrink every hash table every SECONDS: decay show and click by 0.98, delete keys "
                             "scoring under 0.8 (default 0: only when a client asks)")
    ck = parser.add_argument_group("checkpoints and restarts (see docs/operations.md)")
    ck.add_argument("--checkpoint-dir", metavar="DIR", help="where this server writes its own checkpoints (default: the --resume DIR)")
    ck.add_argument("--checkpoint-every", type=float, default=0.0, metavar="SECONDS", help="write this server's shard to --checkpoint-dir every SECONDS (default 0: off)")
    ck.add_argument("--keep-checkpoints", type=int, default=ServerConfig.keep_checkpoints, metavar="K", help="keep the newest K of this server's own checkpoints (default 3)")
    ck.add_argument("--resume", metavar="DIR", help="restart: load this shard from the newest complete checkpoint of it in DIR (refuses to start if there is none)")
    m = parser.add_argument_group("metrics")
    m.add_argument("--metrics-port", type=int, metavar="PORT", help="serve Prometheus metrics over HTTP on PORT; 0 picks a free one (default: off)")
    m.add_argument("--metrics-host", metavar="HOST", help="address of the metrics endpoint (default: --host)")
    m.add_argument("--metrics-port-file", metavar="PATH", help="write the metrics endpoint's bound port to PATH once listening")
    lim = parser.add_argument_group("limits (0 turns one off; see docs/operations.md, Limits)")
    lim.add_argument("--handshake-timeout", type=float, default=ServerConfig.handshake_timeout, metavar="SECONDS", help="close a connection that has not finished HELLO/AUTH by then (default 10)")
    lim.add_argument("--frame-timeout", type=float, default=ServerConfig.frame_timeout, metavar="SECONDS", help="close a connection whose frame is not complete this long after its first byte (default 30)")
    lim.add_argument("--max-connection-bytes", type=int, default=ServerConfig.max_connection_bytes, metavar="BYTES", help="bytes in flight per connection: declared bodies plus waiting requests (default 256 MiB)")
    lim.add_argument("--max-inflight-bytes", type=int, default=ServerConfig.max_inflight_bytes, metavar="BYTES", help="bytes in flight over all connections through their handshake, counted as they arrive (default 1 GiB)")
    lim.add_argument("--max-handshake-bytes", type=int, default=ServerConfig.max_handshake_bytes, metavar="BYTES", help="bytes in flight over all connections not through their handshake, a budget of their own (default 16 MiB)")
    lim.add_argument("--max-table-bytes", type=int, default=ServerConfig.max_table_bytes, metavar="BYTES", help="largest table shard this server creates, values plus optimizer state (default 16 GiB)")
    lim.add_argument("--max-tables-bytes", type=int, default=None, metavar="BYTES", help=f"all table shards of this server together, hash tables' growth included: the table that would pass it is refused, and new keys of a hash table once it is full (default {TABLES_SHARE_OF_MEMORY * 100:.0f}%% of this machine's memory)")
    lim.add_argument("--trainer-timeout", type=float, default=ServerConfig.trainer_timeout, metavar="SECONDS", help="a trainer silent this long (no connection, no heartbeat) is gone: sync rounds and barriers stop waiting for it, naming it, and it counts as done (default 60)")
    lim.add_argument("--client-linger", type=float, default=ServerConfig.client_linger, metavar="SECONDS", help="keep a gone client's change tracking and replay entries this long (default 60)")
    lim.add_argument("--max-tracking-bytes", type=int, default=ServerConfig.max_tracking_bytes, metavar="BYTES", help="GEO change tracking over all clients and tables; over it, gone clients' tracking is dropped first and a dropped client gets every row at its next read (default 256 MiB)")
    lim.add_argument("--max-connections", type=int, default=ServerConfig.max_connections, metavar="N", help="open connections this pserver accepts; one over it is closed at once and logged (default 4096, and always below the file-descriptor limit; 0: only that limit)")
    lim.add_argument("--max-connections-per-address", type=int, default=ServerConfig.max_connections_per_address, metavar="N", help="the same, from one client address (default 512; 0: no limit)")
    add_logging_flags(parser)
    return parser


#: file descriptors kept free for what is not a client connection (checkpoint files, logs,
#: the metrics endpoint, the kernel cache)
_SPARE_FDS = 64


def fit_connections_to_fd_limit(wanted: int) -> tuple[int, int]:
    """Raise this process's soft limit on open files to its hard limit (Linux's soft default of
    1024 would run out long before ``--max-connections``), and return (the connection cap that
    fits under it, the soft limit). Only the CLI does this: a library must not change its host
    process's limits."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass  # keep the soft limit; the cap below follows it
    room = max(soft - _SPARE_FDS, 1)
    return (room if wanted == 0 else min(wanted, room)), soft


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    cluster, own = cluster_from_env()
    pservers = parse_addresses(args.pservers) if args.pservers else cluster.pservers
    host = args.host or own["host"] or "127.0.0.1"
    port = args.port if args.port is not None else (own["port"] or 0)
    index = args.index if args.index is not None else own["server_index"]
    if index is None:
        index = pservers.index(f"{host}:{port}") if f"{host}:{port}" in pservers else 0
        if pservers and f"{host}:{port}" not in pservers and len(pservers) > 1:
            raise ConfigError(f"{host}:{port} is not in the pserver list; pass --index")
    for flag, value in (("--servers", args.servers), ("--trainers", args.trainers)):
        if value is not None and value < 1:
            raise ConfigError(f"{flag} must be >= 1, got {value}")
    if args.port_file and not os.path.isdir(os.path.dirname(os.path.abspath(args.port_file))):
        raise ConfigError(f"--port-file {args.port_file}: its directory does not exist")
    servers = args.servers or (len(pservers) if pservers else 1)
    ports_num = args.ports_num if args.ports_num is not None else cluster.ports_num
    sparse_ports = args.ports_num_for_sparse if args.ports_num_for_sparse is not None else cluster.ports_num_for_sparse
    trainers = args.trainers or cluster.num_trainers
    token = token_from_args(args, own["token"], structlog.get_logger("aps.server").warning)  # type: ignore[arg-type]
    if (args.tls_cert is None) != (args.tls_key is None):
        raise ConfigError("--tls-cert and --tls-key go together")
    if args.checkpoint_every and not (args.checkpoint_dir or args.resume):
        raise ConfigError("--checkpoint-every needs --checkpoint-dir (or --resume) to say where")
    if args.resume is not None and not os.path.isdir(args.resume):
        raise ConfigError(f"--resume {args.resume}: no such directory")
    if args.checkpoint_root is not None and not os.path.isdir(args.checkpoint_root):
        raise ConfigError(f"--checkpoint-root {args.checkpoint_root}: no such directory")
    return ServerConfig(
        host=str(host),
        port=int(port),  # type: ignore[arg-type]
        server_index=int(index),  # type: ignore[arg-type]
        num_servers=servers,
        num_trainers=trainers,
        token=token,
        max_frame=args.max_frame,
        init_model=args.init_model,
        exit_when_done=not args.no_exit_when_done,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        metrics_port_file=args.metrics_port_file,
        checkpoint_root=args.checkpoint_root,
        data_dir=args.data_dir,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        handshake_timeout=args.handshake_timeout,
        frame_timeout=args.frame_timeout,
        max_connection_bytes=args.max_connection_bytes,
        max_inflight_bytes=args.max_inflight_bytes,
        max_table_bytes=args.max_table_bytes,
        max_handshake_bytes=args.max_handshake_bytes,
        **({"max_tables_bytes": args.max_tables_bytes} if args.max_tables_bytes is not None else {}),
        client_linger=args.client_linger,
        max_tracking_bytes=args.max_tracking_bytes,
        trainer_timeout=args.trainer_timeout,
        checkpoint_dir=args.checkpoint_dir,
        checkpoint_every=args.checkpoint_every,
        keep_checkpoints=args.keep_checkpoints,
        shrink_every=args.shrink_every,
        resume=args.resume,
        ports_num=ports_num,
        ports_num_for_sparse=sparse_ports,
        async_lagged_grad_discard_ratio=args.async_lagged_grad_discard_ratio,
        max_connections=args.max_connections,
        max_connections_per_address=args.max_connections_per_address,
    )


async def _amain(args: argparse.Namespace) -> int:
    log = structlog.get_logger("aps.server")
    config = config_from_args(args)
    if config.max_connections >= 0 and config.max_connections_per_address >= 0:  # else PServer says why
        cap, fds = fit_connections_to_fd_limit(config.max_connections)
        if config.max_connections and cap != config.max_connections:
            log.warning("connection cap lowered to fit the open-file limit", max_connections=cap, nofile=fds,
                        asked=config.max_connections)
            config = dataclasses.replace(config, max_connections=cap)
    # everything imported so far lives as long as the process: out of the cyclic collector's
    # sight, its full passes stop walking ~100k objects while requests wait (40-80 ms a pass)
    gc.freeze()
    await PServer(config).serve_until_signalled(args.port_file)
    return 0


def main(argv: list[str] | None = None) -> int:
    return cli_main("aps-server", "pserver", build_parser(), _amain, argv)


if __name__ == "__main__":
    sys.exit(main())
