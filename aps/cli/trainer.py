"""aps-trainer: run one trainer of a cluster."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from pathlib import Path

import structlog

from ..cluster import ClusterSpec, cluster_from_env, parse_addresses
from ..errors import ConfigError
from ..models import BUILTIN, build_model, model_module
from ..storage.hash.accessor import EXPORT_ROWS
from ..tls import ca_context
from ..trainer import OnlineOptions, PassDir, Strategy, Trainer, TrainOptions
from ..trainer.online_exports import ExportOptions
from ..trainer.pool import start_fork_server, stop_fork_server
from ..trainer.sources import RedisStream, Source
from ..trainer.sources.passdir import DEFAULT_DONE_FILE
from ..trainer.sources.redis_stream import DEFAULT_RETRY
from ..trainer.strategy import MERGES, MODES
from .common import add_logging_flags, add_token_flags, cli_main, exit_at_once, on_signals, token_from_args

DESCRIPTION = """\
Run one aps trainer: read this trainer's share of the input files, train the model with a pool
of compute worker processes, and exchange parameters with the pservers in the chosen mode:

  sync        every step, all trainers' gradients are averaged and applied once (barrier)
  async       gradients are merged and pushed as they come; params pulled per batch
  half_async  workers of one trainer step together; trainers are asynchronous
  geo         workers train locally (SGD); every --k-steps the deltas are exchanged
  hybrid      dense parameters as sync (one averaged update per step), sparse as async

Settings come from flags or the environment (flags win): APS_PSERVERS /
PADDLE_PSERVERS_IP_PORT_LIST, APS_TRAINERS / PADDLE_TRAINERS_NUM, APS_TRAINER_ID /
PADDLE_TRAINER_ID, APS_TOKEN, APS_MODE, APS_WORKERS / CPU_NUM, APS_K_STEPS, APS_MAX_STALENESS,
APS_DENSE_LAG, APS_GEO_CACHE_ROWS, and Paddle's FLAGS_communicator_* names for the communicator
knobs.

With --metrics-port the trainer serves Prometheus metrics (text format) at
http://127.0.0.1:PORT/metrics while it trains (--metrics-host 0.0.0.0 to reach it from other
machines): examples, examples/s, steps, loss, AUC and sliding AUC when the model predicts, geo
syncs and geo cache evictions and rows held (hash tables), send queue depth (async), waiting share, bad lines, epoch, process memory; names start
with aps_trainer_ (process metrics: aps_process_), labelled trainer=ID.

Progress records (loss, examples/s, waiting share, AUC) go to --metrics as JSON lines, for
aps-plot, and with --tensorboard DIR to TensorBoard too (step = examples trained so far).
"""

EPILOG = f"""\
built-in models: {', '.join(sorted(BUILTIN))}; or --model package.module:Class or file.py:Class
examples:
  aps-trainer --pservers 127.0.0.1:7164,127.0.0.1:7165 --trainers 2 --trainer-id 0 \\
      --model word2vec --data data/word2vec/train --mode geo --epochs 1
  aps-trainer --model my_model.py:MyModel --model-arg batch_size=64 --data part-*.txt
  aps-trainer --model ctr_dnn --data train/ --metrics-port 9200   # then: curl 127.0.0.1:9200/metrics
  aps-trainer --model ctr_dnn --data train/ --tensorboard runs/ctr   # then: tensorboard --logdir runs
  aps-trainer --model ctr_dnn --data-passes /data/passes --pass-wait 3600 --save-dir online --resume
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="aps-trainer", description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    c = p.add_argument_group("cluster")
    c.add_argument("--pservers", help="host:port of every pserver, comma-separated, in index order")
    c.add_argument("--trainers", type=int, help="number of trainers (default 1)")
    c.add_argument("--trainer-id", type=int, help="this trainer's index (default 0)")
    add_token_flags(c, "of the pservers")
    c.add_argument("--wait-pservers", type=float, default=0.0, metavar="SECONDS",
                   help="wait up to SECONDS at start for every pserver to accept connections, so the trainer "
                   "may start before (or with) its pservers (default 0: they must listen already)")
    c.add_argument("--tls", action="store_true", help="connect over TLS, verifying the pservers against the system's CAs")
    c.add_argument("--tls-ca", metavar="PATH", help="connect over TLS, trusting the CA (or self-signed) certificate(s) in PATH")
    m = p.add_argument_group("model and data")
    m.add_argument("--model", required=True, help="built-in name, module:Class or file.py:Class")
    m.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE", help="model constructor argument (repeatable)")
    src = m.add_mutually_exclusive_group(required=True)
    src.add_argument("--data", nargs="+", metavar="PATH", help="input files, directories or globs")
    src.add_argument("--data-passes", metavar="ROOT",
                     help="online training over pass folders ROOT/DAY/PASS/ (natural order, each trained once when "
                     "its --done-file exists; each pass scored first: online AUC); see docs/operations.md")
    src.add_argument("--data-stream", metavar="redis://HOST:PORT/STREAM",
                     help="online training from a Redis stream (one input line per entry, field 'line'), read "
                     "through a consumer group, --pass-records entries to a pass; needs pip install 'aps[stream]'")
    m.add_argument("--epochs", type=int, default=1, help="passes over the data (default 1)")
    m.add_argument("--pipe-command", help="run each file through this command (e.g. a DataGenerator script)")
    m.add_argument("--skip-bad-lines", action="store_true", help="skip and count malformed lines instead of failing")
    m.add_argument("--chunk-bytes", type=int, default=1 << 20, help="bytes read per chunk (default 1 MiB)")
    m.add_argument("--seed", type=int, default=0, help="seed of the workers' random numbers")
    on = p.add_argument_group("online training (--data-passes, --data-stream)")
    on.add_argument("--done-file", default=DEFAULT_DONE_FILE, metavar="NAME",
                    help=f"a pass folder is complete once it holds NAME (default {DEFAULT_DONE_FILE}, what Hadoop and "
                    "Spark jobs write); ROOT/NAME itself means no more passes will come")
    on.add_argument("--pass-wait", type=float, default=600.0, metavar="SECONDS",
                    help="wait up to SECONDS for the next pass to be complete (a stream: a pass is what arrived in "
                    "SECONDS if fewer than --pass-records), then stop (exit 0, reason logged; default 600)")
    on.add_argument("--last-pass", metavar="DAY/PASS", help="stop after training this pass")
    on.add_argument("--save-every-passes", type=int, default=1, metavar="N",
                    help="trainer 0 saves SAVE_DIR/pass-SEQ with the position after every N passes (default 1; 0: never)")
    on.add_argument("--keep-passes", type=int, default=OnlineOptions.keep_passes, metavar="K",
                    help="after each pass checkpoint, delete those older than the newest K (default %(default)s; 0: keep all)")
    on.add_argument("--resume", action="store_true",
                    help="load the newest complete pass checkpoint in --save-dir and continue after its pass "
                    "(none yet: start at the first pass)")
    on.add_argument("--pass-records", type=int, default=100_000, metavar="N",
                    help="a stream pass: N entries read by this trainer (default 100000)")
    on.add_argument("--stream-retry", type=float, default=DEFAULT_RETRY, metavar="SECONDS",
                    help="a stream's redis-server that cannot be reached is retried, reconnecting, for SECONDS from "
                    "the first failure (logged while waiting), then the trainer stops, exit 1 "
                    "(default %(default)g; 0: fail at once)")
    on.add_argument("--stream-group", metavar="NAME",
                    help="the stream's consumer group, one per job (default aps:STREAM); each trainer is "
                    "consumer trainer-ID of it")
    on.add_argument("--export-dir", metavar="ROOT",
                    help="trainer 0 exports for aps-serve into ROOT (relative: the pservers' checkpoint root): a base "
                    "after the first pass and at new days, deltas between (docs/operations.md)")
    on.add_argument("--export-rows", choices=EXPORT_ROWS, default=EXPORT_ROWS[0],
                    help="what exports write hash tables' rows as: stored (as the pservers store them, with optimizer "
                    "state: a pserver can load the export; the default) or int8 (int8 codes and a float32 scale a row, "
                    "values only: dim + 4 bytes a row, for aps-serve)")
    on.add_argument("--delta-every", type=int, default=1, metavar="N", help="a delta export every N passes (default 1)")
    on.add_argument("--base-every", type=int, default=1, metavar="N",
                    help="shrink every hash table and export a base every N days (default 1)")
    on.add_argument("--no-score", action="store_true", help="train each pass without scoring it first (no online AUC)")
    s = p.add_argument_group("mode and communicator")
    s.add_argument("--mode", choices=MODES, help="default: APS_MODE, else the model's preferred mode "
                   "(hybrid for ctr_dnn and wide_deep), else async")
    s.add_argument("--workers", type=int, help="compute worker processes (default: CPU count, or CPU_NUM; with --data-passes or --data-stream: 1)")
    s.add_argument("--k-steps", type=int, help="geo: exchange deltas every K trainer steps (default 400)")
    s.add_argument("--geo-cache-rows", type=int, metavar="N",
                   help="geo: rows of each hash table's local cache; a full one evicts the least recently used "
                   "(default: APS_GEO_CACHE_ROWS, else the keys the pservers may hold, max_keys x pservers, at most "
                   "2^20; at least 2 x workers x the model's max_batch_ids)")
    s.add_argument("--max-merge-var-num", type=int, help="async: merge at most N batches per push (default workers)")
    s.add_argument("--send-queue-size", type=int, help="async: batches queued before workers wait (default workers)")
    s.add_argument("--min-send-grad-num-before-recv", type=int, help="async: pull dense params every N pushes (default workers)")
    s.add_argument("--thread-pool-size", type=int, help="concurrent table pushes (default 5)")
    s.add_argument("--merge", choices=MERGES, help="how gradients are merged (default auto: see docs/modes.md)")
    s.add_argument("--max-staleness", type=int, metavar="N",
                   help="compute only with sparse rows that lack the gradients of at most N of this trainer's "
                   "batches; a worker waits for pushes otherwise (default: no bound; 0: always fresh)")
    s.add_argument("--dense-lag", type=int, choices=(0, 1), metavar="{0,1}",
                   help="hybrid: 1 runs each step's dense round while the next step computes with the parameters "
                   "of the round before (one-step delayed sync); 0 waits for it (default: APS_DENSE_LAG, else 0)")
    s.add_argument("--no-prefetch", action="store_true", help="async: do not pull the next batch's rows during compute (to measure it)")
    s.add_argument("--rpc-retry-times", type=int, help="retries of a request the pservers refused as retriable (default 3); "
                   "a lost pserver is retried, reconnecting, until --rpc-deadline instead")
    s.add_argument("--rpc-deadline", type=float, help="seconds a lost pserver is retried, reconnecting, before a call "
                   "fails (default 120: long enough for a restart with aps-server --resume)")
    s.add_argument("--rpc-timeout", type=float, help="seconds per call, retries included (default 120)")
    o = p.add_argument_group("output")
    o.add_argument("--save-dir", default="model", help="trainer 0 saves DIR/epoch_N after each epoch (default model)")
    o.add_argument("--no-save", action="store_true", help="do not save after epochs")
    o.add_argument("--print-period", type=float, default=10.0, help="seconds between progress lines (default 10)")
    o.add_argument("--metrics", help="JSON-lines file for progress numbers (default log/trainer.ID.metrics.jsonl)")
    o.add_argument("--record-period", type=float, metavar="SECONDS",
                   help="seconds between progress records in --metrics and --tensorboard (default: automatic, "
                   "1%% of the time trained so far, at least 0.25 s and at most --print-period, so a short run "
                   "still draws curves)")
    o.add_argument("--tensorboard", metavar="DIR",
                   help="also write the progress records as TensorBoard scalars into DIR while training: loss, "
                   "auc and sliding_auc (when the model predicts), examples_per_s, wait_share, staleness and "
                   "staleness_max (of the sparse rows steps computed with); epoch/... per epoch "
                   "(view with: tensorboard --logdir DIR)")
    o.add_argument("--metrics-port", type=int, metavar="PORT", help="serve Prometheus metrics over HTTP on PORT while training; 0 picks a free one (default: off)")
    o.add_argument("--metrics-host", default="127.0.0.1", metavar="HOST", help="address of the metrics endpoint (default 127.0.0.1; 0.0.0.0 for all interfaces)")
    o.add_argument("--metrics-port-file", metavar="PATH", help="write the metrics endpoint's bound port to PATH once listening")
    add_logging_flags(p)
    return p


def _strategy(args: argparse.Namespace) -> Strategy:
    return Strategy.from_env(
        mode=args.mode,
        workers=args.workers,
        k_steps=args.k_steps,
        max_merge_var_num=args.max_merge_var_num,
        send_queue_size=args.send_queue_size,
        min_send_grad_num_before_recv=args.min_send_grad_num_before_recv,
        thread_pool_size=args.thread_pool_size,
        merge=args.merge,
        rpc_retry_times=args.rpc_retry_times,
        rpc_timeout=args.rpc_timeout,
        rpc_deadline=args.rpc_deadline,
        prefetch=False if args.no_prefetch else None,
        max_staleness=args.max_staleness,
        dense_lag=args.dense_lag,
        geo_cache_rows=args.geo_cache_rows,
    )


def make_trainer(args: argparse.Namespace) -> Trainer:
    cluster, own = cluster_from_env()
    pservers = parse_addresses(args.pservers) if args.pservers else cluster.pservers
    if not pservers:
        raise ConfigError("no pservers: pass --pservers host:port,... or set APS_PSERVERS / PADDLE_PSERVERS_IP_PORT_LIST")
    trainers = args.trainers or cluster.num_trainers
    trainer_id = args.trainer_id if args.trainer_id is not None else (own["trainer_id"] or 0)
    # the workers' fork server imports the model's module (torch, numba) while this process
    # imports and builds it: both start-ups overlap instead of one after the other
    start_fork_server(model_module(args.model)[0])
    model = build_model(args.model, args.model_arg)
    metrics = args.metrics or os.path.join("log", f"trainer.{trainer_id}.metrics.jsonl")
    Path(metrics).parent.mkdir(parents=True, exist_ok=True)
    options = TrainOptions(
        save_dir=None if args.no_save else args.save_dir,
        print_period=args.print_period,
        metrics_path=metrics,
        record_period=args.record_period,
        tensorboard=args.tensorboard,
        chunk_bytes=args.chunk_bytes,
        pipe_command=args.pipe_command,
        skip_bad_lines=args.skip_bad_lines,
        seed=args.seed,
        token=token_from_args(args, own["token"], structlog.get_logger("aps.trainer").warning),  # type: ignore[arg-type]
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        metrics_port_file=args.metrics_port_file,
        ssl=ca_context(args.tls_ca) if args.tls_ca else (True if args.tls else None),
        wait_pservers=args.wait_pservers,
    )
    spec = ClusterSpec(pservers, trainers, cluster.ports_num, cluster.ports_num_for_sparse)
    trainer = Trainer(model, _strategy(args), spec, int(trainer_id), options)  # type: ignore[arg-type]
    if args.data_passes or args.data_stream:
        trainer.use_online_defaults()  # before the stream source spools a file per worker
    return trainer


def make_source(args: argparse.Namespace, trainer: Trainer) -> Source:
    """The online source the flags name (--data-passes, --data-stream)."""
    if args.data_stream:
        return RedisStream(
            args.data_stream,
            group=args.stream_group,
            trainer_id=trainer.trainer_id,
            num_trainers=trainer.cluster.num_trainers,
            records=args.pass_records,
            wait=args.pass_wait,
            parts=trainer.strategy.workers or 1,
            retry=args.stream_retry,
        )
    return PassDir(
        args.data_passes,
        trainer_id=trainer.trainer_id,
        num_trainers=trainer.cluster.num_trainers,
        done_file=args.done_file,
        wait=args.pass_wait,
        last_pass=args.last_pass,
    )


def online_options(args: argparse.Namespace) -> OnlineOptions:
    if args.epochs != 1:
        raise ConfigError("--epochs is for --data: online training trains each pass once")
    if args.resume and args.no_save:
        raise ConfigError("--resume reads the checkpoints in --save-dir: it cannot go with --no-save")
    if args.export_rows != EXPORT_ROWS[0] and not args.export_dir:
        raise ConfigError(f"--export-rows {args.export_rows} says what --export-dir's exports hold: pass --export-dir too")
    export = ExportOptions(args.export_dir, args.delta_every, args.base_every, args.export_rows) if args.export_dir else None
    return OnlineOptions(save_every=args.save_every_passes, resume=args.resume, score=not args.no_score, export=export,
                         keep_passes=args.keep_passes)


async def _amain(args: argparse.Namespace) -> int:
    try:
        return await _train(args)
    finally:
        stop_fork_server()  # this program's only trainer is done (or never began): reap its workers' fork server


async def _train(args: argparse.Namespace) -> int:
    log = structlog.get_logger("aps.trainer")
    trainer = make_trainer(args)
    if args.data_passes or args.data_stream:
        online = online_options(args)
        task = asyncio.ensure_future(trainer.atrain_passes(make_source(args, trainer), online))
    else:
        task = asyncio.ensure_future(trainer.atrain(args.data, args.epochs))
    stopped: list[signal.Signals] = []

    def stop(sig: signal.Signals) -> None:
        log.warning("signal received, stopping", signal=sig.name)
        stopped.append(sig)
        task.cancel()

    on_signals(stop)
    try:
        await task
    except asyncio.CancelledError:
        if stopped:
            return 128 + int(stopped[0])
        raise
    return 0


def main(argv: list[str] | None = None) -> int:
    return cli_main("aps-trainer", "trainer", build_parser(), _amain, argv)


def cli() -> None:
    """The aps-trainer program: :func:`main`, then exit without the interpreter's teardown."""
    exit_at_once(main())


if __name__ == "__main__":
    cli()
