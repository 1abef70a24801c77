"""The restore of a new partition's idempotency keys runs on a helper thread: a restore that
cannot finish holds that partition only, never the consumer thread's polls and commits of the
others, its revocations or its shutdown."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from pipeline import Priority, Settings
from pipeline._dedup import Where
from pipeline._dedupstores import DedupStore, MemoryDedupStore
from pipeline_worker._metrics import WorkerMetrics
from pipeline_worker.intake import consumer as consumer_module
from pipeline_worker.intake import keyload
from pipeline_worker.intake.consumer import ConsumerThread
from pipeline_worker.route.changelog import KafkaDedupStore
from tests.waiting import wait_for

from ..test_dedup import NOW, live
from ..test_dedup import FakeConsumer as FakeChangelog
from .test_worker_consumer import TOPIC, FakeConsumer, FakeSide, finish_all, loop, messages, own

__all__ = ["loop"]  # the fixture


class KeyedConsumer(FakeConsumer):
    def incremental_assign(self, tps: list[TopicPartition]) -> None:
        self.assignments.append([(tp.topic, tp.partition) for tp in tps])


class GatedStore(MemoryDedupStore):
    """An application's store whose load waits until the test lets it end."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, list[Where], str]] = []
        """(load or unload, partitions, the calling thread's name), loads once they ended."""
        self.loading = threading.Event()
        self.release = threading.Event()

    def load(self, partitions: Sequence[Where]) -> None:
        self.calls.append(("load started", list(partitions), threading.current_thread().name))
        self.loading.set()
        assert self.release.wait(10)
        self.release.clear()
        self.calls.append(("load", list(partitions), threading.current_thread().name))

    def unload(self, partitions: Sequence[Where]) -> None:
        self.calls.append(("unload", list(partitions), threading.current_thread().name))


class GatedChangelog(FakeChangelog):
    """A changelog whose end each restore finds only once the test lets it (``release``);
    with ``gated`` False, at once."""

    def __init__(self, *, gated: bool = True) -> None:
        super().__init__({})
        self.release = threading.Event()
        if not gated:
            self.release.set()
        self.gated = gated
        self.asked = threading.Event()

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float) -> tuple[int, int]:
        self.asked.set()
        assert self.release.wait(10)
        if self.gated:
            self.release.clear()
        return super().get_watermark_offsets(tp, timeout)


def changelog_store(changelog: GatedChangelog, **options: Any) -> KafkaDedupStore:
    def factory(conf: dict[str, Any]) -> Any:
        return changelog

    return KafkaDedupStore("ns.dedup", {}, consumer_factory=factory, clock=lambda: NOW, **options)


def keyed_thread(
    loop: asyncio.AbstractEventLoop, store: DedupStore
) -> tuple[ConsumerThread, KeyedConsumer]:
    made: list[KeyedConsumer] = []

    def factory(conf: dict[str, Any]) -> KeyedConsumer:
        made.append(KeyedConsumer(conf))
        return made[0]

    thread = ConsumerThread(
        settings=Settings(namespace="ns"),
        group_id="ns.workers",
        topics={TOPIC: (Priority.DEFAULT, 0)},
        side=FakeSide(loop),
        metrics=WorkerMetrics(),
        dedup=store,
        consumer_factory=factory,  # type: ignore[arg-type]
    )
    return thread, made[0]


def assign(thread: ConsumerThread, fake: FakeConsumer, partition: int) -> None:
    thread.rebalance.on_assign(fake, [TopicPartition(TOPIC, partition)])  # type: ignore[arg-type]


def chores_until(thread: ConsumerThread, condition: Any, timeout: float = 5.0) -> bool:
    """Turn the consumer thread's chores (as its loop does between polls) until ``condition``."""

    def turn() -> bool:
        thread._chores(time.monotonic(), idle=True)
        return bool(condition())

    return wait_for(turn, timeout, interval=0.005)


def test_a_restore_that_cannot_finish_holds_neither_the_polls_nor_the_commits_of_the_others(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """Partition 1's changelog partition has no leader: its restore fails after its timeout
    at each try. It held the consumer thread for that timeout at each try, partition 0's
    commits (and every poll) with it, where only partition 1 should wait."""
    changelog = GatedChangelog(gated=False)
    changelog.watermark_error = KafkaError(KafkaError.LEADER_NOT_AVAILABLE)
    store = changelog_store(changelog, restore_timeout_s=10.0)
    thread, fake = keyed_thread(loop, store)
    [running] = own(thread, 0)
    assign(thread, fake, 1)
    try:
        for jobs in (range(0, 5), range(5, 9)):
            thread._hand(messages(0, jobs.start, len(jobs)))
            finish_all(running)
            before, started = len(fake.commits), time.monotonic()
            thread._chores(started + jobs.start, idle=True)  # a commit is due at each
            assert time.monotonic() - started < 5.0, "the consumer thread waited for a restore"
            assert (TOPIC, 0, jobs.stop) in [tp for _, tps in fake.commits[before:] for tp in tps]
            thread._committer.on_commit(None, [TopicPartition(TOPIC, 0, jobs.stop)])
        assert (TOPIC, 1) in fake.paused
        assert thread.assignment.pending
        assert changelog.asked.is_set(), "no restore under way"
        assert not changelog.closed
    finally:
        thread.assignment.close()


def test_a_failed_restore_is_tried_again_after_a_wait_that_doubles(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(keyload, "KEYS_RETRY_S", 0.05)
    tries: list[float] = []

    class Failing(MemoryDedupStore):
        def load(self, partitions: Sequence[Where]) -> None:
            tries.append(time.monotonic())
            raise ConnectionError("the store's backend is down")

    thread, fake = keyed_thread(loop, Failing())
    assign(thread, fake, 1)
    assert chores_until(thread, lambda: len(tries) == 4)
    gaps = [b - a for a, b in itertools.pairwise(tries)]
    assert [gap >= least for gap, least in zip(gaps, (0.05, 0.1, 0.2), strict=True)] == [True] * 3
    assert (TOPIC, 1) in fake.paused


@pytest.mark.parametrize("kind", ["application's store", "Kafka store"])
def test_a_partition_revoked_and_assigned_again_during_its_restore_is_restored_anew(
    loop: asyncio.AbstractEventLoop, kind: str
) -> None:
    """The first restore's keys are those before the partition went: another member may have
    run it meanwhile. Its unload waits for the load's end (calls for one partition never
    overlap) and the partition fetches only once a restore started after it came back ended."""
    changelog = GatedChangelog()
    changelog.add(0, b"*/k", live("job-a"))
    kafka = changelog_store(changelog)
    gated = GatedStore()
    store: DedupStore = gated if kind == "application's store" else kafka
    started = gated.loading if store is gated else changelog.asked
    release = gated.release if store is gated else changelog.release
    thread, fake = keyed_thread(loop, store)
    assign(thread, fake, 0)
    assert chores_until(thread, started.is_set)
    started.clear()
    thread.rebalance.on_revoke(fake, [TopicPartition(TOPIC, 0)])  # type: ignore[arg-type]
    assign(thread, fake, 0)
    if store is gated:
        assert [c[0] for c in gated.calls] == ["load started"], "unloaded during its load"
        assert gated.calls[0][2] != threading.current_thread().name
    changelog.add(0, b"*/k2", live("job-b"))  # written by the member that ran it meanwhile
    release.set()
    assert chores_until(thread, started.is_set), "no second restore"
    assert (TOPIC, 0) in fake.paused, "resumed with the keys of the first restore"
    if store is gated:
        assert [(c[0], c[1]) for c in gated.calls] == [
            ("load started", [(TOPIC, 0)]),
            ("load", [(TOPIC, 0)]),
            ("unload", [(TOPIC, 0)]),
            ("load started", [(TOPIC, 0)]),
        ]
    else:
        assert kafka.size == 0, "the first restore's keys were installed"
    release.set()
    assert chores_until(thread, lambda: (TOPIC, 0) not in fake.paused)
    assert not thread.assignment.pending
    if store is kafka:
        assert kafka.size == 2


@pytest.mark.parametrize("kind", ["application's store", "Kafka store"])
def test_the_keys_of_a_partition_revoked_during_its_restore_are_dropped(
    loop: asyncio.AbstractEventLoop, kind: str
) -> None:
    changelog = GatedChangelog()
    changelog.add(0, b"*/k", live("job-a"))
    kafka = changelog_store(changelog)
    gated = GatedStore()
    store: DedupStore = gated if kind == "application's store" else kafka
    thread, fake = keyed_thread(loop, store)
    assign(thread, fake, 0)
    assert chores_until(thread, (gated.loading if store is gated else changelog.asked).is_set)
    thread.rebalance.on_revoke(fake, [TopicPartition(TOPIC, 0)])  # type: ignore[arg-type]
    assert not thread.assignment.pending
    (gated.release if store is gated else changelog.release).set()
    ended = (lambda: len(gated.calls) == 2) if store is gated else (lambda: changelog.closed)
    assert wait_for(ended, 5)
    assert chores_until(thread, lambda: not thread.assignment.due())
    assert kafka.size == 0
    if store is gated:
        assert [c[0] for c in gated.calls] == ["load started", "load", "unload"]


def test_a_restore_whose_partitions_were_all_given_up_is_cancelled(
    loop: asyncio.AbstractEventLoop, caplog: pytest.LogCaptureFixture
) -> None:
    """Partition 1's changelog partition has no leader and partition 1 is revoked during its
    restore. The restore went on to its timeout (a minute here), and the next assignment's
    restore waited for it (one runs at a time), then warned of partitions no longer owned and
    put the next try off."""

    class Leaderless(GatedChangelog):
        def get_watermark_offsets(self, tp: TopicPartition, timeout: float) -> tuple[int, int]:
            if tp.partition == 1:
                self.asked.set()
                raise KafkaException(KafkaError(KafkaError.LEADER_NOT_AVAILABLE))
            return super().get_watermark_offsets(tp, timeout)

    changelog = Leaderless(gated=False)
    changelog.add(2, b"*/k", live("job-a"))
    store = changelog_store(changelog, restore_timeout_s=60.0)
    thread, fake = keyed_thread(loop, store)
    try:
        assign(thread, fake, 1)
        assert chores_until(thread, changelog.asked.is_set)
        thread.rebalance.on_revoke(fake, [TopicPartition(TOPIC, 1)])  # type: ignore[arg-type]
        assign(thread, fake, 2)
        assert chores_until(thread, lambda: (TOPIC, 2) not in fake.paused, timeout=20)
        assert store.size == 1, "partition 2's keys"
        assert "could not restore" not in caplog.text
    finally:
        thread.assignment.close()


class ClosingConsumer(KeyedConsumer):
    """Enough of a consumer for the thread's whole run: assigns ``assign`` at the first poll."""

    def __init__(self, conf: dict[str, Any]) -> None:
        super().__init__(conf)
        self.callbacks: dict[str, Any] = {}
        self.closed = threading.Event()

    def subscribe(self, topics: list[str], **callbacks: Any) -> None:
        self.callbacks = callbacks

    def poll(self, timeout: float) -> Message | None:
        if not self.assignments:
            self.callbacks["on_assign"](self, [TopicPartition(TOPIC, 0)])
            self.assignments.append([(TOPIC, 0)])
        self.closed.wait(timeout)  # a poll that finds nothing waits its timeout
        return None

    def consume(self, num_messages: int, timeout: float) -> list[Message]:
        return []

    def close(self) -> None:
        self.closed.set()


def test_a_worker_stops_without_waiting_for_a_restore_that_runs(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(consumer_module, "ensure_group_configs", lambda settings: None)
    monkeypatch.setattr(consumer_module, "check_writes", lambda *args, **kwargs: None)
    store = GatedStore()
    made: list[ClosingConsumer] = []

    def factory(conf: dict[str, Any]) -> ClosingConsumer:
        made.append(ClosingConsumer(conf))
        return made[0]

    thread = ConsumerThread(
        settings=Settings(namespace="ns", worker={}),
        group_id="ns.workers",
        topics={TOPIC: (Priority.DEFAULT, 0)},
        side=FakeSide(loop),
        metrics=WorkerMetrics(),
        dedup=store,
        consumer_factory=factory,  # type: ignore[arg-type]
    )
    thread.start()
    try:
        assert store.loading.wait(5)
        polls = thread.last_poll
        assert wait_for(lambda: thread.last_poll > polls, 2), "no poll while the load runs"
        thread.stop_requested = True
        assert thread.done.wait(2), "the stop waited for the restore"
        assert made[0].closed.is_set()
    finally:
        store.release.set()
        thread.join(5)


def test_a_restore_that_ends_at_once_resumes_its_partition_in_the_turn_that_started_it(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """Taken a turn later, the partition resumed after the consumer's next poll, and librdkafka
    then often held its first fetch back for a second: a drain's first job came a second late."""
    thread, fake = keyed_thread(loop, MemoryDedupStore())
    assign(thread, fake, 1)
    try:
        thread._chores(time.monotonic(), idle=True)
        assert (TOPIC, 1) not in fake.paused
        assert not thread.assignment.pending
    finally:
        thread.assignment.close()
