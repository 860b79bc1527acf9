"""The lock that lets a test marked ``alone`` run with no other xdist worker's test beside it:
two MachineShare instances on one directory stand for two workers."""

from __future__ import annotations

import threading
from pathlib import Path

from tests.machine_share import MachineShare


def enter_in_thread(share: MachineShare, alone: bool, leave: threading.Event) -> tuple[threading.Thread, threading.Event]:
    """Holds the share in a thread until ``leave`` is set; the returned event is set once held."""
    entered = threading.Event()

    def hold() -> None:
        with share.hold(alone=alone):
            entered.set()
            leave.wait(10)

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    return thread, entered


def test_shared_holders_run_together_and_an_alone_one_waits_for_them_and_holds_them_off(tmp_path: Path) -> None:
    first, second, third = (MachineShare(tmp_path) for _ in range(3))
    try:
        leave_shared, leave_alone, leave_later = threading.Event(), threading.Event(), threading.Event()
        shared, shared_in = enter_in_thread(first, alone=False, leave=leave_shared)
        assert shared_in.wait(5)
        with second.hold(alone=False):  # two ordinary tests side by side
            pass
        alone, alone_in = enter_in_thread(second, alone=True, leave=leave_alone)
        assert not alone_in.wait(0.2), "an alone test started beside a running one"
        later, later_in = enter_in_thread(third, alone=False, leave=leave_later)
        assert not later_in.wait(0.2), "a test started while an alone one waited (it would starve)"
        leave_shared.set()
        assert alone_in.wait(5), "the alone test did not start once the other ended"
        assert not later_in.wait(0.2), "a test started beside an alone one"
        leave_alone.set()
        assert later_in.wait(5)
        leave_later.set()
        for thread in (shared, alone, later):
            thread.join(5)
            assert not thread.is_alive()
    finally:
        for share in (first, second, third):
            share.close()
