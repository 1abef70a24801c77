"""The two size bounds, against a real Kafka: an enqueue's (librdkafka's own) and the margin of
records written later in a transaction (the outbox's rows), which a broker must take too."""

from __future__ import annotations

import os
import uuid

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from pipeline import Settings
from pipeline._messagesize import PRODUCE_OVERHEAD, RECORD_OVERHEAD, fits_in_message
from pipeline._producerconfig import producer_config

MAX_BYTES = 100_000
KEY = b"k" * 10


def _written(settings: Settings, topic: str, value: bytes) -> Producer:
    """A producer with the relay's options that took a record of ``value`` in an open
    transaction (librdkafka refuses one larger than its own bound here, at once)."""
    conf = producer_config(settings, bulk=True)
    conf["transactional.id"] = f"size-{uuid.uuid4().hex}"
    producer = Producer(conf)
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, value, KEY)
    return producer


def test_a_record_librdkafka_takes_can_fail_a_transaction_the_outbox_margin_cannot(
    settings: Settings,
) -> None:
    # The producers and the topic agree on the largest message (both raised together): the
    # broker measures the record batch, 61 bytes of header more than librdkafka's bound.
    settings = settings.model_copy(update={"kafka": {"message.max.bytes": str(MAX_BYTES)}})
    topic = f"{settings.namespace}.jobs.default"
    limited = NewTopic(topic, 1, 1, config={"max.message.bytes": str(MAX_BYTES)})
    admin = AdminClient({**settings.client_config(), "log_level": 0})
    admin.create_topics([limited])[topic].result(30)
    # Random bytes: compression cannot hide the overhead.
    at_enqueue_bound = os.urandom(MAX_BYTES - PRODUCE_OVERHEAD - len(KEY))
    assert not fits_in_message(MAX_BYTES, at_enqueue_bound, KEY)
    producer = _written(settings, topic, at_enqueue_bound)  # librdkafka takes it
    with pytest.raises(KafkaException) as refused:
        producer.commit_transaction(30)  # the broker does not
    assert refused.value.args[0].code() == KafkaError.MSG_SIZE_TOO_LARGE
    at_record_bound = at_enqueue_bound[: MAX_BYTES - RECORD_OVERHEAD - len(KEY)]
    assert fits_in_message(MAX_BYTES, at_record_bound, KEY)
    _written(settings, topic, at_record_bound).commit_transaction(30)
