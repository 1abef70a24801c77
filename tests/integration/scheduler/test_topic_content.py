"""What other writers may leave on the scheduler's topics never stops it.

Schedules written in a Kafka transaction (Kafka Connect, MirrorMaker 2, a Java tool) end the
topic with a transaction marker rather than a record; an undecodable delayed job may be as
large as Kafka allows; a key may be any bytes. The leader fires, dead-letters or skips, and
every other delayed job and schedule goes on.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from confluent_kafka import Consumer, Message, Producer

from pipeline import Job, JobCodec, Pipeline
from pipeline._codec import DeadLetterCodec, ScheduleCodec
from pipeline._job import new_job_id, now_ms
from pipeline._records import DeadLetter, DeadLetterReason, Schedule
from pipeline._settings import Settings
from pipeline._topics import TopicNames

from .conftest import Released, SchedulerFactory, collect, job_consumer

EVERY_2S = "* * * * * */2"


def test_schedules_written_in_a_transaction_fire(schedulers: SchedulerFactory) -> None:
    settings = schedulers.settings
    topic = TopicNames(settings.namespace).schedules
    producer = Producer(
        {
            "bootstrap.servers": settings.bootstrap_servers,
            "transactional.id": f"{settings.namespace}.other-writer",
        }
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    schedule = Schedule(
        name="txn", cron=EVERY_2S, job_type="cron.txn", payload=b"{}", created_at=now_ms()
    )
    producer.produce(topic, ScheduleCodec().encode(schedule), b"txn")
    producer.commit_transaction(30)
    # An aborted one after it: the topic ends with records a read_committed reader never sees.
    producer.begin_transaction()
    producer.produce(topic, b"aborted", b"txn")
    producer.flush(30)
    producer.abort_transaction(30)
    fired, output = _released(schedulers, 1)
    # One fire at least: a scheduler that took longer than 2 s to lead fires the one before too.
    assert fired, output
    assert {r.job.type for r in fired} == {"cron.txn"}, output


def dead_letters(settings: Settings, count: int, timeout: float) -> list[DeadLetter]:
    consumer = Consumer(
        {
            "bootstrap.servers": settings.bootstrap_servers,
            "group.id": f"{settings.namespace}.test-dlq",
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    consumer.subscribe([TopicNames(settings.namespace).dlq])
    try:
        messages: list[Message] = []
        while len(messages) < count:
            batch = consumer.consume(10, timeout)
            if not batch:
                break
            messages += [m for m in batch if m.error() is None]
        return [DeadLetterCodec().decode(m.value() or b"") for m in messages]
    finally:
        consumer.close()


def test_an_undecodable_delayed_message_too_large_to_dead_letter_whole_stops_nothing(
    schedulers: SchedulerFactory,
) -> None:
    """Its dead letter cannot carry its bytes (the letter would exceed Kafka's message size);
    it goes without them, says so, and the other delayed jobs are released."""
    settings = schedulers.settings
    names = TopicNames(settings.namespace)
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers})
    producer.produce(names.deferred, b"x" * 999_900, b"big", partition=0)
    # Delayed jobs after it in its partition: read only once it was dealt with.
    jobs = [Job(id=new_job_id(), type="t", payload=b"{}", not_before=now_ms() + 500)]
    jobs += [replace(jobs[0], id=new_job_id()) for _ in range(2)]
    _behind(producer, names.deferred, jobs)
    ids = {job.id for job in jobs}
    released, output = _released(schedulers, 3)
    assert {r.job.id for r in released} == ids, output
    letters = dead_letters(settings, 1, timeout=10)
    assert len(letters) == 1
    letter = letters[0]
    assert letter.reason == DeadLetterReason.DECODE_ERROR
    assert letter.raw_value is None
    assert letter.raw_key == b"big"
    assert "999900-byte value left out" in letter.message


@pytest.mark.parametrize("topic", ["scheduler_state", "schedules"])
def test_a_key_that_is_not_utf8_on_a_table_topic_is_not_fatal(
    schedulers: SchedulerFactory, topic: str
) -> None:
    """``<ns>.scheduler-state`` is read whole when a term begins, and so is ``<ns>.schedules``
    with ``--app``; a key that is not UTF-8 there crashed every scheduler of the namespace."""
    settings = schedulers.settings
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers})
    producer.produce(getattr(TopicNames(settings.namespace), topic), b"junk", b"\xff\xfe")
    assert producer.flush(30) == 0
    app = Pipeline(settings)
    job_id = app.enqueue("t", {}, delay=0.5)
    app.flush()
    # The app's own schedule fires every 2 s too: only the delayed job's type is counted.
    released, output = _released(
        schedulers, 1, app="tests.integration.scheduler.cronapp:app", job_type="t"
    )
    assert job_id in {r.job.id for r in released}, output


def _released(
    schedulers: SchedulerFactory, count: int, app: str | None = None, job_type: str | None = None
) -> tuple[list[Released], str]:
    """Start a scheduler and read the jobs it releases (of ``job_type`` if given) until ``count``
    came, it exited, or 60 s passed; with the end of its output, for an assertion's message."""
    consumer = job_consumer(schedulers.settings)
    scheduler = schedulers.start(app=app)
    try:
        released = collect(
            consumer,
            count,
            timeout=60,
            until=lambda: scheduler.process.poll() is not None,
            job_type=job_type,
        )
    finally:
        consumer.close()
    return released, scheduler.output()[-3000:]


def _behind(producer: Producer, topic: str, jobs: list[Job]) -> None:
    """Write ``jobs`` to partition 0 of ``topic``, behind what is there, and wait for Kafka."""
    for job in jobs:
        producer.produce(topic, JobCodec().encode(job), job.id.encode(), partition=0)
    assert producer.flush(30) == 0


def _larger_messages_producer(settings: Settings) -> Producer:
    """A producer of another language's defaults: it sends messages of up to about 1 MiB."""
    return Producer(
        {"bootstrap.servers": settings.bootstrap_servers, "message.max.bytes": 1_040_000}
    )


@pytest.mark.slow  # an edge of releasing; the undecodable one above stays in the default run
def test_a_delayed_job_larger_than_the_scheduler_sends_is_dead_lettered_and_stops_nothing(
    schedulers: SchedulerFactory,
) -> None:
    """Another producer (a larger ``message.max.bytes``, as Java's default allows) wrote a
    valid delayed job the scheduler's producer refuses to send: releasing it would abort every
    transaction of the leader, and no delayed job or cron fire of the namespace would go out.
    It is dead-lettered (``too_large``, without its bytes, saying where they are) instead."""
    settings = schedulers.settings
    names = TopicNames(settings.namespace)
    producer = _larger_messages_producer(settings)
    due = now_ms() + 500
    big = Job(id=new_job_id(), type="big", payload=b'"' + b"x" * 1_010_000 + b'"', not_before=due)
    producer.produce(names.deferred, JobCodec().encode(big), b"big", partition=0)
    small = [Job(id=new_job_id(), type="t", payload=b"{}", not_before=due) for _ in range(2)]
    _behind(producer, names.deferred, small)
    released, output = _released(schedulers, 2)
    assert {r.job.id for r in released} == {job.id for job in small}, output
    [letter] = dead_letters(settings, 1, timeout=10)
    assert letter.reason == DeadLetterReason.TOO_LARGE
    assert (letter.job_id, letter.job_type, letter.raw_key) == (big.id, "big", b"big")
    assert letter.job is None
    assert letter.raw_value is None
    assert (letter.source_topic, letter.source_partition) == (names.deferred, 0)
    assert "message.max.bytes" in letter.message


@pytest.mark.slow  # an edge of dead-lettering; the undecodable one above stays in the default run
def test_a_delayed_message_whose_key_alone_is_too_large_to_send_stops_nothing(
    schedulers: SchedulerFactory,
) -> None:
    """Another producer (a larger ``message.max.bytes``) wrote a message whose key alone is
    more than the scheduler's producer sends. Its dead letter went keyed by that key: refused,
    it aborted every transaction of the leader, and no delayed job was released again."""
    settings = schedulers.settings
    names = TopicNames(settings.namespace)
    producer = _larger_messages_producer(settings)
    producer.produce(names.deferred, b"not a job", b"k" * 1_010_000, partition=0)
    jobs = [Job(id=new_job_id(), type="t", payload=b"{}", not_before=now_ms() + 500)]
    jobs += [replace(jobs[0], id=new_job_id()) for _ in range(2)]
    _behind(producer, names.deferred, jobs)
    released, output = _released(schedulers, 3)
    assert {r.job.id for r in released} == {job.id for job in jobs}, output
    [letter] = dead_letters(settings, 1, timeout=10)
    assert letter.reason == DeadLetterReason.DECODE_ERROR
    assert (letter.raw_key, letter.source_topic, letter.source_offset) == (None, names.deferred, 0)
