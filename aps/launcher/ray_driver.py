"""aps-ray's driver: N pservers and M trainers as Ray actors, started and supervised from here.

Ray decides where every role runs; each pserver reports ``host:port`` back through Ray and the
trainers are started with that list. One failed role (a non-zero exit, a pserver gone before the
trainers are done, an actor or node lost) stops every other role and fails the job with that
role's log tail; the summary names each role's node, exit and time. The ``ray`` module is handed
in by the command (aps/cli/ray_launch.py), which owns the options: Ray stays optional.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..cluster import ENV_NAMES
from ..errors import ApsError
from .local import given_metrics
from .ray_roles import RoleProcess
from .roles import describe_exit

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_TIMEOUT, EXIT_INTERRUPTED = 0, 1, 2, 124, 130
#: pservers exit by themselves once every trainer sent worker_done; this long after, they failed
PSERVER_EXIT_GRACE = 60.0
#: a pserver exits 0 once every trainer has sent worker_done, a moment before the trainers' own
#: processes exit: only trainers still running this long after that make its exit a failure
TRAINER_EXIT_GRACE = 30.0


@dataclass
class Member:
    """One role as the driver sees it: its actor and what became of it."""

    name: str
    kind: str
    index: int
    actor: Any
    node: str = "?"
    code: int | None = None
    failure: str | None = None
    seconds: float = 0.0
    record: dict[str, Any] | None = None
    stopped: bool = False  # stopped by aps-ray because another role failed (or a timeout)
    started: bool = False  # its process started: an actor Ray has not placed answers no call
    seen_exited: float | None = None  # monotonic time the driver first saw it exited 0


class RoleFailed(ApsError):
    """A role that had started failed while the driver was still waiting for Ray to place others."""

    def __init__(self, member: Member) -> None:
        super().__init__(f"{member.name} failed: {member.failure}")
        self.member = member


@dataclass
class RayJob:
    """N pservers and M trainers as Ray actors, supervised from the driver."""

    ray: Any  # the ray module, imported by main() (an optional dependency)
    opts: argparse.Namespace
    trainer_args: list[str]
    out: Any = field(default_factory=lambda: sys.stdout)  # looked up when made, not at import
    err: Any = field(default_factory=lambda: sys.stderr)  # failures and log tails, as aps-local
    servers: list[Member] = field(default_factory=list)
    trainers: list[Member] = field(default_factory=list)
    started: float = field(default_factory=time.time)

    def say(self, text: str, error: bool = False) -> None:
        print(f"aps-ray: {text}", file=self.err if error else self.out, flush=True)

    def _actor(self, name: str, cpus: float, spread: bool) -> Any:
        env = {name: os.environ[name] for name in ENV_NAMES["token"] if os.environ.get(name)}
        options: dict[str, Any] = {"num_cpus": cpus, "max_restarts": 0}
        if spread:
            options["scheduling_strategy"] = "SPREAD"
        log_dir = str(Path(self.opts.workdir, self.opts.log_dir))
        return self.ray.remote(RoleProcess).options(**options).remote(name, log_dir, self.opts.workdir, env)

    def fit_cpus(self) -> None:
        """Fill in the CPUs per role the user left out: 1 each, or, on a cluster with fewer CPUs
        than roles (a laptop's local Ray), an equal share of what it has, so that every role is
        placed at once instead of waiting for CPUs that never come (the trainers meet at
        barriers: a job with one trainer unplaced only waits). Said in one line when shared."""
        n, m = self.opts.layout
        given = (self.opts.pserver_cpus, self.opts.trainer_cpus)
        left = [c is None for c in given]
        if not any(left):
            return
        had = self._cpus_had()
        fixed = (n * (given[0] or 0.0)) + (m * (given[1] or 0.0))
        roles = n * left[0] + m * left[1]
        share = min(1.0, math.floor(1000 * max(had - fixed, 0.0) / roles) / 1000)
        if share <= 0:
            share = 1.0  # nothing left to share: ask for 1 and let the placement wait say so
        if left[0]:
            self.opts.pserver_cpus = share
        if left[1]:
            self.opts.trainer_cpus = share
        if share < 1.0:
            self.say(f"the cluster has {had:g} CPUs for {roles} role(s) without a CPU setting: each reserves "
                     f"{share:g} (pass --pserver-cpus / --trainer-cpus to reserve more and wait for them)")

    def start(self) -> list[str]:
        """Start the pservers, collect their endpoints through Ray, start the trainers with them."""
        n, m = self.opts.layout
        self.fit_cpus()
        if self._cpus_wanted() > self._cpus_had():
            self.say(f"{self._cpus_asked()}: roles Ray cannot place wait for free CPUs, up to --start-timeout "
                     f"{self.opts.start_timeout:g} s (lower --pserver-cpus / --trainer-cpus to run them all at once)",
                     error=True)
        for k in range(n):
            self.servers.append(Member(f"pserver.{k}", "pserver", k, self._actor(f"pserver.{k}", self.opts.pserver_cpus, True)))
        server_args = [*self.opts.server_argv, "--servers", str(n), "--trainers", str(m)]
        refs = [s.actor.start_server.remote([*server_args, "--index", str(s.index)]) for s in self.servers]
        addresses = [str(a) for a in self._placed(self.servers, refs, "pservers")]
        pservers = ",".join(addresses)
        self.say(f"pservers listening: {pservers}")
        for k in range(m):
            self.trainers.append(Member(f"trainer.{k}", "trainer", k, self._actor(f"trainer.{k}", self.opts.trainer_cpus, False)))
        own_metrics = given_metrics(self.trainer_args) is None
        refs = []
        for t in self.trainers:
            extra = ["--metrics", self._metrics_path(t)] if own_metrics else []
            refs.append(t.actor.start_trainer.remote([*self.trainer_args, *extra, "--pservers", pservers, "--trainers",
                                                     str(m), "--trainer-id", str(t.index)]))
        self._placed(self.trainers, refs, "trainers")
        self.say(f"trainers started on {', '.join(t.node for t in self.trainers)}")
        return addresses

    def _placed(self, members: list[Member], refs: list[Any], what: str) -> list[Any]:
        """Results of the start calls, in order, taken as Ray places and starts each role. The
        roles started meanwhile are watched: a role waiting for free CPUs (maybe forever, when the
        job asks for more than the cluster has) must not hide one that already failed, which
        raises RoleFailed at once. ApsError when not every role started within --start-timeout."""
        deadline = time.monotonic() + self.opts.start_timeout
        results: dict[int, Any] = {}
        while len(results) < len(refs):
            waiting = [ref for k, ref in enumerate(refs) if k not in results]
            ready, _ = self.ray.wait(waiting, num_returns=len(waiting), timeout=self.opts.poll)
            for k, ref in enumerate(refs):
                if k not in results and ref in ready:
                    results[k] = self.ray.get(ref)  # a RayTaskError when the role failed to start
                    members[k].started = True
                    members[k].node = str(self.ray.get(members[k].actor.host.remote(), timeout=60))
            self._poll_all()
            if (failed := self._first_failed()) is not None:
                raise RoleFailed(failed)
            if len(results) < len(refs) and time.monotonic() > deadline:
                raise ApsError(f"the {what} did not start within --start-timeout {self.opts.start_timeout:g} s: "
                               f"{self._cpus_asked()}")
        return [results[k] for k in range(len(refs))]

    def _cpus_wanted(self) -> float:
        n, m = self.opts.layout
        return float(n * self.opts.pserver_cpus + m * self.opts.trainer_cpus)

    def _cpus_had(self) -> float:
        return float(self.ray.cluster_resources().get("CPU", 0))

    def _cpus_asked(self) -> str:
        n, m = self.opts.layout
        return (f"the job asks Ray for {self._cpus_wanted():g} CPUs ({n} x --pserver-cpus {self.opts.pserver_cpus:g} + "
                f"{m} x --trainer-cpus {self.opts.trainer_cpus:g}) and the cluster has {self._cpus_had():g}")

    def _metrics_path(self, trainer: Member) -> str:
        """Where a trainer writes its metrics unless the trainer options name a file."""
        return str(Path(self.opts.log_dir, f"{trainer.name}.metrics.jsonl"))

    def _poll(self, member: Member) -> None:
        if not member.started or member.code is not None or member.failure is not None:
            return  # a call to an actor Ray has not placed would wait for its placement
        try:
            member.code = self.ray.get(member.actor.poll.remote(), timeout=60)
        except self.ray.exceptions.RayActorError as exc:
            member.failure = f"its Ray actor was lost ({type(exc).__name__}: the node or the actor process died)"
            return
        if member.code is not None and member.code != 0:
            member.failure = describe_exit(member.code)

    def _poll_all(self) -> None:
        for member in self.servers + self.trainers:
            self._poll(member)

    def _first_failed(self) -> Member | None:
        return next((m for m in self.trainers + self.servers if m.failure is not None), None)

    def supervise(self) -> int:
        """Wait for every trainer, then every pserver; stop all at the first failure."""
        deadline = None if self.opts.timeout is None else time.monotonic() + self.opts.timeout
        done_at: float | None = None
        while True:
            self._poll_all()
            trainers_done = all(t.code == 0 for t in self.trainers)
            if trainers_done and done_at is None:
                done_at = time.monotonic()
            if done_at is not None and time.monotonic() - done_at > PSERVER_EXIT_GRACE:
                for s in self.servers:
                    if s.code is None:
                        s.failure = f"still running {PSERVER_EXIT_GRACE:g} s after every trainer was done"
            now = time.monotonic()
            for s in self.servers:
                if s.code == 0 and not trainers_done and s.failure is None:
                    s.seen_exited = s.seen_exited or now
                    if now - s.seen_exited > TRAINER_EXIT_GRACE:
                        s.failure = f"exited, and the trainers were still running {TRAINER_EXIT_GRACE:g} s later"
            if (failed := self._first_failed()) is not None:
                self.stop(f"{failed.name} failed: {failed.failure}", failed)
                return EXIT_FAILED
            if trainers_done and all(s.code == 0 for s in self.servers):
                return EXIT_OK
            if deadline is not None and time.monotonic() > deadline:
                self.stop(f"--timeout {self.opts.timeout:g} s expired", None)
                return EXIT_TIMEOUT
            time.sleep(self.opts.poll)

    def stop(self, reason: str, culprit: Member | None) -> None:
        """Say why, show the culprit's log tail, and stop every role still running."""
        self.say(f"{reason}; stopping every role", error=True)
        if culprit is not None:
            try:
                tail = self.ray.get(culprit.actor.tail_text.remote(), timeout=30)
            except self.ray.exceptions.RayError:
                tail = f"(its log {self.opts.log_dir}/{culprit.name}.log is on {culprit.node}, which Ray cannot reach)"
            print(f"--- last lines of {culprit.name} ({culprit.node}) ---\n{tail}", file=self.err, flush=True)
        self.stop_all()

    def stop_all(self) -> None:
        """Stop every role still running (SIGTERM, then SIGKILL) and record how each ended."""
        running = [m for m in self.servers + self.trainers if m.started and m.code is None and m.failure is None]
        for member in running:
            member.stopped = True
        refs = [m.actor.stop.remote() for m in running]
        for member, ref in zip(running, refs):
            try:
                member.code = self.ray.get(ref, timeout=60)
            except self.ray.exceptions.RayError:
                member.failure = "lost while being stopped"  # its child died with its actor

    def finish(self) -> None:
        """Collect times and last epochs for the summary, then end every actor."""
        for member in self.servers + self.trainers:
            if not member.started:
                self.ray.kill(member.actor)
                continue
            try:
                member.seconds = self.ray.get(member.actor.seconds.remote(), timeout=30)
                if member.kind == "trainer":
                    path = given_metrics(self.trainer_args) or self._metrics_path(member)
                    member.record = self.ray.get(member.actor.last_epoch.remote(path, member.index, self.started), timeout=30)
            except self.ray.exceptions.RayError:
                pass  # lost: its failure already says so
            self.ray.kill(member.actor)

    def summary(self) -> None:
        print(f"{'role':<11} {'node':<16} {'result':<22} {'seconds':>8}  last epoch", file=self.out)
        for m in self.servers + self.trainers:
            result = m.failure or ("not started" if m.code is None else describe_exit(m.code))
            if m.stopped and not m.failure:
                result = f"stopped ({result})"
            epoch = "" if not m.record else f"epoch {m.record.get('epoch')} loss {m.record.get('loss', float('nan')):.4f}"
            print(f"{m.name:<11} {m.node:<16} {result:<22} {m.seconds:8.1f}  {epoch}", file=self.out)
        self.out.flush()

    def run(self) -> int:
        code = EXIT_FAILED
        try:
            self.start()
            code = self.supervise()
        except KeyboardInterrupt:
            self.say("interrupted; stopping every role", error=True)
            self.stop_all()
            code = EXIT_INTERRUPTED
        except self.ray.exceptions.RayTaskError as exc:  # a role failed to start: its ApsError, with its log
            self.say(f"a role failed to start: {exc.cause if getattr(exc, 'cause', None) else exc}", error=True)
            self.stop_all()
        except RoleFailed as exc:  # while another waited to be placed
            self.stop(str(exc), exc.member)
        except ApsError as exc:
            self.say(str(exc), error=True)
            self.stop_all()
        finally:
            self.finish()
        self.summary()
        return code
