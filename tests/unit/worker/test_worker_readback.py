"""A read-back that fails part-way (the previous owner's mark read, the watermarks its poison
plan needs not) leaves the partition unread: its commits never write over the previous
owner's mark, whose deaths and quarantine the retry (or the next owner) carries on."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from confluent_kafka import TopicPartition

from pipeline_worker.commit.marks import CommitMark
from pipeline_worker.intake.consumer import ConsumerThread

from .test_worker_consumer import TOPIC, FakeConsumer, consumer_thread, loop

__all__ = ["loop"]  # the fixture

PREVIOUS = CommitMark(5, dirty=True, high=9, strikes=2, window=7)
"""The previous owner died twice running offsets 5-8; offset 7 had run alone."""


class _Marks:
    """Keeps each commit's metadata on a fake consumer, and answers ``committed`` with it."""

    def __init__(self, fake: FakeConsumer) -> None:
        self.fake = fake
        self.metadata: dict[tuple[str, int], str | None] = {(TOPIC, 0): PREVIOUS.encode()}
        commit = fake.commit

        def committing(*, offsets: list[TopicPartition], asynchronous: bool) -> Any:
            for tp in offsets:
                self.metadata[(tp.topic, tp.partition)] = tp.metadata
            return commit(offsets=offsets, asynchronous=asynchronous)

        fake.commit = committing  # type: ignore[method-assign]
        fake.committed = self.committed  # type: ignore[method-assign]

    def committed(self, tps: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        return [
            TopicPartition(
                tp.topic,
                tp.partition,
                self.fake.group_committed.get((tp.topic, tp.partition), -1001),
                metadata=self.metadata.get((tp.topic, tp.partition)),
            )
            for tp in tps
        ]

    def mark(self) -> CommitMark:
        offset = self.fake.group_committed[(TOPIC, 0)]
        return CommitMark.decode(offset, self.metadata[(TOPIC, 0)])


def _taken_over(loop: asyncio.AbstractEventLoop) -> tuple[ConsumerThread, FakeConsumer, _Marks]:
    thread, fake, _ = consumer_thread(loop, kafka_consumer={"group.protocol": "classic"})
    marks = _Marks(fake)
    fake.group_committed = {(TOPIC, 0): PREVIOUS.offset}
    fake.ends = {(TOPIC, 0): (0, 20)}
    fake.unanswered = {(TOPIC, 0)}  # its leader does not answer the watermark query, once
    thread.rebalance.on_assign(fake, [TopicPartition(TOPIC, 0)])  # type: ignore[arg-type]
    thread._chores(time.monotonic(), idle=True)  # the read-back fails part-way; a commit due
    return thread, fake, marks


def test_a_scheduled_commit_keeps_the_previous_owner_s_mark_until_the_read_back_ends(
    loop: asyncio.AbstractEventLoop,
) -> None:
    thread, fake, marks = _taken_over(loop)
    mark = marks.mark()
    assert (mark.high, mark.strikes, mark.window) == (9, 2, 7), mark
    fake.unanswered = set()
    thread._chores(time.monotonic() + 1, idle=True)  # read back again, the plan made
    # The new owner's own mark promises what the previous one did: its quarantine runs up to
    # offset 9 (from a plain mark read back, it ran up to 6 and counted no strike).
    secured = marks.mark()
    assert secured.dirty
    assert secured.high == 9, secured


def test_a_revocation_before_the_retry_hands_the_previous_owner_s_mark_on(
    loop: asyncio.AbstractEventLoop,
) -> None:
    thread, fake, marks = _taken_over(loop)
    thread.rebalance.on_revoke(fake, [TopicPartition(TOPIC, 0)])  # type: ignore[arg-type]
    mark = marks.mark()
    assert mark.dirty, "the previous owner's death was forgotten: no quarantine next"
    assert (mark.high, mark.strikes) == (9, 2)
