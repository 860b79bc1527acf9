"""The compute worker processes of one trainer: start, talk over pipes, stop, reap.

Workers are forked by multiprocessing's *fork server*, a clean single-threaded process (no event
loop, no threads of ours) that :func:`start_fork_server` starts as the trainer starts and that
imports, once, the main module, aps's worker, the model's module and a ready numba (see
:mod:`._fork_server_preload`). With *spawn* every worker paid all of that itself, about 0.8 s
of CPU each, on the critical path of every run. A worker asks to die with its parent, the fork
server, which asks the same of the trainer (and would exit anyway when the trainer's end of its
pipe closes), so a SIGKILLed trainer still leaves no worker behind.

Records from a worker are read with the event loop's reader callbacks (no thread, no polling);
each is handed to a callback as a task. A worker that dies or reports an error fails the pool:
the trainer learns it from :meth:`WorkerPool.check` / ``failed`` and every other worker is
stopped - no orphans, no hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import multiprocessing.forkserver
import os
import signal
import threading
from collections.abc import Awaitable, Callable
from multiprocessing.connection import Connection
from typing import Any, TypeVar

import structlog

from ..errors import WorkerFailed
from .ipc import Kind, Record
from .worker import WorkerSpec, worker_main

log = structlog.get_logger("aps.trainer")

T = TypeVar("T")


#: the start method of compute workers (see the module docstring)
START_METHOD = "forkserver"


def start_fork_server(model_module: str) -> None:
    """Start this process's worker fork server now, in the background, preloading what a worker
    of a model defined in ``model_module`` imports; returns at once (the server imports while the
    trainer goes on). Call it first thing: the sooner, the more of its start-up is hidden.

    multiprocessing keeps one fork server per process: when one already runs (an earlier
    trainer in this process) it is reused as it is."""
    ctx = mp.get_context(START_METHOD)
    ctx.set_forkserver_preload(["__main__", "aps.trainer.worker", model_module, "aps.trainer._fork_server_preload"])
    multiprocessing.forkserver.ensure_running()


def stop_fork_server() -> None:
    """Stop this process's fork server and wait for it, for a program whose last trainer is done
    (aps-trainer). The server reaps the workers it forked, so once it is reaped here their CPU
    time counts as this process's children's (what ``getrusage``, ``time`` and a launcher see),
    and nothing of the run outlives the program, even briefly. Not for a library: another
    trainer in the same process may still be using the server (its workers die with it).
    multiprocessing offers no public call for this; without the private one it is a no-op and the
    server exits on its own when this process ends."""
    server = getattr(multiprocessing.forkserver, "_forkserver", None)
    stop = getattr(server, "_stop", None)
    if stop is None:
        return
    pid = getattr(server, "_forkserver_pid", None)
    if pid is not None:  # it holds nothing to flush: spare it the interpreter's teardown (~0.2 s)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    stop()  # closes our end of its pipe and waits for it


class WorkerPool:
    def __init__(self, specs: list[WorkerSpec], on_record: Callable[[int, Record], Awaitable[None]]) -> None:
        self.specs = specs
        self.on_record = on_record
        ctx = mp.get_context(START_METHOD)
        self.conns: list[Connection] = []
        self._child_conns: list[Connection] = []
        self.procs: list[Any] = []
        for spec in specs:
            parent, child = ctx.Pipe(duplex=True)
            proc = ctx.Process(target=worker_main, args=(spec, child), name=f"aps-worker-{spec.worker_id}", daemon=True)
            self.conns.append(parent)
            self._child_conns.append(child)
            self.procs.append(proc)
        self.failed: asyncio.Future[None] | None = None
        self._ready: set[int] = set()
        self._ready_event: asyncio.Event | None = None
        self._epoch_done: set[int] = set()
        self._epoch_event: asyncio.Event | None = None
        self._scores: dict[int, Record] = {}
        self._scores_event: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopping = False
        self._starter: threading.Thread | None = None
        self._started: asyncio.Future[None] | None = None

    def __len__(self) -> int:
        return len(self.specs)

    def launch(self) -> None:
        """Start every worker process in the background and return at once (call it from the
        running event loop).

        A trainer launches its workers before it connects to the pservers: a worker's start
        (the fork server's imports, attaching the arrays, loading its kernels) then runs while
        the trainer waits for table creation and its first pull, instead of after them. The
        processes are started from a thread because ``Process.start`` blocks until the fork
        server, possibly still importing, has forked. :meth:`ready` waits for them; a worker
        that fails meanwhile fails the pool as usual."""
        loop = asyncio.get_running_loop()
        self.failed = loop.create_future()
        self._ready_event = asyncio.Event()
        started: asyncio.Future[None] = loop.create_future()
        self._started = started

        def start_all() -> None:
            error: BaseException | None = None
            try:
                for proc, child in zip(self.procs, self._child_conns):
                    if self._stopping:
                        break
                    proc.start()
                    child.close()
            except BaseException as exc:  # reported to the trainer through ready()
                error = exc
            loop.call_soon_threadsafe(_settle, started, error)

        for w, conn in enumerate(self.conns):
            loop.add_reader(conn.fileno(), self._readable, w)
        # (re)start the fork server from this long-lived thread, not from the short-lived starter:
        # its death signal follows the thread that started it
        multiprocessing.forkserver.ensure_running()
        self._starter = threading.Thread(target=start_all, name="aps-worker-start", daemon=True)
        self._starter.start()

    async def ready(self, timeout: float = 300.0) -> None:
        """Wait until every launched worker attached its arrays and loaded its kernels."""
        assert self._ready_event is not None and self._started is not None, "launch() the pool first"
        started = asyncio.shield(self._started)
        await asyncio.wait({started, self.failed}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if self._started.done():
            self._started.result()  # a worker that could not be started
        await self._wait(self._ready_event, timeout, "workers did not start")

    async def watch(self, work: Awaitable[T]) -> T:
        """Await ``work`` (the trainer's own start-up, while launched workers start), but raise a
        worker's failure as soon as it happens instead of after ``work``, which may be long."""
        assert self.failed is not None, "launch() the pool first"
        task = asyncio.ensure_future(work)
        try:
            await asyncio.wait({task, self.failed}, return_when=asyncio.FIRST_COMPLETED)
            if self.failed.done():
                self.failed.result()
            return task.result()
        finally:
            task.cancel()

    async def start(self, timeout: float = 300.0) -> None:
        """:meth:`launch` and :meth:`ready` in one."""
        self.launch()
        await self.ready(timeout)

    async def _wait(self, event: asyncio.Event, timeout: float | None, what: str) -> None:
        assert self.failed is not None
        waiter = asyncio.ensure_future(event.wait())
        try:
            done, _ = await asyncio.wait({waiter, self.failed}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:  # cancelled too: the waiter is not left pending
            waiter.cancel()
        if self.failed.done():
            self.failed.result()  # raises the worker's failure
        if not done:
            raise WorkerFailed(f"{what} within {timeout} s")

    def _readable(self, w: int) -> None:
        conn = self.conns[w]
        try:
            while conn.poll():
                rec = Record.decode(conn.recv_bytes())
                self._dispatch(w, rec)
        except (EOFError, OSError):
            asyncio.get_running_loop().remove_reader(conn.fileno())
            if not self._stopping:
                proc = self.procs[w]
                proc.join(timeout=1.0)
                code = proc.exitcode
                how = f"killed by {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"
                self._fail(WorkerFailed(f"compute worker {w} died ({how})"))

    def _dispatch(self, w: int, rec: Record) -> None:
        if rec.kind == Kind.READY:
            self._ready.add(w)
            if len(self._ready) == len(self.specs) and self._ready_event is not None:
                self._ready_event.set()
        elif rec.kind == Kind.ERROR:
            self._fail(WorkerFailed(rec.text))
        elif rec.kind == Kind.SCORE_DONE:  # the pool's own business: the communicator never sees it
            self._scores[w] = rec
            if len(self._scores) == len(self.specs) and self._scores_event is not None:
                self._scores_event.set()
        else:
            if rec.kind == Kind.EPOCH_DONE:
                self._epoch_done.add(w)
            task = asyncio.ensure_future(self._run(w, rec))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, w: int, rec: Record) -> None:
        try:
            await self.on_record(w, rec)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # the communicator failed a worker request: fail the trainer
            self._fail(exc)
            return
        if rec.kind == Kind.EPOCH_DONE and len(self._epoch_done) == len(self.specs) and self._epoch_event is not None:
            self._epoch_event.set()

    def _fail(self, exc: BaseException) -> None:
        if self.failed is not None and not self.failed.done():
            self.failed.set_exception(exc)

    def send(self, w: int, rec: Record) -> None:
        self.conns[w].send_bytes(rec.encode())

    async def run_epoch(self, epoch: int, files: list[list[str]] | None = None) -> None:
        """Tell every worker to train one epoch and wait until all of them (and their last
        requests) are done. ``files``: each worker's files of this epoch (an online pass),
        instead of the files it was started with."""
        self._epoch_done = set()
        self._epoch_event = asyncio.Event()
        for w in range(len(self.specs)):
            if files is None:
                self.send(w, Record(Kind.EPOCH, epoch=epoch))
            else:
                self.send(w, Record(Kind.PASS, epoch=epoch, text="\n".join(files[w])))
        await self._wait(self._epoch_event, None, "epoch did not finish")

    async def score(self, seq: int, files: list[list[str]]) -> list[Record]:
        """Have every worker score its ``files`` of pass ``seq`` without updating anything, and
        return their SCORE_DONE records (AUC counts, examples) in worker order."""
        self._scores = {}
        self._scores_event = asyncio.Event()
        for w in range(len(self.specs)):
            self.send(w, Record(Kind.SCORE, epoch=seq, text="\n".join(files[w])))
        await self._wait(self._scores_event, None, "scoring did not finish")
        return [self._scores[w] for w in range(len(self.specs))]

    async def stop(self, grace: float = 5.0) -> None:
        """Ask workers to exit, then make sure they did (SIGTERM, SIGKILL); close every pipe."""
        self._stopping = True
        if self._starter is not None:  # no process may start after this (it stops at the next one)
            await asyncio.to_thread(self._starter.join)
        loop = asyncio.get_running_loop()
        for w, conn in enumerate(self.conns):
            try:
                loop.remove_reader(conn.fileno())
                conn.send_bytes(Record(Kind.STOP).encode())
            except (OSError, ValueError):
                pass
        for task in list(self._tasks):
            task.cancel()
        deadline = loop.time() + grace
        for proc in self.procs:
            if proc.pid is None:
                continue
            while proc.is_alive() and loop.time() < deadline:
                await asyncio.sleep(0.02)
            if proc.is_alive():
                proc.terminate()
                proc.join(1.0)
            if proc.is_alive():
                proc.kill()
                proc.join(1.0)
        for conn in (*self.conns, *self._child_conns):  # a child's end is left open if never started
            conn.close()

    def kill(self) -> None:
        """Synchronous last resort (finally blocks, signal paths)."""
        self._stopping = True
        if self._starter is not None:
            self._starter.join()  # no process may start after this kill (it stops at the next one)
        for proc in self.procs:
            if proc.pid is not None and proc.is_alive():
                proc.kill()
        if self._started is not None and self._started.done() and not self._started.cancelled():
            self._started.exception()
        if self.failed is not None and self.failed.done():
            self.failed.exception()  # a failure nobody waited for (the trainer failed first) is not news

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.pid]


def _settle(future: asyncio.Future[None], error: BaseException | None) -> None:
    """Complete ``future`` from the event loop (the starter thread's result)."""
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
