"""An application's failure log: how many jobs it handed to the producer and had answered,
by generation, and the jobs Kafka did not acknowledge, with the thread that sent each.

A generation is what was sent between two ``flush()`` calls: a flush opens a new one and waits
for the jobs of the older ones only, so that jobs other threads keep enqueueing do not hold it
back (:meth:`FailureLog.mark`, :meth:`FailureLog.unanswered`). A flush on a thread raises the
failures of the jobs sent before it that this thread sent and was not told yet, and those no
call was told of yet, whichever thread sent them (:meth:`FailureLog.take`): a thread hears of
its own jobs' failures at its next flush, the failure of a thread that never flushes (an event
loop's) reaches the first flush anywhere, and a thread does not hear of another thread's
failure that a call was told of already. A failure raised to the call that waited for its job
is dropped (:meth:`FailureLog.raised`). At most :data:`MAX_KEPT` failures are kept, the newest;
the ones let go that no call was told of are counted, and the next flush anywhere (or the next
line, or the exit report) counts them.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass
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
the job no longer holds it): every flush from then on covers it."""
_log = logging.getLogger("pipeline.producer")


@dataclass(slots=True, eq=False)
class _Kept:
    failure: PipelineFailure
    generation: int
    sender: int | None
    """The ``threading.get_ident()`` of the thread that sent the job (None: no thread's, a
    running job's follow-up). The system may give the ident of a thread that ended to a new
    one: that thread's next flush then raises the failure, once, as the sender's would have."""
    logged: bool
    """Logged by :meth:`FailureLog.tell` or the exit report (or waited for: never logged)."""
    told: bool = False
    """A flush raised it (a line that logged it told no call)."""
    sender_told: bool = False
    """A flush on its sender's thread raised it."""

    @property
    def done(self) -> bool:
        """No flush is to raise it any more."""
        return self.told and (self.sender_told or self.sender is None)


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
        "_current",
        "_fresh",
        "_keep",
        "_kept",
        "_lock",
        "_older",
        "_told_at",
        "_transport",
        "_unlogged_let_go",
        "_untold_let_go",
    )

    def __init__(self, transport: Transport | None = None, *, keep: int = MAX_KEPT) -> None:
        self._transport = transport
        self._keep = keep
        self._start()
        _logs.add(self)

    def _start(self) -> None:
        self._lock = threading.Lock()
        self._current = self._generation(_ALWAYS + 1)
        """The generation that takes new jobs."""
        self._older: list[Generation] = []
        """The generations before it not all answered yet, oldest first."""
        self._kept: deque[_Kept] = deque()
        self._untold_let_go = 0
        """Failures let go (over :attr:`_keep`) that no flush raised, not counted by one yet."""
        self._unlogged_let_go = 0
        """Of those, how many no line counted yet (:meth:`unreported`)."""
        self._fresh = False
        self._told_at = -TELL_EVERY_S

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
        theirs comes first. Their generation, which their delivery reports answer (through its
        :meth:`~Generation.on_delivery`, in the name of the calling thread)."""
        # No lock: this runs for every job. Reading the current generation and counting in
        # it is one step that no other thread comes between: it runs C code only
        # (slot reads and writes, int additions), with no call, backward jump or allocation of
        # an object the garbage collector tracks, and CPython with the GIL lets another thread
        # run only at a call, a function's start or a backward jump (its "eval breaker"
        # checks), or in the code a collection runs. So no count is lost to another sender,
        # and none lands in a generation :meth:`mark` closed: it closes one by making a new one
        # current, and whatever was counted in the old one before that is counted when
        # :meth:`unanswered` reads it (the flush waits for it too, a job being sent as the
        # flush began). Answers count under the lock, in other fields; :meth:`not_sent` takes
        # back what a send counted in one step the same way. A build without the GIL would
        # need the lock here.
        generation = self._current
        generation.sent += count
        return generation

    def not_sent(self, generation: Generation, count: int) -> None:
        """``count`` of the jobs counted by :meth:`sending` were not taken by the producer
        (no lock, as :meth:`sending` counts)."""
        generation.sent -= count

    def answer(
        self,
        generation: Generation | None,
        failure: PipelineFailure | None = None,
        *,
        tell: bool = True,
        sender: int | None = None,
    ) -> None:
        """A job's delivery report came: acknowledged, or ``failure`` (``tell``: to be logged
        unless a call raises it first; ``sender``: the ``threading.get_ident()`` of the thread
        that sent the job)."""
        with self._lock:
            if generation is not None:
                generation.answered += 1
            if failure is not None:
                number = generation.number if generation is not None else _ALWAYS
                self._keep_one(_Kept(failure, number, sender, logged=not tell))

    def delivered(
        self, generation: Generation, sender: int, error: KafkaError | None, message: Message
    ) -> None:
        """The delivery callback of a job of ``generation`` that thread ``sender`` sent (served
        by any thread)."""
        if error is None:
            self.answer(generation)
        else:
            self.answer(generation, self._failure(error, message), sender=sender)

    def followed(
        self,
        generation: Generation,
        follow: JobsFollowUps,
        error: KafkaError | None,
        message: Message,
    ) -> None:
        """The delivery report of a job a running job enqueued: its fate is that job's."""
        failure = self._failure(error, message) if error is not None else None
        self.answer(generation)  # answered; a refusal is the job's, not the log's
        follow.answered(failure, self)

    def _failure(self, error: KafkaError, message: Message) -> PipelineFailure:
        fatal = fatal_of(self._transport) if self._transport is not None else None
        return PipelineFailure.from_delivery(error, message, fatal)

    def add(self, failure: PipelineFailure) -> None:
        """A failure its running job no longer holds (its report was answered already): no
        thread's, the first flush anywhere raises it."""
        with self._lock:
            self._keep_one(_Kept(failure, _ALWAYS, None, logged=False))

    def _keep_one(self, kept: _Kept) -> None:
        """Under the lock."""
        if len(self._kept) >= self._keep:
            old = self._kept.popleft()
            if not old.told:
                self._untold_let_go += 1
                self._unlogged_let_go += not old.logged
        self._kept.append(kept)
        self._fresh = self._fresh or not kept.logged

    # -- flushing ---------------------------------------------------------------------------

    def mark(self) -> int:
        """A flush begins: the jobs sent from now on are of a new generation. Returns the
        number of the last generation it waits for (:meth:`unanswered`, :meth:`take`)."""
        with self._lock:
            current = self._current
            if not current.sent:
                return current.number - 1
            self._older.append(current)
            self._current = self._generation(current.number + 1)
            return current.number

    def unanswered(self, through: int | None = None) -> int:
        """How many jobs of the generations up to ``through`` (None: of all) have no delivery
        report yet."""
        with self._lock:
            self._older = [g for g in self._older if g.answered < g.sent]
            return sum(
                max(0, g.sent - g.answered)
                for g in (*self._older, self._current)
                if through is None or g.number <= through
            )

    def take(self, through: int) -> Taken:
        """What a flush on this thread raises: the failures of the jobs of the generations up
        to ``through`` that this thread sent and was not told of yet, or that no flush raised
        yet; and how many that no flush raised were let go since the last flush counted them.
        They count as told now (and need no log line)."""
        me = threading.get_ident()
        with self._lock:
            taken: list[PipelineFailure] = []
            for kept in self._kept:
                if kept.generation > through:
                    continue
                mine = kept.sender == me
                if not kept.told or (mine and not kept.sender_told):
                    taken.append(kept.failure)
                    kept.told = True
                    kept.sender_told = kept.sender_told or mine
            if taken:
                self._kept = deque(k for k in self._kept if not k.done)
            not_kept, self._untold_let_go = self._untold_let_go, 0
            if not_kept:  # told to a call: no line is to count them
                self._unlogged_let_go = 0
        return Taken(taken, not_kept)

    def raised(self, failure: PipelineFailure) -> None:
        """``failure`` was raised to the caller that waits for its job (a handle's ``wait()``,
        ``enqueue(..., wait=True)``): the one call that knows which job it is has been told, so
        no flush raises it and no line logs it."""
        with self._lock:
            for kept in list(self._kept):
                if kept.failure is failure:
                    self._kept.remove(kept)

    def untold(self, failure: PipelineFailure) -> None:
        """``failure`` came while a call waited for its job, so it was kept as not to be
        logged, but that call gave up (timed out) without raising it: it is logged as any
        failure no call raised."""
        with self._lock:
            for kept in self._kept:
                if kept.failure is failure and kept.logged and not kept.told:
                    kept.logged = False
                    self._fresh = True

    def unreported(self) -> Taken:
        """The failures no call raised nor a line logged yet (the exit report's), and how many
        such were let go; they count as logged now. A flush still raises them (a line tells
        no call)."""
        with self._lock:
            kept = [k for k in self._kept if not k.told and not k.logged]
            for k in kept:
                k.logged = True
            not_kept, self._unlogged_let_go = self._unlogged_let_go, 0
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
