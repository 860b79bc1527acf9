"""A Redis stream as an online source: a consumer group per job, each trainer a consumer.

``aps-trainer --data-stream redis://HOST:PORT/STREAM``: every stream entry holds one input line
in its field ``line`` (the model's own format, as a line of a file). Each trainer reads with
``XREADGROUP`` as consumer ``trainer-ID`` of the job's group, so the trainers share the stream
without overlap; ``records`` entries (or what came before the stream went quiet for ``wait``
seconds) make one pass. A pass's lines are spooled into one file per worker, so the workers read
them as they read any pass.

Exactly once, with the checkpoints (:mod:`aps.trainer.online`):

* an entry is acknowledged (``XACK``) only once a checkpoint covering it is written, so a
  trainer that dies leaves the entries it read since in the group's pending list;
* the checkpoint's position holds, per consumer, the id of the last entry it covers (each
  trainer writes its pass's last id into the hash ``<group>:covered`` when it reads the pass;
  trainer 0 saves them all);
* ``--resume`` loads that checkpoint, acknowledges this consumer's pending entries up to its
  covered id (the checkpoint has them: a crash came between the save and the XACK) and trains
  the rest again first; how many is the pass's ``reread`` (metrics: ``aps_trainer_reread_records``).

The trainers of a job agree on every pass: each writes how many entries it read for pass ``seq``
into the hash ``<group>:read`` and waits until every trainer has; the pass goes ahead (empty for
those that read nothing: they still meet the others at its barriers) unless none read anything,
and then all of them stop. Without that, a stream ending with fewer entries than the trainers
take stopped the trainers that got none while the others waited for them at the pass's barrier.
A trainer's field of a pass is written anew each time it reads that pass, so a resumed trainer
could in principle read the field another trainer wrote for that pass before a crash, if it
finishes reading the pass before the other restarts; it is deleted by its owner once a
checkpoint covers the pass.

A stream that goes quiet, and a redis-server that goes away for a while, are both ordinary:

* a blocking read never outlives the client's socket timeout: both are set here
  (:data:`BLOCK_SLICE` < :data:`SOCKET_TIMEOUT`), not left to redis-py's defaults (5 s today),
  and a wait of ``--pass-wait`` is made of reads of at most :data:`BLOCK_SLICE` seconds;
* every Redis call that fails to connect or times out is retried, reconnecting, for ``retry``
  seconds (``--stream-retry``), logged while it waits; past that the trainer stops with
  :class:`~aps.errors.SourceUnavailable` naming the option. redis-py's own retries are off, so
  a read is never sent twice unseen: a read of new entries whose reply was lost delivered them
  to this consumer's pending list, and the retry takes them from there first (past the last id
  this consumer got, they can only be those).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

import structlog

from ...errors import ConfigError, RequestTimeout, SourceUnavailable
from .base import Pass

log = structlog.get_logger("aps.trainer")

FIELD = b"line"
#: entries asked for per XREADGROUP
READ_COUNT = 1000
#: seconds a trainer waits, beyond --pass-wait, for the others to say what they read of a pass
AGREE_GRACE = 120.0
#: seconds between two looks at the others' counts
AGREE_POLL = 0.02
#: the longest one blocking XREADGROUP waits; a longer --pass-wait is several reads
BLOCK_SLICE = 2.0
#: the client's socket timeout: a reply is due within it, a blocking read's included
SOCKET_TIMEOUT = BLOCK_SLICE + 8.0
#: seconds a Redis call that cannot reach the server is retried by default (--stream-retry)
DEFAULT_RETRY = 120.0
#: the longest pause between two tries
RETRY_PAUSE_MAX = 1.0

T = TypeVar("T")


def parse_stream_url(url: str) -> tuple[str, int, str]:
    """``redis://HOST:PORT/STREAM`` -> (host, port, stream)."""
    parts = urlsplit(url)
    stream = parts.path.lstrip("/")
    if parts.scheme != "redis" or not parts.hostname or not stream:
        raise ConfigError(f"stream must be redis://HOST:PORT/STREAM, got {url!r}")
    return parts.hostname, parts.port or 6379, stream


def _id_key(entry_id: bytes | str) -> tuple[int, int]:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


class RedisStream:
    """Passes of ``records`` entries of a Redis stream, for trainer ``trainer_id``."""

    def __init__(
        self,
        url: str,
        *,
        group: str | None = None,
        trainer_id: int = 0,
        num_trainers: int = 1,
        records: int = 100_000,
        wait: float = 600.0,
        parts: int = 1,
        spool_dir: str | None = None,
        retry: float = DEFAULT_RETRY,
    ) -> None:
        self.host, self.port, self.stream = parse_stream_url(url)
        if records < 1:
            raise ConfigError(f"records per pass must be >= 1, got {records}")
        if not wait > 0:
            raise ConfigError(f"stream wait must be > 0 seconds, got {wait}")
        if not retry >= 0:
            raise ConfigError(f"--stream-retry must be >= 0 seconds (0: fail at once), got {retry}")
        self.retry = retry
        self.group = group or f"aps:{self.stream}"
        self.consumer = f"trainer-{trainer_id}"
        if num_trainers > 1 and not 0 <= trainer_id < num_trainers:
            raise ConfigError(f"trainer id {trainer_id} is not one of {num_trainers} trainers")
        self.trainer_id, self.num_trainers = trainer_id, max(1, num_trainers)
        self.records, self.wait, self.parts = records, wait, max(1, parts)
        self.spool_parent = spool_dir
        self.stop_reason: str | None = None
        self._redis: Any = None
        self._retried: tuple[type[BaseException], ...] = ()
        self._not_retried: tuple[type[BaseException], ...] = ()
        self._spool: str | None = None
        self._seq = 0
        self._pending: list[bytes] = []  # entries to train first (re-read on resume)
        self._lines: dict[bytes, bytes] = {}  # their lines
        self._unacked: list[bytes] = []  # read, not yet covered by a written checkpoint
        self._last_file: list[str] = []
        self._last_id: str | None = None  # the last entry this consumer read

    @property
    def covered_key(self) -> str:
        return f"{self.group}:covered"

    @property
    def read_key(self) -> str:
        return f"{self.group}:read"

    async def open(self, position: dict[str, Any] | None) -> None:
        try:
            import redis.asyncio as aioredis
            from redis.asyncio.retry import Retry
            from redis.backoff import NoBackoff
            from redis.exceptions import AuthenticationError, AuthorizationError, ResponseError
            from redis.exceptions import ConnectionError as RedisConnectionError
            from redis.exceptions import TimeoutError as RedisTimeoutError
        except ImportError as exc:  # pragma: no cover - depends on the installation
            raise ConfigError("--data-stream needs redis-py: pip install 'aps[stream]'") from exc
        if position and (position.get("source") != "redis" or position.get("stream") != self.stream):
            raise ConfigError(f"the checkpoint's position {position!r} is not of stream {self.stream!r}")
        # what _call retries (a server away for a while), and what it does not (a setting to fix)
        self._retried = (RedisConnectionError, RedisTimeoutError)
        self._not_retried = (AuthenticationError, AuthorizationError)
        self._redis = aioredis.Redis(
            host=self.host, port=self.port, socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=SOCKET_TIMEOUT,
            retry=Retry(NoBackoff(), 0),
        )
        try:
            await self._call("XGROUP CREATE", self._redis.xgroup_create, self.stream, self.group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._spool = tempfile.mkdtemp(prefix="aps-stream-", dir=self.spool_parent)
        covered = (position or {}).get("covered", {}).get(self.consumer)
        self._last_id = covered
        if position:
            self._seq = int(position["seq"]) + 1
        await self._take_pending(covered)

    async def _take_pending(self, covered: str | None) -> None:
        """This consumer's pending entries: those the checkpoint covers are acknowledged, the
        others trained first."""
        start = "0"
        done: list[bytes] = []
        while True:
            entries = await self._read_pending(start, READ_COUNT)
            if not entries:
                break
            for entry_id, fields in entries:
                if covered is not None and _id_key(entry_id) <= _id_key(covered):
                    done.append(entry_id)
                else:
                    self._pending.append(entry_id)
                    self._lines[entry_id] = fields.get(FIELD, b"") if fields else b""
            start = entries[-1][0]
        if done:
            await self._call("XACK", self._redis.xack, self.stream, self.group, *done)
        log.info("stream opened", stream=self.stream, group=self.group, consumer=self.consumer,
                 acknowledged=len(done), reread=len(self._pending))

    async def next_pass(self) -> Pass | None:
        self._clear_last()
        ids: list[bytes] = []
        lines: list[bytes] = []
        reread = 0
        while self._pending and len(ids) < self.records:
            entry_id = self._pending.pop(0)
            ids.append(entry_id)
            lines.append(self._lines.pop(entry_id))
            reread += 1
        deadline = time.monotonic() + self.wait
        while len(ids) < self.records:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            after = ids[-1].decode() if ids else self._last_id
            entries = await self._read_new(min(READ_COUNT, self.records - len(ids)), min(left, BLOCK_SLICE), after)
            for entry_id, fields in entries:
                ids.append(entry_id)
                lines.append(fields.get(FIELD, b"") if fields else b"")
        seq = self._seq
        if ids:
            self._last_id = ids[-1].decode()
        if self._last_id is not None:
            await self._call("HSET", self._redis.hset, self.covered_key, f"{seq}:{self.consumer}", self._last_id)
        if not await self._anyone_read(seq, len(ids)):
            self.stop_reason = f"no new entry in stream {self.stream} within --pass-wait {self.wait:g} s"
            return None
        self._seq += 1
        self._unacked.extend(ids)
        files = self._spool_lines(seq, lines)
        name = f"{self.stream}@{self._last_id or '0-0'}"
        day = time.strftime("%Y%m%d", time.gmtime())
        return Pass(seq, name, files, {"source": "redis", "stream": self.stream, "seq": seq}, reread=reread, day=day)

    async def _anyone_read(self, seq: int, count: int) -> bool:
        """Say how many entries this trainer read for pass ``seq``, wait until every trainer has,
        and return whether any read one (see the module). A trainer alone asks nobody."""
        if self.num_trainers == 1:
            return count > 0
        await self._call("HSET", self._redis.hset, self.read_key, f"{seq}:{self.consumer}", count)
        fields = [f"{seq}:trainer-{k}" for k in range(self.num_trainers)]
        deadline = time.monotonic() + self.wait + AGREE_GRACE
        while True:
            counts = await self._call("HMGET", self._redis.hmget, self.read_key, fields)
            if all(c is not None for c in counts):
                return any(int(c) for c in counts)
            if time.monotonic() > deadline:
                missing = [f for f, c in zip(fields, counts) if c is None]
                raise RequestTimeout(f"stream {self.stream}: {', '.join(missing)} did not read pass {seq} "
                                     f"within --pass-wait {self.wait:g} s + {AGREE_GRACE:g} s")
            await asyncio.sleep(AGREE_POLL)

    async def _read_pending(self, after: str, count: int) -> list[Any]:
        """Up to ``count`` of this consumer's pending entries with ids past ``after``."""
        reply = await self._call(
            "XREADGROUP", self._redis.xreadgroup, self.group, self.consumer, {self.stream: after}, count=count
        )
        return reply[0][1] if reply else []

    async def _read_new(self, count: int, block: float, after: str | None) -> list[Any]:
        """Up to ``count`` new entries, waiting up to ``block`` seconds for the first. A retry
        after a lost reply first takes what that read delivered: this consumer's pending
        entries past ``after``, the last id it got (see the module)."""
        tries = 0

        async def read() -> list[Any]:
            nonlocal tries
            tries += 1
            if tries > 1:
                lost = await self._redis.xreadgroup(self.group, self.consumer, {self.stream: after or "0"}, count=count)
                if lost and lost[0][1]:
                    return lost[0][1]  # type: ignore[no-any-return]
            reply = await self._redis.xreadgroup(
                self.group, self.consumer, {self.stream: ">"}, count=count, block=max(1, int(block * 1000))
            )
            return reply[0][1] if reply else []

        return await self._call("XREADGROUP", read)

    async def _call(self, what: str, call: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """``await call(*args, **kwargs)``, tried again (reconnecting) while the server cannot be
        reached, for at most ``retry`` seconds from the first failure; logged while it waits."""
        deadline: float | None = None
        pause = 0.05
        while True:
            try:
                return await call(*args, **kwargs)
            except self._not_retried:
                raise
            except self._retried as exc:
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self.retry
                    log.warning("redis unreachable, retrying", server=f"{self.host}:{self.port}", call=what,
                                error=str(exc), retry_s=self.retry)
                if now >= deadline:
                    raise SourceUnavailable(
                        f"redis://{self.host}:{self.port}/{self.stream}: {what} failed and the server stayed "
                        f"unreachable for --stream-retry {self.retry:g} s: {exc}"
                    ) from exc
                await asyncio.sleep(min(pause, deadline - now))
                pause = min(2 * pause, RETRY_PAUSE_MAX)
                log.info("redis still unreachable, retrying", server=f"{self.host}:{self.port}", call=what,
                         left_s=round(max(0.0, deadline - time.monotonic()), 1))

    def _spool_lines(self, seq: int, lines: list[bytes]) -> list[str]:
        assert self._spool is not None
        files = []
        for k in range(min(self.parts, len(lines))):
            path = os.path.join(self._spool, f"pass-{seq:06d}.part-{k:03d}")
            with open(path, "wb") as f:
                for line in lines[k :: self.parts]:
                    f.write(line.rstrip(b"\n") + b"\n")
            files.append(path)
        self._last_file = files
        return files

    def _clear_last(self) -> None:
        for path in self._last_file:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        self._last_file = []

    async def position(self, done: Pass) -> dict[str, Any]:
        """``done``'s position with every consumer's covered id (read back from Redis, where
        each trainer wrote its own when it read the pass)."""
        prefix = f"{done.seq}:"
        raw = await self._call("HGETALL", self._redis.hgetall, self.covered_key)
        covered = {k.decode()[len(prefix):]: v.decode() for k, v in raw.items() if k.decode().startswith(prefix)}
        return {**done.position, "covered": covered}

    async def committed(self, done: Pass) -> None:
        """Acknowledge every entry read so far: the checkpoint just written covers them."""
        if self._unacked:
            await self._call("XACK", self._redis.xack, self.stream, self.group, *self._unacked)
            self._unacked = []
        covered = await self._call("HKEYS", self._redis.hkeys, self.covered_key)
        stale = [k for k in covered if int(k.decode().split(":")[0]) < done.seq]
        if stale and self.trainer_id == 0:
            await self._call("HDEL", self._redis.hdel, self.covered_key, *stale)
        mine = [k for k in await self._call("HKEYS", self._redis.hkeys, self.read_key)
                if k.decode().endswith(f":{self.consumer}") and int(k.decode().split(":")[0]) <= done.seq]
        if mine:
            await self._call("HDEL", self._redis.hdel, self.read_key, *mine)

    async def aclose(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()
            self._redis = None
        if self._spool is not None:
            shutil.rmtree(self._spool, ignore_errors=True)
            self._spool = None
