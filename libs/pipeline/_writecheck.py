"""Whether this client may write every topic of its role: asked of Kafka at start, not learnt
from the first job that writes there.

A worker writes some topics only when a job goes that way: a failed job's retry tier,
``<ns>.deferred`` or ``<ns>.dlq``, the events, the changelog of an idempotency key. Kafka's
authorizer refuses such a write only when it comes, and a refused move stops the worker with
the job unfinished (the next worker runs it, and is refused, again). So the worker and the
scheduler call :func:`check_writes` as they start: it asks Kafka whether this client may write
each topic its role's ACLs grant WRITE on (:func:`pipeline._acls.written_topics`, what
``pipeline acls apply --role`` creates) and raises :class:`NotAuthorizedError` naming the first
it may not; the heartbeats' ``<ns>.workers`` only warns (a refused heartbeat is dropped, and
the worker runs on).

How, without writing: DescribeTopics with the client's authorized operations (KIP-430). A
cluster without an authorizer answers with every operation. What Kafka does not say (a broker
that leaves the operations out, a topic that does not exist, which the services' own checks
report, no answer in time) counts as allowed: the check never stops a process that could run.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from confluent_kafka import KafkaError

from ._acls import Role, written_topics
from ._adminsession import AdminSession, has_code
from ._errors import KafkaUnavailableError, NotAuthorizedError, TopicAdminError
from ._topics import TopicNames

if TYPE_CHECKING:
    from ._settings import Settings

_log = logging.getLogger("pipeline.kafka.admin")

CHECK_TIMEOUT_S = 10.0
"""How long a starting process waits for Kafka's answer before it starts unchecked."""
_WRITE = frozenset({"WRITE", "ALL"})


def check_writes(
    settings: Settings,
    role: Role,
    *,
    timeout: float = CHECK_TIMEOUT_S,
    session: AdminSession | None = None,
    unused: Iterable[str] = (),
) -> None:
    """Raise :class:`NotAuthorizedError` if Kafka says this client may not write a topic that
    ``role`` writes with ``settings`` (but ``unused``, the topics this process does not
    write, say ``<ns>.dedup`` beside an application's own dedup store); log a warning and
    return if Kafka does not answer.
    :class:`~pipeline._errors.KafkaAuthenticationError` (refused credentials) goes through."""
    skipped = _unused(settings) | set(unused)
    topics = [t for t in written_topics(role, settings) if t not in skipped]
    try:
        refused = unwritable(session or AdminSession(settings, timeout), topics)
    except KafkaUnavailableError as exc:
        _log.warning("could not check that this client may write its topics: %s", exc)
        return
    user = settings.security.sasl_username
    beats = TopicNames(settings.namespace).workers
    if beats in refused:  # heartbeats are not the work: `pipeline status` goes without them
        refused.remove(beats)
        _log.warning(
            "this client may not write %s: no heartbeat will be written (`pipeline status` "
            "shows no load for this process); %s",
            beats,
            NotAuthorizedError("TOPIC", beats, "WRITE", user, role.value),
        )
    if refused:
        raise NotAuthorizedError("TOPIC", refused[0], "WRITE", user, role.value)


def unwritable(session: AdminSession, topics: Sequence[str]) -> list[str]:
    """Which of ``topics`` Kafka says this client may not write, in their order: a topic whose
    authorized operations lack WRITE, or that it may not even describe (WRITE implies
    DESCRIBE)."""
    refused = []
    for topic, found in session.describe(topics, operations=True).items():
        if not isinstance(found, TopicAdminError):
            allowed = _allows_write(found.authorized_operations)
        else:
            allowed = not has_code(found.__cause__, KafkaError.TOPIC_AUTHORIZATION_FAILED)
            if allowed and not has_code(found.__cause__, KafkaError.UNKNOWN_TOPIC_OR_PART):
                _log.info("could not check that this client may write %s: %s", topic, found)
        if not allowed:
            refused.append(topic)
    return refused


def _allows_write(operations: Iterable[object] | None) -> bool:
    """Whether a topic's authorized operations include WRITE (None: Kafka did not say)."""
    if operations is None:
        return True
    return any(str(getattr(op, "name", op)) in _WRITE for op in operations)


def _unused(settings: Settings) -> set[str]:
    """Topics of the roles that ``settings`` turn off: the events, the heartbeats."""
    names = TopicNames(settings.namespace)
    unused = set()
    if settings.events == "off":
        unused.add(names.events)
    if not settings.worker.heartbeat_interval_s:
        unused.add(names.workers)
    return unused
