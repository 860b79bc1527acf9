"""A step-wise trainer's one compute worker: the caller's thread, not a process.

:class:`CallerWorker` is what :class:`~aps.trainer.runtime.TrainerRuntime` drives in place of a
worker pool for :class:`~aps.trainer.StepTrainer`. It holds the same
:class:`~aps.trainer.worker.Worker` a worker process runs; the caller's thread calls its
:meth:`~aps.trainer.worker.Worker.step` and :meth:`~aps.trainer.worker.Worker.score`, which talk
to the communicator over a pipe with the worker protocol, exactly as a worker process does. The
communicator's end of the pipe is read by the runtime's event loop (a background thread of the
caller's process), each request served as a task.

A request the communicator fails (a pserver gone, a timeout) is kept as :attr:`failure`, and the
caller's thread, which may be waiting for the reply, is woken with an error record.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from multiprocessing import Pipe
from multiprocessing.connection import Connection
from typing import TypeVar

import structlog

from .ipc import Kind, Record
from .runtime import OnRecord
from .worker import Worker, WorkerSpec

log = structlog.get_logger("aps.trainer")

T = TypeVar("T")


class CallerWorker:
    """The one worker of a step-wise trainer (see the module); made by the runtime from its one spec."""

    def __init__(self, specs: list[WorkerSpec], on_record: OnRecord) -> None:
        [self.spec] = specs
        self.on_record = on_record
        #: the worker the caller's thread runs (made by :meth:`launch`)
        self.worker: Worker | None = None
        #: the first failure of the communicator serving this worker, if any
        self.failure: BaseException | None = None
        self._mine: Connection | None = None  # the communicator's end of the pipe
        self._tasks: set[asyncio.Task[None]] = set()

    def launch(self) -> None:
        worker_end, self._mine = Pipe()
        self.worker = Worker(self.spec, worker_end)
        asyncio.get_running_loop().add_reader(self._mine.fileno(), self._readable)

    async def watch(self, work: Awaitable[T]) -> T:
        return await work  # nothing runs meanwhile that could fail: the caller waits for start()

    async def ready(self) -> None:
        """Ready as soon as launched: the caller's thread loads the kernels at its first step."""

    def send(self, worker: int, rec: Record) -> None:
        assert self._mine is not None
        self._mine.send_bytes(rec.encode())

    def fail(self, exc: BaseException) -> None:
        """Keep the first failure and wake the caller's thread if it waits on a reply."""
        if self.failure is not None:
            return
        self.failure = exc
        log.error("communicator failed", trainer=self.spec.trainer_id, error=str(exc))
        if self._mine is not None:
            try:
                self._mine.send_bytes(Record(Kind.ERROR, text=f"communicator failed: {exc}").encode())
            except (OSError, ValueError):
                pass  # the pipe is closed: nobody waits

    def _readable(self) -> None:
        """A request from the caller's thread (PULL, GRADS) arrived: serve it as a task."""
        assert self._mine is not None
        try:
            rec = Record.decode(self._mine.recv_bytes())
        except (EOFError, OSError):
            asyncio.get_running_loop().remove_reader(self._mine.fileno())
            return
        task = asyncio.ensure_future(self._serve(rec))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, rec: Record) -> None:
        try:
            await self.on_record(0, rec)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # surfaced in the caller's thread by its step
            self.fail(exc)

    async def stop(self, grace: float = 0.0) -> None:
        """Stop serving the caller's requests and close both ends of the pipe (``grace``: none
        needed, the worker is the caller's thread, which is not waiting now)."""
        for task in list(self._tasks):
            task.cancel()
        if self._mine is not None and not self._mine.closed:
            asyncio.get_running_loop().remove_reader(self._mine.fileno())
        self.kill()

    def kill(self) -> None:
        for end in (self._mine, self.worker.conn if self.worker is not None else None):
            if end is not None:
                end.close()
