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
import contextvars
import heapq
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
        *,
        free: Callable[[Work], None],
        outlives: Callable[[Work], object] | None = None,
    ) -> None:
        """``free(work)`` frees a job's slot, key and caps (the processor's ``free_slot``);
        ``outlives(work)``, with interceptors, tells the time limits that the job ends while a
        thread may still run its handler (its key and caps wait for that thread)."""
        self._loop = loop
        self._free = free
        self._outlives = outlives
        self.freed_early = 0
        """Held jobs, from their hold until they end (as the processor's ``in_flight`` counts a
        running job)."""
        self._settings = settings
        self._polls: tuple[Poll, ...] = ()
        """The producers' polls the follow-ups of waiting jobs need (loop thread writes)."""
        self._complete = complete
        self._pump = pump
        self._held: dict[Work, tuple[float, float, int]] = {}
        """Jobs whose end waits for their follow-ups (loop thread): when their handler
        returned, when to stop waiting (the producers that took its follow-ups may have
        different delivery timeouts), and the order it was held in."""
        self._deadlines: list[tuple[float, int, Work]] = []
        """The held jobs by deadline (a heap; jobs answered meanwhile stay until popped, or
        until they are most of it and it is made again)."""
        self._holds = 0
        self._answered: deque[Work] = deque()
        self._scheduled = False
        self._timer: asyncio.TimerHandle | None = None
        self._loop_thread = 0
        self._context = contextvars.Context()
        """What the jobs end in when a thread that served their answers wakes the loop: that
        thread may be another job's handler, whose context would otherwise come along (what the
        ending's hooks enqueue would be counted as that job's follow-ups)."""
        """The event loop's thread (known from the first job held on)."""

    def hold(self, work: Work, ended: float) -> bool:
        """Whether ``work``, whose handler returned at ``ended``, waits for its follow-ups:
        then its slot is free, and it is completed again once Kafka answered for every one."""
        follow = work.follow_ups
        assert follow is not None
        if work.finished or follow.answered_all or follow.wait(partial(self._on_answered, work)):
            return False
        if self._outlives is not None:
            self._outlives(work)
        self._free(work)
        work.slot_freed = True
        self.freed_early += 1
        if work.timer is not None:
            # The handler kept its time limit; its follow-ups wait for Kafka's answer, which
            # the producer's delivery timeout bounds.
            work.timer.cancel()
            work.timer = None
        self._holds += 1
        deadline = self._loop.time() + follow.patience_s
        self._held[work] = (ended, deadline, self._holds)
        deadlines = self._deadlines
        if len(deadlines) > 2 * len(self._held) + 64:  # mostly answered jobs: made again
            deadlines[:] = [(d, n, w) for w, (_, d, n) in self._held.items()]
            heapq.heapify(deadlines)
        else:
            heapq.heappush(deadlines, (deadline, self._holds, work))
        if not self._loop_thread:
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
        if error is not None or work.finished:
            follow.failed()
            return error
        return follow.succeeded(self._settings)

    def freed_ended(self) -> None:
        """A job held here ended (its slot was freed at its hold)."""
        self.freed_early -= 1

    @property
    def waiting(self) -> int:
        """Jobs whose end waits for their follow-ups."""
        return len(self._held)

    def _on_answered(self, work: Work) -> None:
        """Kafka answered for ``work``'s last follow-up (on any thread that served a producer:
        on the loop's, :meth:`_poll` ends it next)."""
        self._answered.append(work)
        if threading.get_ident() == self._loop_thread:
            return
        # One wake-up per batch: answers that come before the loop drains ride along.
        if not self._scheduled:
            self._scheduled = True
            # A closed loop: the worker exited without this job's end (its offset stays).
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._drain, context=self._context)

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
        self._give_up()
        if not self._held:
            self._polls = ()  # the applications of jobs gone are not held alive nor polled
        elif self._timer is None:
            self._timer = self._loop.call_later(POLL_EVERY_S, self._poll)

    def _drain(self) -> None:
        self._scheduled = False
        answered = self._answered
        if not answered:
            return
        held = self._held
        while answered:
            work = answered.popleft()
            times = held.pop(work, None)
            if times is not None:  # else given up on already
                self._complete(work, None, times[0])
        self._pump()

    def _give_up(self) -> None:
        """Fail the jobs Kafka has not answered for in the producer's delivery timeout (and a
        margin): a producer closed meanwhile, say, will never tell their follow-ups' fate."""
        held, deadlines = self._held, self._deadlines
        now = self._loop.time()
        overdue = False
        while deadlines and deadlines[0][0] <= now:
            _, hold, work = heapq.heappop(deadlines)
            times = held.get(work)
            if times is None or times[2] != hold:
                continue  # answered meanwhile (and maybe held again, with a later deadline)
            del held[work]
            overdue = True
            assert work.follow_ups is not None
            error = work.follow_ups.unanswered(work.job.id, self._settings)
            self._complete(work, error, times[0])
        if not held:
            deadlines.clear()  # answered, every one: nothing to give up on
        if overdue:
            self._pump()

    def close(self) -> None:
        """Stop polling (jobs still waiting are not ended: their offsets stay unfinished)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
