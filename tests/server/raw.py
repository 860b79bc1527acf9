"""A bare TCP connection speaking aps frames by hand, for tests that misbehave on purpose."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aps
from aps import wire
from aps.wire.frame import FrameDecoder


class Raw:
    """A bare TCP connection speaking frames by hand (no client-side validation at all)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.decoder = FrameDecoder(1 << 30)

    @classmethod
    async def open(cls, server: aps.PServer) -> Raw:
        reader, writer = await asyncio.open_connection(server.host, server.port)
        return cls(reader, writer)

    def send_bytes(self, data: bytes) -> None:
        self.writer.write(data)

    def send(self, msg: wire.Message, request_id: int, flags: int = 0) -> None:
        self.writer.write(wire.encode_bytes(msg, request_id, flags, max_frame=1 << 31))

    async def recv(self, timeout: float = 5.0) -> tuple[int, wire.Message]:
        async with asyncio.timeout(timeout):
            while True:
                frame = self.decoder.next_frame()
                if frame is not None:
                    return frame.request_id, wire.decode(frame)
                data = await self.reader.read(65536)
                if not data:
                    raise EOFError("server closed the connection")
                self.decoder.receive_data(data)

    async def hello(self, client_id: int = 77) -> wire.HelloReply:
        self.send(wire.Hello(client_id=client_id), 1)
        rid, reply = await self.recv()
        assert rid == 1 and isinstance(reply, wire.HelloReply)
        return reply

    async def call(self, msg: wire.Message, request_id: int, flags: int = 0) -> wire.Message:
        self.send(msg, request_id, flags)
        rid, reply = await self.recv()
        assert rid == request_id
        return reply

    async def closed_by_peer(self, timeout: float = 3.0) -> bytes:
        """Wait for EOF / reset; returns whatever bytes came before it."""
        got = bytearray()
        async with asyncio.timeout(timeout):
            while True:
                try:
                    data = await self.reader.read(65536)
                except (ConnectionResetError, BrokenPipeError):
                    return bytes(got)
                if not data:
                    return bytes(got)
                got += data

    def close(self) -> None:
        self.writer.close()


@asynccontextmanager
async def silent_server() -> AsyncIterator[str]:
    """Accepts connections, reads what comes and never answers: a handshake never completes."""
    writers: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        while await reader.read(4096):
            pass

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        for writer in writers:
            writer.close()
        server.close()
        await server.wait_closed()
