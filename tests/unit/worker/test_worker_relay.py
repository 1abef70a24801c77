"""The retry relay's reading of its tiers against a fake consumer and transactional producer."""

from __future__ import annotations

import sys
import threading
from typing import Any

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_INVALID,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from pipeline import Job, Settings
from pipeline._codec import DeadLetterCodec
from pipeline._records import DeadLetter, DeadLetterReason
from pipeline_worker._metrics import WorkerMetrics
from pipeline_worker.recovery import relay as relay_module
from pipeline_worker.recovery.detours import AHEAD_MARGIN_MS, Detours
from tests.unit.test_transactions import FakeProducer, abortable, fenced, retriable

TIER = "acme.retry.0"
MAX_BYTES = 1_000_000
"""librdkafka's default ``message.max.bytes``, which the relay's producer keeps."""


class FakeConsumer:
    """One consumer of the retry tiers: a log per partition, a position, committed offsets."""

    def __init__(self, conf: dict[str, Any]) -> None:
        self.log: dict[tuple[str, int], list[Message]] = {}
        self.position_of: dict[tuple[str, int], int] = {}
        self.group_committed: dict[tuple[str, int], int] = {}
        self.paused: set[tuple[str, int]] = set()

    def consume(self, n: int, timeout: float) -> list[Message]:
        out: list[Message] = []
        for where, messages in self.log.items():
            at = self.position_of.get(where, 0)
            while where not in self.paused and at < len(messages) and len(out) < n:
                out.append(messages[at])
                at += 1
            self.position_of[where] = at
        return out

    def committed(self, tps: list[TopicPartition], timeout: float = -1) -> list[TopicPartition]:
        return [
            TopicPartition(
                tp.topic,
                tp.partition,
                self.group_committed.get((tp.topic, tp.partition), OFFSET_INVALID),
            )
            for tp in tps
        ]

    def seek(self, tp: TopicPartition) -> None:
        self.position_of[(tp.topic, tp.partition)] = (
            0 if tp.offset == OFFSET_BEGINNING else tp.offset
        )

    def position(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        return [
            TopicPartition(
                tp.topic, tp.partition, self.position_of.get((tp.topic, tp.partition), -1)
            )
            for tp in tps
        ]

    def commit(self, *, offsets: list[TopicPartition], asynchronous: bool = True) -> None:
        for tp in offsets:
            self.group_committed[(tp.topic, tp.partition)] = tp.offset

    def pause(self, tps: list[TopicPartition]) -> None:
        self.paused |= {(tp.topic, tp.partition) for tp in tps}

    def resume(self, tps: list[TopicPartition]) -> None:
        self.paused -= {(tp.topic, tp.partition) for tp in tps}

    def consumer_group_metadata(self) -> object:
        return object()

    def incremental_assign(self, tps: list[TopicPartition]) -> None:
        pass

    def incremental_unassign(self, tps: list[TopicPartition]) -> None:
        for tp in tps:
            self.log.pop((tp.topic, tp.partition), None)


class GroupCommits(FakeProducer):
    """A fake transactional producer whose committed offsets land in the consumer's group
    (``group``); mixed in before the fake it extends."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.group: FakeConsumer | None = None
        self._offsets: list[TopicPartition] = []

    def send_offsets_to_transaction(
        self, positions: list[TopicPartition], group_metadata: Any, timeout: float = -1, /
    ) -> None:
        super().send_offsets_to_transaction(positions, group_metadata, timeout)
        self._offsets = positions

    def commit_transaction(self, timeout: float = -1, /) -> None:
        super().commit_transaction(timeout)
        assert self.group is not None
        self.group.commit(offsets=self._offsets)


class CommittingProducer(GroupCommits):
    """:class:`GroupCommits` refusing a message larger than it sends, as librdkafka does before
    taking it."""

    def __init__(self) -> None:
        super().__init__(MAX_BYTES)


Relay = tuple[relay_module.RetryRelay, FakeConsumer, CommittingProducer]


@pytest.fixture
def fakes(monkeypatch: pytest.MonkeyPatch) -> Relay:
    producer = CommittingProducer()
    monkeypatch.setattr(relay_module, "Consumer", FakeConsumer)
    monkeypatch.setattr(relay_module, "Producer", lambda conf: producer)
    relay = relay_module.RetryRelay(
        Settings(namespace="acme"), "acme.workers", WorkerMetrics(), on_failed=print
    )
    consumer: FakeConsumer = relay._consumer  # type: ignore[assignment]
    producer.group = consumer
    return relay, consumer, producer


def test_jobs_of_an_aborted_transaction_are_forwarded_again_on_a_tier_never_committed(
    fakes: Relay,
) -> None:
    relay, consumer, producer = fakes
    codec = relay._codec
    jobs_on_the_tier(relay, consumer, 3)
    producer.failing("send_offsets_to_transaction", abortable())
    relay._turn()  # the three jobs forwarded in one transaction...
    relay._commit()  # ...which Kafka aborts: nothing of it is visible
    assert producer.committed == []
    for _ in range(2):
        relay._turn()
        relay._commit()
    [forwarded] = producer.committed
    assert [codec.decode(value or b"").id for _, value in forwarded] == [
        "job-0",
        "job-1",
        "job-2",
    ]
    assert consumer.group_committed[(TIER, 0)] == 3


def test_an_abort_in_a_revocation_reads_again_after_the_callback(fakes: Relay) -> None:
    # The revocation commits what was forwarded; Kafka aborts it. Asking for the committed
    # offsets (a blocking call) inside the rebalance callback would break the client.
    relay, consumer, producer = fakes
    codec = relay._codec
    for partition in (0, 1):
        consumer.log[(TIER, partition)] = [
            Message(
                topic=TIER,
                partition=partition,
                offset=0,
                value=codec.encode(Job(id=f"job-{partition}", type="t", payload=b"{}")),
            )
        ]
    relay._on_assign(consumer, [TopicPartition(TIER, 0), TopicPartition(TIER, 1)])  # type: ignore[arg-type]
    relay._turn()
    producer.failing("send_offsets_to_transaction", abortable())
    asked: list[int] = []
    committed = consumer.committed

    def counted(tps: list[TopicPartition], timeout: float = -1) -> list[TopicPartition]:
        asked.append(len(tps))
        return committed(tps, timeout)

    consumer.committed = counted  # type: ignore[method-assign]
    relay._on_revoke(consumer, [TopicPartition(TIER, 1)])  # type: ignore[arg-type]
    assert asked == []
    for _ in range(2):
        relay._turn()
        relay._commit()
    assert asked == [1]  # partition 0, read again after the poll
    [forwarded] = producer.committed
    assert [codec.decode(value or b"").id for _, value in forwarded] == ["job-0"]


def jobs_on_the_tier(relay: relay_module.RetryRelay, consumer: FakeConsumer, count: int) -> None:
    codec = relay._codec
    consumer.log[(TIER, 0)] = [
        Message(
            topic=TIER,
            partition=0,
            offset=offset,
            value=codec.encode(Job(id=f"job-{offset}", type="t", payload=b"{}")),
        )
        for offset in range(count)
    ]
    relay._on_assign(consumer, [TopicPartition(TIER, 0)])  # type: ignore[arg-type]


def forwarded_ids(relay: relay_module.RetryRelay, producer: CommittingProducer) -> list[str]:
    return [
        relay._codec.decode(value or b"").id
        for transaction in producer.committed
        for _, value in transaction
    ]


def forwarded_again_after_a_failed_commit(fakes: Relay, *errors: BaseException) -> None:
    """Two jobs on the tier, forwarded in a transaction whose commit raises ``errors``: nothing
    of it is visible, and the next turns forward both again and commit them; nothing stops."""
    relay, consumer, producer = fakes
    failed: list[BaseException] = []
    relay._on_failed = failed.append
    jobs_on_the_tier(relay, consumer, 2)
    producer.failing("commit_transaction", *errors)
    relay._turn()
    relay._commit()
    assert producer.committed == []
    for _ in range(2):
        relay._turn()
        relay._commit()
    assert forwarded_ids(relay, producer) == ["job-0", "job-1"]
    assert consumer.group_committed[(TIER, 0)] == 2
    assert failed == []


def test_a_commit_kafka_does_not_answer_is_read_again_not_the_end_of_the_worker(
    fakes: Relay,
) -> None:
    # The broker is down while the relay commits: every attempt times out (retriable), the
    # library gives up (KafkaUnavailableError, the transaction aborted). An outage must not
    # stop the worker: the relay reads the jobs again and forwards them once Kafka is back.
    relay, _, _ = fakes
    relay._txn._sleep = lambda seconds: None
    forwarded_again_after_a_failed_commit(fakes, *[retriable() for _ in range(5)])


def test_a_producer_that_fails_for_good_is_replaced_and_the_jobs_forwarded_again(
    fakes: Relay,
) -> None:
    # Kafka fenced the relay's producer (its transaction timed out): a new one (here the same
    # fake) registers the relay's transactional id again, and the relay reads the jobs again.
    relay, _, producer = fakes
    relay._txn.init()  # what the relay's thread does first
    forwarded_again_after_a_failed_commit(fakes, fenced())
    assert relay._txn.renewals == 1
    assert producer.calls.count("init_transactions") == 2  # the new producer registered


def test_a_rewind_kafka_does_not_answer_is_tried_again(fakes: Relay) -> None:
    # After an abort the relay asks for the committed offsets; while the broker is down that
    # times out. The relay must try again later, not die (and stop the worker with it).
    relay, consumer, producer = fakes
    jobs_on_the_tier(relay, consumer, 2)
    producer.failing("send_offsets_to_transaction", abortable())
    relay._turn()
    relay._commit()  # aborted: the rewind is due after the next poll
    committed = consumer.committed
    outage = [True]

    def unanswered(tps: list[TopicPartition], timeout: float = -1) -> list[TopicPartition]:
        if outage:
            outage.pop()
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "timed out", retriable=True))
        return committed(tps, timeout)

    consumer.committed = unanswered  # type: ignore[method-assign]
    relay._turn()  # the broker does not answer the rewind
    for _ in range(3):
        relay._turn()
        relay._commit()
    assert forwarded_ids(relay, producer) == ["job-0", "job-1"]
    assert consumer.group_committed[(TIER, 0)] == 2


def tier_of(relay: relay_module.RetryRelay, consumer: FakeConsumer, *values: bytes) -> None:
    """``values`` on partition 0 of tier 0, which the relay owns."""
    consumer.log[(TIER, 0)] = [
        Message(topic=TIER, partition=0, offset=offset, value=value, key=b"k")
        for offset, value in enumerate(values)
    ]
    relay._on_assign(consumer, [TopicPartition(TIER, 0)])  # type: ignore[arg-type]


def written(producer: CommittingProducer) -> list[tuple[str, bytes | None]]:
    return [record for transaction in producer.committed for record in transaction]


def letter_of(value: bytes | None) -> DeadLetter:
    return DeadLetterCodec().decode(value or b"")


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The relay's wall clock, in ms: the test moves it."""
    now = [1_700_000_000_000]
    monkeypatch.setattr(relay_module, "now_ms", lambda: now[0])
    return now


def test_a_retried_job_larger_than_the_relay_sends_is_dead_lettered_and_the_tier_moves_on(
    fakes: Relay,
) -> None:
    # A worker allowed larger messages wrote it to the tier. Forwarding it made the producer
    # refuse it, which failed the transaction and stopped the worker, at every restart.
    relay, consumer, producer = fakes
    failed: list[BaseException] = []
    relay._on_failed = failed.append
    codec = relay._codec
    big = codec.encode(Job(id="big", type="t", payload=b"x" * MAX_BYTES, tenant="acme"))
    small = codec.encode(Job(id="small", type="t", payload=b"{}"))
    tier_of(relay, consumer, big, small)
    relay._turn()
    relay._commit()
    [(dlq, value), forwarded] = written(producer)
    assert forwarded == ("acme.jobs.default", small)
    assert dlq == "acme.dlq"
    letter = letter_of(value)
    assert letter.reason == DeadLetterReason.TOO_LARGE
    assert (letter.job_id, letter.job_type, letter.tenant) == ("big", "t", "acme")
    assert letter.job is None
    assert letter.raw_value is None
    assert (letter.source_topic, letter.source_partition, letter.source_offset) == (TIER, 0, 0)
    assert f"{TIER}[0] at offset 0" in letter.message
    assert f"message.max.bytes {MAX_BYTES}" in letter.message
    assert consumer.group_committed[(TIER, 0)] == 2
    assert failed == []


def test_an_undecodable_tier_message_too_large_for_its_letter_is_dead_lettered_without_it(
    fakes: Relay,
) -> None:
    relay, consumer, producer = fakes
    garbage = b"\xc3\x01" + b"?" * (MAX_BYTES - 100)  # fits; its letter with it would not
    tier_of(relay, consumer, garbage)
    relay._turn()
    relay._commit()
    [(dlq, value)] = written(producer)
    letter = letter_of(value)
    assert (dlq, letter.reason, letter.raw_value) == ("acme.dlq", "decode_error", None)
    assert f"{TIER}[0] at offset 0" in letter.message
    assert consumer.group_committed[(TIER, 0)] == 1


def test_a_tier_head_due_far_beyond_its_tier_goes_to_the_deferred_topic_unchanged(
    fakes: Relay, clock: list[int]
) -> None:
    # Parked until its not_before (a day away), it held every job behind it as long.
    relay, consumer, producer = fakes
    codec = relay._codec
    far = codec.encode(Job(id="far", type="t", payload=b"{}", not_before=clock[0] + 86_400_000))
    due = codec.encode(Job(id="due", type="t", payload=b"{}", not_before=clock[0]))
    tier_of(relay, consumer, far, due)
    relay._turn()
    relay._commit()
    assert written(producer) == [("acme.deferred", far), ("acme.jobs.default", due)]
    assert consumer.paused == set()
    assert relay.parked == 0
    assert consumer.group_committed[(TIER, 0)] == 2
    assert relay._metrics.retries == {("?", "deferred"): 1}


def test_a_far_ahead_job_read_behind_a_parked_head_is_deferred_in_its_turn(
    fakes: Relay, clock: list[int]
) -> None:
    relay, consumer, producer = fakes
    codec = relay._codec
    head = codec.encode(Job(id="head", type="t", payload=b"{}", not_before=clock[0] + 10_000))
    far = codec.encode(Job(id="far", type="t", payload=b"{}", not_before=clock[0] + 86_400_000))
    after = codec.encode(Job(id="after", type="t", payload=b"{}", not_before=clock[0]))
    tier_of(relay, consumer, head, far, after)
    relay._turn()  # the head is due in 10 s: parked, the partition paused
    assert (written(producer), consumer.paused) == ([], {(TIER, 0)})
    clock[0] += 10_000
    relay._turn()
    relay._commit()
    assert written(producer) == [
        ("acme.jobs.default", head),
        ("acme.deferred", far),
        ("acme.jobs.default", after),
    ]
    assert consumer.paused == set()
    assert consumer.group_committed[(TIER, 0)] == 3


@pytest.mark.parametrize(
    ("tier", "ahead_s", "deferred"),
    [
        (0, 0.0, False),
        (0, 30.0, False),  # the longest delay the worker gives tier 0: tier 1's
        (1, 300.0 + AHEAD_MARGIN_MS / 1000, False),
        (1, 300.0 + AHEAD_MARGIN_MS / 1000 + 0.001, True),
        (3, 3600.0 + AHEAD_MARGIN_MS / 1000, False),  # the last tier: twice its own
        (3, 3600.0 + AHEAD_MARGIN_MS / 1000 + 0.001, True),
    ],
)
def test_a_job_waits_on_its_tier_up_to_the_longest_delay_the_worker_gives_it(
    tier: int, ahead_s: float, deferred: bool
) -> None:
    detours = Detours(Settings(namespace="acme"), DeadLetterCodec())  # 5 s, 30 s, 5 min, 30 min
    now = 1_700_000_000_000
    job = Job(id="j", type="t", payload=b"{}", not_before=now + round(ahead_s * 1000))
    message = Message(topic=f"acme.retry.{tier}", partition=0, offset=7)
    assert detours.too_far(message, job, now) is deferred


def test_the_jobs_of_an_aborted_transaction_are_counted_once_committed(fakes: Relay) -> None:
    relay, consumer, producer = fakes
    jobs_on_the_tier(relay, consumer, 3)
    producer.failing("send_offsets_to_transaction", abortable())
    relay._turn()
    relay._commit()  # aborted: read and forwarded again below
    assert relay._metrics.relayed == {}
    for _ in range(2):
        relay._turn()
        relay._commit()
    assert relay._metrics.relayed == {TIER: 3}


def test_moves_counted_by_two_threads_at_once_are_all_counted() -> None:
    # The loop (the router) and the relay thread count moves in one table.
    metrics = WorkerMetrics()
    per_thread = 100_000

    def count() -> None:
        for _ in range(per_thread):
            metrics.count_move("t", False, "retry.0")

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch as often as they can: a lost count shows
    try:
        threads = [threading.Thread(target=count) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(switch)
    assert metrics.retries[("t", "retry.0")] == 2 * per_thread
