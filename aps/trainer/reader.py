"""Async readers: files (or a pipe command's output) → line-aligned byte chunks → bounded queue.

Readers only do I/O. They never parse: a chunk is raw bytes holding whole lines, and the worker
that receives it turns it into arrays with a numba kernel (see :mod:`aps.trainer.multislot`), so
the event loop stays free for network traffic. Chunks are line-aligned so a worker can parse one
without seeing its neighbours, and they carry their file name and first line number so every
parse error can say exactly where the bad record is.

Memory stays bounded everywhere: blocks are read ``chunk_bytes`` at a time, a partial line is
carried over at most ``max_line_bytes`` long, and :func:`feed_queue` waits on a bounded queue
instead of reading ahead of a slow consumer.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections import deque
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass

import aiofiles

from ..errors import ConfigError, DataError
from .files import FilePart, lines_before

#: longest line a reader accepts; a longer one is almost surely a binary or mis-split file
MAX_LINE_BYTES = 64 << 20
#: how much of a failing pipe command's stderr goes into the error message
STDERR_TAIL_BYTES = 4096


@dataclass(frozen=True, slots=True)
class Chunk:
    """Whole lines of one file: ``data`` ends with ``b"\\n"`` and holds ``lines`` newlines.

    ``first_line`` is the 1-based number of the first line in ``data`` (counted in the pipe
    command's output when one is used, since that is what gets parsed).
    """

    file: str
    first_line: int
    data: bytes
    lines: int


async def _file_blocks(path: str, block: int, start: int = 0, stop: int | None = None) -> AsyncIterator[bytes]:
    """The file's bytes ``[start, stop)`` (``stop`` None: to its end), ``block`` at a time."""
    try:
        f = await aiofiles.open(path, "rb")
    except OSError as exc:
        raise DataError(f"cannot open input: {exc.strerror or exc}", path) from exc
    try:
        if start:
            await f.seek(start)
        left = -1 if stop is None else stop - start
        while left != 0 and (data := await f.read(block if left < 0 else min(block, left))):
            yield data
            if left > 0:
                left -= len(data)
    finally:
        await f.close()


async def _stderr_tail(stream: asyncio.StreamReader) -> bytes:
    """Drain ``stream`` (so the child never blocks on a full stderr pipe), keeping only the tail."""
    tail: deque[bytes] = deque()
    size = 0
    while data := await stream.read(65536):
        tail.append(data)
        size += len(data)
        while size - len(tail[0]) >= STDERR_TAIL_BYTES:
            size -= len(tail.popleft())
    return b"".join(tail)[-STDERR_TAIL_BYTES:]


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    """Kill the shell and everything it started (a pipeline's children outlive a killed sh)."""
    if proc.returncode is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


async def _reap(proc: asyncio.subprocess.Process, tail_task: asyncio.Future, grace: float = 5.0) -> None:
    """Wait for a killed pipeline and read its pipes to EOF, so no process or pipe is leaked."""
    assert proc.stdout is not None

    async def drain() -> None:
        # pipes first: asyncio's wait() only returns once every pipe has reached EOF
        while await proc.stdout.read(65536):  # what the dead pipeline left in the pipe: bounded
            pass
        await tail_task
        await proc.wait()

    try:
        await asyncio.wait_for(drain(), grace)
    except asyncio.TimeoutError:  # a descendant escaped the process group and holds the pipe
        tail_task.cancel()


async def _pipe_blocks(path: str, command: str, block: int) -> AsyncIterator[bytes]:
    """Stdout of ``cat path | command``, ``block`` bytes at a time; DataError if it fails."""
    try:
        stdin = open(path, "rb")  # the child reads it; we only pass the descriptor
    except OSError as exc:
        raise DataError(f"cannot open input: {exc.strerror or exc}", path) from exc
    with stdin:
        proc = await asyncio.create_subprocess_shell(
            command,
            stdin=stdin,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # its own process group, so _kill_group reaches the pipeline
        )
    assert proc.stdout is not None and proc.stderr is not None
    tail_task = asyncio.ensure_future(_stderr_tail(proc.stderr))
    done = False
    try:
        while data := await proc.stdout.read(block):
            yield data
        code = await proc.wait()
        tail = await tail_task
        done = True
    finally:
        if not done:  # consumer stopped early, was cancelled, or reading failed
            _kill_group(proc)
            await _reap(proc, tail_task)
    if code != 0:
        text = tail.decode("utf-8", "replace").strip()
        raise DataError(f"pipe command {command!r} exited with status {code}; stderr: {text or '(empty)'}", path)


async def read_chunks(
    path: str,
    chunk_bytes: int = 1 << 20,
    pipe_command: str | None = None,
    *,
    max_line_bytes: int = MAX_LINE_BYTES,
    part: FilePart | None = None,
    first_line: int = 1,
) -> AsyncIterator[Chunk]:
    """Yield the file (or ``cat path | pipe_command``'s output) as line-aligned chunks; with
    ``part`` (of ``path``, no pipe command) only its bytes, whose first line is line
    ``first_line`` of the file (:func:`~aps.trainer.files.lines_before` + 1).

    Each read takes ``chunk_bytes``; the bytes up to its last newline become a chunk (together
    with the line carried over from the previous read), the rest is carried to the next. A final
    line without a newline gets one. A line longer than ``max_line_bytes`` (newline excluded;
    must be >= ``chunk_bytes``) is a :class:`DataError` instead of unbounded growth.

    With ``pipe_command`` the command runs in a shell with the file as stdin (Paddle's
    ``dataset.set_pipe_command``) and its stdout is chunked instead; a non-zero exit raises
    :class:`DataError` naming the file, the command and the end of its stderr. Closing the
    iterator early (or cancelling its consumer) kills the command's whole process group.
    """
    if chunk_bytes < 1:
        raise ConfigError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
    if max_line_bytes < chunk_bytes:
        # then every line longer than the limit spans reads and the check below is exact
        raise ConfigError(f"max_line_bytes ({max_line_bytes}) must be >= chunk_bytes ({chunk_bytes})")
    path = os.fspath(path)
    if part is not None and pipe_command:
        raise ConfigError("a pipe command reads whole files, not parts of one")
    if pipe_command:
        blocks = _pipe_blocks(path, pipe_command, chunk_bytes)
    elif part is not None:
        blocks = _file_blocks(path, chunk_bytes, part.start, part.stop)
    else:
        blocks = _file_blocks(path, chunk_bytes)
    carry: list[bytes] = []  # pieces of the unfinished line; joined once, so long lines cost O(n)
    carry_len = 0
    line_no = first_line
    async with aclosing(blocks):
        async for block in blocks:
            end = block.rfind(b"\n")
            if end < 0:
                carry.append(block)
                carry_len += len(block)
                if carry_len > max_line_bytes:
                    raise DataError(f"line longer than {max_line_bytes} bytes (no newline found)", path, line_no)
                continue
            if carry_len + block.find(b"\n") > max_line_bytes:
                raise DataError(f"line longer than {max_line_bytes} bytes", path, line_no)
            head = block[: end + 1]
            data = b"".join((*carry, head)) if carry else head
            rest = block[end + 1 :]
            carry = [rest] if rest else []
            carry_len = len(rest)
            lines = data.count(b"\n")
            yield Chunk(path, line_no, data, lines)
            line_no += lines
    if carry:
        yield Chunk(path, line_no, b"".join(carry) + b"\n", 1)


async def whole_batches(chunks: AsyncIterator[Chunk], lines: int) -> AsyncIterator[Chunk]:
    """One file's chunks re-cut so that each holds a multiple of ``lines`` lines, except the file's
    last one.

    For a model whose batch is ``lines`` lines (:meth:`Model.lines_per_batch`): cutting each read's
    chunk into batches left a short batch at the end of every chunk (1,168 steps for 1M lines of
    ~170 bytes in 1 MiB chunks at 1000 lines a batch, where 1,000 are due); now only a file's last
    batch can be short. The lines held back (fewer than ``lines``, or a whole chunk shorter than
    that) go in front of the next chunk of the same file, so every chunk still holds consecutive
    lines of one file and its ``first_line`` stays exact for error messages. Closing this closes
    ``chunks``."""
    if lines < 1:
        raise ConfigError(f"lines a batch must be >= 1, got {lines}")
    held: list[Chunk] = []  # joined once a batch is complete: a batch of many reads costs O(n)
    held_lines = 0
    async with aclosing(chunks):  # type: ignore[type-var]
        async for chunk in chunks:
            held.append(chunk)
            held_lines += chunk.lines
            if held_lines < lines:
                continue
            merged = _joined(held, held_lines)
            whole = held_lines - held_lines % lines
            if whole == held_lines:
                held, held_lines = [], 0
                yield merged
                continue
            cut = _after_line(merged.data, held_lines - whole)
            held = [Chunk(merged.file, merged.first_line + whole, merged.data[cut:], held_lines - whole)]
            held_lines -= whole
            yield Chunk(merged.file, merged.first_line, merged.data[:cut], whole)
    if held:
        yield _joined(held, held_lines)


def _joined(parts: list[Chunk], lines: int) -> Chunk:
    """Consecutive chunks of one file as one."""
    if len(parts) == 1:
        return parts[0]
    return Chunk(parts[0].file, parts[0].first_line, b"".join(p.data for p in parts), lines)


def _after_line(data: bytes, last: int) -> int:
    """The offset just past the newline that ends all but the ``last`` lines of ``data`` (which
    ends with a newline): found from the end, ``last`` searches, fewer than a batch's lines."""
    end = len(data) - 1
    for _ in range(last):
        end = data.rfind(b"\n", 0, end)
    return end + 1


async def feed_queue(
    files: Sequence[str | FilePart],
    queue: asyncio.Queue,
    *,
    chunk_bytes: int = 1 << 20,
    pipe_command: str | None = None,
    epochs: int = 1,
    max_line_bytes: int = MAX_LINE_BYTES,
    batch_lines: int | None = None,
    lines_known: dict[FilePart, int] | None = None,
) -> None:
    """Put every chunk of ``files`` (``epochs`` passes, in order) into ``queue``, then ``None``.
    With ``batch_lines``, each file's chunks hold whole batches of that many lines but the last
    (:func:`whole_batches`). A :class:`~aps.trainer.files.FilePart` is read from its first byte;
    the lines of its file before it are counted once (in a thread) and kept in ``lines_known``
    for the next epochs, so its errors name the file's own line numbers.

    ``queue`` must be bounded: ``put`` then waits while the consumer is behind, so memory holds at
    most ``maxsize`` chunks however fast the disk is. Errors do not vanish with the producer task:
    any exception (a :class:`DataError` from a file, a :class:`ConfigError` for bad arguments) is
    put into the queue *as the item itself* and the function returns — the consumer raises it
    when it sees it (:func:`iter_queue` does). Cancellation is not caught.
    """
    try:
        if queue.maxsize <= 0:
            raise ConfigError("feed_queue needs a bounded queue (maxsize > 0) for backpressure")
        if epochs < 1:
            raise ConfigError(f"epochs must be >= 1, got {epochs}")
        known = {} if lines_known is None else lines_known
        for _ in range(epochs):
            for item in files:
                if isinstance(item, FilePart):
                    if item not in known:
                        known[item] = await asyncio.to_thread(lines_before, item)
                    chunks = read_chunks(item.path, chunk_bytes, pipe_command, max_line_bytes=max_line_bytes,
                                         part=item, first_line=known[item] + 1)
                else:
                    chunks = read_chunks(item, chunk_bytes, pipe_command, max_line_bytes=max_line_bytes)
                if batch_lines is not None:
                    chunks = whole_batches(chunks, batch_lines)
                async with aclosing(chunks):
                    async for chunk in chunks:
                        await queue.put(chunk)
    except Exception as exc:  # handed to the consumer, not swallowed
        await queue.put(exc)
        return
    await queue.put(None)


async def iter_queue(queue: asyncio.Queue) -> AsyncIterator[Chunk]:
    """Consume what :func:`feed_queue` produces: yield chunks, stop at ``None``, raise errors."""
    while True:
        item = await queue.get()
        if item is None:
            return
        if isinstance(item, BaseException):
            raise item
        yield item
