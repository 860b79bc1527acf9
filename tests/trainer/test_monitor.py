"""The trainer's progress records: what they say between steps."""

from __future__ import annotations

import numpy as np
import pytest

from aps.trainer.monitor import Monitor
from aps.trainer.shared import STAT, STAT_FIELDS


def test_wait_share_is_a_share_even_when_read_in_the_middle_of_a_step() -> None:
    """A worker adds a step's wait before the step's whole time: a record taken in between saw
    the wait alone (a run's first record said 6.8 million). The share is 0 until a step ends and
    never above 1."""
    stats = np.zeros((2, len(STAT_FIELDS)))
    monitor = Monitor(stats, 0.0, 0, record_period=0.0)
    monitor.start_epoch()
    stats[0, STAT["wait_s"]] = 0.4  # worker 0 waits for its first step's rows; no step has ended
    first = monitor.tick(1)
    assert first is not None and first["wait_share"] == 0.0
    stats[0, STAT["compute_s"]] = 0.5  # its step ended: 0.4 s of 0.5 waiting
    stats[1, STAT["wait_s"]] = 0.8  # worker 1 in the middle of its first step: 0.8 s waited, of 0.5 ended
    second = monitor.tick(2)
    assert second is not None and second["wait_share"] == 1.0
    stats[1, STAT["compute_s"]] = 1.0
    assert monitor.end_epoch(0, {})["wait_share"] == pytest.approx(1.2 / 1.5)
