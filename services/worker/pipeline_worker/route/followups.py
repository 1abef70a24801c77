"""Jobs whose handler returned while Kafka had not yet answered for the jobs it enqueued.

Such a job ends once Kafka has (see :mod:`pipeline._followups`). Its offset stays unfinished
meanwhile, so a worker that dies before the follow-ups are acknowledged runs it again instead
of losing them; its slot, key and caps are free for the next jobs at once (the processor frees
them), so a handler that enqueues does not hold back the jobs behind it for a broker round
trip. A producer tells the fate of its jobs only when polled, and the application's own
background thread polls twice a second: while jobs wait, the event loop polls the producers of
their follow-ups every :data:`POLL_EVERY_S` (the application's, or any other a handler enqueued
with), and ends the jobs whose last follow-up was answered, in one batch. Answers served by
another thread (the producer's own, an enqueue that polls) come back to the loop in batches,
as the thread pool's completions do.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import deque
from collections.abc import Callable
from functools import partial

from pipeline import Settings
from pipeline._followups import Poll
from pipeline._ratelog import RateLimitedLog

from .._work import Work

_log = RateLimitedLog(logging.getLogger("pipeline.worker"), interval_s=60.0)

POLL_EVERY_S = 0.005
"""How often the loop polls the producers while jobs wait: an answer waits this long at most,
and a poll serves every answer that came meanwhile (far below the commit interval, which an
offset waits for anyway)."""

Complete = Callable[[Work, BaseException | None, float], None]
"""``complete(work, error, ended)``: the processor's end of a job, called again once answered."""


class FollowUpWatch:
    """The succeeded jobs that wait for Kafka's answers for their follow-ups."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        settings: Settings,
        complete: Complete,
        pump: Callable[[], None],
    ) -> None:
        self._loop = loop
        self._settings = settings
        self._polls: tuple[Poll, ...] = ()
        """The producers' polls the follow-ups of waiting jobs need (loop thread writes)."""
        self._complete = complete
        self._pump = pump
        self.waiting = 0
        """Jobs whose end waits for their follow-ups (loop thread)."""
        self._answered: deque[tuple[Work, float]] = deque()
        self._scheduled = False
        self._timer: asyncio.TimerHandle | None = None
        self._loop_thread = 0
        """The event loop's thread (known from the first job held on)."""

    def holds(self, work: Work, ended: float) -> bool:
        """Whether ``work``, whose handler returned at ``ended``, waits for its follow-ups:
        then :meth:`_drain` completes it again once Kafka answered for every one."""
        follow = work.follow_ups
        assert follow is not None
        if follow.wait(partial(self._on_answered, work, ended)):
            return False
        if work.timer is not None:
            # The handler kept its time limit; its follow-ups wait for Kafka's answer, which
            # the producer's delivery timeout bounds.
            work.timer.cancel()
            work.timer = None
        self.waiting += 1
        self._loop_thread = threading.get_ident()
        for poll in follow.polls:
            if poll not in self._polls:
                self._polls = (*self._polls, poll)
        if self._timer is None:
            self._timer = self._loop.call_later(POLL_EVERY_S, self._poll)
        return True

    def release(self, work: Work, error: BaseException | None) -> BaseException | None:
        """``work`` ends with ``error`` (None: it succeeded, and Kafka answered for its
        follow-ups): what Kafka refuses from now on is logged as for any enqueue. Returns its
        error: a success ends as a failure when Kafka refused a follow-up (the first names it)."""
        follow = work.follow_ups
        assert follow is not None
        refused = follow.end(succeeded=error is None)
        return refused.error(self._settings) if refused is not None else error

    def _on_answered(self, work: Work, ended: float) -> None:
        """Kafka answered for ``work``'s last follow-up (on any thread that served a producer:
        on the loop's, :meth:`_poll` ends it next)."""
        self._answered.append((work, ended))
        if threading.get_ident() == self._loop_thread:
            return
        # One wake-up per batch: answers that come before the loop drains ride along.
        if not self._scheduled:
            self._scheduled = True
            # A closed loop: the worker exited without this job's end (its offset stays).
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._drain)

    def _poll(self) -> None:
        """Serve the producers' answers, end the jobs answered, and poll again later while
        jobs still wait."""
        self._timer = None
        for poll in self._polls:
            try:
                poll(0)
            except Exception:
                _log.error("poll", "serving a producer's delivery reports failed", exc_info=True)
        self._drain()
        if self.waiting and self._timer is None:
            self._timer = self._loop.call_later(POLL_EVERY_S, self._poll)

    def _drain(self) -> None:
        self._scheduled = False
        answered = self._answered
        if not answered:
            return
        while answered:
            work, ended = answered.popleft()
            self.waiting -= 1
            self._complete(work, None, ended)
        self._pump()

    def close(self) -> None:
        """Stop polling (jobs still waiting are not ended: their offsets stay unfinished)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
