"""The relay's look-up of its progress topic against librdkafka's mock cluster, which creates a
topic a client asks for by name, as a broker does by default (``auto.create.topics.enable``;
the test brokers turn it off, so they cannot show this).

The look-up made the topic so, with the broker's defaults (several partitions, deleted rather
than compacted): the progress record then landed on a partition the relay never reads back,
and a crash between Kafka's commit and the database's published a batch twice. The relay's own
creation (compacted, one partition: tests/integration/outbox) must be what makes it.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from pipeline import Settings
from pipeline.outbox import _progress as progress_module
from pipeline.outbox._progress import RelayProgress

SETTINGS = Settings(namespace="unit", kafka={"test.mock.num.brokers": "1"})
"""Each client of these settings makes a mock cluster of its own."""


def test_looking_the_progress_topic_up_does_not_create_it(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[AdminClient] = []

    class Kept(AdminClient):
        """The relay's admin client, kept to ask its mock cluster afterwards."""

        def __init__(self, conf: dict[str, Any]) -> None:
            super().__init__(conf)
            made.append(self)

    monkeypatch.setattr(progress_module, "AdminClient", Kept)
    progress = RelayProgress(SETTINGS, "pipeline_outbox")
    try:
        with contextlib.suppress(KafkaException):  # the mock cluster creates no topic asked to
            progress.ensure_topic(2.0)
    finally:
        progress.close()
    [admin] = made
    found = admin.list_topics(progress.topic, timeout=10.0).topics[progress.topic]
    assert found.error is not None, f"made by the look-up: {len(found.partitions)} partition(s)"
