"""The retry relay's start in a namespace whose workers' group is not the default one: it waits
for the relays' former group to empty, then takes over its offsets (against a fake cluster)."""

from __future__ import annotations

import concurrent.futures
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, KafkaException, TopicPartition

from pipeline import Settings
from pipeline._errors import KafkaUnavailableError, NotAuthorizedError, TopicAdminError
from pipeline_worker.recovery.handover import RECHECK_S, take_over

SETTINGS = Settings(namespace="ns", worker={"group_id": "fleet"})
FORMER, GROUP = "fleet.retry", "ns.workers.retry"


def _future(value: Any) -> concurrent.futures.Future[Any]:
    future: concurrent.futures.Future[Any] = concurrent.futures.Future()
    if isinstance(value, BaseException):
        future.set_exception(value)
    else:
        future.set_result(value)
    return future


def _refusal(code: int) -> KafkaException:
    return KafkaException(KafkaError(code))


class Cluster:
    """The groups' members and committed offsets, as an AdminSession's client sees them."""

    def __init__(
        self, members: list[int], committed: dict[str, dict[tuple[str, int], int]]
    ) -> None:
        self.members = members  # the former group's, one entry per look
        self.committed = committed
        self.describe: BaseException | None = None
        self.alter: BaseException | None = None
        self.altered: list[tuple[str, list[tuple[str, int, int]]]] = []
        self.settings = SETTINGS

    # -- the session -------------------------------------------------------------------------
    @property
    def client(self) -> Cluster:
        return self

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

    # -- the admin client ----------------------------------------------------------------------
    def describe_consumer_groups(self, groups: list[str], **_: Any) -> dict[str, Any]:
        assert groups == [FORMER]
        if self.describe is not None:
            raised, self.describe = self.describe, None
            return {FORMER: _future(raised)}
        count = self.members.pop(0) if len(self.members) > 1 else self.members[0]
        return {FORMER: _future(SimpleNamespace(members=[object()] * count))}

    def list_consumer_group_offsets(
        self, request: list[ConsumerGroupTopicPartitions], **_: Any
    ) -> dict[str, Any]:
        [asked] = request
        tps = [
            TopicPartition(t, p, o) for (t, p), o in self.committed.get(asked.group_id, {}).items()
        ]
        return {asked.group_id: _future(SimpleNamespace(topic_partitions=tps))}

    def alter_consumer_group_offsets(
        self, request: list[ConsumerGroupTopicPartitions], **_: Any
    ) -> dict[str, Any]:
        [asked] = request
        if self.alter is not None:
            return {asked.group_id: _future(self.alter)}
        offsets = [(tp.topic, tp.partition, tp.offset) for tp in asked.topic_partitions or []]
        self.altered.append((asked.group_id, offsets))
        self.committed[asked.group_id] = {(t, p): o for t, p, o in offsets}
        return {asked.group_id: _future(SimpleNamespace())}


def _never(seconds: float) -> bool:
    return False


def test_the_default_group_has_nothing_to_take_over() -> None:
    assert take_over(Settings(namespace="ns"), _never, session=None)  # no cluster asked


def test_the_former_group_s_offsets_of_the_tiers_are_copied_once_it_is_empty() -> None:
    former = {("ns.retry.0", 0): 3, ("ns.retry.1", 2): 7, ("elsewhere", 0): 9}
    cluster = Cluster([2, 1, 0], {FORMER: former})
    waits: list[float] = []

    def stopped(seconds: float) -> bool:
        waits.append(seconds)
        return False

    assert take_over(SETTINGS, stopped, session=cluster)  # type: ignore[arg-type]
    assert waits == [RECHECK_S, RECHECK_S]  # two looks with members, then empty
    assert cluster.altered == [(GROUP, [("ns.retry.0", 0, 3), ("ns.retry.1", 2, 7)])]


def test_a_group_that_committed_already_is_left_as_it_is() -> None:
    cluster = Cluster([0], {FORMER: {("ns.retry.0", 0): 3}, GROUP: {("ns.retry.0", 0): 9}})
    assert take_over(SETTINGS, _never, session=cluster)  # type: ignore[arg-type]
    assert cluster.altered == []


def test_a_relay_that_joined_first_makes_the_copy_needless() -> None:
    cluster = Cluster([0], {FORMER: {("ns.retry.0", 0): 3}})
    cluster.alter = _refusal(KafkaError.UNKNOWN_MEMBER_ID)  # the group is not empty any more
    cluster.committed[GROUP] = {}
    original = cluster.list_consumer_group_offsets
    calls = 0

    def listed(request: list[ConsumerGroupTopicPartitions], **kw: Any) -> dict[str, Any]:
        nonlocal calls
        if request[0].group_id == GROUP:
            calls += 1
            if calls == 2:  # asked again after the refusal: the other relay committed
                cluster.committed[GROUP] = {("ns.retry.0", 0): 4}
        return original(request, **kw)

    cluster.list_consumer_group_offsets = listed  # type: ignore[method-assign]
    assert take_over(SETTINGS, _never, session=cluster)  # type: ignore[arg-type]
    cluster.committed[GROUP] = {}
    calls = 0
    cluster.list_consumer_group_offsets = original  # type: ignore[method-assign]
    with pytest.raises(TopicAdminError):  # refused, and nobody committed: said
        take_over(SETTINGS, _never, session=cluster)  # type: ignore[arg-type]


def test_a_stop_while_the_former_group_has_members_ends_the_wait() -> None:
    cluster = Cluster([1], {})
    assert not take_over(SETTINGS, lambda s: True, session=cluster)  # type: ignore[arg-type]
    assert cluster.altered == []


def test_an_outage_is_waited_out_and_a_missing_acl_is_named() -> None:
    cluster = Cluster([0], {FORMER: {("ns.retry.0", 0): 3}})
    cluster.describe = _refusal(KafkaError._TRANSPORT)
    waits: list[float] = []

    def stopped(seconds: float) -> bool:
        waits.append(seconds)
        return False

    assert take_over(SETTINGS, stopped, session=cluster)  # type: ignore[arg-type]
    assert waits == [RECHECK_S]
    assert cluster.altered
    cluster = Cluster([0], {})
    cluster.describe = _refusal(KafkaError.GROUP_AUTHORIZATION_FAILED)
    with pytest.raises(NotAuthorizedError, match=r"DESCRIBE on GROUP fleet\.retry"):
        take_over(SETTINGS, _never, session=cluster)  # type: ignore[arg-type]
    cluster.describe = _refusal(KafkaError.GROUP_ID_NOT_FOUND)  # never existed: nothing to wait for
    assert take_over(SETTINGS, _never, session=cluster)  # type: ignore[arg-type]
