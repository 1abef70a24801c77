"""A topic's partitions asked of Kafka in steps (pipeline._partitions): what the table reader
and the dead-letter reader both call.

The fake client stands for a consumer: ``list_topics`` answers, fails at once, or waits out
its step (on a fake clock) as librdkafka does while no broker answers; ``poll`` hands over the
log lines librdkafka queued, as the real client does, among them a refusal of the credentials.
"""

from __future__ import annotations

import concurrent.futures
import logging
from types import SimpleNamespace

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import ClusterMetadata, PartitionMetadata, TopicMetadata
from pydantic import SecretStr

from pipeline import (
    KafkaAuthenticationError,
    KafkaUnavailableError,
    NotAuthorizedError,
    Settings,
    _partitions,
)
from pipeline._adminsession import AdminSession
from pipeline._clientlog import LastProblemLog
from pipeline._errors import TopicMissingError
from pipeline._partitions import STEP_S, cluster_metadata, topic_partitions, unavailable
from pipeline._settings import SecuritySettings
from pipeline.testing import FakeClock

TOPIC = "acme.schedules"
PASSWORD = "s3cret-pa55"
REFUSAL = (
    "[thrd:sasl_plaintext://localhost:9094/bootstrap]: sasl_plaintext://localhost:9094/bootstrap"
    ": SASL authentication error: Authentication failed during authentication due to invalid "
    "credentials with SASL mechanism SCRAM-SHA-512 (after 12ms in state AUTH_REQ)"
)
TRANSPORT = "Local: Broker transport failure"
CONNECT_FAILED = (
    "[thrd:127.0.0.1:1/bootstrap]: 127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: "
    "Connection refused (after 0ms in state CONNECT)"
)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """The module's clock, moved only by the fake client's waits: no test waits for real."""
    fake = FakeClock(start_ms=1_000_000)
    monkeypatch.setattr(_partitions, "time", SimpleNamespace(monotonic=lambda: now(fake)))
    return fake


def now(clock: FakeClock) -> float:
    return clock.now_ms() / 1000


def settings() -> Settings:
    return Settings(
        namespace="acme",
        bootstrap_servers="127.0.0.1:1",
        security=SecuritySettings(
            protocol="SASL_PLAINTEXT",
            sasl_mechanism="SCRAM-SHA-512",
            sasl_username="alice",
            sasl_password=SecretStr(PASSWORD),
        ),
    )


def described(name: str, partitions: int, error: KafkaError | None = None) -> TopicMetadata:
    meta = TopicMetadata()
    meta.topic = name
    meta.error = error
    meta.partitions = {}
    for number in reversed(range(partitions)):  # Kafka's order is not the partitions' order
        partition = PartitionMetadata()
        partition.id = number
        meta.partitions[number] = partition
    return meta


def listing(*topics: TopicMetadata) -> ClusterMetadata:
    metadata = ClusterMetadata()
    metadata.topics = {t.topic: t for t in topics if t.topic is not None}
    return metadata


class FakeConsumer:
    """``unanswered`` requests fail before one is answered from ``cluster``; each unanswered
    one fails at once, or (``waits``) after its whole step, as when no broker answers."""

    def __init__(
        self,
        clock: FakeClock,
        *topics: TopicMetadata,
        unanswered: int = 0,
        waits: bool = False,
        refused_after: int | None = None,
        named_answers: dict[str, TopicMetadata] | None = None,
    ) -> None:
        self.log = LastProblemLog()
        self.clock = clock
        self.cluster = listing(*topics)
        self.unanswered = unanswered
        self.waits = waits
        self.refused_after = refused_after
        self.named_answers = named_answers or {}
        self.asked: list[tuple[str | None, float]] = []
        self.queued: list[tuple[int, str]] = []

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> ClusterMetadata:
        self.asked.append((topic, timeout))
        if len(self.asked) <= self.unanswered:
            if self.waits:
                self.clock.advance(timeout)
            self.queued.append((logging.ERROR, CONNECT_FAILED))
            if self.refused_after is not None and len(self.asked) >= self.refused_after:
                self.queued.append((logging.ERROR, REFUSAL))
            raise KafkaException(
                KafkaError(KafkaError._TRANSPORT, "Local: Broker transport failure")
            )
        if topic is None:
            return self.cluster
        if topic in self.named_answers:
            return listing(self.named_answers[topic])
        found = self.cluster.topics.get(topic)
        missing = described(topic, 0, KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))
        return listing(found if found is not None else missing)

    def poll(self, timeout: float = -1) -> None:
        """Hands the queued log lines to the ``logger``, as confluent-kafka's poll does."""
        for level, text in self.queued:
            self.log.log(level, "%s [%s] %s", "FAIL", "rdkafka#consumer-1", text)
        self.queued.clear()


def partitions_of(fake: FakeConsumer, clock: FakeClock, name: str, timeout: float) -> list[int]:
    return topic_partitions(
        fake, fake.log, settings(), name, deadline=now(clock) + timeout, timeout=timeout
    )


def test_an_answered_request_gives_the_partitions_in_order(clock: FakeClock) -> None:
    fake = FakeConsumer(clock, described(TOPIC, 3), described("acme.other", 1))
    assert partitions_of(fake, clock, TOPIC, 30.0) == [0, 1, 2]
    assert fake.asked == [(TOPIC, STEP_S)]  # the topic alone: a small answer on a big cluster


def test_a_listing_the_caller_keeps_serves_several_topics_without_a_request(
    clock: FakeClock,
) -> None:
    """The dead-letter reader lists the cluster once for <ns>.dlq and <ns>.dlq-state."""
    fake = FakeConsumer(clock, described("acme.dlq", 2), described("acme.dlq-state", 1))
    whole = cluster_metadata(fake, fake.log, settings(), deadline=now(clock) + 30, timeout=30)
    assert fake.asked == [(None, STEP_S)]  # no topic named: none is auto-created
    for name, expected in [("acme.dlq", [0, 1]), ("acme.dlq-state", [0])]:
        found = topic_partitions(
            fake, fake.log, settings(), name, deadline=now(clock) + 30, timeout=30, metadata=whole
        )
        assert found == expected
    assert len(fake.asked) == 1


def test_unanswered_steps_are_asked_again_until_one_is_answered(clock: FakeClock) -> None:
    fake = FakeConsumer(clock, described(TOPIC, 1), unanswered=2, waits=True)
    assert partitions_of(fake, clock, TOPIC, 30.0) == [0]
    assert fake.asked == [(TOPIC, 1.0)] * 3


def test_an_unreachable_kafka_waits_out_the_timeout_in_steps_then_says_what_to_do(
    clock: FakeClock,
) -> None:
    fake = FakeConsumer(clock, described(TOPIC, 1), unanswered=99, waits=True)
    started = now(clock)
    with pytest.raises(KafkaUnavailableError) as caught:
        partitions_of(fake, clock, TOPIC, 2.5)
    assert [step for _, step in fake.asked] == [1.0, 1.0, 0.5]
    assert now(clock) - started == 2.5
    assert str(caught.value) == (
        "Kafka at 127.0.0.1:1 did not answer within 2.5s (Local: Broker transport failure; "
        "127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused "
        "(after 0ms in state CONNECT)); is Kafka running? start one with `pipeline dev up`, "
        "or point PIPELINE_BOOTSTRAP_SERVERS at your cluster"
    )
    assert isinstance(caught.value.__cause__, KafkaException)


def test_a_step_never_asks_for_less_than_a_tenth_of_a_second(clock: FakeClock) -> None:
    fake = FakeConsumer(clock, described(TOPIC, 1), unanswered=99, waits=True)
    with pytest.raises(KafkaUnavailableError):
        partitions_of(fake, clock, TOPIC, 0.05)
    assert fake.asked == [(TOPIC, 0.1)]


def test_a_refusal_of_the_credentials_stops_at_once_with_the_authentication_error(
    clock: FakeClock,
) -> None:
    """Not after the timeout as though Kafka were down: exit code 4, the user, no password."""
    fake = FakeConsumer(clock, described(TOPIC, 1), unanswered=99, waits=True, refused_after=3)
    with pytest.raises(KafkaAuthenticationError) as caught:
        partitions_of(fake, clock, TOPIC, 30.0)
    assert len(fake.asked) == 3  # the step whose log lines said so, of the 30 the wait allows
    assert caught.value.exit_code == 4
    assert "refused the credentials of SASL user 'alice'" in str(caught.value)
    assert PASSWORD not in str(caught.value)
    assert isinstance(caught.value.__cause__, KafkaException)


def test_a_refusal_seen_when_a_request_fails_at_once_also_stops(clock: FakeClock) -> None:
    fake = FakeConsumer(clock, described(TOPIC, 1), unanswered=99, refused_after=1)
    with pytest.raises(KafkaAuthenticationError):
        partitions_of(fake, clock, TOPIC, 30.0)
    assert len(fake.asked) == 1


def test_a_missing_topic_names_it_and_the_fix(clock: FakeClock) -> None:
    fake = FakeConsumer(clock, described("acme.other", 1))
    with pytest.raises(TopicMissingError) as caught:
        partitions_of(fake, clock, TOPIC, 30.0)
    assert caught.value.topics == [TOPIC]
    assert str(caught.value) == (
        f"topic {TOPIC} does not exist; create the namespace's topics with "
        "`pipeline topics apply --namespace acme`"
    )


def test_a_topic_listed_with_an_error_is_missing(clock: FakeClock) -> None:
    fake = FakeConsumer(clock, described(TOPIC, 0, KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)))
    with pytest.raises(TopicMissingError):
        partitions_of(fake, clock, TOPIC, 30.0)


def test_a_topic_kafka_will_not_describe_is_not_authorized_rather_than_missing(
    clock: FakeClock,
) -> None:
    """Absent from the whole listing; asked for by name, it comes with the authorizer's no."""
    refused = described(TOPIC, 0, KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))
    fake = FakeConsumer(clock, named_answers={TOPIC: refused})
    whole = cluster_metadata(fake, fake.log, settings(), deadline=now(clock) + 30, timeout=30)
    with pytest.raises(NotAuthorizedError) as caught:
        topic_partitions(
            fake, fake.log, settings(), TOPIC, deadline=now(clock) + 30, timeout=30, metadata=whole
        )
    message = str(caught.value)
    assert f"Kafka user alice lacks READ on TOPIC {TOPIC}" in message
    assert "pipeline acls apply" in message
    assert fake.asked[-1][0] == TOPIC


def test_unavailable_says_the_refusal_when_the_log_holds_one(clock: FakeClock) -> None:
    """What the dead-letter reader raises when a read (not only the listing) runs out of time."""
    fake = FakeConsumer(clock)
    fake.queued.append((logging.ERROR, REFUSAL))
    error = unavailable(fake, fake.log, settings(), 5.0, "acme.dlq not read to the end")
    assert isinstance(error, KafkaAuthenticationError)


def test_unavailable_without_a_logged_problem_names_the_reason_alone(clock: FakeClock) -> None:
    fake = FakeConsumer(clock)
    error = unavailable(fake, fake.log, settings(), 5.0, "no answer")
    assert isinstance(error, KafkaUnavailableError)
    assert "did not answer within 5s (no answer); is Kafka running?" in str(error)


def test_a_refusal_is_forgotten_once_kafka_answers_again(clock: FakeClock) -> None:
    """A broker refused the credentials a moment (restarting, say), then answers: a long-lived
    reader (the exporter's, the dashboard's) kept the refusal, and every later request that
    failed once (a slow answer) was a refusal of its credentials, until a restart."""
    fake = FakeConsumer(clock, described(TOPIC, 1))
    fake.queued.append((logging.ERROR, REFUSAL))
    fake.poll()
    assert fake.log.refusal is not None
    assert partitions_of(fake, clock, TOPIC, 30.0) == [0]
    assert fake.log.refusal is None
    fake.unanswered = len(fake.asked) + 1  # the next request fails once, then is answered
    assert partitions_of(fake, clock, TOPIC, 30.0) == [0]


def test_an_admin_session_forgets_a_refusal_once_answered() -> None:
    """The same for the admin client a backlog reader keeps between reads."""
    session = AdminSession(settings(), timeout=5.0)
    session._client_log.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#admin-1", REFUSAL)
    with pytest.raises(KafkaAuthenticationError):
        session.check_refused()
    answered: concurrent.futures.Future[str] = concurrent.futures.Future()
    answered.set_result("answer")
    assert session.result(answered, "describe the group", None) == "answer"
    session.check_refused()  # no refusal now
