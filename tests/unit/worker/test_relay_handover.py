"""A starting retry relay takes over from the relay groups of earlier releases: it waits until
none has members, then raises the namespace's one relay group to their furthest offsets
(against a fake cluster that answers as librdkafka's admin client does)."""

from __future__ import annotations

import concurrent.futures
import logging
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, KafkaException

from pipeline import Settings
from pipeline._errors import KafkaUnavailableError, TopicAdminError
from pipeline_worker.recovery.handover import RECHECK_S, take_over

SETTINGS = Settings(
    namespace="ns",
    worker={"group_id": "fleet"},
    security={"protocol": "SASL_SSL", "sasl_username": "orders-worker", "sasl_password": "x"},
)
GROUP = "ns.workers.retry"
Offsets = dict[tuple[str, int], int]


def _future(value: Any) -> concurrent.futures.Future[Any]:
    future: concurrent.futures.Future[Any] = concurrent.futures.Future()
    if isinstance(value, BaseException):
        future.set_exception(value)
    else:
        future.set_result(value)
    return future


def _refusal(code: int) -> KafkaException:
    return KafkaException(KafkaError(code))


class Group:
    def __init__(self, members: list[int] | None = None, offsets: Offsets | None = None) -> None:
        self.members = members or [0]  # one entry per look; the last one stays
        self.offsets = offsets or {}
        self.later: list[Offsets] = []
        """Offsets it commits after each read of them, one entry per read."""
        self.unstable = 0
        """Reads still answered UNSTABLE_OFFSET_COMMIT on its first partition."""

    def look(self) -> int:
        return self.members.pop(0) if len(self.members) > 1 else self.members[0]


class Cluster:
    """Groups, their members and committed offsets, as an AdminSession and its client see
    them; ``refusals`` are raised by the next calls of that name, one each."""

    def __init__(self, **groups: Group) -> None:
        self.groups = {name.replace("__", "."): group for name, group in groups.items()}
        self.refusals: dict[str, list[BaseException]] = {}
        self.altered: list[list[tuple[str, int, int]]] = []
        self.settings = SETTINGS
        self.client = self

    def remaining(self) -> float:
        return 1.0

    def restart_deadline(self) -> None:
        pass

    def result(self, future: concurrent.futures.Future[Any], doing: str, topic: str | None) -> Any:
        try:
            return future.result()
        except KafkaException as exc:
            if exc.args[0].code() == KafkaError._TRANSPORT:
                raise KafkaUnavailableError(doing) from exc
            raise TopicAdminError(topic, f"Kafka refused to {doing}") from exc

    def _refused(self, call: str) -> BaseException | None:
        waiting = self.refusals.get(call)
        return waiting.pop(0) if waiting else None

    def list_consumer_groups(self, **_: Any) -> concurrent.futures.Future[Any]:
        listings = [SimpleNamespace(group_id=name) for name in self.groups]
        errors = [self._refused("list partly")] if self.refusals.get("list partly") else []
        return _future(self._refused("list") or SimpleNamespace(valid=listings, errors=errors))

    def describe_consumer_groups(self, groups: list[str], **_: Any) -> dict[str, Any]:
        [name] = groups
        refused = self._refused("describe")
        if refused is None and name not in self.groups:
            refused = _refusal(KafkaError.GROUP_ID_NOT_FOUND)
        found = refused or SimpleNamespace(members=[object()] * self.groups[name].look())
        return {name: _future(found)}

    def list_consumer_group_offsets(
        self, request: list[ConsumerGroupTopicPartitions], **_: Any
    ) -> dict[str, Any]:
        [asked] = request
        refused = self._refused(f"offsets of {asked.group_id}")
        if refused is not None:
            return {asked.group_id: _future(refused)}
        group = self.groups.get(asked.group_id, Group())
        tps = [
            SimpleNamespace(topic=t, partition=p, offset=o, error=None)
            for (t, p), o in group.offsets.items()
        ]
        if group.unstable and tps:
            group.unstable -= 1
            tps[0].error, tps[0].offset = KafkaError(KafkaError.UNSTABLE_OFFSET_COMMIT), -1
        if group.later:
            group.offsets.update(group.later.pop(0))
        return {asked.group_id: _future(SimpleNamespace(topic_partitions=tps))}

    def alter_consumer_group_offsets(
        self, request: list[ConsumerGroupTopicPartitions], **_: Any
    ) -> dict[str, Any]:
        [asked] = request
        group = self.groups.setdefault(asked.group_id, Group())
        wanted = [(tp.topic, tp.partition, tp.offset) for tp in asked.topic_partitions or []]
        # As librdkafka: the group's future succeeds; each partition carries its own error.
        refused = self._refused("alter")
        if refused is None and group.members[0]:
            refused = _refusal(KafkaError.UNKNOWN_MEMBER_ID)  # Kafka: the group is not empty
        error = refused.args[0] if isinstance(refused, KafkaException) else None
        if error is None:
            self.altered.append(wanted)
            group.offsets.update({(t, p): o for t, p, o in wanted})
        tps = [SimpleNamespace(topic=t, partition=p, offset=o, error=error) for t, p, o in wanted]
        return {asked.group_id: _future(SimpleNamespace(topic_partitions=tps))}


def _never(seconds: float) -> bool:
    return False


class Waits:
    def __init__(self) -> None:
        self.seconds: list[float] = []

    def __call__(self, seconds: float) -> bool:
        self.seconds.append(seconds)
        return False


def _take_over(cluster: Cluster, stopped: Any = _never, settings: Settings = SETTINGS) -> bool:
    return take_over(settings, stopped, session=cluster)  # type: ignore[arg-type]


def test_with_no_group_before_it_nothing_is_taken_over() -> None:
    cluster = Cluster(ns__workers__retry=Group([1], {("ns.retry.0", 0): 4}))
    assert _take_over(cluster, settings=Settings(namespace="ns"))
    assert _take_over(cluster)
    assert cluster.altered == []


def test_the_former_group_s_tier_offsets_are_taken_once_it_is_empty() -> None:
    former = {("ns.retry.0", 0): 3, ("ns.retry.1", 2): 7, ("elsewhere", 0): 9, ("ns.retry.x", 0): 1}
    cluster = Cluster(fleet__retry=Group([2, 1, 0], former))
    waits = Waits()
    assert _take_over(cluster, waits)
    assert waits.seconds == [RECHECK_S, RECHECK_S]  # two looks with members, then empty
    assert cluster.altered == [[("ns.retry.0", 0, 3), ("ns.retry.1", 2, 7)]]


def test_every_former_group_of_the_namespace_is_waited_for_and_the_furthest_offset_taken() -> None:
    cluster = Cluster(
        fleet__retry=Group([0], {("ns.retry.0", 0): 3, ("ns.retry.0", 1): 8}),
        bulk__retry=Group([1, 1, 0], {("ns.retry.0", 0): 5}),  # its old workers stop later
        other__workers__retry=Group([3], {("other.retry.0", 0): 50}),  # another namespace's
        ns__workers=Group([2], {("ns.jobs.default", 0): 90}),  # not a relays' group
    )
    waits = Waits()
    assert _take_over(cluster, waits)
    assert len(waits.seconds) == 2
    assert cluster.altered == [[("ns.retry.0", 0, 5), ("ns.retry.0", 1, 8)]]


def test_only_the_partitions_the_group_is_behind_on_are_raised() -> None:
    cluster = Cluster(
        fleet__retry=Group([0], {("ns.retry.0", 0): 3, ("ns.retry.0", 1): 8}),
        ns__workers__retry=Group([0], {("ns.retry.0", 0): 9, ("ns.retry.0", 1): 2}),
    )
    assert _take_over(cluster)
    assert cluster.altered == [[("ns.retry.0", 1, 8)]]
    assert _take_over(cluster)  # the next start: nothing behind
    assert len(cluster.altered) == 1


def test_a_relay_that_joined_first_leaves_the_group_as_it_is() -> None:
    cluster = Cluster(
        fleet__retry=Group([0], {("ns.retry.0", 0): 3}),
        ns__workers__retry=Group([1], {}),  # another relay joined and has not committed yet
    )
    assert _take_over(cluster)
    assert cluster.altered == []


def test_a_refused_commit_of_the_offsets_is_not_taken_for_a_take_over() -> None:
    cluster = Cluster(fleet__retry=Group([0], {("ns.retry.0", 0): 3}))
    cluster.refusals["alter"] = [_refusal(KafkaError.COORDINATOR_LOAD_IN_PROGRESS)]
    waits = Waits()
    assert _take_over(cluster, waits)  # asked again a second later, then committed
    assert waits.seconds == [RECHECK_S]
    assert cluster.altered == [[("ns.retry.0", 0, 3)]]
    cluster = Cluster(fleet__retry=Group([0], {("ns.retry.0", 0): 3}))
    cluster.refusals["alter"] = [_refusal(KafkaError.GROUP_AUTHORIZATION_FAILED)]
    with pytest.raises(TopicAdminError, match=r"commit the offsets of group ns\.workers\.retry"):
        _take_over(cluster)


def test_a_stop_while_a_former_group_has_members_ends_the_wait() -> None:
    cluster = Cluster(fleet__retry=Group([1], {("ns.retry.0", 0): 3}))
    assert not _take_over(cluster, lambda seconds: True)
    assert cluster.altered == []


@pytest.mark.parametrize(
    "code",
    [KafkaError._TRANSPORT, KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.NOT_COORDINATOR],
)
def test_an_outage_or_a_moving_coordinator_is_waited_out(code: int) -> None:
    cluster = Cluster(fleet__retry=Group([0], {("ns.retry.0", 0): 3}))
    cluster.refusals["describe"] = [_refusal(code)]
    cluster.refusals["list"] = [_refusal(code)]
    waits = Waits()
    assert _take_over(cluster, waits)
    assert waits.seconds == [RECHECK_S, RECHECK_S]
    assert cluster.altered == [[("ns.retry.0", 0, 3)]]


def test_a_group_it_may_not_describe_is_waited_for_with_one_warning_naming_the_acl(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Whether an old relay still reads the tiers there is unknown: joining could return jobs
    # twice. The relay waits, less and less often, and joins once the ACL is granted.
    cluster = Cluster(fleet__retry=Group([0], {("ns.retry.0", 0): 3}))
    cluster.refusals["describe"] = [_refusal(KafkaError.GROUP_AUTHORIZATION_FAILED)] * 7
    waits = Waits()
    with caplog.at_level(logging.INFO, "pipeline.worker.relay"):
        assert _take_over(cluster, waits)
    assert waits.seconds == [2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]  # doubled, up to 30 s
    assert cluster.altered == [[("ns.retry.0", 0, 3)]]
    [warning] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert "does not join ns.workers.retry yet, and relays no retried job" in warning
    assert "Kafka user orders-worker lacks DESCRIBE on GROUP fleet.retry" in warning
    assert "`pipeline acls apply --role worker --principal User:orders-worker`" in warning
    assert "may describe fleet.retry now" in caplog.text


def test_a_group_whose_offsets_cannot_be_read_is_passed_over_but_our_former_one_waited_for() -> (
    None
):
    def cluster() -> Cluster:
        made = Cluster(
            fleet__retry=Group([0], {("ns.retry.0", 0): 3}),
            theirs__retry=Group([1], {("theirs.retry.0", 0): 3}),
        )
        refused = _refusal(KafkaError.GROUP_AUTHORIZATION_FAILED)
        made.refusals = {"offsets of theirs.retry": [refused], "offsets of fleet.retry": []}
        return made

    passing = cluster()
    assert _take_over(passing)
    assert passing.altered == [[("ns.retry.0", 0, 3)]]
    refusing = cluster()  # our former group: waited for until its offsets may be read
    refusing.refusals["offsets of fleet.retry"] = [_refusal(KafkaError.GROUP_AUTHORIZATION_FAILED)]
    waits = Waits()
    assert _take_over(refusing, waits)
    assert waits.seconds == [2.0]
    assert refusing.altered == [[("ns.retry.0", 0, 3)]]
    failing = cluster()  # another refusal of it still stops the worker
    failing.refusals["offsets of fleet.retry"] = [_refusal(KafkaError.INVALID_GROUP_ID)]
    with pytest.raises(TopicAdminError, match=r"offsets of group fleet\.retry"):
        _take_over(failing)


def test_offsets_committed_by_a_relay_that_left_during_the_look_are_taken() -> None:
    # Read at 3; then its last relay commits 10 and leaves before the members are counted.
    former = Group([0], {("ns.retry.0", 0): 3})
    former.later = [{("ns.retry.0", 0): 10}]
    cluster = Cluster(fleet__retry=former)
    assert _take_over(cluster)
    assert cluster.altered == [[("ns.retry.0", 0, 10)]]


def test_offsets_a_transaction_has_not_decided_yet_are_asked_again() -> None:
    former = Group([0], {("ns.retry.0", 0): 3})
    former.unstable = 2
    cluster = Cluster(fleet__retry=former)
    waits = Waits()
    assert _take_over(cluster, waits)
    assert waits.seconds == [RECHECK_S, RECHECK_S]
    assert cluster.altered == [[("ns.retry.0", 0, 3)]]


def test_a_listing_that_missed_a_coordinator_s_groups_is_asked_again() -> None:
    cluster = Cluster(bulk__retry=Group([2, 0], {("ns.retry.0", 0): 5}))
    cluster.refusals["list partly"] = [_refusal(KafkaError.COORDINATOR_NOT_AVAILABLE)]
    waits = Waits()
    assert _take_over(cluster, waits)
    assert len(waits.seconds) == 2  # the partial list, then bulk.retry's members
    assert cluster.altered == [[("ns.retry.0", 0, 5)]]


def test_another_group_whose_coordinator_is_away_does_not_hold_the_relay() -> None:
    cluster = Cluster(
        fleet__retry=Group([0], {("ns.retry.0", 0): 3}),
        theirs__retry=Group([0], {("theirs.retry.0", 0): 7}),
    )
    cluster.refusals["offsets of theirs.retry"] = [
        _refusal(KafkaError.COORDINATOR_LOAD_IN_PROGRESS) for _ in range(3)
    ]
    assert _take_over(cluster)
    assert cluster.altered == [[("ns.retry.0", 0, 3)]]
