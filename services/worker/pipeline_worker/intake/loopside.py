"""The seam between the consumer thread and the event loop: what one hands the other."""

from __future__ import annotations

import asyncio
from typing import Protocol

from confluent_kafka import Message

from .._work import PartitionState

Batch = list[tuple[PartitionState, list[Message]]]


class LoopSide(Protocol):
    """What the consumer thread needs from the event loop side of the worker."""

    loop: asyncio.AbstractEventLoop

    @property
    def finished_jobs(self) -> int:
        """Offsets finished so far: a commit follows every ``commit_every`` of them."""
        ...

    def on_checked(self) -> None:
        """The start-up checks passed (the topics it moves jobs to are writable): what must not
        start before them may start."""

    def on_batch(self, batch: Batch) -> None: ...

    def on_assigned(self, states: list[PartitionState]) -> None: ...

    async def revoke(self, states: list[PartitionState], *, lost: bool) -> None: ...

    def on_share(self, owned: dict[str, int], total: dict[str, int]) -> None:
        """Partitions owned and in all, per topic, after an assignment change."""

    def on_burst_drained(self) -> None: ...

    def on_consumer_failed(self, exc: BaseException) -> None: ...
