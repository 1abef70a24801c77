"""A batch whose Kafka commit went through but whose answer the relay never got.

librdkafka's ``commit_transaction`` can time out while the commit goes on in Kafka (its answer
lost, the broker slow to reply): the relay cannot tell whether the batch is in Kafka. It used to
take it for not published and send the same rows again in a new transaction: every job of the
batch twice. It now reads back what Kafka committed (the batch's progress record) before the
rows go out again, as a relay taking over does.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from pipeline import Pipeline, Settings
from pipeline._admin import apply_topics
from pipeline.outbox import OutboxRelay, RelayOptions
from tests.waiting import wait_for

from .relays import assert_published_once, pending, relay_in_thread, write_orders

RELAY_TIMEOUT_S = 120.0


class _CommitAnswerLost:
    """A relay's producer whose first commit reaches Kafka and whose answer never comes: every
    try of that commit times out, until the relay gives it up (aborts); then a plain producer."""

    def __init__(self, producer: Any) -> None:
        self._producer = producer
        self.committed_unanswered = False
        self._answering = False

    def commit_transaction(self, timeout: float = -1) -> None:
        if self._answering:
            self._producer.commit_transaction(timeout)
            return
        if not self.committed_unanswered:
            self._producer.commit_transaction(timeout)  # Kafka commits the batch
            self.committed_unanswered = True
        raise KafkaException(
            KafkaError(KafkaError._TIMED_OUT, "commit_transaction timed out", retriable=True)
        )

    def abort_transaction(self, timeout: float = -1) -> None:
        if self.committed_unanswered:
            self._answering = True
        self._producer.abort_transaction(timeout)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)


class _RelayLosingACommitAnswer(OutboxRelay):
    producer: _CommitAnswerLost | None = None

    def _producer(self) -> Any:
        producer = super()._producer()
        if self.producer is None:  # the first producer only: one lost answer
            self.producer = _CommitAnswerLost(producer)
            return self.producer
        return producer


def test_a_batch_whose_commit_answer_was_lost_is_not_published_again(
    outbox_dsn: str, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    apply_topics(settings)
    written = write_orders(Pipeline(settings), outbox_dsn, 300, rollback_every=10**6)
    relay = _RelayLosingACommitAnswer(
        settings, outbox_dsn, RelayOptions(batch_size=100, retry_s=0.1)
    )
    with caplog.at_level(logging.INFO, logger="pipeline.outbox"), relay_in_thread(relay):
        assert wait_for(lambda: pending(outbox_dsn) == 0, RELAY_TIMEOUT_S)
    assert relay.producer is not None
    assert relay.producer.committed_unanswered, "no commit went unanswered"
    assert "Kafka did not take 100 outbox rows from id 1" in caplog.text
    assert_published_once(settings, written.committed)
    assert "100 rows of the last batch Kafka committed" in caplog.text
