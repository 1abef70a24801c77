"""The topics a worker moves jobs to (retry tiers, deferred jobs, dead letters, events) are
checked once Kafka answers: one that is missing stops the worker at start, naming it. Nothing
else told: the worker ran, and the first failed job's move aborted every transaction of the
moves, and with them every commit of the offsets, for good."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from pipeline._errors import TopicMissingError

from .test_worker_consumer import consumer_thread, loop

__all__ = ["loop"]  # the fixture

WRITTEN = ["ns.retry.0", "ns.retry.1", "ns.retry.2", "ns.retry.3", "ns.deferred", "ns.dlq"]


def test_a_missing_topic_the_moves_write_stops_the_worker_at_start(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    thread, fake, _ = consumer_thread(loop)
    answer = fake.list_topics

    def list_topics(topic: str, timeout: float) -> Any:
        if topic == "ns.events":
            fake.topic_lists.append(topic)
            return SimpleNamespace(topics={})  # not in the cluster
        return answer(topic, timeout)

    fake.list_topics = list_topics  # type: ignore[method-assign]
    monkeypatch.setattr(thread.health, "down", True)
    thread._chores(1000.0, idle=True)
    assert fake.topic_lists == []  # not asked while Kafka is unreachable: it would block
    monkeypatch.setattr(thread.health, "down", False)
    with pytest.raises(TopicMissingError, match="pipeline topics apply") as caught:
        thread._chores(1001.0, idle=True)
    assert caught.value.topics == ["ns.events"]
    assert fake.topic_lists == [*WRITTEN, "ns.events"]


def test_the_topics_written_are_checked_once(loop: asyncio.AbstractEventLoop) -> None:
    thread, fake, _ = consumer_thread(loop)
    thread._chores(1000.0, idle=True)
    thread._chores(1001.0, idle=True)
    assert fake.topic_lists == [*WRITTEN, "ns.events"]
