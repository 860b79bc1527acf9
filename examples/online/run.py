"""Online training end to end, in about two minutes: a drifting click stream, a trainer that
scores then trains each pass and exports it, aps-serve following the exports, scoring from it.

    python examples/online/run.py                  # 3 days x 3 passes of 4,000 lines
    python examples/online/run.py --no-admission   # the same stream, every key kept, no cap

What it starts (all stopped at the end, and on Ctrl-C): one ``aps-server``, one ``aps-trainer
--data-passes`` (CTR-DNN with a hash table: ``max_keys``, ``admit_probability``; a shrink and a
base export at each new day, a delta export after every other pass) and ``aps-serve`` on the
export root. Per pass it prints:

* the trainer's **online AUC**: the pass scored with the model before it was trained on it;
* the **keys** the hash table held after the pass (at most ``max_keys``);
* the **export** written after it and its **freshness**: from the export's done marker to the
  first aps-serve reply tagged with its version;
* the **served AUC**: the next pass, not trained yet, scored by predict.py's code with the
  parameters aps-serve serves at that version (the online AUC of the same lines, seen from the
  serving side; lower when a base or delta leaves out keys under its score threshold).

``--json PATH`` writes every number. The logs of the processes are under ``--workdir``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(ROOT), str(HERE)]  # run from a checkout without installing

import aps  # noqa: E402
from aps.models import build_model  # noqa: E402
from aps.serving.layout import MARKER, list_exports  # noqa: E402
from make_passes import write_passes  # noqa: E402
from predict import score  # noqa: E402

EMBEDDING = "SparseFeatFactors"


@dataclass
class Settings:
    days: int = 3
    passes_per_day: int = 3
    lines: int = 4000
    seed: int = 0
    #: the hash table's cap (per pserver); None: no cap
    max_keys: int | None = 8000
    admit_probability: float = 0.5
    #: the model's other --model-arg values (a small net: the example runs on a laptop)
    model_args: list[str] = field(default_factory=lambda: ["hidden=64,64", "batch_size=256", "lr=0.003"])
    #: serve the exports and score from them (off: train and export only, as a benchmark may)
    serve: bool = True
    #: export after every pass, with a shrink at each new day (off: no exports, no shrink, no serving)
    exports: bool = True
    #: seconds to wait for any process step before giving up
    timeout: float = 120.0

    def trainer_model_args(self) -> list[str]:
        args = ["table=hash", f"admit_probability={self.admit_probability}", f"seed={self.seed}", *self.model_args]
        return args + ([f"max_keys={self.max_keys}"] if self.max_keys is not None else [])


class Processes:
    """The example's child processes; :meth:`stop` ends every one still running."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: list[subprocess.Popen] = []
        (workdir / "logs").mkdir(parents=True, exist_ok=True)

    def start(self, command: str, *args: str) -> subprocess.Popen:
        log = open(self.workdir / "logs" / f"{command}.log", "wb")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        with log:
            proc = subprocess.Popen([sys.executable, str(ROOT / "bin" / command), *args], stdout=log, stderr=subprocess.STDOUT, env=env)
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def wait_for_port(path: Path, proc: subprocess.Popen, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[1]} exited with {proc.returncode} before listening (see its log)")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{proc.args[1]} did not listen within {timeout:g} s")
        await asyncio.sleep(0.05)
    return int(path.read_text())


def epoch_records(path: Path) -> list[dict[str, Any]]:
    """The trainer's pass records so far (one JSON line each in its metrics file)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return [r for line in text.splitlines() if line.endswith("}") and (r := json.loads(line))["event"] == "epoch"]


class Follower:
    """Watches the export root and aps-serve: when each export was done, when it was served,
    and the served AUC of the next pass at each version."""

    def __init__(self, settings: Settings, exports: Path, passes: Path, names: list[str], client: aps.PSClient | None) -> None:
        self.settings, self.exports, self.passes, self.names = settings, exports, passes, names
        self.client = client
        self.model = build_model("ctr_dnn", settings.trainer_model_args())
        self.done: dict[int, float] = {}  # version -> its DONE marker's time
        self.freshness: dict[int, float] = {}
        self.served_auc: dict[int, float] = {}

    async def look(self) -> None:
        for e in list_exports(self.exports):
            if e.done and e.version not in self.done:
                self.done[e.version] = (e.path / MARKER).stat().st_mtime
        if self.client is None or not self.done:
            return  # aps-serve has no table before the first export
        try:
            _, version = await self.client.pull_sparse(EMBEDDING, np.zeros(1, np.int64), with_version=True)
        except aps.ServerError as exc:
            if "no export" not in exc.message:
                raise
            return  # the first export is done but not loaded yet
        now = time.time()
        for v in sorted(self.done):
            if v <= (version or 0) and v not in self.freshness:
                self.freshness[v] = max(0.0, now - self.done[v])
                if v == version and v < len(self.names):  # export v follows pass v: score pass v + 1
                    files = [str(self.passes / self.names[v] / "part-00000")]
                    self.served_auc[v] = (await score(self.model, self.client, files, None))["auc"]

    def ready(self, version: int | None) -> bool:
        """Export ``version`` (None: the pass wrote none) is done, and served when there is a
        server to ask."""
        if version is None:
            return True
        return version in (self.freshness if self.client is not None else self.done)


async def follow(settings: Settings, workdir: Path, names: list[str], trainer: subprocess.Popen,
                 serve_port: int | None, report: Any) -> list[dict[str, Any]]:
    """Print a row per pass once its export is served, until the trainer is done and every
    export it wrote is served; returns the rows."""
    metrics = workdir / "trainer.metrics.jsonl"
    async with contextlib.AsyncExitStack() as stack:
        client = None if serve_port is None else await stack.enter_async_context(aps.connect([f"127.0.0.1:{serve_port}"]))
        f = Follower(settings, workdir / "ckpt" / "exports", workdir / "passes", names, client)
        rows: list[dict[str, Any]] = []
        deadline = time.monotonic() + settings.timeout
        while True:
            await f.look()
            records = epoch_records(metrics)
            while len(rows) < len(records) and f.ready(records[len(rows)].get("export")):
                rows.append(row(records[len(rows)], f))
                report(rows[-1])
                deadline = time.monotonic() + settings.timeout
            if trainer.poll() is not None:
                if trainer.returncode != 0:
                    raise RuntimeError(f"aps-trainer exited with {trainer.returncode} (log: {workdir / 'logs' / 'aps-trainer.log'})")
                if len(rows) == len(records):
                    return rows
            if time.monotonic() > deadline:
                raise RuntimeError(f"no pass served within {settings.timeout:g} s (logs: {workdir / 'logs'})")
            await asyncio.sleep(0.02)


def row(record: dict[str, Any], f: Follower) -> dict[str, Any]:
    version = record.get("export")
    return {
        "pass": record["pass"], "online_auc": record.get("online_auc"), "keys": record.get("keys", {}).get(EMBEDDING),
        "export": version, "export_kind": record.get("export_kind"),
        "freshness_s": f.freshness.get(version), "served_auc_next_pass": f.served_auc.get(version),
    }


def show(r: dict[str, Any]) -> str:
    def num(x: float | None, fmt: str) -> str:
        return "-" if x is None else format(x, fmt)

    return (f"{r['pass']:>14}  {num(r['online_auc'], '.4f'):>10}  {num(r['keys'], ',d'):>7}  "
            f"{num(r['export'], 'd'):>3} {r['export_kind'] or '':<5}  {num(r['freshness_s'], '.2f'):>11}  {num(r['served_auc_next_pass'], '.4f'):>10}")


HEADER = f"{'pass':>14}  {'online AUC':>10}  {'keys':>7}  {'export':<9}  {'freshness s':>11}  {'served AUC':>10}"


async def run(settings: Settings, workdir: Path, report: Any = print) -> dict[str, Any]:
    """Generate the stream, start the processes, follow them to the end; returns the numbers.
    Every process started is stopped before it returns or raises."""
    meta = write_passes(workdir / "passes", days=settings.days, passes_per_day=settings.passes_per_day,
                        lines=settings.lines, seed=settings.seed)
    (workdir / "ckpt" / "exports").mkdir(parents=True, exist_ok=True)
    procs = Processes(workdir)
    try:
        server = procs.start("aps-server", "--port", "0", "--port-file", str(workdir / "ps.port"),
                             "--checkpoint-root", str(workdir / "ckpt"), "--no-exit-when-done")
        ps_port = await wait_for_port(workdir / "ps.port", server, settings.timeout)
        serve_port = None
        if settings.serve and settings.exports:
            serving = procs.start("aps-serve", str(workdir / "ckpt" / "exports"), "--port", "0",
                                  "--port-file", str(workdir / "serve.port"), "--poll", "0.05")
            serve_port = await wait_for_port(workdir / "serve.port", serving, settings.timeout)
        model_args = [a for arg in settings.trainer_model_args() for a in ("--model-arg", arg)]
        trainer = procs.start(
            "aps-trainer", "--pservers", f"127.0.0.1:{ps_port}", "--model", "ctr_dnn", *model_args, "--workers", "1",
            "--mode", "async", "--seed", str(settings.seed), "--data-passes", str(workdir / "passes"), "--pass-wait", "10",
            "--save-every-passes", "0", *(["--export-dir", "exports"] if settings.exports else []), "--metrics", str(workdir / "trainer.metrics.jsonl"),
            "--print-period", "0",
        )
        report(f"{len(meta['passes'])} passes of {settings.lines} lines ({meta['passes'][0]} .. {meta['passes'][-1]}), "
               f"Bayes AUC at the end of the drift {meta['bayes_auc_test']:.4f}; max_keys {settings.max_keys}, "
               f"admit_probability {settings.admit_probability}; logs in {workdir / 'logs'}")
        report(HEADER)
        rows = await follow(settings, workdir, meta["passes"], trainer, serve_port, lambda r: report(show(r)))
    finally:
        procs.stop()
    return {"passes": rows, "settings": settings.__dict__, "bayes_auc_end": meta["bayes_auc_test"],
            "pids": [p.pid for p in procs.procs]}


async def until_interrupted(work: Awaitable[dict[str, Any]], interrupted: list[bool]) -> dict[str, Any]:
    """``work``, cancelled on Ctrl-C (SIGINT), which is noted in ``interrupted``: the exit status
    then says so (130) whatever the cancelled work did with its cancellation on the way out.
    (asyncio.run's own handler turns SIGINT into KeyboardInterrupt only when the cancellation
    comes back out of the task; one lost on the way let the example run on to its end and exit 0.)"""
    task = asyncio.current_task()
    assert task is not None

    def on_sigint() -> None:
        interrupted.append(True)
        task.cancel()

    asyncio.get_running_loop().add_signal_handler(signal.SIGINT, on_sigint)
    return await work


@contextlib.contextmanager
def workdir_of(path: str | None) -> Iterator[Path]:
    if path is not None:
        Path(path).mkdir(parents=True, exist_ok=True)
        yield Path(path)
        return
    with tempfile.TemporaryDirectory(prefix="aps-online-") as tmp:
        yield Path(tmp)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    d = Settings()
    p.add_argument("--days", type=int, default=d.days, help="days of passes (default %(default)s; a base at each)")
    p.add_argument("--passes-per-day", type=int, default=d.passes_per_day, help="default %(default)s")
    p.add_argument("--lines", type=int, default=d.lines, help="lines a pass (default %(default)s)")
    p.add_argument("--seed", type=int, default=d.seed, help="default %(default)s")
    p.add_argument("--max-keys", type=int, default=d.max_keys, help="the hash table's cap (default %(default)s)")
    p.add_argument("--admit-probability", type=float, default=d.admit_probability, help="default %(default)s")
    p.add_argument("--no-admission", action="store_true", help="no cap and every key admitted")
    p.add_argument("--workdir", help="keep the passes, exports and logs here (default: a temporary directory)")
    p.add_argument("--json", help="write the numbers here")
    args = p.parse_args(argv)
    if min(args.days, args.passes_per_day, args.lines) < 1:
        p.error("--days, --passes-per-day and --lines must be >= 1")
    settings = Settings(args.days, args.passes_per_day, args.lines, args.seed,
                        None if args.no_admission else args.max_keys, 1.0 if args.no_admission else args.admit_probability)
    interrupted: list[bool] = []
    with workdir_of(args.workdir) as workdir:
        try:
            result = asyncio.run(until_interrupted(run(settings, workdir), interrupted))
        except RuntimeError as exc:
            if not interrupted:
                print(f"run.py: error: {exc}", file=sys.stderr)
                return 1
        except (KeyboardInterrupt, asyncio.CancelledError):
            interrupted.append(True)
        if interrupted:
            print("run.py: interrupted; every process it started is stopped", file=sys.stderr)
            return 130
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
