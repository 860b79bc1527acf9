"""Protocol fuzzing at scale: 100k+ hostile frames against one aps-server process with its default
limits, without and with a token, while a well-behaved client pings it and is checked bit-exact.

    .venv/bin/python bench/fuzz_protocol.py                    # 100k frames per mode, ~3-4 minutes
    .venv/bin/python bench/fuzz_protocol.py --frames 10000 --client-linger 1   # smoke run, ~30 s

The attack is bench/hostile.py (the same one tests/server/transport/test_fuzz.py runs at CI size): random
bytes, header and payload mutations of real requests of every opcode, frames cut short, headers
declaring bodies of up to 4 GiB, requests before the handshake, wrong AUTHs, from many loopback
source addresses. Reported per mode: frames, sessions (connections), the server's replies by
code, how sessions ended, server RSS before / peak (VmHWM) / after the attack's connections
closed / after the server's client linger time passed, and the probe's ping latency during the
attack. Prints Markdown tables and writes JSON (``--json``).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from aps.wire import DEFAULT_MAX_FRAME

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import hostile  # noqa: E402
from bench.pservers import MIB, PingProbe, ServerProcess, markdown_table, percentiles_ms, window, write_results  # noqa: E402

TOKEN = "fuzz-bench-token"
DEFAULT_LINGER = 60.0  # aps-server's default --client-linger


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--frames", type=int, default=100_000, help="hostile frames per mode (default 100000)")
    p.add_argument("--burst", type=int, default=10_000, help="frames between two bit-exact probe checks (default 10000)")
    p.add_argument("--concurrency", type=int, default=32, help="hostile connections open at once (default 32)")
    p.add_argument("--sources", type=int, default=1000, help="loopback source addresses the attack uses (default 1000)")
    p.add_argument("--seed", type=int, default=None, help="RNG seed (default: random, printed)")
    p.add_argument("--modes", default="no_token,token", help="comma-separated: no_token, token (default both)")
    p.add_argument("--trainers", type=int, default=1, help="the server's --trainers: with 2, sync pushes and "
                   "default-count barriers wait for a second trainer that never comes (default 1)")
    p.add_argument("--client-linger", type=float, default=DEFAULT_LINGER,
                   help="the server's --client-linger; 'after linger' is read this long + 1 s after the attack (default 60)")
    p.add_argument("--json", type=Path, default=Path(__file__).resolve().parent / "results" / "fuzz_protocol.json")
    args = p.parse_args(argv)
    for mode in args.modes.split(","):
        if mode not in ("no_token", "token"):
            p.error(f"--modes: unknown mode {mode!r} (no_token, token)")
    return args


async def attack(server: ServerProcess, token: str | None, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    plan = hostile.Attack("127.0.0.1", server.port, token, DEFAULT_MAX_FRAME, sources=hostile.source_pool(rng, args.sources))
    probe = await hostile.Probe(server.address, token, seed).open()
    rss_before = server.rss()[0]
    total = hostile.Tally()
    pinger = PingProbe(server.address, token)  # its own process: the attack here cannot delay it
    started = time.perf_counter()
    began = time.monotonic()
    try:
        while total.frames < args.frames:
            total.add(await hostile.burst(plan, rng, min(args.burst, args.frames - total.frames), args.concurrency))
            if not server.alive():
                raise RuntimeError(f"the server died (exit status {server.proc.returncode}); see {server.log_path}")
            await probe.check()
            print(f"  {total.frames:,} frames, {total.sessions:,} sessions, RSS {server.rss()[0] / MIB:.0f} MiB", flush=True)
        elapsed = time.perf_counter() - started
    finally:
        pings = pinger.stop()
    ended = time.monotonic()
    state = await probe.settle()
    rss_closed, peak = server.rss()
    await asyncio.sleep(args.client_linger + 1.0)
    state = await probe.settle()
    rss_linger = server.rss()[0]
    await probe.check()
    await probe.aclose()
    return {
        "seed": seed,
        "seconds": round(elapsed, 2),
        "frames_per_s": round(total.frames / elapsed),
        **total.as_dict(),
        "probe_checks_passed": probe.checks,
        "ping_ms": percentiles_ms(window(pings, began, ended)),
        "rss_before": rss_before,
        "rss_peak": peak,
        "rss_after_closed": rss_closed,
        "rss_after_linger": rss_linger,
        "table_bytes_after": hostile.table_bytes(state),
        "server_connections_total": state["connections_total"],
    }


def run_mode(mode: str, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    token = TOKEN if mode == "token" else None
    with tempfile.TemporaryDirectory(prefix="aps-fuzz-") as tmp:
        work = Path(tmp)
        token_file = None
        if token is not None:
            token_file = work / "token"
            token_file.write_text(token + "\n")
        flags = hostile.server_flags(token_file, work, "--client-linger", str(args.client_linger), "--trainers", str(args.trainers))
        server = ServerProcess.start(work, *flags, name=f"pserver-{mode}")
        print(f"{mode}: aps-server pid {server.proc.pid} on {server.address}, seed {seed}", flush=True)
        try:
            result = asyncio.run(attack(server, token, args, seed))
        finally:
            status = server.stop()
        log = server.log_path.read_text(errors="replace")
        result["server_exit_status"] = status
        result["server_tracebacks"] = log.count("Traceback")
    return result


def report(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    def mib(n: int) -> str:
        return f"{n / MIB:.0f}"

    rows = []
    for mode, r in results.items():
        replies = sum(r["replies"].values())
        rows.append([
            mode, f"{r['frames']:,}", f"{r['sessions']:,}", f"{replies:,}", r["replies"].get("error:INTERNAL", 0),
            r["unauthenticated_served"], f"{r['frames_per_s']:,}", mib(r["rss_before"]), mib(r["rss_peak"]),
            mib(r["rss_after_closed"]), mib(r["rss_after_linger"]), r["ping_ms"].get("p50"), r["ping_ms"].get("p99"),
            r["ping_ms"].get("max"), r["probe_checks_passed"], r["server_exit_status"],
        ])
    print(f"\nProtocol fuzz, default limits, --trainers {args.trainers} --client-linger {args.client_linger:g} s, "
          f"{args.concurrency} connections at once\n")
    print(markdown_table(
        ["mode", "frames", "sessions", "replies", "INTERNAL", "unauth. served", "frames/s", "RSS before MiB", "peak MiB",
         "after close MiB", "after linger MiB", "ping p50 ms", "p99 ms", "max ms", "bit-exact checks", "exit"], rows))
    codes = sorted(set().union(*(r["replies"] for r in results.values())))
    print("\nServer replies by code\n")
    print(markdown_table(["reply", *results], [[c, *(f"{r['replies'].get(c, 0):,}" for r in results.values())] for c in codes]))
    kinds = list(hostile.FRAME_KINDS)
    endings = sorted(set().union(*(r["endings"] for r in results.values())))
    print("\nFrames sent by kind, and how sessions ended\n")
    print(markdown_table(
        ["mode", *kinds, *(f"ended: {e}" for e in endings)],
        [[m, *(f"{r['frames_by_kind'].get(k, 0):,}" for k in kinds), *(f"{r['endings'].get(e, 0):,}" for e in endings)]
         for m, r in results.items()],
    ))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    seed = args.seed if args.seed is not None else int(np.random.SeedSequence().entropy % (1 << 32))
    results: dict[str, dict[str, Any]] = {}
    for mode in args.modes.split(","):
        results[mode] = run_mode(mode, args, seed)
    report(results, args)
    write_results(args.json, {"config": {k: str(v) for k, v in vars(args).items()}, "modes": results})
    bad = [m for m, r in results.items() if r["replies"].get("error:INTERNAL") or r["unauthenticated_served"]
           or r["server_exit_status"] != 0 or r["server_tracebacks"]]
    if bad:
        print(f"\nFAILED in {', '.join(bad)}: see the JSON (seed {seed})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
