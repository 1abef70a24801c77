"""The retry relays' group is one per namespace: a starting relay takes over from the ones before.

The relay's group used to be ``<workers group>.retry``. Two groups of workers in one namespace
(say one per priority) then ran two relays over the same tiers, and every retried job came
back, and ran, once per group. It is ``<ns>.workers.retry`` now whatever the workers' group is
called (:func:`pipeline._topics.retry_group`).

The groups of earlier releases are found by what they did: a group other than that one (and
named ``<something>.retry``) with offsets committed on this namespace's tiers, the relay's own
former group included. Before it joins, a relay waits until none of them has members: workers
of an earlier release still relay there, and relaying beside them would return their jobs
twice (meanwhile they return every retried job, of every priority). Then it raises the new
group's committed offsets to the furthest any of them reached, so that what the old relays
returned is not returned again. Kafka takes offsets for a group only while it has no members:
when another relay joined first, that relay did the same, and this one joins too.

Under ACLs a relay sees only the groups its user may describe. Another namespace's group it may
not read is passed over; its own former group (``<workers group>.retry``, which the worker role
may describe) and a group whose members it must count are not: joining without knowing whether
an old relay still reads the tiers there, or how far it went, could return retried jobs twice.
A refusal there is a warning, once, naming the group, the user and the ACL; the relay then
relays nothing and looks again, less and less often (up to every :data:`REFUSED_RECHECK_MAX_S`
seconds), until the ACL is granted. The worker runs its jobs meanwhile; retried jobs wait in
their tiers.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, TopicPartition

from pipeline._acls import Role
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
"""How often a relay waiting for the former groups to empty looks again."""
PATIENCE = 30
"""Looks in a row that Kafka did not answer after which the wait is a warning."""
REFUSED_RECHECK_MAX_S = 30.0
"""The longest pause between two looks while an ACL is missing (doubled from RECHECK_S)."""
SUFFIX = ".retry"
"""What the name of every relay group of an earlier release ends with."""
_NOT_FOUND = (KafkaError.GROUP_ID_NOT_FOUND,)
_UNSTABLE = (KafkaError.UNSTABLE_OFFSET_COMMIT,)
"""A partition whose committed offset waits for a transaction's outcome: asked again."""
_PASSING = (
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.NOT_COORDINATOR,
)
"""Errors of a group coordinator moving or starting: asked again, as in an outage."""

Offsets = dict[tuple[str, int], int]


def take_over(
    settings: Settings, stopped: Callable[[float], bool], session: AdminSession | None = None
) -> bool:
    """Wait for the former groups to empty, then take their offsets; False: stopped first.

    ``stopped(seconds)`` waits up to that long for a stop and says whether one came. An outage
    is waited out; so is a group Kafka refuses to describe (an ACL missing: see the module
    docstring), with a warning that names it. Another refusal raises.
    """
    session = session or AdminSession(settings, TIMEOUT_S)
    handover = _Handover(settings, session)
    failed = 0
    refused: set[str] = set()
    pause = RECHECK_S
    while True:
        session.restart_deadline()
        try:
            if handover.done():
                if refused:
                    _log.info("the retry relay may describe %s now", ", ".join(sorted(refused)))
                return True
            failed, pause = 0, RECHECK_S
        except NotAuthorizedError as exc:
            if exc.name not in refused:
                refused.add(exc.name)
                _log.warning(
                    "the retry relay does not join %s yet, and relays no retried job: %s. "
                    "Without that group it cannot tell whether a relay of an earlier release "
                    "still returns them, or how far it went (joining could return jobs twice). "
                    "The worker runs its jobs meanwhile; the relay looks again every %g s at "
                    "most and joins once the ACL is there",
                    retry_group(settings), exc, REFUSED_RECHECK_MAX_S,
                )  # fmt: skip
            else:
                _log.debug("the retry relay waits to join %s: %s", retry_group(settings), exc)
            pause = min(pause * 2, REFUSED_RECHECK_MAX_S)
        except (KafkaUnavailableError, TopicAdminError) as exc:
            if isinstance(exc, TopicAdminError) and not has_code(exc.__cause__, *_PASSING):
                raise
            failed, pause = failed + 1, RECHECK_S
            # Kafka's own outage is told by the consumers; this is a coordinator that stays away.
            log = _log.warning if failed == PATIENCE else _log.debug
            log("the retry relay waits to join %s: %s", retry_group(settings), exc)
        if stopped(pause):
            return False


class _Handover:
    """One relay's look at the groups, as often as it takes."""

    def __init__(self, settings: Settings, session: AdminSession) -> None:
        self._session = session
        self._names = TopicNames(settings.namespace)
        self._group = retry_group(settings)
        self._own_former = former_retry_group(settings)
        self._told: set[str] = set()

    def done(self) -> bool:
        """Whether the relay may join now (else it looks again later)."""
        formers = self._formers()
        busy = {group: n for group in formers if (n := self._members(group))}
        if not busy:
            # Read again: a relay of a former group may have committed, then left, meanwhile.
            formers = self._formers()
            busy = {group: n for group in formers if (n := self._members(group))}
        if busy:
            for group in sorted(busy.keys() - self._told):
                _log.warning(
                    "the retry relay waits for the %d members of group %s (a relays' group of "
                    "workers of an earlier release) to leave before it joins %s",
                    busy[group], group, self._group,
                )  # fmt: skip
            self._told |= busy.keys()
            return False
        return self._raise(formers)

    def _formers(self) -> dict[str, Offsets]:
        """The relay groups of earlier releases, with their offsets on this namespace's tiers."""
        session = self._session
        future = session.client.list_consumer_groups(request_timeout=session.remaining())
        listed = session.result(future, "list the consumer groups", None)
        if listed.errors:  # a coordinator did not answer: its groups are missing from the list
            raise KafkaUnavailableError(f"Kafka did not list every group: {listed.errors[0]}")
        names = {g.group_id for g in listed.valid if g.group_id.endswith(SUFFIX)}
        names |= {self._own_former} if self._own_former is not None else set()
        names.discard(self._group)
        # Other namespaces' relay groups are among them: asked at once, and one that cannot be
        # read (not ours to read) is passed over.
        found = self._committed(*sorted(names), others=True)
        return {name: offsets for name, offsets in found.items() if offsets}

    def _raise(self, formers: dict[str, Offsets]) -> bool:
        """Commit to the new group, where it is behind, the furthest offset of the formers."""
        if not formers:
            return True
        if self._members(self._group):
            return True  # Kafka takes no offsets for it now; its relays took over before
        current = self._committed(self._group)[self._group]
        furthest: Offsets = {}
        for offsets in formers.values():
            for where, offset in offsets.items():
                furthest[where] = max(offset, furthest.get(where, -1))
        behind = [
            TopicPartition(topic, partition, offset)
            for (topic, partition), offset in sorted(furthest.items())
            if offset > current.get((topic, partition), -1)
        ]
        if not behind:
            return True
        session = self._session
        request = [ConsumerGroupTopicPartitions(self._group, behind)]
        futures = session.client.alter_consumer_group_offsets(
            request, request_timeout=session.remaining()
        )
        doing = f"commit the offsets of group {self._group}"
        answer = session.result(futures[self._group], doing, None)
        # librdkafka answers each partition apart; the group's own future holds no error.
        refused = [tp.error for tp in answer.topic_partitions or [] if tp.error is not None]
        if not refused:
            _log.info(
                "the retry relays' group %s took over the offsets of %d tier partitions from %s",
                self._group, len(behind), ", ".join(sorted(formers)),
            )  # fmt: skip
            return True
        if self._members(self._group):
            return True  # another relay joined first (having done this) and relays on
        if refused[0].code() in _PASSING:
            raise KafkaUnavailableError(f"Kafka did not {doing}: {refused[0].str()}")
        raise TopicAdminError(None, f"Kafka refused to {doing}: {refused[0].str()}")

    def _members(self, group: str) -> int:
        session = self._session
        futures = session.client.describe_consumer_groups(
            [group], request_timeout=session.remaining()
        )
        try:
            described = session.result(futures[group], f"describe the consumer group {group}", None)
        except TopicAdminError as exc:
            if has_code(exc.__cause__, *_NOT_FOUND):
                return 0
            self._check_refused(exc, group)
            raise
        return len(described.members)

    def _check_refused(self, exc: TopicAdminError, group: str) -> None:
        """Raise :class:`NotAuthorizedError` if ``exc`` is Kafka refusing to describe ``group``."""
        if has_code(exc.__cause__, KafkaError.GROUP_AUTHORIZATION_FAILED):
            user = self._session.settings.security.sasl_username
            raise NotAuthorizedError("GROUP", group, "DESCRIBE", user, Role.WORKER.value) from exc

    def _committed(self, *groups: str, others: bool = False) -> dict[str, Offsets]:
        """Each group's committed offsets on the namespace's tiers, asked all at once (the
        admin client takes one group a request); with ``others``, a group Kafka refuses to
        answer for (other than our own former one) is left out."""
        session = self._session
        futures = {
            group: session.client.list_consumer_group_offsets(
                [ConsumerGroupTopicPartitions(group)],
                require_stable=True,  # not before a transaction's offsets are decided
                request_timeout=session.remaining(),
            )[group]
            for group in groups
        }
        found: dict[str, Offsets] = {}
        for group, future in futures.items():
            doing = f"list the committed offsets of group {group}"
            try:
                answer = session.result(future, doing, None)
            except TopicAdminError as exc:
                if not others or group == self._own_former:
                    self._check_refused(exc, group)
                    raise
                # Not ours to read, or its coordinator is away: another namespace's, most likely.
                _log.debug("the retry relay's handover passes over group %s: %s", group, exc)
                continue
            tiers = self._names.tier_number
            listed = [tp for tp in answer.topic_partitions or [] if tiers(tp.topic) is not None]
            if any(tp.error is not None and tp.error.code() in _UNSTABLE for tp in listed):
                raise KafkaUnavailableError(f"group {group} has offsets being committed")
            found[group] = {
                (tp.topic, tp.partition): tp.offset
                for tp in listed
                if tp.error is None and tp.offset >= 0
            }
        return found
