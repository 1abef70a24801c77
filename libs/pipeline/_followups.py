"""The jobs a running job enqueues (its *follow-ups*): its success waits until Kafka answered
for each of them.

A handler that enqueues a job hands it to the producer and returns; Kafka acknowledges it
moments later. Were the handler's job counted as done at its return, its offset could be
committed first, and a worker killed in between (or a follow-up Kafka refused) would lose the
follow-up for good while its parent never runs again. So the worker marks each job, in its
context (:data:`RUNNING`; a plain function's on its pool thread, :data:`ON_THIS_THREAD`), an
enqueue made there (by the handler, an interceptor, a task or a thread an ``async def``
handler started with its context) is counted on the job's
:class:`FollowUps`, and the worker ends the job only once every one of them was answered: a
success when Kafka acknowledged them all, else a failure with the first refusal (retried as
any failure is).

An enqueue made outside any job's context, or after its job ended, is not counted: its fate is
reported as for any other enqueue (``flush()``, the failure log).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextvars import ContextVar
from functools import partial
from typing import TYPE_CHECKING, Protocol

from ._errors import KafkaUnavailableError
from ._transport import taken_of

if TYPE_CHECKING:
    from confluent_kafka import KafkaError, Message

    from ._delivery import FailureSink, PipelineFailure
    from ._errors import PipelineError
    from ._settings import Settings
    from ._transport import DeliveryCallback

__all__ = [
    "RUNNING",
    "FollowUps",
    "Followed",
    "RunningJob",
    "follow_ups",
    "patience",
    "produce_followed",
]


class RunningJob(Protocol):
    """A job the worker runs, as an enqueue in its context sees it."""

    finished: bool
    follow_ups: FollowUps | None


RUNNING: ContextVar[RunningJob | None] = ContextVar("pipeline_running_job", default=None)
"""The job whose context this is (set by the worker in each job's context; None elsewhere)."""

Followed = Callable[["FollowUps", "KafkaError | None", "Message"], None]
"""``followed(follow_ups, error, message)``: the delivery callback of a follow-up."""
Poll = Callable[[float], int]
"""``poll(timeout)``: serves the delivery reports of a producer (``Pipeline.poll``)."""

ANSWER_MARGIN_S = 10.0
"""How much longer than the producer's delivery timeout a job's end waits for Kafka's answers."""
ANSWER_POLL_S = 0.005
"""How often a blocking wait for the answers serves the producers."""

_creating = threading.Lock()


class _ThreadJob(threading.local):
    job: RunningJob | None = None


ON_THIS_THREAD = _ThreadJob()
"""The job a worker's pool thread runs now (``ON_THIS_THREAD.job``): a plain function's job is
marked so, not in its context (:data:`RUNNING`), which costs allocations per job."""


def follow_ups() -> FollowUps | None:
    """The follow-ups of the job whose context this is (or that this pool thread runs); None
    outside a running job."""
    job = RUNNING.get()
    if job is None:
        job = ON_THIS_THREAD.job
        if job is None:
            return None
    follow = job.follow_ups
    if follow is None:
        with _creating:  # a handler may enqueue from several threads at once
            follow = job.follow_ups
            if follow is None and not job.finished:
                follow = job.follow_ups = FollowUps()
    return follow


def patience(settings: Settings) -> float:
    """How long a job's end waits for Kafka's answers for its follow-ups: a producer tells every
    job's fate within its delivery timeout, unless it was closed meanwhile (then never)."""
    return settings.producer.delivery_timeout_s + ANSWER_MARGIN_S


def produce_followed(
    follow: FollowUps,
    count: int,
    produce: Callable[[DeliveryCallback], None],
    *,
    plain: DeliveryCallback,
    followed: Followed,
    poll: Poll,
    patience_s: float,
) -> None:
    """``produce(callback)`` ``count`` jobs of ``follow``'s job: each delivery report goes to
    ``followed(follow, error, message)``, which tells the job their fate, or to ``plain`` once
    the job's end no longer waits for them. ``poll`` serves the reports, which the producer
    gives within ``patience_s`` (:func:`patience` of its application's settings). When
    ``produce`` raises, the jobs it took before (:func:`~._transport.taken_of`) stay counted."""
    if not follow.sending(count, poll, patience_s):
        produce(plain)
        return
    try:
        produce(partial(followed, follow))
    except BaseException as exc:
        follow.not_sent(count - taken_of(exc, count))
        raise


class FollowUps:
    """The follow-ups of one job: how many Kafka has not answered for yet, and its refusals.

    Thread-safe: enqueues count on any thread, delivery reports come on whichever thread serves
    the producer. Once the job's end no longer waits for them (it :meth:`succeeded` or
    :meth:`failed`), what Kafka refuses goes to the application's failure log, as for any
    enqueue.
    """

    __slots__ = (
        "_failures", "_lock", "_on_answered", "_pending", "_polls", "_released", "patience_s",
    )  # fmt: skip

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending = 0
        self._failures: list[tuple[PipelineFailure, FailureSink]] = []
        self._on_answered: Callable[[], None] | None = None
        self._released = False
        self._polls: tuple[Poll, ...] = ()
        self.patience_s = 0.0
        """How long Kafka may take to answer for them all: the longest :func:`patience` of the
        applications that produced them."""

    def sending(self, count: int, poll: Poll, patience_s: float) -> bool:
        """``count`` jobs are about to be produced, their reports served by ``poll`` within
        ``patience_s``: False once the job's end no longer waits for them (they are sent as
        any enqueue is)."""
        with self._lock:
            if self._released:
                return False
            self._pending += count
            if poll not in self._polls:
                self._polls = (*self._polls, poll)
            self.patience_s = max(self.patience_s, patience_s)
            return True

    @property
    def polls(self) -> tuple[Poll, ...]:
        """What serves the delivery reports of the follow-ups (a producer's poll each)."""
        return self._polls

    def not_sent(self, count: int = 1) -> None:
        """The producer did not take ``count`` of the jobs :meth:`sending` counted."""
        self.answered(None, None, count)

    def answered(
        self, failure: PipelineFailure | None, log: FailureSink | None, count: int = 1
    ) -> None:
        """Kafka answered for a follow-up: acknowledged (``failure`` None) or refused it."""
        with self._lock:
            self._pending -= count
            if failure is not None and log is not None:
                if self._released:
                    log.add(failure)
                else:
                    self._failures.append((failure, log))
            notify = self._on_answered if self._pending <= 0 else None
            if notify is not None:
                self._on_answered = None
        if notify is not None:
            notify()

    @property
    def answered_all(self) -> bool:
        """Whether Kafka answered for every follow-up counted so far."""
        return self._pending <= 0

    def wait(self, on_answered: Callable[[], None]) -> bool:
        """True if Kafka answered for every follow-up; else False, and ``on_answered()`` is
        called once it has (on the thread that served the last answer)."""
        with self._lock:
            if self._pending <= 0:
                return True
            self._on_answered = on_answered
            return False

    def discard(self, failure: PipelineFailure) -> None:
        """``failure`` was raised to the handler (a handle's ``wait()``): the handler's to
        handle, not the job's."""
        with self._lock:
            self._failures = [f for f in self._failures if f[0] is not failure]

    def succeeded(self, settings: Settings) -> PipelineError | None:
        """The job's handler succeeded and Kafka answered for its follow-ups: the error of the
        first one Kafka refused (or did not acknowledge in time), which fails the job (the
        others are not logged: the job runs again); None if it acknowledged them all. What
        Kafka refuses from now on goes to the failure log."""
        failures = self._end()
        return failures[0][0].error(settings) if failures else None

    def failed(self) -> None:
        """The job failed: its follow-ups are sent as any enqueue is (what Kafka refused of
        them so far, and refuses from now on, goes to the failure log)."""
        for failure, log in self._end():
            log.add(failure)

    def _end(self) -> list[tuple[PipelineFailure, FailureSink]]:
        with self._lock:
            self._released = True
            self._on_answered = None
            failures, self._failures = self._failures, []
        return failures

    def unanswered(self, job_id: str, settings: Settings) -> KafkaUnavailableError:
        """The error of job ``job_id`` when Kafka did not answer within :attr:`patience_s` (the
        job fails)."""
        self.failed()
        return KafkaUnavailableError(
            f"Kafka did not answer for the jobs job {job_id} enqueued within "
            f"{self.patience_s:g}s (at {settings.bootstrap_servers}); is it running?"
        )

    def answered_by_now(self) -> bool:
        """Serve the follow-ups' producers until Kafka answered for each of them (True), for
        :attr:`patience_s` at most (a caller that may block: the test kit's)."""
        answered = threading.Event()
        if self.wait(answered.set):
            return True
        deadline = time.monotonic() + self.patience_s
        while not answered.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            for poll in self._polls:
                poll(0)
            answered.wait(min(remaining, ANSWER_POLL_S))
        return True
