"""A burst member that no assignment callback reached asks the group's description whether it
joined with no partition (the consumer protocol calls ``on_assign`` for no empty assignment)."""

from __future__ import annotations

import concurrent.futures
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import ConsumerGroupState, TopicPartition

from pipeline import Settings
from pipeline._errors import KafkaUnavailableError
from pipeline_worker.intake import burst
from pipeline_worker.intake.burst import JOIN_CHECK_S, EmptyJoin

GROUP = "ns.workers"
ME = "member-1"


class FakeSession:
    """The admin session's part that describes a group: the test sets what it answers."""

    answer: Any = None
    described = 0

    def __init__(self, settings: Settings, timeout: float) -> None:
        self.client = SimpleNamespace(describe_consumer_groups=self._describe)

    def _describe(self, groups: list[str], request_timeout: float) -> dict[str, Any]:
        assert groups == [GROUP]
        FakeSession.described += 1
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        future.set_result(FakeSession.answer)
        return {GROUP: future}

    def restart_deadline(self) -> None:
        pass

    def remaining(self) -> float:
        return 5.0

    def result(self, future: concurrent.futures.Future[Any], doing: str, topic: None) -> Any:
        if isinstance(FakeSession.answer, Exception):
            raise FakeSession.answer
        return future.result()


def group(state: ConsumerGroupState, **members: list[int]) -> SimpleNamespace:
    return SimpleNamespace(
        state=state,
        members=[
            SimpleNamespace(
                member_id=member,
                assignment=SimpleNamespace(
                    topic_partitions=[TopicPartition("ns.jobs.default", p) for p in partitions]
                ),
            )
            for member, partitions in members.items()
        ],
    )


@pytest.fixture
def join(monkeypatch: pytest.MonkeyPatch) -> EmptyJoin:
    monkeypatch.setattr(burst, "AdminSession", FakeSession)
    FakeSession.described = 0
    consumer = SimpleNamespace(memberid=lambda: ME)
    return EmptyJoin(Settings(namespace="ns"), GROUP, consumer)  # type: ignore[arg-type]


def test_a_member_listed_with_no_partition_in_a_stable_group_has_joined(join: EmptyJoin) -> None:
    FakeSession.answer = group(ConsumerGroupState.STABLE, **{ME: [], "other": [0, 1]})
    assert not join.joined(100.0)  # a member with partitions has its callback by then
    assert not join.joined(100.0 + JOIN_CHECK_S / 2)
    assert FakeSession.described == 0
    assert join.joined(100.0 + JOIN_CHECK_S)
    assert FakeSession.described == 1


@pytest.mark.parametrize(
    "answer",
    [
        group(ConsumerGroupState.STABLE, **{ME: [0], "other": [1]}),  # its callback is coming
        group(ConsumerGroupState.PREPARING_REBALANCING, **{ME: [], "other": [0, 1]}),
        group(ConsumerGroupState.STABLE, other=[0, 1]),  # not taken in yet
        KafkaUnavailableError("no answer to describe the group"),
    ],
    ids=["assigned", "rebalancing", "not-listed", "no-answer"],
)
def test_a_member_not_listed_empty_in_a_stable_group_has_not_joined(
    join: EmptyJoin, answer: Any
) -> None:
    FakeSession.answer = answer
    join.joined(0.0)
    assert not join.joined(JOIN_CHECK_S)
    assert FakeSession.described == 1
    assert not join.joined(JOIN_CHECK_S * 1.5), "asked again before JOIN_CHECK_S"
    assert FakeSession.described == 1


def test_without_a_member_id_the_group_is_not_asked(join: EmptyJoin) -> None:
    join._consumer = SimpleNamespace(memberid=lambda: None)  # type: ignore[assignment]
    FakeSession.answer = group(ConsumerGroupState.STABLE, other=[0, 1])
    join.joined(0.0)
    assert not join.joined(JOIN_CHECK_S)
    assert FakeSession.described == 0
