"""The compute worker processes of one trainer: start (spawn), talk over pipes, stop, reap.

Records from a worker are read with the event loop's reader callbacks (no thread, no polling);
each is handed to a callback as a task. A worker that dies or reports an error fails the pool:
the trainer learns it from :meth:`WorkerPool.check` / ``failed`` and every other worker is
stopped - no orphans, no hang.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import signal
from collections.abc import Awaitable, Callable
from multiprocessing.connection import Connection
from typing import Any

import structlog

from ..errors import WorkerFailed
from .ipc import Kind, Record
from .worker import WorkerSpec, worker_main

log = structlog.get_logger("aps.trainer")


class WorkerPool:
    def __init__(self, specs: list[WorkerSpec], on_record: Callable[[int, Record], Awaitable[None]]) -> None:
        self.specs = specs
        self.on_record = on_record
        ctx = mp.get_context("spawn")
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
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopping = False

    def __len__(self) -> int:
        return len(self.specs)

    async def start(self, timeout: float = 300.0) -> None:
        """Start every worker and wait until each attached its arrays and compiled its kernels."""
        loop = asyncio.get_running_loop()
        self.failed = loop.create_future()
        self._ready_event = asyncio.Event()
        for proc, child in zip(self.procs, self._child_conns):
            proc.start()
            child.close()
        for w, conn in enumerate(self.conns):
            loop.add_reader(conn.fileno(), self._readable, w)
        await self._wait(self._ready_event, timeout, "workers did not start")

    async def _wait(self, event: asyncio.Event, timeout: float | None, what: str) -> None:
        assert self.failed is not None
        waiter = asyncio.ensure_future(event.wait())
        done, _ = await asyncio.wait({waiter, self.failed}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if not waiter.done():
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

    async def run_epoch(self, epoch: int) -> None:
        """Tell every worker to train one epoch and wait until all of them (and their last
        requests) are done."""
        self._epoch_done = set()
        self._epoch_event = asyncio.Event()
        for w in range(len(self.specs)):
            self.send(w, Record(Kind.EPOCH, epoch=epoch))
        await self._wait(self._epoch_event, None, "epoch did not finish")

    async def stop(self, grace: float = 5.0) -> None:
        """Ask workers to exit, then make sure they did (SIGTERM, SIGKILL)."""
        self._stopping = True
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
        for conn in self.conns:
            conn.close()

    def kill(self) -> None:
        """Synchronous last resort (finally blocks, signal paths)."""
        self._stopping = True
        for proc in self.procs:
            if proc.pid is not None and proc.is_alive():
                proc.kill()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.pid]
