"""The launcher's supervisor: start the roles, watch them, stop them all when one fails.

Process model (the choices that make "no orphans, no double signals" hold):

* Every child runs in its **own session / process group**. A terminal Ctrl-C then reaches only
  the launcher, which forwards exactly one SIGTERM; without this the terminal would SIGINT every
  child *and* the launcher would SIGTERM them again. Owning a group per role also lets the
  launcher signal what a role forked (a trainer's worker pool).
* On Linux each child asks for ``PR_SET_PDEATHSIG = SIGKILL`` (:mod:`aps.procs`), so even if the
  launcher is SIGKILLed its direct children die with it instead of holding ports forever. SIGKILL,
  not SIGTERM, because a hung child must not survive either. The death signal follows the
  *thread* that forked: the supervisor forks from the event loop's thread.
* Stopping sends SIGTERM to each role's whole group (as a terminal or systemd would), SIGKILL to
  the group after a grace period; a second interrupt skips the grace. At the end, anything still
  running in a role's group (a leaked grandchild) is SIGKILLed and reported.

What the supervisor says goes to a :class:`Reporter` (the terminal board of aps-local, or nothing
for a program that only wants the result).
"""

from __future__ import annotations

import asyncio
import shlex
import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from .roles import Role, child_options, describe_exit, group_alive, signal_group

if TYPE_CHECKING:
    from .restart import Restarts

EXIT_FAILED, EXIT_TIMEOUT = 1, 124
STOP_GRACE = 10.0  # SIGTERM -> SIGKILL when a role failed or the timeout expired
INTERRUPT_GRACE = 5.0  # the same after an interrupt (Ctrl-C, SIGTERM): someone is waiting
INTERRUPTED = frozenset({128 + signal.SIGINT, 128 + signal.SIGTERM, 128 + signal.SIGHUP})


class Reporter(Protocol):
    """Where the supervisor's lines and periodic status go."""

    def line(self, text: str, error: bool = False) -> None: ...

    def status(self, roles: list[Role], elapsed: float) -> None: ...

    def status_period(self) -> float:
        """Seconds between status calls; 0 for none."""
        ...


class Quiet:
    """A reporter that shows nothing: the caller reads the result instead."""

    def line(self, text: str, error: bool = False) -> None:
        return None

    def status(self, roles: list[Role], elapsed: float) -> None:
        return None

    def status_period(self) -> float:
        return 0.0


class Supervisor:
    """Runs planned roles to the end; :meth:`run` returns the exit code (0, 1, 124, 128+signal)."""

    def __init__(self, servers: list[Role], trainers: list[Role], reporter: Reporter, *, label: str,
                 start_timeout: float, server_grace: float, keep_serving: bool, script: bool,
                 restarts: Restarts | None = None) -> None:
        self.servers, self.trainers = servers, trainers
        self.reporter = reporter
        self.label = label
        self.start_timeout, self.server_grace = start_timeout, server_grace
        self.keep_serving = keep_serving  # pservers told not to exit when the trainers are done
        self.script = script  # a user's script in every role (for the hint when a pserver never listens)
        self.restarts = restarts  # which dead pservers to start again (none: any failure stops the run)
        self.stop_code: int | None = None  # set by an interrupt or a timeout
        self.stop_reason = ""
        self.changed = asyncio.Event()  # set whenever a child exits or a stop is requested
        self.hurry = asyncio.Event()  # a second interrupt: SIGKILL without waiting
        self.began = time.monotonic()
        self.began_wall = time.time()  # metrics records carry unix time
        self.watchers: list[asyncio.Task[None]] = []
        self.stopping = False  # in _stop_all: an interrupt now only means "hurry"

    @property
    def roles(self) -> list[Role]:
        return self.servers + self.trainers

    def say(self, text: str, error: bool = False) -> None:
        self.reporter.line(f"{self.label}: {text}", error)

    # -- requests from outside (signal handlers, timers)

    def stop(self, code: int, reason: str, announce: str) -> None:
        """Stop every role and end with ``code`` (the first request wins; ``announce`` is shown)."""
        if self.stop_code is None and not self.stopping:
            self.stop_code, self.stop_reason = code, reason
            self.say(announce, error=True)
            self.changed.set()

    def interrupt(self, sig: signal.Signals) -> None:
        """A signal to the launcher: the first stops the cluster, a second kills at once."""
        if self.stop_code is not None or self.stopping:
            self.hurry.set()
            self.say(f"{sig.name} again, killing everything", error=True)
            self.changed.set()
        else:
            self.stop(128 + sig.value, f"interrupted by {sig.name}",
                      f"{sig.name}, stopping the cluster ({sig.name} again kills at once)")

    def stop_after(self, seconds: float, announce: str) -> asyncio.TimerHandle:
        """Fail with exit 124 after ``seconds`` unless everything ended before."""
        return asyncio.get_running_loop().call_later(
            seconds, self.stop, EXIT_TIMEOUT, f"timed out after {seconds:g} s", announce)

    # -- running

    async def run(self) -> int:
        ticker = asyncio.create_task(self._status_loop())
        try:
            code = await self._supervise()
        finally:
            ticker.cancel()
            await self._stop_all(INTERRUPT_GRACE if self.stop_code in INTERRUPTED else STOP_GRACE)
            await self._sweep_groups()
        return code

    async def _supervise(self) -> int:
        for role in self.servers:
            await self._spawn(role)
        for role in self.trainers:
            if role.waits_for_pservers:  # it waits for them itself: both start-ups overlap
                await self._spawn(role)
        listening = await self._wait_until(self._all_listening, self.start_timeout, poll=0.05)
        hint = " (does the script call fleet.run_server()?)" if self.script else ""
        if not listening and self._verdict() is None:  # the start timeout, not another role's failure
            for role in self.servers:
                if not role.listening:
                    role.fail(f"did not start listening within {self.start_timeout:g} s{hint}")
        if (code := self._verdict()) is not None:
            return code
        for role in self.trainers:
            if self._verdict() is not None:
                break  # a stop request or a failure while starting: start no more
            if not role.waits_for_pservers:
                await self._spawn(role)
        await self._wait_until(lambda: not any(r.running for r in self.trainers), None)
        if (code := self._verdict()) is not None:
            return code
        grace = 0.0 if self.keep_serving else self.server_grace
        await self._wait_until(lambda: not any(r.running for r in self.servers), grace)
        if (code := self._verdict()) is not None:
            return code
        for role in self.servers:
            if role.running and not self.keep_serving:
                role.fail(f"still running {grace:g} s after every trainer finished (did each trainer call worker_done?)")
        return EXIT_FAILED if any(r.failure for r in self.servers) else 0

    def _verdict(self) -> int | None:
        """Why to stop now, as an exit code: a stop request, or a failed role; None to go on."""
        if self.stop_code is not None:
            return self.stop_code
        return EXIT_FAILED if any(r.failure for r in self.roles) else None

    def _all_listening(self) -> bool:
        for role in self.servers:
            if not role.saw_listening() and role.returncode is not None:
                role.fail(f"{describe_exit(role.returncode)} before listening")
        return all(r.listening for r in self.servers)

    async def _wait_until(self, done: Callable[[], bool], timeout: float | None, poll: float | None = None,
                          stopping: bool = False) -> bool:
        """Sleep until ``done()``, waking on every child exit (and every ``poll`` s); give up at the
        timeout, or (unless ``stopping``) as soon as a role failed or a stop was requested."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            if done():
                return True
            if (not stopping and self._verdict() is not None) or (stopping and self.hurry.is_set()):
                return False
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return False
            nap = poll if remaining is None else (remaining if poll is None else min(poll, remaining))
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), nap)
            except TimeoutError:
                pass

    async def _spawn(self, role: Role) -> None:
        role.log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(role.log_path, "wb") as log:
                role.proc = await asyncio.create_subprocess_exec(
                    *role.argv, stdout=log, stderr=asyncio.subprocess.STDOUT, env=role.env, cwd=role.cwd,
                    **child_options(),
                )
        except OSError as exc:
            role.fail(f"could not start {shlex.join(role.argv[:1])}: {exc}")
            self.changed.set()
            return
        role.started = time.monotonic()
        self.watchers.append(asyncio.create_task(self._watch(role)))

    async def _watch(self, role: Role) -> None:
        assert role.proc is not None
        role.returncode = await role.proc.wait()
        role.ended = time.monotonic()
        if self.restarts is not None and not self.stopping and (line := self.restarts.take(role)) is not None:
            self.say(line, error=True)
            await self._spawn(role)
            return
        if role.returncode != 0 and role.sent is None:
            early = role.port_file is not None and not role.saw_listening()
            role.fail(describe_exit(role.returncode) + (" before listening" if early else ""))
        mark = "" if role.returncode == 0 or role.sent else "  <- FAILED"
        self.say(f"{role.name} exited: {role.state()} after {role.duration():.1f} s{mark}")
        self.changed.set()

    async def _status_loop(self) -> None:
        period = self.reporter.status_period()
        if period <= 0:
            return
        while True:
            await asyncio.sleep(period)
            self.reporter.status(self.roles, time.monotonic() - self.began)

    # -- stopping

    async def _stop_all(self, grace: float) -> None:
        """SIGTERM every running role's group, SIGKILL what is left after ``grace``, reap all."""
        self.stopping = True
        cause = self._cause()
        for role in self.roles:
            if role.running:
                role.sent, role.stopped_for = "SIGTERM", cause
                role.saw_listening()  # its state says whether it was stopped before it listened
                signal_group(role, signal.SIGTERM)
        await self._wait_until(lambda: not any(r.running for r in self.roles), grace, stopping=True)
        for role in self.roles:
            if role.running:
                role.sent = "SIGKILL"
                signal_group(role, signal.SIGKILL)
        if self.watchers:
            await asyncio.gather(*self.watchers)

    def _cause(self) -> str:
        """Why the roles still running are stopped: the stop request, else the first failure."""
        if self.stop_code is not None:
            return self.stop_reason
        failed = sorted((r for r in self.roles if r.failure is not None), key=lambda r: r.failed_at)
        return f"{failed[0].name} failed" if failed else "every trainer finished"

    async def _sweep_groups(self, grace: float = 3.0) -> None:
        """Kill anything a role forked and left behind after the role itself exited.

        Helpers of a role (e.g. multiprocessing's resource tracker) exit a moment after the role
        does, so they get ``grace`` seconds before they count as left behind."""
        deadline = time.monotonic() + grace
        while any(group_alive(r) for r in self.roles) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for role in self.roles:
            if group_alive(role):
                signal_group(role, signal.SIGKILL)
                self.say(f"{role.name} left processes behind in its group; killed them", error=True)
