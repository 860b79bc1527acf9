"""Control messages between a trainer and its compute workers (over a multiprocessing pipe).

Only small fixed records cross the pipe; bulk data (ids, gradients, rows) goes through the
shared arrays. A record is ``kind:u8, a:i64, b:i64, counts:i64[*]`` packed with struct, plus an
optional UTF-8 text (error messages).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from enum import IntEnum

_HEAD = struct.Struct("<BqqI")


class Kind(IntEnum):
    # trainer -> worker
    EPOCH = 1  # a = epoch number: train over your files once
    OK = 2  # the request you sent is done; a = request step
    STOP = 3  # exit now
    # worker -> trainer
    PULL = 10  # refresh the rows whose ids are in my mailbox; counts = ids per sparse table
    GRADS = 11  # my gradients are in my mailbox; counts = ids per sparse table
    EPOCH_DONE = 12  # I finished epoch a (b = steps in it)
    ERROR = 13  # I failed; text says why (I exit after sending)
    READY = 14  # kernels compiled, arrays attached


@dataclass
class Record:
    kind: Kind
    a: int = 0
    b: int = 0
    counts: list[int] = field(default_factory=list)
    text: str = ""

    def encode(self) -> bytes:
        text = self.text.encode("utf-8")
        return (
            _HEAD.pack(int(self.kind), self.a, self.b, len(self.counts))
            + struct.pack(f"<{len(self.counts)}q", *self.counts)
            + text
        )

    @classmethod
    def decode(cls, data: bytes) -> Record:
        kind, a, b, n = _HEAD.unpack_from(data, 0)
        counts = list(struct.unpack_from(f"<{n}q", data, _HEAD.size))
        text = data[_HEAD.size + 8 * n :].decode("utf-8", errors="replace")
        return cls(Kind(kind), a, b, counts, text)
