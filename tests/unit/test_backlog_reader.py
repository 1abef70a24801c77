"""A backlog reader kept for as long as its process runs (the dashboard's, the exporter's) asks
with a new admin client after a read Kafka did not answer."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline import KafkaUnavailableError, Settings, _backlog
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
