"""A private network of Linux network namespaces for multi-host tests: one namespace per host,
each with its own address on a bridge that lives in a namespace of its own, so the test network
exists nowhere else (the host's namespace gets no address and no route to it).

Names are unique per run (pid + random) and everything is removed on exit, even when setting up
failed half-way: deleting a namespace removes the veth ends and the bridge inside it.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass, field
from types import TracebackType

#: RFC 2544's benchmarking range: private, and not used by real networks or container runtimes
TEST_RANGE = "198.18"


def _ip(*args: str) -> None:
    """Run one ``ip`` command; a failure names the command and ip's own message."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")


def unavailable() -> str | None:
    """Why namespaces cannot be used here (a skip reason), or None when they can."""
    if os.name != "posix" or os.geteuid() != 0:
        return "needs root to create network namespaces (ip netns add); CI runs it as root"
    if shutil.which("ip") is None:
        return "needs iproute2's ip command (apt-get install iproute2)"
    probe = f"aps-probe-{os.getpid()}-{secrets.token_hex(3)}"
    try:
        _ip("netns", "add", probe)
    except RuntimeError as exc:
        return f"cannot create a network namespace here (no CAP_SYS_ADMIN?): {exc}"
    _ip("netns", "del", probe)
    return None


@dataclass
class NetnsNetwork:
    """``hosts`` namespaces on one bridge; ``address(k)`` is host k's address, ``argv(k, ...)``
    runs a command inside host k. Use as a context manager."""

    hosts: int
    tag: str = field(default_factory=lambda: f"{os.getpid() % 10000}{secrets.token_hex(2)}")
    subnet: int = field(default_factory=lambda: 1 + secrets.randbelow(254))
    created: list[str] = field(default_factory=list)

    @property
    def bridge_ns(self) -> str:
        return f"aps-{self.tag}-br"

    def namespace(self, k: int) -> str:
        return f"aps-{self.tag}-h{k}"

    def address(self, k: int) -> str:
        return f"{TEST_RANGE}.{self.subnet}.{k + 1}"

    def argv(self, k: int, *command: str) -> list[str]:
        """``ip netns exec`` execs the command, so the child's pid is the command's own."""
        return ["ip", "netns", "exec", self.namespace(k), *command]

    def __enter__(self) -> NetnsNetwork:
        try:
            self._create()
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.remove()

    def _add_namespace(self, name: str) -> None:
        _ip("netns", "add", name)
        self.created.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    def _create(self) -> None:
        bridge = "br0"
        self._add_namespace(self.bridge_ns)
        _ip("-n", self.bridge_ns, "link", "add", bridge, "type", "bridge")
        _ip("-n", self.bridge_ns, "link", "set", bridge, "up")
        for k in range(self.hosts):
            ns = self.namespace(k)
            self._add_namespace(ns)
            # both ends are made inside the host's namespace (no name can clash with the
            # machine's own links), then the bridge end moves to the bridge's namespace
            _ip("-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", f"port{k}")
            _ip("-n", ns, "link", "set", f"port{k}", "netns", self.bridge_ns)
            _ip("-n", self.bridge_ns, "link", "set", f"port{k}", "master", bridge, "up")
            _ip("-n", ns, "addr", "add", f"{self.address(k)}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")

    def remove(self) -> None:
        """Delete every namespace this network made (their links go with them); report the
        first failure after trying all."""
        errors = []
        for name in reversed(self.created):
            try:
                _ip("netns", "del", name)
            except RuntimeError as exc:
                errors.append(str(exc))
        self.created.clear()
        if errors:
            raise RuntimeError("; ".join(errors))
