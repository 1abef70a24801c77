"""Poison-pill detection, one partition on the consumer thread: which messages may go to the
event loop now, and what its commits say (see :mod:`.poison` for the whole design). Pure.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from ..commit.marks import CommitMark
from .quarantine import Quarantine

if TYPE_CHECKING:
    from confluent_kafka import Message

    from ..commit.offsetmap import Runs
    from .quarantine import Takeover

UNLIMITED = 2**63 - 1
"""The lease of a partition when detection is off: hand everything at once."""


class Guard:
    """One partition, on the consumer thread: which messages may go to the loop now, and what
    its commits say (``floor``, ``high``, ``strikes``).

    Messages not handed yet are *withheld* here, in order; they count as handed for flow control
    (the usual buffer bound pauses the partition) and keep the committer from committing the
    consumer's position past them.
    """

    __slots__ = (
        "counting",
        "floor",
        "lease",
        "promised",
        "quarantine",
        "released",
        "secured",
        "sent",
        "strike_offset",
        "strikes",
        "withheld",
    )

    def __init__(self, plan: Takeover, *, lease: int, limit: int, window: int = 1) -> None:
        self.withheld: deque[Message] = deque()
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

    def stamp(
        self, offset: int, moved: tuple[int, ...], *, clean: bool, finished: Runs = ()
    ) -> CommitMark:
        """The mark to commit at ``offset`` (see :attr:`floor`), with the offsets ``moved`` and
        ``finished`` above it."""
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
        return CommitMark(offset, moved, dirty, self.promised, strikes, window, finished)

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
        if self.withheld or self.quarantine is not None:
            self.withheld.extend(group)
            return []
        secured = self.secured
        if group[-1].offset() < secured:  # type: ignore[operator]
            self.released = group[-1].offset() + 1  # type: ignore[operator]
            return group
        ready = 0
        while group[ready].offset() < secured:  # type: ignore[operator]
            ready += 1
        self.withheld.extend(group[ready:])
        if not ready:
            return []
        self.released = group[ready - 1].offset() + 1  # type: ignore[operator]
        return group[:ready]

    def release(self) -> list[Message]:
        """Held messages that the acknowledged lease now covers (none during a quarantine)."""
        withheld = self.withheld
        if self.quarantine is not None or not withheld:
            return []
        ready = []
        secured = self.secured
        while withheld and withheld[0].offset() < secured:  # type: ignore[operator]
            ready.append(withheld.popleft())
        if ready:
            self.released = ready[-1].offset() + 1  # type: ignore[operator]
        return ready

    @property
    def short(self) -> bool:
        """Whether the lease should grow: half of it is used, or messages wait beyond it."""
        if not self.lease or self.quarantine is not None:
            return False
        need = self.withheld[-1].offset() + 1 if self.withheld else self.released  # type: ignore[operator]
        return max(need, self.released) + self.lease // 2 > self.promised

    def extend(self) -> bool:
        """Grow the lease if it is short; whether a commit must carry the new promise."""
        if self.short:
            need = self.withheld[-1].offset() + 1 if self.withheld else self.released  # type: ignore[operator]
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
        """Back to normal: strikes are over, and the lease must cover what is withheld."""
        self.quarantine = None
        self.strike_offset = -1
        self.strikes = 0
        self.counting = False
        self.extend()
