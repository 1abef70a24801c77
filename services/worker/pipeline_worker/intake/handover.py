"""What a poll returned, handed to the event loop by partition, counted, screened; its errors."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import KafkaError, Message

from pipeline._acls import Role
from pipeline._clientlog import is_fatal
from pipeline._errors import NotAuthorizedError
from pipeline._ratelog import RateLimitedLog
from pipeline._topiccheck import REFUSED_READS, is_missing_topic

from .._work import PartitionState
from ..recovery.poison import PoisonWatch
from .assignment import Assignment
from .cluster import ClusterView
from .flow import FlowControl
from .loopside import Batch

_log = logging.getLogger("pipeline.worker.consumer")


class Handover:
    """What the consumer thread does with what a poll returned; see the module docstring.

    ``deliver`` hands a batch to the loop; ``on_fatal`` is told of a fatal consumer error. A
    refusal of the group's or a topic's READ raises :class:`NotAuthorizedError` (the worker
    stops, exit 4): librdkafka reports it and goes on trying, and the worker sat with no
    partition (or read nothing) for good, ``/healthz`` saying ok. ``group`` and ``user`` name
    what it lacks."""

    def __init__(
        self,
        *,
        states: dict[tuple[str, int], PartitionState],
        assignment: Assignment,
        flow: FlowControl,
        poison: PoisonWatch,
        cluster: ClusterView,
        deliver: Callable[[Batch], None],
        on_fatal: Callable[[KafkaError], None],
        group: str = "",
        user: str | None = None,
    ) -> None:
        self._group = group
        self._user = user
        self._states = states
        self._assignment = assignment
        self._flow = flow
        self._poison = poison
        self._cluster = cluster
        self._deliver = deliver
        self._on_fatal = on_fatal
        self._errors = RateLimitedLog(_log, interval_s=10.0)

    def hand(self, messages: list[Message], *, held: bool = False) -> None:
        """Group a batch by partition, count it into the buffers, pause full ones, hand it over
        (but for what poison-pill detection withholds for now: it is counted all the same).

        ``held``: messages consumed earlier and held until their partition was read back; an
        end-of-partition event that came after them still stands."""
        states = self._states
        batch: Batch = []
        state: PartitionState | None = None
        group: list[Message] = []
        for msg in messages:
            if msg.error() is not None:
                self._message_error(msg)
                state = None  # a message after an end-of-partition event starts a new group
                continue
            partition = msg.partition()
            topic = msg.topic()
            if state is None or partition != state.partition or topic != state.topic:
                state = states.get((topic, partition))  # type: ignore[arg-type]
                if state is None:
                    continue  # not ours any more (cannot happen after incremental_unassign)
                if not held:
                    state.at_end = False
                group = []
                batch.append((state, group))
            group.append(msg)
        assignment = self._assignment
        if assignment.pending:  # not read back yet: held until it is
            batch = [(s, g) for s, g in batch if not assignment.hold(s, g)]
        if not batch:
            return
        for state, group in batch:
            state.handed += len(group)
            last = group[-1].offset() + 1  # type: ignore[operator]
            state.handed_next = max(state.handed_next, last)
        self._flow.pause_full(state for state, _ in batch)
        batch = self._poison.screen(batch)
        if batch:
            self._deliver(batch)

    def _message_error(self, msg: Message) -> None:
        error = msg.error()
        if error is not None and error.code() == KafkaError._PARTITION_EOF:
            # Burst mode asks for these: the partition is consumed up to its end (for now).
            state = self._states.get((msg.topic(), msg.partition()))  # type: ignore[arg-type]
            if state is not None:
                state.at_end = True
            return
        if is_missing_topic(error):
            self._cluster.topic_missing(time.monotonic())  # checked after this poll
            return
        resource = REFUSED_READS.get(error.code()) if error is not None else None
        if resource is not None:
            name = self._group if resource == "GROUP" else msg.topic() or "the consumed topics"
            raise NotAuthorizedError(resource, name, "READ", self._user, Role.WORKER.value)
        if error is not None and error.code() == KafkaError.INVALID_SESSION_TIMEOUT:
            # The broker refuses the group's session timeout, at every join: a worker would
            # try again for good (a burst run never ending). It stops, saying which setting.
            error = KafkaError(
                error.code(),
                f"{error.str()}: worker.session_timeout_ms is outside what the broker allows "
                "(group.min.session.timeout.ms to group.max.session.timeout.ms; classic "
                "protocol)",
                fatal=True,
            )
        if error is not None and is_fatal(error):
            # How librdkafka reports a fatal consumer error to a polling consumer (e.g. its
            # static member id taken by another one): it reads nothing more.
            self._on_fatal(error)
            return
        topic = msg.topic()
        where = f" on {topic}[{msg.partition()}]" if topic else ""  # a group's error: none
        self._errors.warning(
            "message", "consumer error%s: %s", where, error.str() if error is not None else "?"
        )
