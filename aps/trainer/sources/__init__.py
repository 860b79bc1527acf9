"""Where an online trainer's data comes from, one *pass* at a time.

A source hands the trainer passes in order (:class:`Pass`: a name, a sequence number and this
trainer's files for it), says why it stopped when it has no more, and is told when a checkpoint
covering a pass is written (a stream acknowledges its records only then). The trainer's loop is
in :mod:`aps.trainer.online`; the sources are:

* :class:`PassDir` (``aps-trainer --data-passes ROOT``): folders ``ROOT/<day>/<pass>/``, each
  complete once its done-file exists;
* :class:`RedisStream` (``aps-trainer --data-stream redis://HOST:PORT/STREAM``): a Redis stream
  read through a consumer group, N entries to a pass (redis-py is imported only when it opens).
"""

from .base import Pass, Source
from .passdir import PassDir, natural_key
from .redis_stream import RedisStream

__all__ = ["Pass", "PassDir", "RedisStream", "Source", "natural_key"]
