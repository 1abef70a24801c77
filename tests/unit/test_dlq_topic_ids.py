"""The ids of the dead-letter topics, read with an admin client: a zero id (a cluster that
gives none) or a topic Kafka does not describe tells nothing; an outage fails the refresh."""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass, field
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Uuid

from pipeline._adminsession import AdminSession
from pipeline._deadletters import _topicids
from pipeline._errors import KafkaUnavailableError, TopicAdminError
from pipeline._settings import Settings


@dataclass
class Description:
    topic_id: Uuid | None


@dataclass
class FakeSession:
    """An admin session whose client describes topics from ``answers``: a description or
    the error of its future."""

    answers: dict[str, Description | KafkaException]
    deadlines: list[float] = field(default_factory=list)
    client: Any = None

    def __post_init__(self) -> None:
        self.client = self

    def restart_deadline(self, timeout: float | None = None) -> None:
        self.deadlines.append(timeout or 0.0)

    def remaining(self) -> float:
        return self.deadlines[-1]

    def describe(self, topics: Any, *, operations: bool = False) -> dict[str, Any]:
        """The session's own: over this client and :meth:`result`."""
        return AdminSession.describe(self, topics, operations=operations)  # type: ignore[arg-type]

    def describe_topics(
        self, topics: Any, request_timeout: float, include_authorized_operations: bool
    ) -> dict[str, concurrent.futures.Future[Description]]:
        futures = {}
        for name in topics.topic_names:
            future: concurrent.futures.Future[Description] = concurrent.futures.Future()
            answer = self.answers[name]
            if isinstance(answer, KafkaException):
                future.set_exception(answer)
            else:
                future.set_result(answer)
            futures[name] = future
        return futures

    def result(self, future: concurrent.futures.Future[Description], *args: object) -> Any:
        try:
            return future.result()
        except KafkaException as exc:
            error = exc.args[0]
            if error.code() == KafkaError._TRANSPORT:
                raise KafkaUnavailableError("down") from exc
            raise TopicAdminError(None, "refused") from exc


def test_topic_ids_are_read_and_a_zero_or_refused_one_tells_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    session = FakeSession(
        {
            "a": Description(Uuid(1, 2)),
            "zero": Description(Uuid(0, 0)),
            "none": Description(None),
            "missing": KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)),
        }
    )
    monkeypatch.setattr(_topicids, "AdminSession", lambda settings, timeout: session)
    topic_ids = _topicids.TopicIds(Settings())
    assert topic_ids.read(["a", "zero", "none", "missing"], 3.0) == {"a": str(Uuid(1, 2))}
    assert session.deadlines == [3.0]

    session.answers["a"] = KafkaException(KafkaError(KafkaError._TRANSPORT))
    with pytest.raises(KafkaUnavailableError):  # the refresh fails, the index as it was
        topic_ids.read(["a"], 2.0)


def test_renewed_names_the_topics_whose_id_changed() -> None:
    seen = {"a": "1", "b": "2"}
    assert _topicids.renewed(seen, {"a": "1", "b": "3", "c": "4"}) == {"b"}
    assert _topicids.renewed({}, {"a": "1"}) == set()  # the first reading
    assert _topicids.renewed(seen, {}) == set()  # no ids given this time
