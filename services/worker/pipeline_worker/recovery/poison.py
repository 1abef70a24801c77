"""Poison pills: a job that kills its worker process every time it runs (segfault, OOM kill,
``os._exit``) is found after ``poison_deliveries`` deaths and dead-lettered, so that its
partition moves on. Everything needed to find it travels in Kafka, in the metadata of the
committed offsets (:class:`..commit.marks.CommitMark`), so it survives the crashes it counts.

**Promise before handing.** Every commit of a partition says ``dirty`` (an owner is running it)
and ``high``: no offset at or above ``high`` was handed to the event loop. The consumer thread
keeps that promise: it hands the loop only offsets below the ``high`` of a commit Kafka has
acknowledged (a *lease*), and promises more (a higher ``high``) when half of the lease is used.
The next scheduled commit carries the new promise (every ``commit_interval_s``: at the default
50 ms and a lease of two ``consume_batch``, a partition would have to run 20,000 jobs/s to use
half a lease between two); a commit of its own is pushed only when messages wait beyond the
lease, so a running worker rarely waits for it. Whatever killed an owner was among
the offsets from its committed offset ``W`` up to that ``high``.

**Takeover.** A new owner reads ``(W, mark)`` and commits its own mark at once, before fetching.
If the previous mark is dirty, its owner died (or was cut off) without a clean hand-over: the
partition goes into *quarantine* until ``E = min(mark.high, end offset now)`` (offsets at or past
the end did not exist when it died).

**Quarantine.** Messages are withheld on the consumer thread and handed in *windows*: one message,
then 2, 4, 8... (up to a cap) while windows finish, since most crashes are not poison pills and
thousands of suspects run one at a time would take minutes. Before handing a window starting at
``X`` the mark ``(X, dirty, high=E, window=end of the window, strikes=k)`` is committed
synchronously, and the next window is handed once this one is finished. A window of one message
is a run *alone*: ``k`` is the previous mark's strikes plus one if ``X`` is the previous mark's
offset, else 1 (0 for bigger windows). If the owner dies, the next one runs the offsets of the
mark's window one at a time, then grows windows again. A message whose previous mark already has
``strikes >= poison_deliveries`` is not run again: it is dead-lettered (``poison_pill``). At ``E``
the quarantine ends and the partition runs normally again. A clean hand-over during a quarantine
(revocation, shutdown) stays ``dirty`` so that the next owner carries on with it.

A poison pill therefore runs ``1 + poison_deliveries`` times, plus once if it was not the first
suspect: once unsuspected, once in a window of several, then once alone per strike.

**One window at a time per process.** A death strikes every suspect that was running, so
suspects of different partitions must not run together: an innocent job running alone on its
partition next to a poison pill on another would be struck each time the poison pill kills the
process, and dead-lettered with it. So of all the quarantined partitions of a process, only
one has a window out at a time; the others wait their turn (in turn, one window each), their
marks unchanged, so a death strikes nothing of theirs.

**Limitation.** Partitions that are not in quarantine keep running during one. If one of their
jobs kills the process while a quarantined job runs alone, the quarantined job gets the strike,
and that partition is quarantined in its turn: from then on it waits for its turn too. So each
job that kills its worker can strike an innocent job at most once, in its first, unsuspected
run; ``poison_deliveries`` such jobs in a row must come at the same moments to dead-letter one
innocent job, hence the default of 3.

**Cost.** In normal operation, a longer mark in the scheduled commits, and a pushed commit
only when a partition's messages outrun them (a whole lease within one commit interval, or a
commit left unanswered). After a crash, one synchronous commit per window of the quarantined
range, and the windows run one after the other.

:mod:`.quarantine` (takeover plans, quarantine steps) and :mod:`.guard` (one partition's
intake and marks) are pure; :class:`PoisonWatch` is the consumer thread's glue.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from confluent_kafka import TopicPartition

from ..commit.marks import CommitMark
from .guard import Guard
from .quarantine import Step, needs_watermarks, plan_takeover

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from confluent_kafka import Consumer, Message

    from .._metrics import WorkerMetrics
    from .._work import PartitionState
    from ..commit.committer import Committer

    Batch = list[tuple[PartitionState, list[Message]]]

_log = logging.getLogger("pipeline.worker.poison")

Where = tuple[str, int]
WATERMARKS_TIMEOUT_S = 10.0


class PoisonPillError(Exception):
    """A job killed its worker process every time it ran alone on its partition."""

    def __init__(self, kills: int) -> None:
        super().__init__(f"killed its worker {kills} times while running alone on its partition")
        self.kills = kills


@runtime_checkable
class PoisonSide(Protocol):
    """The event loop side that dead-letters a poison pill (``Worker`` has it)."""

    def on_poison(self, state: PartitionState, message: Message, error: PoisonPillError) -> None:
        """Dead-letter ``message`` without running it; finish its offset once moved."""


class PoisonWatch:
    """Takeovers, leases and quarantines of the owned partitions (consumer thread only)."""

    def __init__(
        self,
        *,
        deliveries: int,
        lease: int,
        window: int,
        consumer: Consumer,
        committer: Committer,
        states: Mapping[Where, PartitionState],
        metrics: WorkerMetrics,
        deliver: Callable[[Batch], None],
        dead_letter: Callable[[PartitionState, Message, PoisonPillError], None] | None,
    ) -> None:
        self.deliveries = deliveries
        self._lease = lease if deliveries > 0 else 0
        self._window = max(1, window)
        self._consumer = consumer
        self._committer = committer
        self._states = states
        self._metrics = metrics
        self._deliver = deliver
        self._dead_letter = dead_letter
        self.guards: dict[Where, Guard] = {}
        self._active: set[Where] = set()
        self._quarantined: set[Where] = set()
        """The partitions counted in the ``quarantined`` gauge: secured in quarantine."""
        """Partitions with withheld messages, a quarantine or a lease running short."""
        self._turn: Where | None = None
        """The quarantined partition whose window is out (one at a time per process)."""
        self._queue: deque[Where] = deque()
        """Quarantined partitions waiting for their turn to hand a window, in order."""
        self._window_uncommitted: PartitionState | None = None
        """The partition whose window finished last, if Kafka was not told yet."""

    # -- takeover ----------------------------------------------------------------------------

    def plan(self, state: PartitionState, committed: TopicPartition) -> None:
        """Make the guard of a newly assigned partition from its committed offset and mark.

        Raises ``KafkaException`` if the watermarks it needs cannot be read.
        """
        previous = (
            CommitMark.decode(committed.offset, committed.metadata)
            if committed.offset >= 0
            else None
        )
        watermarks = None
        if needs_watermarks(previous, self.deliveries):
            watermarks = self._consumer.get_watermark_offsets(
                TopicPartition(state.topic, state.partition), timeout=WATERMARKS_TIMEOUT_S
            )
        plan = plan_takeover(previous, watermarks, self.deliveries)
        self.guards[(state.topic, state.partition)] = Guard(
            plan, lease=self._lease, limit=self.deliveries, window=self._window
        )

    @property
    def busy(self) -> bool:
        """Messages are withwithheld, a quarantine runs or a lease is short: poll briefly."""
        return bool(self._active)

    def planned(self, state: PartitionState) -> bool:
        return (state.topic, state.partition) in self.guards

    def secure(self, states: Sequence[PartitionState]) -> bool:
        """Commit the new owner's mark of ``states`` synchronously (before they fetch), so that
        an owner that dies before its first regular commit still leaves a dirty mark."""
        if not self._committer.push(states, sync=True):
            return False
        for state in states:
            where = (state.topic, state.partition)
            guard = self.guards[where]
            quarantine = guard.quarantine
            if quarantine is not None:
                self._active.add(where)
                self._metrics.quarantines += 1
                self._count_quarantined(where, True)
                _log.info(
                    "quarantine: the previous owner of %s[%d] died; its jobs run in small "
                    "windows up to offset %d",
                    state.topic,
                    state.partition,
                    quarantine.until,
                    extra={
                        "from": quarantine.offset,
                        "alone_until": quarantine.alone,
                        "strikes": quarantine.strikes,
                    },
                )
        return True

    def forget(self, states: Sequence[PartitionState]) -> None:
        """``states`` are not ours any more: drop their guards and withheld messages."""
        for state in states:
            where = (state.topic, state.partition)
            self.guards.pop(where, None)
            self._active.discard(where)
            self._leave(where)
            self._count_quarantined(where, False)  # if secure() counted it (a push may fail)

    def _count_quarantined(self, where: Where, quarantined: bool) -> None:
        """Keep the ``quarantined`` gauge to the partitions secured in quarantine."""
        counted = self._quarantined
        if quarantined and where not in counted:
            counted.add(where)
            self._metrics.quarantined += 1
        elif not quarantined and where in counted:
            counted.discard(where)
            self._metrics.quarantined -= 1

    # -- intake ------------------------------------------------------------------------------

    def screen(self, batch: Batch) -> Batch:
        """What of a consumed batch goes to the loop now; the rest is withheld here."""
        guards = self.guards
        ready: Batch = []
        for state, group in batch:
            where = (state.topic, state.partition)
            guard = guards.get(where)
            if guard is None:
                ready.append((state, group))
                continue
            allowed = guard.take(group)
            if guard.withheld or guard.short:
                self._active.add(where)
            if allowed:
                ready.append((state, allowed))
        return ready

    def step(self, *, stopped: bool = False) -> None:
        """Advance quarantines, grow leases, hand what became allowed. Call once per poll;
        ``stopped``: intake is stopped (shutdown), nothing more is handed."""
        if stopped or not self._active:
            return
        ready: Batch = []
        renew: list[PartitionState] = []
        # The partition whose window is out first: when its window is finished, the turn
        # passes in this same step.
        turn = self._turn
        for where in sorted(self._active, key=lambda w: w != turn):
            guard = self.guards.get(where)
            state = self._states.get(where)
            if guard is None or state is None:
                self._active.discard(where)
                continue
            if guard.quarantine is not None and not self._quarantine(state, guard):
                continue
            if guard.extend() and guard.withheld:
                renew.append(state)  # else the next scheduled commit carries the promise
            released = guard.release()
            if released:
                ready.append((state, released))
            if not guard.withheld and not guard.short:
                self._active.discard(where)
        if renew:
            self._committer.push(renew, sync=False)
        if ready:
            self._deliver(ready)

    def _position(self, state: PartitionState) -> int:
        [tp] = self._consumer.position([TopicPartition(state.topic, state.partition)])
        return int(tp.offset)

    def _quarantine(self, state: PartitionState, guard: Guard) -> bool:
        """One step of a quarantine; True once it is over."""
        quarantine = guard.quarantine
        assert quarantine is not None
        withheld = guard.withheld
        head: int | None = withheld[0].offset() if withheld else None
        step = quarantine.step(head, state.commit_offset)
        if step is Step.WAIT and head is None and quarantine.window_end < 0:
            step = quarantine.step(head, state.commit_offset, self._position(state))
        where = (state.topic, state.partition)
        if self._turn == where and quarantine.window_end < 0:
            self._turn = None  # its window is finished
            self._window_uncommitted = state
        if step is Step.WAIT:
            return False
        if step is Step.END:
            self._leave(where)  # its end is committed just below
            guard.end_quarantine()
            self._count_quarantined(where, False)
            # Strikes back to 0 and a lease for what is withheld, before anything more runs.
            self._committer.push([state], sync=True)
            _log.info(
                "quarantine over: %s[%d] runs normally again",
                state.topic,
                state.partition,
                extra={"until": quarantine.until},
            )
            return True
        assert head is not None
        if step is Step.RUN:
            if self._take_turn(state):
                self._hand_window(state, guard, head)
            # else another partition's suspects are running: they would share a death
            return False
        message = guard.withheld.popleft()
        quarantine.handed(head, head)
        guard.released = head + 1
        self._metrics.poison_pills += 1
        error = PoisonPillError(quarantine.strikes)
        if self._dead_letter is None:
            _log.error("no way to dead-letter a poison pill here; running it again")
            self._deliver([(state, [message])])
            return False
        self._dead_letter(state, message, error)
        return False

    def _hand_window(self, state: PartitionState, guard: Guard, head: int) -> None:
        """Commit the next window of a quarantine (its strike, if it runs alone), then hand it."""
        quarantine = guard.quarantine
        assert quarantine is not None
        withheld = guard.withheld
        size = quarantine.window_size(head)
        until = quarantine.until
        count, last = 0, head
        for message in withheld:
            if count == size or message.offset() >= until:  # type: ignore[operator]
                break
            count += 1
            last = message.offset()  # type: ignore[assignment]
        guard.window(head, quarantine.strikes_for(head) if count == 1 else 0)
        quarantine.handed(head, last)
        if not self._committer.push([state], sync=True):
            quarantine.window_end = -1
            self._turn = None
            return  # the window must be in Kafka before its jobs run: next poll
        guard.released = last + 1
        self._deliver([(state, [withheld.popleft() for _ in range(count)])])

    def _take_turn(self, state: PartitionState) -> bool:
        """Whether the quarantine of ``state`` may hand a window now (it then has the turn).

        Only one quarantined partition has a window out at a time; waiting partitions take
        turns in the order they asked, so that each quarantine moves on. Before the turn
        passes to another partition, the end of the last window is committed: a death in the
        next window must not find that window's strike standing. (A partition that takes the
        turn again commits where its next window starts anyway.)
        """
        where = (state.topic, state.partition)
        if self._turn is not None:
            if where not in self._queue:
                self._queue.append(where)
            return False
        queue = self._queue
        if queue and queue[0] != where:
            if where not in queue:
                queue.append(where)
            return False
        uncommitted = self._window_uncommitted
        if (
            uncommitted is not None
            and uncommitted is not state
            and not self._committer.push([uncommitted], sync=True)
        ):
            return False  # nothing else runs until that is in Kafka: next poll
        self._window_uncommitted = None
        if queue:
            queue.popleft()
        if queue:
            queue.append(where)  # it asks again after the others had theirs
        self._turn = where
        return True

    def _leave(self, where: Where) -> None:
        """``where`` is out of quarantine (or not ours): it neither has nor waits for a turn."""
        if self._turn == where:
            self._turn = None
        uncommitted = self._window_uncommitted
        if uncommitted is not None and (uncommitted.topic, uncommitted.partition) == where:
            self._window_uncommitted = None
        if where in self._queue:
            self._queue.remove(where)
