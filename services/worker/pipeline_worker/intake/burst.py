"""``--burst``: when may a worker exit? When the whole backlog of its topics is done.

First locally: every owned partition consumed to its end and every job finished. The end of a
partition is librdkafka's end-of-partition event (``enable.partition.eof``, on in burst mode),
which costs nothing; querying watermarks instead would wait behind the long-polling fetch.
Then the owned partitions are committed synchronously, none left out (one whose moves are in
no transaction, Kafka not answering, is not committed: the run goes on, or gives up after
``unhealthy_after_s`` of an outage), and the group's committed offsets of
*every* partition of the topics must have reached their ends: a member must not leave while a
rebalance moves partitions with jobs left between members (``--processes N``, or several burst
workers), nor while another member still drains its own.

None of it starts before the member has joined the group: an assignment callback says so, or,
for a member given no partition, the group's description (:class:`EmptyJoin`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from confluent_kafka import Consumer, ConsumerGroupState, KafkaException, TopicPartition

from pipeline import Settings
from pipeline._adminsession import AdminSession
from pipeline._errors import PipelineError
from pipeline._ratelog import RateLimitedLog

from .._work import PartitionState
from ..commit.committer import Committer

_log = logging.getLogger("pipeline.worker.consumer")

CHECK_S = 0.05
GROUP_CHECK_S = 0.5
JOIN_CHECK_S = 1.0
"""How often a member the group assigned nothing yet describes the group (the first time once it
has waited this long: a member with partitions has its assignment callback by then)."""
DESCRIBE_TIMEOUT_S = 5.0
SAY_AFTER_S = 30.0
"""How long an idle burst run waits before its log says what for."""


class BurstWatch:
    """Decides, on the consumer thread, when a burst run is over."""

    def __init__(
        self,
        consumer: Consumer,
        committer: Committer,
        states: Mapping[tuple[str, int], PartitionState],
        partition_counts: Callable[[], Mapping[str, int] | None],
    ) -> None:
        self._consumer = consumer
        self._committer = committer
        self._states = states
        self._counts = partition_counts
        self._next_check = 0.0
        self._next_group_check = 0.0
        self._errors = RateLimitedLog(_log, interval_s=10.0)
        self._waits = RateLimitedLog(_log, interval_s=30.0)
        self._waiting_since: float | None = None

    def drained(self, now: float) -> bool:
        """Whether everything is done (and committed); checks at most every ``CHECK_S``."""
        if now < self._next_check:
            return False
        self._next_check = now + CHECK_S
        states = list(self._states.values())
        undone = next((state for state in states if not _done(state)), None)
        if undone is not None:
            self._waiting(now, f"{undone.topic}[{undone.partition}]: {_progress(undone)}")
            return False
        if not self._committer.commit(states, now, sync=True):  # refused, or left one out
            self._waiting(now, "the commit of the owned partitions")
            return False
        if now < self._next_group_check:
            return False
        self._next_group_check = now + GROUP_CHECK_S
        left = self._undrained_partition()
        if left is not None:
            self._waiting(now, f"the group to drain {left}")
            return False
        _log.info("every partition is drained", extra={"owned": len(states)})
        return True

    def _waiting(self, now: float, what: str) -> None:
        """Say what the run waits for, once it has waited ``SAY_AFTER_S`` (then now and then):
        a run that does not end tells why in its log."""
        _log.debug("burst: waiting for %s", what)
        if self._waiting_since is None:
            self._waiting_since = now
        elif now - self._waiting_since >= SAY_AFTER_S:
            self._waits.log(
                logging.INFO, "wait", "burst: waiting for %s for %.0fs", what,
                now - self._waiting_since,
            )  # fmt: skip

    def recheck_now(self) -> None:
        self._next_check = self._next_group_check = 0.0

    def _undrained_partition(self) -> str | None:
        """A partition of the topics whose committed offset is short of its end, if any."""
        counts = self._counts()
        if counts is None:
            return "(partition counts unknown)"
        # Owned partitions are drained and committed already (checked just before); ask the
        # broker only about the others, which usually means not at all with one worker.
        others = [
            TopicPartition(topic, partition)
            for topic, count in counts.items()
            for partition in range(count)
            if (topic, partition) not in self._states
        ]
        if not others:
            return None
        try:
            for tp in self._consumer.committed(others, timeout=10.0):
                low, high = self._consumer.get_watermark_offsets(tp, timeout=10.0)
                if tp.offset < high and not (tp.offset < 0 and low >= high):
                    return f"{tp.topic}[{tp.partition}] at {tp.offset} of {high}"
        except KafkaException as exc:
            self._errors.warning("burst", "could not read the group's offsets: %s", exc)
            return "(unknown)"
        return None


class EmptyJoin:
    """Whether the group has taken this member in with no partition.

    The classic protocol tells every member its assignment, an empty one too (``on_assign``
    with no partition). Under the consumer protocol (KIP-848) librdkafka calls ``on_assign``
    only when the assignment changes, and an empty one given at the join changes nothing: a
    member of a group with fewer partitions than members would wait for a callback that never
    comes, as long as the others keep their partitions. So a member without a callback asks
    the group's coordinator: it has joined when the group is stable and lists it, assigned
    nothing.
    """

    def __init__(self, settings: Settings, group: str, consumer: Consumer) -> None:
        self._settings = settings
        self._group = group
        self._consumer = consumer
        self._session: AdminSession | None = None
        """Made at the first describe: a member with partitions never needs it."""
        self._next: float | None = None
        self._errors = RateLimitedLog(_log, interval_s=10.0)

    def joined(self, now: float) -> bool:
        """Asked on the consumer thread (it reads the member id); at most every ``JOIN_CHECK_S``."""
        if self._next is None:
            self._next = now + JOIN_CHECK_S
        if now < self._next:
            return False
        self._next = now + JOIN_CHECK_S
        member = self._consumer.memberid()
        if not member:
            return False
        try:
            session = self._session or AdminSession(self._settings, DESCRIBE_TIMEOUT_S)
            self._session = session
            session.restart_deadline()
            futures = session.client.describe_consumer_groups(
                [self._group], request_timeout=session.remaining()
            )
            described = session.result(futures[self._group], "describe the group", None)
        except PipelineError as exc:
            self._errors.warning("join", "could not describe the group %s: %s", self._group, exc)
            self._session = None  # asked with a new client next time (see BacklogReader.read)
            return False
        joined = described.state == ConsumerGroupState.STABLE and any(
            m.member_id == member and not (m.assignment and m.assignment.topic_partitions)
            for m in described.members
        )
        if joined:
            self._session = None  # not needed again
        return joined


def _progress(state: PartitionState) -> str:
    """Where ``state`` stands, for the log of a run that waits for it."""
    return (
        f"at end {state.at_end}, paused {state.paused}, handed {state.handed}, taken "
        f"{state.taken}, next {state.handed_next}, commit point {state.commit_offset}"
    )


def _done(state: PartitionState) -> bool:
    """Consumed to its end, nothing buffered, every job finished (none stuck)."""
    if not state.at_end or state.paused or state.handed != state.taken:
        return False
    return state.handed_next < 0 or state.commit_offset == state.handed_next
