"""Poison-pill detection, the pure decisions: how a new owner takes a partition over, and how a
quarantine steps through its suspects (see :mod:`.poison` for the whole design).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..commit.marks import CommitMark


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
        """The next step, given the first withheld offset (None: none), the partition's commit
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
