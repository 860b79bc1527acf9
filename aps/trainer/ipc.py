"""Control messages between a trainer and its compute workers (over a multiprocessing pipe).

Only small fixed records cross the pipe (a record bigger than the pipe's buffer could be read
half-written: the event loop may make the pipe non-blocking); bulk data (ids, gradients, rows) goes through the
shared arrays. A record is ``kind:u8, answers:u8, buffer:u8, step:i64, epoch:i64, examples:i64,
steps:i64, clock:i64, counts:i64[*]`` packed with struct, plus an optional UTF-8 text (error messages). Every field has
one meaning in every kind that uses it; the others stay 0.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from enum import IntEnum

_HEAD = struct.Struct("<BBBqqqqqI")


class Kind(IntEnum):
    # trainer -> worker
    EPOCH = 1  # train over your files once (epoch)
    OK = 2  # the request of kind ``answers`` you sent for ``step`` is done
    STOP = 3  # exit now
    PASS = 4  # train once over the files listed in ``text`` (one per line), as pass ``epoch``
    SCORE = 5  # score the files listed in ``text`` with the current parameters, no update
    # worker -> trainer
    PULL = 10  # refresh the rows whose ids are in my id mailbox half of ``step``; counts per sparse table
    GRADS = 11  # my gradients of ``step`` (``examples`` examples) are in my mailbox; counts per sparse table
    EPOCH_DONE = 12  # I finished ``epoch`` after ``steps`` steps in it
    ERROR = 13  # I failed; text says why (I exit after sending)
    READY = 14  # kernels compiled, arrays attached
    SCORE_DONE = 15  # I scored ``examples`` examples in ``steps`` batches (AUC counts: shared ``scores``)
    STEPS = 16  # geo: my step brought the trainer's step count to ``steps``, where its next exchange is due; no reply


@dataclass
class Record:
    """One control message; which fields a kind uses is written beside each :class:`Kind`."""

    kind: Kind
    #: the worker step a PULL, GRADS or OK is about (its id mailbox half is ``step % 2``)
    step: int = 0
    #: the epoch an EPOCH or EPOCH_DONE is about; the pass sequence number of a PASS or SCORE
    epoch: int = 0
    #: GRADS: examples in the batch whose gradients are in the mailbox
    examples: int = 0
    #: EPOCH_DONE: steps the worker trained in that epoch; STEPS: the trainer's steps it saw
    steps: int = 0
    #: OK: the kind of request it answers (PULL or GRADS); 0 otherwise
    answers: int = 0
    #: OK answering a PULL: how many of this trainer's batches had their sparse gradients
    #: applied on the pservers before the rows were pulled (what a worker's staleness counts from)
    clock: int = 0
    #: PULL, GRADS: ids written to the mailbox, one count per sparse table in the model's order
    counts: list[int] = field(default_factory=list)
    #: ERROR: what went wrong; PASS, SCORE: the files to read, one per line
    text: str = ""
    #: OK answering a GRADS: which dense parameter buffer the worker computes its next step with
    #: (two where the mode lags the dense rounds: aps.trainer.shared, SharedLayout.dense_spare)
    buffer: int = 0

    def encode(self) -> bytes:
        text = self.text.encode("utf-8")
        head = _HEAD.pack(
            int(self.kind), self.answers, self.buffer, self.step, self.epoch, self.examples, self.steps, self.clock, len(self.counts)
        )
        return head + struct.pack(f"<{len(self.counts)}q", *self.counts) + text

    @classmethod
    def decode(cls, data: bytes) -> Record:
        kind, answers, buffer, step, epoch, examples, steps, clock, n = _HEAD.unpack_from(data, 0)
        counts = list(struct.unpack_from(f"<{n}q", data, _HEAD.size))
        text = data[_HEAD.size + 8 * n :].decode("utf-8", errors="replace")
        return cls(Kind(kind), step, epoch, examples, steps, answers, clock, counts, text, buffer)
