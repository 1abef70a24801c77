"""A PostgreSQL DSN before the relay connects with it: options libpq refuses, and keepalives.

**Refused options.** libpq checks most option values (``sslmode``, ``port``, ``keepalives_idle``,
``target_session_attrs``...) only when it connects, and reports a bad one as a failed connection:
the relay would wait for ever for a database that is not down. :func:`refusal` asks libpq itself,
with no network traffic: the DSN's options aimed at a target that cannot answer (a socket in an
empty directory of our own; a loopback port we hold bound and do not listen on, for the TCP-only
options), compared with that same target and no options. Same failure: libpq took the options;
another one: it refused them, and each option that alone makes the difference is named. No
message text is interpreted, so a translated libpq is judged the same.

**Keepalives.** libpq turns TCP keepalives on but leaves their timing to the system, whose
default first probe comes after two hours of silence: a connection a NAT or firewall dropped
without a word would hang the relay that long. :class:`Keepalives` adds the timing, unless the
DSN sets it.
"""

from __future__ import annotations

import re
import select
import socket
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

__all__ = ["RELAY_KEEPALIVES", "Keepalives", "refusal"]

_PROBE_TIMEOUT_S = 5.0
"""A probe's connection fails at once (nothing there); past this, no verdict."""
_DIGITS = re.compile(r"\s*[0-9]{1,5}\s*").fullmatch


@dataclass(frozen=True, slots=True)
class Keepalives:
    """TCP keepalives of a connection: a peer silent for ``idle`` seconds is probed ``count``
    times ``interval`` seconds apart, then the connection is dropped."""

    idle: int
    interval: int
    count: int

    def params(self, given: Mapping[str, str]) -> dict[str, int]:
        """The libpq parameters of these keepalives that ``given`` (a parsed DSN) lacks: an
        option the DSN sets, ``keepalives=0`` included, is the user's choice."""
        wanted = {
            "keepalives": 1,
            "keepalives_idle": self.idle,
            "keepalives_interval": self.interval,
            "keepalives_count": self.count,
        }
        return {name: value for name, value in wanted.items() if not given.get(name)}


RELAY_KEEPALIVES = Keepalives(idle=30, interval=10, count=3)
"""The relay's connection: a silently dropped one is noticed within about a minute."""


def refusal(params: Mapping[str, str]) -> str | None:
    """Why libpq refuses the connection options ``params`` (a parsed DSN), found without
    network traffic; None when it takes them (see the module docstring)."""
    options = {k: v for k, v in params.items() if k not in ("host", "hostaddr", "port")}
    hosts = max(len(params.get("host", "").split(",")), len(params.get("hostaddr", "").split(",")))
    ports = params.get("port", "")
    with tempfile.TemporaryDirectory(prefix="pipeline-conninfo-") as empty, _refusing_port() as p:
        # The DSN's ports, against ports libpq surely takes, on sockets that are not there.
        sockets = {"host": ",".join([empty] * hosts)}
        reason = _refused({**sockets, "port": ports}, {**sockets, "port": _plain(ports, hosts)})
        if reason is not None:
            return f"libpq refuses port={ports!r} ({reason})"
        # The other options, on a loopback port that refuses (some only apply to TCP).
        tcp = {"host": "127.0.0.1", "port": str(p)}
        reason = _refused({**options, **tcp}, tcp)
        if reason is not None:
            culprits = [k for k in options if _refused({k: options[k], **tcp}, tcp) is not None]
            named = ", ".join(_shown(k, options[k]) for k in culprits)
            return f"libpq refuses {named or 'the combination of its options'} ({reason})"
    return None


def _plain(ports: str, hosts: int) -> str:
    """Ports libpq takes for ``hosts`` hosts, the same as ``ports`` where libpq reads them so:
    a port libpq reads otherwise fails differently, and is refused."""
    each = [p.strip() if _DIGITS(p) else "" for p in ports.split(",")]
    return ",".join(each if len(each) in (1, hosts) else each[:1])


def _refused(tried: Mapping[str, str], baseline_params: Mapping[str, str]) -> str | None:
    """libpq's failure with ``tried`` when it is not its failure with ``baseline_params`` (the
    part after what both say of the target); None if it is."""
    baseline = _failure(baseline_params)
    failure = _failure(tried)
    if failure == baseline or failure is None or baseline is None:
        return None
    shared = next((i for i, (a, b) in enumerate(zip(baseline, failure, strict=False)) if a != b), 0)
    cut = failure.rfind(": ", 0, shared)
    return failure[cut + 2 if cut >= 0 else 0 :].strip()


def _failure(params: Mapping[str, str]) -> str | None:
    """libpq's error message of a connection with ``params`` (``hostaddr`` cleared: an
    environment's ``PGHOSTADDR`` would aim it elsewhere); None if it did not fail in time."""
    from psycopg import pq
    from psycopg.conninfo import make_conninfo

    conninfo = make_conninfo("", **{**params, "hostaddr": ""})
    pgconn = pq.PGconn.connect_start(conninfo.encode())
    try:
        status: int = pq.PollingStatus.WRITING
        while pgconn.status != pq.ConnStatus.BAD and status != pq.PollingStatus.FAILED:
            if status == pq.PollingStatus.OK:
                return None
            # poll(), not select(): select() refuses a descriptor past 1023, which a process
            # with many files and sockets open (a web server, a worker) hands out.
            poller = select.poll()
            reading = status == pq.PollingStatus.READING
            poller.register(pgconn.socket, select.POLLIN if reading else select.POLLOUT)
            if not poller.poll(_PROBE_TIMEOUT_S * 1000):
                return None
            status = pgconn.connect_poll()
        return pgconn.get_error_message()
    finally:
        pgconn.finish()


@contextmanager
def _refusing_port() -> Iterator[int]:
    """A loopback port that refuses connections for as long as it is held: bound, never
    listened on, so no other process can listen there meanwhile."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        yield int(held.getsockname()[1])


def _shown(name: str, value: str) -> str:
    return f"{name}=***" if name == "password" else f"{name}={value!r}"
