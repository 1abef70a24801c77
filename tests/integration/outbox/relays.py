"""``pipeline outbox relay`` processes, and business transactions that write outbox jobs."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, TopicPartition
from ops.webproc import start_logged

from pipeline import Pipeline
from pipeline.outbox import connect, create_table, outbox_status
from tests.waiting import wait_for

from ..worker.harness import REPO_ROOT, WorkerProcess

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from pipeline import Settings
    from pipeline.outbox import OutboxRelay


def pending(dsn: str) -> int:
    """Rows of the outbox table not relayed yet."""
    return outbox_status(dsn).pending


@contextlib.contextmanager
def relay_in_thread(relay: OutboxRelay) -> Iterator[OutboxRelay]:
    """``relay`` running on a thread of this process until the block ends (then stopped and
    joined)."""
    stop = threading.Event()
    thread = threading.Thread(target=relay.run, args=(stop,), daemon=True)
    thread.start()
    try:
        yield relay
    finally:
        stop.set()
        thread.join(60)


@dataclass
class RelayLauncher:
    """Starts relays of the settings' namespace; :meth:`stop_all` kills every one still running."""

    settings: Settings
    log_dir: Path
    started: list[WorkerProcess] = field(default_factory=list)

    def start(self, dsn: str, *args: str) -> WorkerProcess:
        number = len(self.started) + 1
        command = [
            str(Path(sys.executable).parent / "pipeline"),
            "outbox",
            "relay",
            "--dsn",
            dsn,
            *args,
        ]
        env = {
            **os.environ,
            "PIPELINE_BOOTSTRAP_SERVERS": self.settings.bootstrap_servers,
            "PIPELINE_NAMESPACE": self.settings.namespace,
            "PYTHONUNBUFFERED": "1",
        }
        log_path = self.log_dir / f"relay-{number}.log"
        popen = start_logged(command, log_path, env, REPO_ROOT)
        relay = WorkerProcess(popen, log_path, command, f"relay-{number}")
        self.started.append(relay)
        return relay

    def stop_all(self) -> None:
        for relay in self.started:
            relay.kill()


@dataclass
class Written:
    """What the business transactions did: the jobs of committed and of rolled-back ones."""

    committed: list[str] = field(default_factory=list)
    rolled_back: list[str] = field(default_factory=list)


def write_orders(
    app: Pipeline,
    dsn: str,
    count: int,
    *,
    per_transaction: int = 50,
    rollback_every: int = 5,
    job_type: str = "noop",
    key_of: Any = None,
    start: int = 0,
) -> Written:
    """``count`` jobs (``n`` from ``start`` on), each with an order row, in transactions of
    ``per_transaction``; every ``rollback_every``-th transaction is rolled back (its orders and
    jobs with it)."""
    connection, _ = connect(dsn)
    written = Written()
    try:
        create_table(connection)
        cursor = connection.cursor()
        cursor.execute("CREATE TABLE IF NOT EXISTS orders (n INTEGER PRIMARY KEY)")
        connection.commit()
        placeholder = "?" if dsn.startswith("sqlite:") else "%s"
        outbox = app.outbox(connection)
        for first in range(start, start + count, per_transaction):
            ids = []
            for n in range(first, min(first + per_transaction, start + count)):
                cursor.execute(f"INSERT INTO orders (n) VALUES ({placeholder})", (n,))
                options = {} if key_of is None else {"key": key_of(n)}
                ids.append(outbox.enqueue(job_type, {"n": n}, **options))
            if ((first - start) // per_transaction) % rollback_every == rollback_every - 1:
                connection.rollback()
                written.rolled_back.extend(ids)
            else:
                connection.commit()
                written.committed.extend(ids)
        cursor.close()
    finally:
        connection.close()
    return written


def read_topic(settings: Settings, topic: str, timeout: float = 60.0) -> list[Message]:
    """Every committed record of ``topic`` now: read from the start to the last stable offset of
    each partition (so a test sees duplicates too, without waiting for anything to arrive)."""
    consumer = Consumer(
        {
            "bootstrap.servers": settings.bootstrap_servers,
            "group.id": f"{settings.namespace}.read-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {}
        for partition in partitions:
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
            ends[partition] = high
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        records: list[Message] = []

        def done() -> bool:
            for message in consumer.consume(1000, timeout=0.1):
                if message.error() is None:
                    records.append(message)
            positions = consumer.position([TopicPartition(topic, p) for p in partitions])
            return all(tp.offset >= ends[tp.partition] for tp in positions if ends[tp.partition])

        assert wait_for(done, timeout, interval=0), f"could not read {topic} to its end"
        return records
    finally:
        consumer.close()


def assert_published_once(settings: Settings, job_ids: Iterable[str]) -> None:
    """Every job of ``job_ids`` (the committed ones) is on ``<ns>.jobs.default`` exactly once,
    and no other job is (none lost, none doubled)."""
    codec = Pipeline(settings).codec
    records = read_topic(settings, f"{settings.namespace}.jobs.default")
    published = Counter(codec.decode(record.value() or b"").id for record in records)
    assert sorted(published) == sorted(job_ids)
    assert set(published.values()) == {1}, "a batch was published twice"
