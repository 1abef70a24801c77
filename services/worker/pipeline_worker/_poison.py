"""Poison pills: a job that kills its worker process every time it runs (segfault, OOM kill,
``os._exit``) is found after ``poison_deliveries`` deaths and dead-lettered, so that its
partition moves on. Everything needed to find it travels in Kafka, in the metadata of the
committed offsets (:class:`._marks.CommitMark`), so it survives the crashes it counts.

**Promise before handing.** Every commit of a partition says ``dirty`` (an owner is running it)
and ``high``: no offset at or above ``high`` was handed to the event loop. The consumer thread
keeps that promise: it hands the loop only offsets below the ``high`` of a commit Kafka has
acknowledged (a *lease*), and asks for more (an asynchronous commit with a higher ``high``)
when half of the lease is used, so a running worker rarely waits for it. Whatever killed an
owner was among the offsets from its committed offset ``W`` up to that ``high``.

**Takeover.** A new owner reads ``(W, mark)`` and commits its own mark at once, before fetching.
If the previous mark is dirty, its owner died (or was cut off) without a clean hand-over: the
partition goes into *quarantine* until ``E = min(mark.high, end offset now)`` (offsets at or past
the end did not exist when it died).

**Quarantine.** Messages are held on the consumer thread and handed in *windows*: one message,
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

**Limitation.** Other partitions of the process keep running during a quarantine. If one of
their jobs kills the process while a quarantined job runs alone, the quarantined job gets the
strike. It takes ``poison_deliveries`` such coincidences in a row on the same job to dead-letter
an innocent one, hence the default of 3.

**Cost.** In normal operation, one extra asynchronous commit per ``lease / 2`` messages of a
partition. After a crash, one synchronous commit per window of the quarantined range, and the
windows run one after the other.

:class:`Gate` and :class:`Quarantine` are pure; :class:`PoisonWatch` is the consumer thread's glue.
"""

from __future__ import annotations

import enum
import logging
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from confluent_kafka import TopicPartition

from ._marks import CommitMark

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from confluent_kafka import Consumer, Message

    from ._commits import Committer
    from ._metrics import WorkerMetrics
    from ._work import PartitionState

    Batch = list[tuple[PartitionState, list[Message]]]

_log = logging.getLogger("pipeline.worker.poison")

Where = tuple[str, int]
UNLIMITED = 2**63 - 1
"""The lease of a partition when detection is off: hand everything at once."""
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


# -- decisions (pure) --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Takeover:
    """What a new owner of a partition does first."""

    start: int
    """Where the partition resumes: the committed offset, else the partition's first offset."""
    until: int
    """The quarantine ends at this offset (exclusive); ``<= start``: no quarantine."""
    strikes: int
    """Times the message at ``start`` already ran alone and killed its worker."""
    alone: int = -1
    """Offsets below this run one at a time: a group of them was running when an owner died."""

    @property
    def quarantined(self) -> bool:
        return self.until > self.start


def needs_watermarks(previous: CommitMark | None, deliveries: int) -> bool:
    """Whether :func:`plan_takeover` needs the partition's watermarks (a request to Kafka)."""
    return previous is None or (deliveries > 0 and previous.dirty)


def plan_takeover(
    previous: CommitMark | None, watermarks: tuple[int, int] | None, deliveries: int
) -> Takeover:
    """The takeover of a partition whose last committed mark is ``previous`` (None: nothing was
    ever committed), given its ``(low, high)`` watermarks now (see :func:`needs_watermarks`)."""
    if previous is None:
        low = watermarks[0] if watermarks is not None else 0
        return Takeover(low, low, 0)
    start = previous.offset
    if deliveries <= 0 or not previous.dirty or watermarks is None:
        return Takeover(start, start, 0)
    # A mark without a promise (written with detection off) suspects the first job only.
    bound = previous.high if previous.high >= 0 else start + 1
    until = min(bound, watermarks[1])
    if until <= start:
        return Takeover(start, start, 0)  # nothing was there to be run: nothing to suspect
    return Takeover(start, until, previous.strikes, max(previous.window, start))


class Step(enum.Enum):
    """What a quarantine does next."""

    WAIT = "wait"
    """The window handed is not finished, or no message is there yet."""
    RUN = "run"
    """Commit the next window (with the strike of its message if it is alone), then hand it."""
    DEAD = "dead"
    """Dead-letter the next message: it killed its worker too often."""
    END = "end"
    """Every suspect offset is done: back to normal."""


@dataclass(slots=True)
class Quarantine:
    """A partition whose jobs run in small windows, up to ``until``, after a dirty takeover."""

    until: int
    offset: int
    """The previous owner's committed offset, whose message has ``strikes`` already."""
    strikes: int
    limit: int
    """``poison_deliveries``."""
    alone: int
    """Offsets below this run one at a time (see :attr:`Takeover.alone`)."""
    cap: int = 1
    """The largest window."""
    size: int = 1
    """The next window's size past :attr:`alone`: doubles each time a window finishes."""
    window_end: int = -1
    """One past the last offset of the window handed (or dead-lettered) and not finished."""
    growing: bool = False

    def strikes_for(self, offset: int) -> int:
        """The strikes to commit before handing ``offset`` alone (this run included)."""
        return self.strikes + 1 if offset == self.offset else 1

    def is_poison(self, offset: int) -> bool:
        return offset == self.offset and self.strikes >= self.limit

    def window_size(self, head: int) -> int:
        """How many messages, from ``head`` on, the next window takes (at most)."""
        return 1 if head < self.alone else self.size

    def handed(self, first: int, last: int) -> None:
        """A window of offsets ``first``..``last`` went to the loop (or to the DLQ)."""
        self.window_end = last + 1
        self.growing = first >= self.alone

    @property
    def suspects(self) -> int:
        """Offsets below this would run one at a time if we died now: the window handed, and
        what is left of a window that killed a previous owner."""
        return max(self.alone, self.window_end)

    def step(self, head: int | None, commit_offset: int, position: int = -1) -> Step:
        """The next step, given the first held offset (None: none), the partition's commit
        point (one past the window handed once all of it is finished) and the consumer's
        position (one past the last message consumed; offsets below ``until`` that never come,
        such as transaction markers, end the quarantine too)."""
        if self.window_end >= 0:
            if commit_offset < self.window_end:
                return Step.WAIT
            self.window_end = -1
            if self.growing:
                self.size = min(2 * self.size, self.cap)
        if head is None:
            done = max(commit_offset, position) >= self.until
            return Step.END if done else Step.WAIT
        if head >= self.until:
            return Step.END
        return Step.DEAD if self.is_poison(head) else Step.RUN


class Gate:
    """One partition, on the consumer thread: which messages may go to the loop now, and what
    its commits say (``floor``, ``high``, ``strikes``).

    Messages not handed yet are *held* here, in order; they count as handed for flow control
    (the usual buffer bound pauses the partition) and keep the committer from committing the
    consumer's position past them.
    """

    __slots__ = (
        "counting",
        "floor",
        "held",
        "lease",
        "promised",
        "quarantine",
        "released",
        "secured",
        "sent",
        "strike_offset",
        "strikes",
    )

    def __init__(self, plan: Takeover, *, lease: int, limit: int, window: int = 1) -> None:
        self.held: deque[Message] = deque()
        self.lease = lease
        """Offsets promised ahead of the last handed one; 0: detection off."""
        self.floor = plan.start
        """An offset every commit may use: everything below it is done."""
        self.released = plan.start
        """One past the last offset handed to the loop."""
        self.quarantine = (
            Quarantine(plan.until, plan.start, plan.strikes, limit, plan.alone, window)
            if plan.quarantined
            else None
        )
        if self.quarantine is not None:
            self.promised = plan.until
        else:
            self.promised = plan.start + lease if lease else -1
        """The ``high`` of every commit from now on; never decreases."""
        self.secured = -1 if lease else UNLIMITED
        """The ``high`` of the last commit Kafka acknowledged: offsets below it may be handed."""
        self.sent = -1
        """The highest ``high`` put in a commit so far (acknowledged or not)."""
        self.strike_offset = plan.start if plan.strikes else -1
        self.strikes = plan.strikes
        self.counting = False
        """Whether ``strikes`` counts a run of ``strike_offset`` that has not ended yet."""

    # -- what commits say --------------------------------------------------------------------

    def stamp(self, offset: int, moved: tuple[int, ...], *, clean: bool) -> CommitMark:
        """The mark to commit at ``offset`` (see :attr:`floor`)."""
        strikes = 0
        if offset == self.strike_offset:
            strikes = self.strikes
            if clean and self.counting:
                strikes -= 1  # handed over while it ran: that run did not kill anyone
        self.sent = max(self.sent, self.promised)
        quarantine = self.quarantine
        # A quarantine handed over in good order goes on with the next owner.
        dirty = not clean or quarantine is not None
        window = quarantine.suspects if quarantine is not None and not clean else -1
        return CommitMark(offset, moved, dirty, self.promised, strikes, window)

    @property
    def unsecured(self) -> bool:
        """A promise was made that Kafka has not acknowledged yet."""
        return self.promised > self.secured

    def acknowledged(self, high: int) -> None:
        """Kafka acknowledged a commit of this partition whose mark had ``high``."""
        self.secured = max(self.secured, high)

    # -- normal operation --------------------------------------------------------------------

    def take(self, group: list[Message]) -> list[Message]:
        """Messages just consumed (in offset order): those that may go to the loop now."""
        if self.held or self.quarantine is not None:
            self.held.extend(group)
            return []
        secured = self.secured
        if group[-1].offset() < secured:  # type: ignore[operator]
            self.released = group[-1].offset() + 1  # type: ignore[operator]
            return group
        ready = 0
        while group[ready].offset() < secured:  # type: ignore[operator]
            ready += 1
        self.held.extend(group[ready:])
        if not ready:
            return []
        self.released = group[ready - 1].offset() + 1  # type: ignore[operator]
        return group[:ready]

    def release(self) -> list[Message]:
        """Held messages that the acknowledged lease now covers (none during a quarantine)."""
        held = self.held
        if self.quarantine is not None or not held:
            return []
        ready = []
        secured = self.secured
        while held and held[0].offset() < secured:  # type: ignore[operator]
            ready.append(held.popleft())
        if ready:
            self.released = ready[-1].offset() + 1  # type: ignore[operator]
        return ready

    @property
    def short(self) -> bool:
        """Whether the lease should grow: half of it is used, or messages wait beyond it."""
        if not self.lease or self.quarantine is not None:
            return False
        need = self.held[-1].offset() + 1 if self.held else self.released  # type: ignore[operator]
        return max(need, self.released) + self.lease // 2 > self.promised

    def extend(self) -> bool:
        """Grow the lease if it is short; whether a commit must carry the new promise."""
        if self.short:
            need = self.held[-1].offset() + 1 if self.held else self.released  # type: ignore[operator]
            self.promised = max(self.promised, max(need, self.released) + self.lease)
        return self.promised > self.sent

    # -- quarantine --------------------------------------------------------------------------

    def window(self, offset: int, strikes: int) -> None:
        """A quarantine window starts at ``offset``: commit from there, with ``strikes`` for
        ``offset`` (this run counted) if it runs alone (0: it does not)."""
        self.floor = offset  # everything below it is done: windows are handed one at a time
        self.strike_offset = offset if strikes else -1
        self.strikes = strikes
        self.counting = bool(strikes)

    def end_quarantine(self) -> None:
        """Back to normal: strikes are over, and the lease must cover what is held."""
        self.quarantine = None
        self.strike_offset = -1
        self.strikes = 0
        self.counting = False
        self.extend()


# -- the consumer thread's glue ----------------------------------------------------------------


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
        self.gates: dict[Where, Gate] = {}
        self._active: set[Where] = set()
        """Partitions with held messages, a quarantine or a lease running short."""

    # -- takeover ----------------------------------------------------------------------------

    def plan(self, state: PartitionState, committed: TopicPartition) -> None:
        """Make the gate of a newly assigned partition from its committed offset and mark.

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
        self.gates[(state.topic, state.partition)] = Gate(
            plan, lease=self._lease, limit=self.deliveries, window=self._window
        )

    @property
    def busy(self) -> bool:
        """Messages are held back, a quarantine runs or a lease is short: poll briefly."""
        return bool(self._active)

    def planned(self, state: PartitionState) -> bool:
        return (state.topic, state.partition) in self.gates

    def secure(self, states: Sequence[PartitionState]) -> bool:
        """Commit the new owner's mark of ``states`` synchronously (before they fetch), so that
        an owner that dies before its first regular commit still leaves a dirty mark."""
        if not self._committer.push(states, sync=True):
            return False
        for state in states:
            where = (state.topic, state.partition)
            gate = self.gates[where]
            quarantine = gate.quarantine
            if quarantine is not None:
                self._active.add(where)
                self._metrics.quarantines += 1
                self._metrics.quarantined += 1
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
        """``states`` are not ours any more: drop their gates and held messages."""
        for state in states:
            where = (state.topic, state.partition)
            gate = self.gates.pop(where, None)
            self._active.discard(where)
            if gate is not None and gate.quarantine is not None:
                self._metrics.quarantined -= 1

    # -- intake ------------------------------------------------------------------------------

    def gate(self, batch: Batch) -> Batch:
        """What of a consumed batch goes to the loop now; the rest is held here."""
        gates = self.gates
        ready: Batch = []
        for state, group in batch:
            where = (state.topic, state.partition)
            gate = gates.get(where)
            if gate is None:
                ready.append((state, group))
                continue
            allowed = gate.take(group)
            if gate.held or gate.short:
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
        for where in list(self._active):
            gate = self.gates.get(where)
            state = self._states.get(where)
            if gate is None or state is None:
                self._active.discard(where)
                continue
            if gate.quarantine is not None and not self._quarantine(state, gate):
                continue
            if gate.extend():
                renew.append(state)
            released = gate.release()
            if released:
                ready.append((state, released))
            if not gate.held and not gate.short:
                self._active.discard(where)
        if renew:
            self._committer.push(renew, sync=False)
        if ready:
            self._deliver(ready)

    def _position(self, state: PartitionState) -> int:
        [tp] = self._consumer.position([TopicPartition(state.topic, state.partition)])
        return int(tp.offset)

    def _quarantine(self, state: PartitionState, gate: Gate) -> bool:
        """One step of a quarantine; True once it is over."""
        quarantine = gate.quarantine
        assert quarantine is not None
        held = gate.held
        head: int | None = held[0].offset() if held else None
        step = quarantine.step(head, state.commit_offset)
        if step is Step.WAIT and head is None and quarantine.window_end < 0:
            step = quarantine.step(head, state.commit_offset, self._position(state))
        if step is Step.WAIT:
            return False
        if step is Step.END:
            gate.end_quarantine()
            self._metrics.quarantined -= 1
            # Strikes back to 0 and a lease for what is held, before anything more runs.
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
            size = quarantine.window_size(head)
            until = quarantine.until
            count, last = 0, head
            for message in held:
                if count == size or message.offset() >= until:  # type: ignore[operator]
                    break
                count += 1
                last = message.offset()  # type: ignore[assignment]
            gate.window(head, quarantine.strikes_for(head) if count == 1 else 0)
            quarantine.handed(head, last)
            if not self._committer.push([state], sync=True):
                quarantine.window_end = -1
                return False  # the window must be in Kafka before its jobs run: next poll
            gate.released = last + 1
            self._deliver([(state, [held.popleft() for _ in range(count)])])
            return False
        message = held.popleft()
        quarantine.handed(head, head)
        gate.released = head + 1
        self._metrics.poison_pills += 1
        error = PoisonPillError(quarantine.strikes)
        if self._dead_letter is None:
            _log.error("no way to dead-letter a poison pill here; running it again")
            self._deliver([(state, [message])])
            return False
        self._dead_letter(state, message, error)
        return False
