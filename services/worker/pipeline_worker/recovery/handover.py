"""The retry relay's group is one per namespace: a starting relay takes over from the one before.

The relay's group used to be ``<workers group>.retry``. Two groups of workers in one namespace
(say one per priority) then ran two relays over the same tiers, and every retried job came
back, and ran, once per group. It is ``<ns>.workers.retry`` now whatever the workers' group is
called (:func:`pipeline._topics.retry_group`); for the default workers' group that is the
group it always was, and nothing here runs.

A relay whose workers' group has another name first waits until its former group has no
members: workers of an earlier release still relay there, and relaying beside them would
return their jobs twice. Then, if the new group has committed nothing yet, it commits the
former group's offsets to it, so that what the old relays returned is not returned again.
While two relays of new workers start at once, both copy the same offsets; once one has
joined, Kafka refuses a copy into the group, and none is needed.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, TopicPartition

from pipeline._adminsession import AdminSession, has_code
from pipeline._errors import KafkaUnavailableError, NotAuthorizedError, TopicAdminError
from pipeline._topics import TopicNames, former_retry_group, retry_group

if TYPE_CHECKING:
    from collections.abc import Callable

    from pipeline import Settings

_log = logging.getLogger("pipeline.worker.relay")

TIMEOUT_S = 30.0
"""One look at the groups: how long Kafka may take to answer it."""
RECHECK_S = 1.0
"""How often a relay waiting for its former group to empty looks again."""
_NOT_FOUND = (KafkaError.GROUP_ID_NOT_FOUND,)


def take_over(
    settings: Settings, stopped: Callable[[float], bool], session: AdminSession | None = None
) -> bool:
    """Wait for the former group to empty, then copy its offsets; False: stopped first.

    ``stopped(seconds)`` waits up to that long for a stop and says whether one came. An outage
    is waited out; a refusal (an ACL missing) raises, saying which group and what.
    """
    former = former_retry_group(settings)
    if former is None:
        return True
    group = retry_group(settings)
    session = session or AdminSession(settings, TIMEOUT_S)
    said = False
    while True:
        session.restart_deadline()
        try:
            members = _members(session, former)
            if members == 0:
                _copy(session, former, group, TopicNames(settings.namespace).retry_prefix)
                return True
            if not said:
                _log.warning(
                    "the retry relay waits for the %d members of group %s (the relay's group of "
                    "workers of an earlier release) to leave before it joins %s",
                    members,
                    former,
                    group,
                )
                said = True
        except KafkaUnavailableError as exc:
            _log.debug("the retry relay's handover waits for Kafka: %s", exc)
        if stopped(RECHECK_S):
            return False


def _members(session: AdminSession, group: str) -> int:
    futures = session.client.describe_consumer_groups([group], request_timeout=session.remaining())
    try:
        described = session.result(futures[group], f"describe the consumer group {group}", None)
    except TopicAdminError as exc:
        if has_code(exc.__cause__, *_NOT_FOUND):
            return 0
        if has_code(exc.__cause__, KafkaError.GROUP_AUTHORIZATION_FAILED):
            user = session.settings.security.sasl_username
            raise NotAuthorizedError("GROUP", group, "DESCRIBE", user) from exc
        raise
    return len(described.members)


def _committed(session: AdminSession, group: str, prefix: str) -> list[TopicPartition]:
    futures = session.client.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group)], request_timeout=session.remaining()
    )
    doing = f"list the committed offsets of group {group}"
    listed = session.result(futures[group], doing, None).topic_partitions or []
    return [
        TopicPartition(tp.topic, tp.partition, tp.offset)
        for tp in listed
        if tp.error is None and tp.offset >= 0 and tp.topic.startswith(prefix)
    ]


def _copy(session: AdminSession, former: str, group: str, prefix: str) -> None:
    if _committed(session, group, prefix):
        return  # taken over before, or relayed since
    offsets = _committed(session, former, prefix)
    if not offsets:
        return
    futures = session.client.alter_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group, offsets)], request_timeout=session.remaining()
    )
    try:
        session.result(futures[group], f"commit the offsets of group {group}", None)
    except TopicAdminError:
        if _committed(session, group, prefix):
            return  # another relay joined and committed first
        raise
    _log.info(
        "the retry relay's group is %s now: took over the offsets of %d tier partitions from %s",
        group,
        len(offsets),
        former,
    )
