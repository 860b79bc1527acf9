"""Readers: line-aligned chunks, pipe commands, bounded queues."""

from __future__ import annotations

import asyncio
import os
import shlex
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aps.errors import ConfigError, DataError
from aps.trainer.files import FilePart
from aps.trainer.reader import Chunk, feed_queue, iter_queue, read_chunks, whole_batches
from tests.conftest import eventually


async def collect(path, chunk_bytes=1 << 20, pipe_command=None, **kw) -> list[Chunk]:
    return [c async for c in read_chunks(str(path), chunk_bytes, pipe_command, **kw)]


def check_chunks(chunks: list[Chunk], path: str) -> None:
    """Invariants of every chunk sequence: whole lines, consistent counts and numbering."""
    expected_first = 1
    for c in chunks:
        assert c.file == path
        assert c.data.endswith(b"\n")
        assert c.lines == c.data.count(b"\n") >= 1
        assert c.first_line == expected_first
        expected_first += c.lines


@settings(max_examples=60, deadline=None)
@given(
    lines=st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), max_size=30),
    trailing_newline=st.booleans(),
    chunk_bytes=st.integers(1, 64),
)
def test_chunks_rejoin_to_exact_bytes(tmp_path_factory, lines, trailing_newline, chunk_bytes):
    path = tmp_path_factory.mktemp("r") / "data"
    raw = b"\n".join(lines)
    if lines and trailing_newline:
        raw += b"\n"
    path.write_bytes(raw)
    chunks = asyncio.run(collect(path, chunk_bytes))
    check_chunks(chunks, str(path))
    joined = b"".join(c.data for c in chunks)
    assert joined == (raw if raw.endswith(b"\n") or not raw else raw + b"\n")
    # every chunk boundary is a line boundary: the lines are exactly the file's lines
    expected = raw.split(b"\n")
    if expected[-1] == b"":  # text-file convention: a final newline ends a line, it does not start one
        expected.pop()
    assert [line for c in chunks for line in c.data.split(b"\n")[:-1]] == expected


async def test_line_numbers_across_chunks(tmp_path):
    path = tmp_path / "numbers"
    path.write_bytes(b"".join(b"line %d\n" % k for k in range(1, 101)))
    chunks = await collect(path, chunk_bytes=50)
    assert len(chunks) > 10
    check_chunks(chunks, str(path))
    for c in chunks:
        first = c.data.split(b"\n")[0]
        assert first == b"line %d" % c.first_line  # the number in the text is the line number


@settings(max_examples=60, deadline=None)
@given(n_lines=st.integers(0, 120), chunk_bytes=st.integers(1, 200), batch=st.integers(1, 40))
def test_whole_batches_recut_every_chunk_but_the_last(tmp_path_factory, n_lines, chunk_bytes, batch):
    """Chunks of whole batches: the same lines in the same order, numbered exactly, every chunk
    but the last a multiple of the batch, so cutting each into batches leaves one short batch."""
    path = tmp_path_factory.mktemp("w") / "data"
    raw = b"".join(b"line %d\n" % k for k in range(1, n_lines + 1))
    path.write_bytes(raw)

    async def recut() -> list[Chunk]:
        return [c async for c in whole_batches(read_chunks(str(path), chunk_bytes), batch)]

    chunks = asyncio.run(recut())
    check_chunks(chunks, str(path))
    assert b"".join(c.data for c in chunks) == raw
    assert all(c.lines % batch == 0 for c in chunks[:-1])
    assert sum(-(-c.lines // batch) for c in chunks) == -(-n_lines // batch)  # batches as if one chunk
    for c in chunks:
        assert c.data.split(b"\n")[0] == b"line %d" % c.first_line


async def test_whole_batches_number_held_lines_exactly(tmp_path):
    """Lines held over from one read to the next keep their own line numbers (what a parse
    error names): each chunk's first_line plus the line's place in it is its line in the file."""
    path = tmp_path / "f"
    path.write_bytes(b"".join(b"%d\n" % k for k in range(1, 31)))
    chunks = [c async for c in whole_batches(read_chunks(str(path), 16), 7)]
    assert len(chunks) > 1 and all(c.lines % 7 == 0 for c in chunks[:-1])
    line_of = {int(line): c.first_line + i for c in chunks for i, line in enumerate(c.data.split(b"\n")[:-1])}
    assert line_of == {k: k for k in range(1, 31)}


async def test_feed_queue_hands_over_whole_batches_per_file(tmp_path):
    """batch_lines re-cuts each file on its own: a file's last batch is short, never one that
    spans files."""
    files = []
    for name, n in (("a", 25), ("b", 13)):
        path = tmp_path / name
        path.write_bytes(b"".join(b"%s%d\n" % (name.encode(), k) for k in range(n)))
        files.append(str(path))
    queue: asyncio.Queue = asyncio.Queue(maxsize=2)
    producer = asyncio.ensure_future(feed_queue(files, queue, chunk_bytes=20, batch_lines=10))
    chunks = [c async for c in iter_queue(queue)]
    await producer
    per_file = {f: [c.lines for c in chunks if c.file == f] for f in files}
    assert sum(per_file[files[0]]) == 25 and sum(per_file[files[1]]) == 13
    for counts in per_file.values():
        assert all(k % 10 == 0 for k in counts[:-1])


async def test_file_without_trailing_newline_gets_one(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"a b\nc d\nlast")
    chunks = await collect(path, chunk_bytes=3)
    assert b"".join(c.data for c in chunks) == b"a b\nc d\nlast\n"
    assert chunks[-1] == Chunk(str(path), 3, b"last\n", 1)


async def test_empty_file_yields_nothing(tmp_path):
    path = tmp_path / "empty"
    path.write_bytes(b"")
    assert await collect(path) == []


async def test_overlong_line_is_a_data_error(tmp_path):
    path = tmp_path / "long"
    path.write_bytes(b"short\n" + b"x" * 300 + b"\nok\n")
    with pytest.raises(DataError) as info:
        await collect(path, chunk_bytes=16, max_line_bytes=100)
    assert info.value.file == str(path) and info.value.line == 2
    # a line of exactly the limit is fine, whatever the block size
    for chunk_bytes in (1, 7, 100, 300):
        chunks = await collect(path, chunk_bytes=chunk_bytes, max_line_bytes=300)
        assert b"".join(c.data for c in chunks) == path.read_bytes()
        with pytest.raises(DataError):
            await collect(path, chunk_bytes=min(chunk_bytes, 299), max_line_bytes=299)
    # a limit below the block size could not be checked exactly: refused
    with pytest.raises(ConfigError):
        await collect(path, chunk_bytes=1024, max_line_bytes=100)


async def test_missing_file_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="cannot open") as info:
        await collect(tmp_path / "absent")
    assert info.value.file == str(tmp_path / "absent")


async def test_bad_chunk_bytes_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError):
        await collect(tmp_path / "x", chunk_bytes=0)


async def test_pipe_command_output_is_chunked(tmp_path):
    path = tmp_path / "words"
    text = b"".join(b"hello %d world\n" % k for k in range(200))
    path.write_bytes(text)
    chunks = await collect(path, chunk_bytes=64, pipe_command="tr a-z A-Z")
    check_chunks(chunks, str(path))
    assert b"".join(c.data for c in chunks) == text.upper()


async def test_failing_pipe_command_raises_with_stderr_tail(tmp_path):
    path = tmp_path / "in"
    path.write_bytes(b"1\n2\n")
    command = "cat; echo 'something broke' >&2; exit 3"
    with pytest.raises(DataError) as info:
        await collect(path, pipe_command=command)
    message = str(info.value)
    assert info.value.file == str(path)
    assert "status 3" in message and "something broke" in message and command in message


async def test_pipe_command_killed_when_consumer_stops(tmp_path):
    path = tmp_path / "in"
    path.write_bytes(b"x\n")
    pid_file = tmp_path / "pid"
    command = f"echo $$ > {shlex.quote(str(pid_file))}; exec yes"
    chunks = read_chunks(str(path), 4096, command)
    first = await chunks.__anext__()
    assert first.data.startswith(b"y\ny\n")
    await chunks.aclose()
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):  # killed and reaped, not left running
        os.kill(pid, 0)


async def test_feed_queue_is_bounded_and_complete(tmp_path):
    files = []
    for k in range(3):
        p = tmp_path / f"part-{k}"
        p.write_bytes(b"".join(b"%d %d\n" % (k, i) for i in range(40)))
        files.append(str(p))
    queue: asyncio.Queue = asyncio.Queue(maxsize=2)
    producer = asyncio.create_task(feed_queue(files, queue, chunk_bytes=16, pipe_command=None, epochs=2))
    await eventually(queue.full)  # consumer absent: the producer fills the queue and parks on put()
    assert not producer.done()

    sizes = []
    got: list[Chunk] = []
    async for chunk in iter_queue(queue):
        sizes.append(queue.qsize())
        got.append(chunk)
        await asyncio.sleep(0.001)  # slow consumer
    await producer
    assert max(sizes) <= queue.maxsize
    one_epoch = b"".join(Path(f).read_bytes() for f in files)
    assert b"".join(c.data for c in got) == one_epoch * 2
    assert [c.file for c in got if c.first_line == 1] == files * 2


async def test_feed_queue_hands_errors_to_the_consumer(tmp_path):
    good = tmp_path / "good"
    good.write_bytes(b"a\nb\n")
    queue: asyncio.Queue = asyncio.Queue(maxsize=4)
    producer = asyncio.create_task(feed_queue([str(good), str(tmp_path / "missing")], queue))
    got = []
    with pytest.raises(DataError, match="missing"):
        async for chunk in iter_queue(queue):
            got.append(chunk.data)
    assert got == [b"a\nb\n"]
    await producer  # returned normally after handing the error over
    assert producer.exception() is None


async def test_feed_queue_refuses_unbounded_queue(tmp_path):
    queue: asyncio.Queue = asyncio.Queue()
    await feed_queue([], queue)
    item = queue.get_nowait()
    assert isinstance(item, ConfigError) and "bounded" in str(item)


async def test_feed_queue_runs_pipe_command(tmp_path):
    p = tmp_path / "in"
    p.write_bytes(b"abc\ndef\n")
    queue: asyncio.Queue = asyncio.Queue(maxsize=1)
    task = asyncio.create_task(feed_queue([str(p)], queue, pipe_command=f"{shlex.quote(sys.executable)} -c "
                                          "\"import sys; sys.stdout.write(sys.stdin.read()[::-1].strip() + '\\n')\""))
    got = [c.data async for c in iter_queue(queue)]
    await task
    assert got == [b"fed\ncba\n"]


async def test_cancelled_producer_kills_its_pipe_command(tmp_path):
    path = tmp_path / "in"
    path.write_bytes(b"x\n")
    pid_file = tmp_path / "pid"
    queue: asyncio.Queue = asyncio.Queue(maxsize=1)
    command = f"echo $$ > {shlex.quote(str(pid_file))}; exec yes"
    producer = asyncio.create_task(feed_queue([str(path)], queue, chunk_bytes=1024, pipe_command=command))
    while not queue.full():
        await asyncio.sleep(0.01)
    producer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await producer
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)


async def test_a_part_is_read_alone_and_numbers_its_lines_as_the_file_does(tmp_path):
    path = tmp_path / "numbers"
    path.write_bytes(b"".join(b"line %03d\n" % k for k in range(1, 101)))  # 9 bytes a line
    part = FilePart(str(path), 9 * 40, 9 * 70)  # lines 41..70
    chunks = await collect(path, 50, part=part, first_line=41)
    assert b"".join(c.data for c in chunks) == b"".join(b"line %03d\n" % k for k in range(41, 71))
    for c in chunks:
        assert c.data.startswith(b"line %03d\n" % c.first_line)
    with pytest.raises(ConfigError, match="whole files"):
        await collect(path, 50, pipe_command="cat", part=part)


async def test_feed_queue_counts_the_lines_before_a_part_once(tmp_path):
    path = tmp_path / "data"
    path.write_bytes(b"".join(b"%04d\n" % k for k in range(1, 201)))  # 5 bytes a line
    parts = [FilePart(str(path), 0, 500), FilePart(str(path), 500, 1000)]
    known: dict[FilePart, int] = {}
    queue: asyncio.Queue = asyncio.Queue(maxsize=64)
    await feed_queue(parts[::-1], queue, chunk_bytes=128, epochs=2, lines_known=known)
    got = [c async for c in iter_queue(queue)]
    assert b"".join(c.data for c in got) == (path.read_bytes()[500:] + path.read_bytes()[:500]) * 2
    assert got[0].first_line == 101 and known == {parts[0]: 0, parts[1]: 100}
    known[parts[1]] = 7  # a later epoch takes the count it kept, it does not read the file again
    await feed_queue(parts[1:], queue, chunk_bytes=1000, lines_known=known)
    assert [c.first_line async for c in iter_queue(queue)] == [8]
