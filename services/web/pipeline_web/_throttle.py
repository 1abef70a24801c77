"""Brute-force protection of the credentials: :class:`LoginThrottle`.

Every failed attempt (a wrong token at ``/login``, a wrong ``Authorization: Bearer`` token, or
wrong basic credentials) counts against the client's address. After ``max_failures`` of them
within ``window_s`` seconds, every attempt from that address is refused with 429 and a
``Retry-After`` for ``lockout_s`` seconds, the right credentials included, so that guessing
goes no faster than ``max_failures`` a ``lockout_s``; other addresses are not affected. A
success does not clear the count: a client with the right token sharing an address (a NAT)
with a guesser would otherwise reset the guesser's count.

An IPv6 client counts by its /64 network, which one host usually holds whole. The table
holds ``max_clients`` addresses at most, and forgets an address only once it counts nothing
any more: no failure for ``max(window_s, lockout_s)``, so neither a failure in the window
nor a lockout. Forgetting one still locked, or still counting, would let an attacker failing
from more addresses than the table holds (an IPv6 /48 holds 65,536 /64s) guess without
bound. While the table is full of addresses that still count, an address not in it is
refused as if locked, unchecked, until the oldest one is forgotten: guessing stays bounded
(``max_failures`` per ``window_s`` for each address held). Only an attacker who keeps failing
from ``max_clients`` addresses at once holds new addresses off that way; an address already
held (an operator who mistyped once) keeps its own count, and a session already earned is
not checked here. A global failure limit instead would let a handful of guesses from
anywhere lock every operator out.
"""

from __future__ import annotations

import ipaddress
import math
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

MAX_FAILURES = 10
WINDOW_S = 300.0
LOCKOUT_S = 300.0
MAX_CLIENTS = 10_000


def client_key(host: str | None) -> str:
    """The address ``host`` counts as: itself, an IPv6 address's /64 network (an IPv4 one
    mapped into IPv6 as the IPv4 address), or the text given when it is not an address."""
    if host is None:
        return "unknown"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


@dataclass
class _Client:
    failures: deque[float]
    last: float = 0.0
    locked_until: float = 0.0


@dataclass
class LoginThrottle:
    """Failed credential attempts per client address, and the addresses locked out; ``clock``
    is monotonic seconds (tests give a fake one)."""

    max_failures: int = MAX_FAILURES
    window_s: float = WINDOW_S
    lockout_s: float = LOCKOUT_S
    max_clients: int = MAX_CLIENTS
    clock: Callable[[], float] = time.monotonic
    _clients: OrderedDict[str, _Client] = field(default_factory=OrderedDict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def retry_after(self, host: str | None) -> int | None:
        """Whole seconds until ``host`` may try again, or None when it may now: a locked
        address, or one not in a table full of addresses that still count."""
        key = client_key(host)
        with self._lock:
            now = self.clock()
            self._forget(now)
            found = self._clients.get(key)
            if found is not None:
                left = found.locked_until - now
            elif len(self._clients) >= self.max_clients:
                oldest = next(iter(self._clients.values()))
                left = max(oldest.last + self._keep_s - now, 1.0)
            else:
                return None
        return math.ceil(left) if left > 0 else None

    def failed(self, host: str | None) -> None:
        """Count a failed attempt of ``host``; the one that reaches ``max_failures`` within
        ``window_s`` locks it out for ``lockout_s``. An address not in a full table is not
        added (:meth:`retry_after` refuses it anyway)."""
        key = client_key(host)
        now = self.clock()
        with self._lock:
            self._forget(now)
            found = self._clients.pop(key, None)
            if found is None:
                if len(self._clients) >= self.max_clients:
                    return
                found = _Client(deque(maxlen=self.max_failures))
            self._clients[key] = found  # last: the most recent failure
            found.last = now
            failures = found.failures
            while failures and failures[0] <= now - self.window_s:
                failures.popleft()
            failures.append(now)
            if len(failures) >= self.max_failures:
                found.locked_until = now + self.lockout_s
                failures.clear()

    @property
    def _keep_s(self) -> float:
        """How long after its last failure an address still counts at most: a lockout starts
        at a failure, so past this it has no failure in the window and is not locked."""
        return max(self.window_s, self.lockout_s)

    def _forget(self, now: float) -> None:
        """Drop the addresses that count nothing any more: the table is in the order of the
        last failures, so they are the first ones (called with the lock held)."""
        clients = self._clients
        while clients and next(iter(clients.values())).last <= now - self._keep_s:
            clients.popitem(last=False)

    def __len__(self) -> int:
        """How many addresses are held."""
        with self._lock:
            return len(self._clients)
