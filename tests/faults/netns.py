"""Client hosts as Linux network namespaces joined to this one by veth pairs.

The brokers listen on one address of this namespace (on ``lo``, a /32 of a private block picked
per run); each host is a namespace (``ip netns``) with one veth pair: its end has the host's
address and a default route to the other end, here. A host reaches the brokers' address like a
remote machine, and only that: nothing is forwarded anywhere else. :meth:`HostNetwork.cut` drops
one broker's traffic inside the host namespaces (``iptables``, both ways): cut from every host,
that broker is cut off from the clients while it still replicates with the other brokers; every
broker cut from one host cuts that host off from the cluster.

Every name carries a token of the run, so parallel runs do not collide, and :meth:`close`
removes all of it (the namespaces take their veth ends and rules with them).
"""

from __future__ import annotations

import ipaddress
import random
import subprocess
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence


class NetworkSetupError(RuntimeError):
    """A namespace, veth pair, address or rule could not be made; the message says which."""


def _run(*command: str) -> str:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetworkSetupError(f"`{' '.join(command)}` could not run: {exc}") from exc
    if done.returncode != 0:
        raise NetworkSetupError(
            f"`{' '.join(command)}` failed ({done.returncode}): {done.stderr.strip()} "
            "(network namespaces need root, iproute2 and iptables)"
        )
    return done.stdout


def _free_block() -> ipaddress.IPv4Network:
    """A /24 of 10.0.0.0/8 that no address or route of this namespace uses."""
    used = _run("ip", "-4", "-o", "addr", "show") + _run("ip", "-4", "route", "show")
    for _ in range(100):
        block = ipaddress.IPv4Network(
            f"10.{random.randrange(64, 250)}.{random.randrange(256)}.0/24"
        )
        if f"{block.network_address}"[:-1] not in used:
            return block
    raise NetworkSetupError("found no free 10.x.y.0/24 block for the test hosts")


@dataclass
class HostNetwork:
    """Namespaces named after ``hosts`` (e.g. ``("producer", "hostA", "hostB")``)."""

    hosts: Sequence[str]
    token: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    broker_address: str = ""
    """The address of this namespace the brokers listen on; every host reaches it."""
    addresses: dict[str, str] = field(default_factory=dict)
    """Each host's own address."""
    _made: list[tuple[str, ...]] = field(default_factory=list)
    _cuts: set[tuple[str, int]] = field(default_factory=set)

    @property
    def cuts(self) -> frozenset[tuple[str, int]]:
        """The (host, broker port) pairs cut off now."""
        return frozenset(self._cuts)

    def namespace(self, host: str) -> str:
        return f"pl-{self.token}-{host}"

    def prefix(self, host: str) -> list[str]:
        """The command prefix that runs a program on ``host``."""
        return ["ip", "netns", "exec", self.namespace(host)]

    def create(self) -> HostNetwork:
        if len(self.hosts) > 60:
            raise NetworkSetupError("at most 60 hosts fit one /24")
        block = _free_block()
        base = block.network_address
        self.broker_address = str(base + 1)
        # Whatever in the block is not a host or the brokers' address stays on this machine.
        _run("ip", "route", "add", "unreachable", str(block))
        self._made.append(("ip", "route", "del", "unreachable", str(block)))
        _run("ip", "addr", "add", f"{self.broker_address}/32", "dev", "lo")
        self._made.append(("ip", "addr", "del", f"{self.broker_address}/32", "dev", "lo"))
        for number, host in enumerate(self.hosts, start=1):
            ns, here, there = (
                self.namespace(host),
                f"pl{self.token}{number}r",
                f"pl{self.token}{number}n",
            )
            gateway, address = base + 4 * number + 1, base + 4 * number + 2
            _run("ip", "netns", "add", ns)
            self._made.append(("ip", "netns", "del", ns))
            _run("ip", "link", "add", here, "type", "veth", "peer", "name", there)
            self._made.append(("ip", "link", "del", here))
            _run("ip", "link", "set", there, "netns", ns)
            _run("ip", "addr", "add", f"{gateway}/30", "dev", here)
            _run("ip", "link", "set", here, "up")
            _run("ip", "-n", ns, "addr", "add", f"{address}/30", "dev", there)
            _run("ip", "-n", ns, "link", "set", there, "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            _run("ip", "-n", ns, "route", "add", "default", "via", str(gateway))
            self.addresses[host] = str(address)
        return self

    def _rules(self, port: int) -> list[list[str]]:
        broker = self.broker_address
        return [
            ["OUTPUT", "-d", broker, "-p", "tcp", "--dport", str(port), "-j", "DROP"],
            ["INPUT", "-s", broker, "-p", "tcp", "--sport", str(port), "-j", "DROP"],
        ]

    def cut(self, port: int, hosts: Sequence[str] | None = None) -> None:
        """Drop every packet between ``hosts`` (default: all) and the broker on ``port``."""
        for host in self.hosts if hosts is None else hosts:
            for rule in self._rules(port):
                _run(*self.prefix(host), "iptables", "-w", "-A", *rule)
            self._cuts.add((host, port))

    def heal(self, port: int, hosts: Sequence[str] | None = None) -> None:
        """Undo :meth:`cut`."""
        for host in self.hosts if hosts is None else hosts:
            for rule in self._rules(port):
                _run(*self.prefix(host), "iptables", "-w", "-D", *rule)
            self._cuts.discard((host, port))

    def heal_all(self) -> None:
        for host, port in sorted(self._cuts):
            self.heal(port, [host])

    def close(self) -> list[str]:
        """Remove everything :meth:`create` made, newest first; returns what could not be."""
        problems = []
        for command in reversed(self._made):
            try:
                _run(*command)
            except NetworkSetupError as exc:
                if command[:3] != ("ip", "link", "del"):  # gone with its namespace already
                    problems.append(str(exc))
        self._made.clear()
        return problems
