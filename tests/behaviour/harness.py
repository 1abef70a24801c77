"""What a scenario drives: a :class:`Harness`, and what it reports once jobs settled.

A harness enqueues jobs of the suite's application (:mod:`.app`), runs them until every job
asked about has *settled* (succeeded, or dead-lettered) and reports each job's :class:`Outcome`
as the worker saw it, with the handler calls the application itself recorded
(:class:`Call`, from the :class:`~.app.Observer` lines). Both implementations read the same
recording, so only where the outcome comes from differs: the stub worker's results, or what the
real worker wrote to Kafka.
"""

from __future__ import annotations

import abc
import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from contextlib import AbstractContextManager
    from pathlib import Path

    from pipeline import Pipeline

Status = Literal["succeeded", "dead", "deduplicated"]
PARTITIONS = 3
"""Partitions of each job topic, on both sides: what ``with_retry_tiers`` gives the real
worker's namespace, and what the stub side's application is configured with."""


@dataclass(frozen=True, slots=True)
class Call:
    """One call of a handler, as the application recorded it."""

    job_id: str
    attempt: int
    key: str | None
    priority: str
    max_attempts: int
    partition: int
    last: bool
    """What ``ctx`` told the handler (``last``: ``is_last_attempt``)."""
    at_ms: int
    """When it was called, on the harness's clock (:meth:`Harness.now_ms`)."""
    wall_ms: int
    """When it was called, on the wall clock."""
    ended: str | None = None
    """``return`` or ``raise``; None while it runs."""
    ended_at_ms: int | None = None
    ended_wall_ms: int | None = None
    value: Any = None

    @property
    def wall_duration_ms(self) -> int | None:
        return None if self.ended_wall_ms is None else self.ended_wall_ms - self.wall_ms


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one job ended, by the worker's account."""

    status: Status
    """``deduplicated``: acknowledged unrun, its idempotency key being held by another job."""
    reason: str | None
    """The dead-letter reason (``DeadLetterReason`` values); None for a success."""
    attempts: int
    """The attempt of its last run (or of the delivery that was dead-lettered unrun)."""
    value: Any = None
    """What the handler returned, for a success."""


@dataclass(frozen=True, slots=True)
class Settled:
    """What :meth:`Harness.settle` saw: each job's outcome and every handler call, in order."""

    outcomes: dict[str, Outcome]
    calls: list[Call] = field(default_factory=list)

    def __getitem__(self, job_id: str) -> Outcome:
        return self.outcomes[job_id]

    def calls_of(self, job_id: str) -> list[Call]:
        return [call for call in self.calls if call.job_id == job_id]

    def order(self, job_ids: Iterable[str]) -> list[str]:
        """The ids of ``job_ids`` in the order their handlers were first called."""
        wanted, seen = set(job_ids), dict[str, None]()
        for call in self.calls:
            if call.job_id in wanted:
                seen.setdefault(call.job_id)
        return list(seen)


class Harness(abc.ABC):
    """One way to run the suite's application: the stub worker, or a real worker on Kafka.

    Jobs go through ``producer`` (the application, which validates payloads and fills in the
    types' declared options) or ``foreign`` (a ``Pipeline`` on the same transport that knows no
    job type, like a producer in another service).
    """

    name: str
    producer: Pipeline
    foreign: Pipeline
    backlog_counts: Counter[str] | None = None
    """While not None, counts the jobs enqueued per priority (for :meth:`backlog`)."""

    @abc.abstractmethod
    def now_ms(self) -> int:
        """The time on the clock the worker goes by (fake for the stub), in epoch ms."""

    def enqueue(
        self,
        job_type: str,
        payload: Mapping[str, Any],
        *,
        key: str | None = None,
        priority: str | None = None,
        delay_s: float | None = None,
        max_attempts: int | None = None,
        idempotency_key: str | None = None,
        foreign: bool = False,
    ) -> str:
        """Enqueue one job; return its id. ``foreign``: as a producer that does not know the
        type would (no validation against the handler, no declared options)."""
        if self.backlog_counts is not None:
            self.backlog_counts[priority or "default"] += 1  # the suite's types declare none
        options: dict[str, Any] = {
            "key": key,
            "priority": priority,
            "delay": delay_s,
            "max_attempts": max_attempts,
            "idempotency_key": idempotency_key,
        }
        given = {name: value for name, value in options.items() if value is not None}
        return (self.foreign if foreign else self.producer).enqueue(job_type, payload, **given)

    @abc.abstractmethod
    def send_raw(self, value: bytes) -> str:
        """Write ``value`` as it is to the ``default`` priority's topic, as a client that knows
        nothing of the wire format could; return the name to settle it by (:func:`raw_name`)."""

    @abc.abstractmethod
    def backlog(self) -> AbstractContextManager[None]:
        """Jobs enqueued in the block all wait until it ends: the worker has every one of them
        at hand before it may start any, as with a backlog that built up while it was busy."""

    @abc.abstractmethod
    def settle(self, job_ids: Sequence[str], timeout_s: float = 30.0) -> Settled:
        """Run jobs until every one of ``job_ids`` succeeded, was dead-lettered or was dropped
        as a duplicate."""


def raw_name(value: bytes) -> str:
    """What :meth:`Harness.send_raw` and :meth:`Harness.settle` call a message that is not a
    job (it has no job id)."""
    return f"raw:{hashlib.sha256(value).hexdigest()[:16]}"


def read_calls(path: Path, job_ids: Iterable[str]) -> list[Call]:
    """The calls of ``job_ids`` recorded in ``path``, in the order they were made."""
    wanted = set(job_ids)
    calls: list[Call] = []
    open_calls: dict[tuple[str, int], int] = {}
    for line in path.read_text().splitlines() if path.exists() else ():
        fields = json.loads(line)
        job_id, attempt = fields["id"], fields["attempt"]
        if job_id not in wanted:
            continue
        if fields["kind"] == "call":
            open_calls[job_id, attempt] = len(calls)
            calls.append(
                Call(
                    job_id,
                    attempt,
                    fields["key"],
                    fields["priority"],
                    fields["max_attempts"],
                    fields["partition"],
                    fields["last"],
                    fields["at"],
                    fields["wall"],
                )
            )
        else:
            index = open_calls.pop((job_id, attempt))
            calls[index] = replace(
                calls[index],
                ended=fields["kind"],
                ended_at_ms=fields["at"],
                ended_wall_ms=fields["wall"],
                value=fields.get("value"),
            )
    return calls
