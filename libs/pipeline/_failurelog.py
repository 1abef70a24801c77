"""An application's failure log: how many jobs it handed to the producer and had answered,
by generation, and the jobs Kafka did not acknowledge, with whom they were told to.

A generation is what was sent between two ``flush()`` calls: a flush opens a new one and waits
for the jobs of the older ones only, so that jobs other threads keep enqueueing do not hold it
back (:meth:`FailureLog.mark`, :meth:`FailureLog.unanswered`). Every flush raises the failures
of the jobs sent before it that its thread was not told yet, whichever thread enqueued them
(:meth:`FailureLog.take`): one that returns means those jobs were all acknowledged, or their
failure was raised to the call that waited for the job itself (:meth:`FailureLog.raised`). At most
:data:`MAX_KEPT` failures are kept, the newest; the ones let go are counted, and each thread
hears how many it was never told.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ._delivery import Generation, JobsFollowUps, PipelineFailure
from ._transport import UNREACHABLE_CODES, Transport, fatal_of

if TYPE_CHECKING:
    from confluent_kafka import KafkaError, Message

    from ._settings import Settings

__all__ = ["MAX_KEPT", "TELL_EVERY_S", "FailureLog", "Taken"]

MAX_KEPT = 1000
"""Failures an application keeps at most (the newest); the older ones are only counted."""
TELL_EVERY_S = 10.0
"""Failed jobs nobody raised are logged at most this often, in one line that counts them."""
_TOLD_IDS = 10
"""Job ids such a line names at most."""
_ALWAYS = 0
"""The generation of a failure added after its job's report (a running job's follow-up, once
the job no longer holds it): every flush from then on raises it."""
_log = logging.getLogger("pipeline.producer")


class _Reader:
    """A thread that flushes: ``not_kept_seen``, how many of the failures let go it has heard
    of (counted by its flushes, or told to it before they were let go)."""

    __slots__ = ("not_kept_seen",)

    def __init__(self) -> None:
        self.not_kept_seen = 0


@dataclass(slots=True, eq=False)
class _Kept:
    failure: PipelineFailure
    generation: int
    logged: bool
    """Logged by :meth:`FailureLog.tell` or the exit report (or waited for: never logged)."""
    told: set[_Reader] = field(default_factory=set)
    """The threads a call raised it to."""


@dataclass(frozen=True, slots=True)
class Taken:
    """The failures a call raises, oldest first, and how many more were not kept."""

    failures: list[PipelineFailure]
    not_kept: int = 0

    def __bool__(self) -> bool:
        return bool(self.failures) or self.not_kept > 0


class FailureLog:
    """The failure log of one application (thread-safe): delivery reports are served by any
    thread, the producer's polling thread among them; a forked child starts with none (see
    :meth:`_forget_the_parents`).

    The failures no call raised yet are also logged at ERROR as they come, at most once per
    :data:`TELL_EVERY_S` (:meth:`tell`, from the producer's polling thread): a process that
    never flushes, or is killed before its exit flush, has said which jobs it lost.
    """

    __slots__ = (
        "__weakref__",
        "_fresh",
        "_gens",
        "_keep",
        "_kept",
        "_local",
        "_lock",
        "_not_kept",
        "_told_at",
        "_transport",
        "_unlogged_not_kept",
        "answered",
        "sent",
    )

    def __init__(self, transport: Transport | None = None, *, keep: int = MAX_KEPT) -> None:
        self._transport = transport
        self._keep = keep
        self._start()
        _logs.add(self)

    def _start(self) -> None:
        self._lock = threading.Lock()
        self._gens: list[Generation] = [self._generation(_ALWAYS + 1)]
        """The generations not all answered yet, oldest first; the last takes new jobs."""
        self._kept: deque[_Kept] = deque()
        self._local = threading.local()
        self._not_kept = 0
        """Failures let go so far (over :attr:`_keep`)."""
        self._unlogged_not_kept = 0
        """Of those, how many nobody was told of (for :meth:`tell` and the exit report)."""
        self._fresh = False
        self._told_at = -TELL_EVERY_S
        self.sent = 0
        self.answered = 0

    def _forget_the_parents(self) -> None:
        """In a forked child: the failures so far are the parent's jobs, which the parent
        reports (at its flush or exit); the child would tell them again as its own. A lock that
        another thread of the parent held stays held in the child: it gets a new one."""
        self._start()

    # -- sending and answers ----------------------------------------------------------------

    def _generation(self, number: int) -> Generation:
        return Generation(number, self.delivered)

    def sending(self, count: int = 1) -> Generation:
        """``count`` jobs are handed to the producer now: counted before, so that no report of
        theirs comes first. Their generation, which their delivery reports answer."""
        with self._lock:
            generation = self._gens[-1]
            generation.sent += count
            self.sent += count
            return generation

    def not_sent(self, generation: Generation, count: int) -> None:
        """``count`` of the jobs counted by :meth:`sending` were not taken by the producer."""
        if count > 0:
            with self._lock:
                generation.sent -= count
                self.sent -= count

    def answer(
        self,
        generation: Generation | None,
        failure: PipelineFailure | None = None,
        *,
        tell: bool = True,
    ) -> None:
        """A job's delivery report came: acknowledged, or ``failure`` (``tell``: to be logged
        unless a call raises it first)."""
        with self._lock:
            self.answered += 1
            if generation is not None:
                generation.answered += 1
            if failure is not None:
                number = generation.number if generation is not None else _ALWAYS
                self._keep_one(_Kept(failure, number, logged=not tell))

    def delivered(self, generation: Generation, error: KafkaError | None, message: Message) -> None:
        """The delivery callback of a job of ``generation`` (served by any thread)."""
        if error is None:
            self.answer(generation)
        else:
            fatal = fatal_of(self._transport) if self._transport is not None else None
            self.answer(generation, PipelineFailure.from_delivery(error, message, fatal))

    def followed(
        self,
        generation: Generation,
        follow: JobsFollowUps,
        error: KafkaError | None,
        message: Message,
    ) -> None:
        """The delivery report of a job a running job enqueued: its fate is that job's."""
        failure = None
        if error is not None:
            fatal = fatal_of(self._transport) if self._transport is not None else None
            failure = PipelineFailure.from_delivery(error, message, fatal)
        self.answer(generation)  # answered; a refusal is the job's, not the log's
        follow.answered(failure, self)

    def add(self, failure: PipelineFailure) -> None:
        """A failure its running job no longer holds (its report was answered already)."""
        with self._lock:
            self._keep_one(_Kept(failure, _ALWAYS, logged=False))

    def _keep_one(self, kept: _Kept) -> None:
        """Under the lock."""
        if len(self._kept) >= self._keep:
            old = self._kept.popleft()
            self._not_kept += 1
            for reader in old.told:  # it heard of this one: not to be counted again
                reader.not_kept_seen += 1
            if not old.told and not old.logged:
                self._unlogged_not_kept += 1
        self._kept.append(kept)
        self._fresh = self._fresh or not kept.logged

    # -- flushing ---------------------------------------------------------------------------

    def mark(self) -> int:
        """A flush begins: the jobs sent from now on are of a new generation. Returns the
        number of the last generation it waits for (:meth:`unanswered`, :meth:`take`)."""
        with self._lock:
            current = self._gens[-1]
            if not current.sent:
                return current.number - 1
            self._gens.append(self._generation(current.number + 1))
            return current.number

    def unanswered(self, through: int | None = None) -> int:
        """How many jobs of the generations up to ``through`` (None: of all) have no delivery
        report yet."""
        with self._lock:
            *older, current = self._gens
            self._gens = [g for g in older if g.answered < g.sent]
            self._gens.append(current)
            return sum(
                max(0, g.sent - g.answered)
                for g in self._gens
                if through is None or g.number <= through
            )

    def _reader(self) -> _Reader:
        reader: _Reader | None = getattr(self._local, "reader", None)
        if reader is None:
            reader = self._local.reader = _Reader()
        return reader

    def take(self, through: int) -> Taken:
        """The failures of the jobs of the generations up to ``through`` that no call told this
        thread yet, and how many this thread never heard of were let go; they count as told to
        it now (and need no log line)."""
        reader = self._reader()
        with self._lock:
            kept = [k for k in self._kept if k.generation <= through and reader not in k.told]
            for k in kept:
                k.told.add(reader)
            not_kept = self._not_kept - reader.not_kept_seen
            reader.not_kept_seen = self._not_kept
            if not_kept:  # it hears of every one let go untold: told now
                self._unlogged_not_kept = 0
        return Taken([k.failure for k in kept], not_kept)

    def raised(self, failure: PipelineFailure) -> None:
        """``failure`` was raised to the caller that waits for its job (a handle's ``wait()``,
        ``enqueue(..., wait=True)``): the one call that knows which job it is has been told, so
        no flush raises it and no line logs it."""
        with self._lock:
            for kept in list(self._kept):
                if kept.failure is failure:
                    self._kept.remove(kept)

    def unreported(self) -> Taken:
        """The failures no call raised nor a line logged yet (the exit report's); they count
        as logged now."""
        with self._lock:
            kept = [k for k in self._kept if not k.told and not k.logged]
            for k in kept:
                k.logged = True
            not_kept, self._unlogged_not_kept = self._unlogged_not_kept, 0
            self._fresh = False
        return Taken([k.failure for k in kept], not_kept)

    def tell(self, settings: Settings, now: float | None = None) -> None:
        """Log at ERROR the failures no call raised nor a line logged yet, unless a line was
        logged less than :data:`TELL_EVERY_S` ago (they wait for the next). They stay for
        ``flush()``."""
        now = time.monotonic() if now is None else now
        with self._lock:
            if not self._fresh or now - self._told_at < TELL_EVERY_S:
                return
            self._told_at = now
        untold = self.unreported()
        if not untold:
            return
        ids = [f.job_id for f in untold.failures]
        count = len(ids) + untold.not_kept
        timeout = settings.producer.delivery_timeout_s
        reasons = sorted({_reason(f, timeout) for f in untold.failures})
        _log.error(
            "%d enqueued job(s) never reached Kafka at %s and will not run (%s); job ids: %s%s. "
            "Nothing retries them: enqueue them again if they must run (flush() and "
            "enqueue(..., wait=True) raise such failures; see docs/operations.md, "
            "'When Kafka is down')",
            count,
            settings.bootstrap_servers,
            "; ".join(reasons[:3]),
            ", ".join(ids[:_TOLD_IDS]) or "not kept",
            f" and {count - _TOLD_IDS} more" if count > _TOLD_IDS else "",
            extra={"failed_jobs": count, "job_ids": ids[:_TOLD_IDS]},
        )


def _reason(failure: PipelineFailure, timeout: float) -> str:
    if failure.fatal is None and failure.code in UNREACHABLE_CODES:
        return f"not acknowledged within the delivery timeout of {timeout:g}s: {failure.reason}"
    return failure.why


_logs: weakref.WeakSet[FailureLog] = weakref.WeakSet()


def _after_fork() -> None:
    for log in list(_logs):
        log._forget_the_parents()


os.register_at_fork(after_in_child=_after_fork)
