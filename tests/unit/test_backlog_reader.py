"""A backlog reader kept for as long as its process runs (the dashboard's, the exporter's) asks
with a new admin client after a read Kafka did not answer."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from pipeline import KafkaUnavailableError, NotAuthorizedError, Settings, _backlog
from pipeline._backlog import BacklogReader


class Unanswered:
    """An admin session whose every read times out, counting the sessions made."""

    made = 0

    def __init__(self, settings: Settings, timeout: float) -> None:
        type(self).made += 1

    def restart_deadline(self, timeout: float | None = None) -> None:
        return None

    def metadata(self) -> Any:
        raise KafkaUnavailableError("Kafka did not answer in 1s")


def test_a_read_kafka_did_not_answer_makes_the_next_one_ask_with_a_new_client(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After a broker restart a kept client never heard from the group coordinator again:
    `pipeline web` and `pipeline exporter` said Kafka could not be read until restarted."""
    monkeypatch.setattr(_backlog, "AdminSession", Unanswered)
    Unanswered.made = 0
    with BacklogReader(Settings(bootstrap_servers="127.0.0.1:9"), timeout=1.0) as reader:
        assert Unanswered.made == 1
        for reads in (1, 2):
            with pytest.raises(KafkaUnavailableError):
                reader.read()
            assert Unanswered.made == 1 + reads


class _RefusedOffsets:
    """An admin client whose listing of a group's committed offsets Kafka's ACLs refuse."""

    def list_consumer_group_offsets(self, request: Any, request_timeout: float) -> Any:
        refused: Future[Any] = Future()
        refused.set_exception(
            KafkaException(KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED, "not authorized"))
        )
        return {request[0].group_id: refused}

    def poll(self, timeout: float) -> int:
        return 0


def test_a_group_whose_offsets_the_acls_refuse_is_named_as_a_refusal() -> None:
    """`pipeline status` said "Kafka refused to list the committed offsets of group
    orders.workers in: ...": a dangling "in", not what to allow whom."""
    settings = Settings(
        bootstrap_servers="127.0.0.1:9",
        security={
            "protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "PLAIN",
            "sasl_username": "ops",
            "sasl_password": "secret",
        },
    )
    with BacklogReader(settings, timeout=1.0) as reader:
        reader._admin.client = _RefusedOffsets()  # type: ignore[assignment]
        metadata = SimpleNamespace(
            topics={"pipeline.jobs.default": SimpleNamespace(partitions={0: None})}
        )
        with pytest.raises(NotAuthorizedError) as raised:
            reader._committed(metadata, {"pipeline.jobs.default": "pipeline.workers"})
    assert "Kafka user ops lacks DESCRIBE on GROUP pipeline.workers" in str(raised.value)
    assert "--role operator --principal User:ops" in str(raised.value)


def test_the_dead_letter_index_asks_for_topic_ids_with_a_new_client_after_no_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The dashboard's and the exporter's index keep their admin client as the reader does."""
    from pipeline._deadletters import _topicids

    class Silent(Unanswered):
        def describe(self, topics: list[str]) -> Any:
            raise KafkaUnavailableError("Kafka did not answer in 1s")

    monkeypatch.setattr(_topicids, "AdminSession", Silent)
    Silent.made = 0
    ids = _topicids.TopicIds(Settings(bootstrap_servers="127.0.0.1:9"))
    for reads in (1, 2):
        with pytest.raises(KafkaUnavailableError):
            ids.read(["pipeline.dlq"], 1.0)
        assert Silent.made == reads
