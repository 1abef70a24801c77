"""Consumer lag and the paused-partitions gauge: a paused partition is not fetched, so librdkafka's
cached high watermark of it stands still; its end is asked of its leader instead (not while
Kafka is unreachable, once a lag interval). ``pipeline_partitions_paused`` counts the partitions
backpressure paused, not every pause."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

import pytest

from pipeline import Pipeline, Settings
from pipeline_worker._runtime import Worker
from pipeline_worker.intake.cluster import LAG_INTERVAL_S

from .test_worker_consumer import TOPIC, consumer_thread, loop, messages, own

__all__ = ["loop"]  # the fixture

P0, P1, P2 = (TOPIC, 0), (TOPIC, 1), (TOPIC, 2)


def test_a_paused_partitions_lag_is_read_from_its_leader_and_the_others_from_the_cache(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    thread, fake, _ = consumer_thread(loop)
    paused, _fetching = own(thread, 0, 1)
    paused.paused = True  # a full buffer: librdkafka fetches it no more
    fake.positions = {P0: 10, P1: 10}
    fake.ends = {P0: (0, 500), P1: (0, 40)}
    fake.cached_ends = {P0: (0, 20)}  # what the last fetch before the pause said
    timeouts: list[float] = []
    answer = fake.get_watermark_offsets

    def timed(tp: object, timeout: float = 0, cached: bool = False) -> tuple[int, int]:
        if not cached:
            timeouts.append(timeout)
        return answer(tp, timeout, cached)  # type: ignore[arg-type]

    monkeypatch.setattr(fake, "get_watermark_offsets", timed)
    cluster = thread._cluster
    cluster.update_lag(100.0)
    assert fake.watermark_calls == [(TOPIC, 0, False), (TOPIC, 1, True)]  # one query each
    assert len(timeouts) == 1
    assert 0 < timeouts[0] <= 1.0  # short: the consumer thread waits for it
    assert thread._metrics.lag == {P0: 490, P1: 30}
    cluster.update_lag(100.0 + LAG_INTERVAL_S / 2)  # not due yet: nothing asked
    assert len(fake.watermark_calls) == 2
    fake.ends[P0] = (0, 900)
    cluster.update_lag(100.0 + LAG_INTERVAL_S)
    assert fake.watermark_calls[2:] == [(TOPIC, 0, False), (TOPIC, 1, True)]
    assert thread._metrics.lag == {P0: 890, P1: 30}


def test_no_leader_is_asked_while_kafka_is_unreachable(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    thread, fake, _ = consumer_thread(loop)
    for state in own(thread, 0, 1):
        state.paused = True
    monkeypatch.setattr(thread.health, "down", True)
    thread._cluster.update_lag(100.0)
    assert fake.watermark_calls == [(TOPIC, 0, True), (TOPIC, 1, True)]


def test_after_a_leader_does_not_answer_the_rounds_other_paused_partitions_take_the_cache(
    loop: asyncio.AbstractEventLoop, caplog: pytest.LogCaptureFixture
) -> None:
    thread, fake, _ = consumer_thread(loop)
    for state in own(thread, 0, 1, 2):
        state.paused = True
    fake.positions = {P0: 1, P1: 1, P2: 1}
    fake.ends = {P0: (0, 9), P1: (0, 9), P2: (0, 9)}
    fake.cached_ends = {P1: (0, 5), P2: (0, 5)}
    fake.unanswered = {P1}
    with caplog.at_level(logging.WARNING, "pipeline.worker.consumer"):
        thread._cluster.update_lag(100.0)
    assert fake.watermark_calls == [
        (TOPIC, 0, False),
        (TOPIC, 1, False),  # times out: at most one such wait a round
        (TOPIC, 1, True),
        (TOPIC, 2, True),
    ]
    assert thread._metrics.lag == {P0: 8, P1: 4, P2: 4}
    assert "could not read a paused partition's end" in caplog.text


def test_the_paused_gauge_counts_the_partitions_backpressure_paused(
    loop: asyncio.AbstractEventLoop,
) -> None:
    thread, _, _ = consumer_thread(loop, buffer_size=4)
    full, arriving, _fetching = own(thread, 0, 1, 2)
    arriving.paused = True  # assigned, paused until read back (as flow.arrive leaves it)
    thread._flow.arrive([arriving])
    thread._hand(messages(0, 0, 4))  # 4 buffered: full
    assert full.paused
    worker = Worker(Pipeline(Settings(namespace="ns")))
    worker._consumer = thread
    processor = SimpleNamespace(in_flight=0, pool=SimpleNamespace(threads=0, overdue=0))
    worker._start_http(processor)  # type: ignore[arg-type]
    assert worker.registry is not None

    def gauge() -> float | None:
        assert worker.registry is not None
        return worker.registry.get_sample_value("pipeline_partitions_paused")

    assert gauge() == 1
    full.taken = 4
    thread._flow.resume_drained()
    assert gauge() == 0
    thread._flow.pause_all()  # shutdown: every partition paused, none of them by backpressure
    assert gauge() == 0
