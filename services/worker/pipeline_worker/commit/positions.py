"""The consumer's position as a commit point: for a partition whose handed jobs are all
finished, or one at its end that handed nothing, committing the position steps over what is
never delivered (transaction markers, aborted records, records retention deleted)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from confluent_kafka import Consumer, TopicPartition

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .._work import PartitionState


def idle(state: PartitionState) -> bool:
    """Whether everything ``state`` handed over is finished, or it is at its end and handed
    nothing: its commit may be the consumer's position. Not before it is read back: the
    position is past the messages held until then."""
    if not state.read_back:
        return False
    if state.handed_next >= 0:
        return state.commit_offset == state.handed_next
    return state.at_end and state.handed == state.taken


def positions(consumer: Consumer, states: Sequence[PartitionState]) -> dict[PartitionState, int]:
    """The consumer's position of each of ``states``, never past the partition's end.

    librdkafka from 2.2 until a fix of late 2025 moved the position two past the last message
    when a batch (``consume()``) carried the end-of-partition event with it (burst mode asks
    for those events): committed, it skipped the next message written, or sent the next
    owner back to the partition's start (out of range). The end is the high watermark the
    fetches brought (librdkafka's cache: no request); unknown (nothing fetched yet), the
    position stands as it is.
    """
    if not states:
        return {}
    found = consumer.position([TopicPartition(s.topic, s.partition) for s in states])
    result = {}
    for state, tp in zip(states, found, strict=True):
        _, high = consumer.get_watermark_offsets(
            TopicPartition(state.topic, state.partition), cached=True
        )
        result[state] = min(tp.offset, high) if high >= 0 else tp.offset
    return result
