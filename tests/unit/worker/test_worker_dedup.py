"""The event loop's side of idempotency keys: duplicates skipped at intake, keys settled with
the offset (records in the transaction before the offset finishes, the slot free at once)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Coroutine, Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from pipeline import Job, Pipeline, Priority, Settings
from pipeline._deduptable import DedupTable
from pipeline._registry import JobOptions
from pipeline.dedup import DedupPolicy, DedupScope, KeyOutcome, MemoryDedupStore, PartitionTables
from pipeline.testing import InMemoryTransport
from pipeline_worker._metrics import WorkerMetrics
from pipeline_worker._work import PartitionState
from pipeline_worker.commit.moves import Mover
from pipeline_worker.route.dedup import Deduplicator
from pipeline_worker.route.policy import Record

from ..test_transactions import FakeProducer
from .support import PRIORITIES, Harness
from .test_worker_executor import until


class HeldMover:
    """Takes records like the worker's mover; the test says when they are in the transaction."""

    def __init__(self) -> None:
        self.records: list[Record] = []
        self.waiting: list[Callable[[bool], None]] = []
        self.changed = asyncio.Event()

    def submit(
        self,
        where: tuple[str, int],
        offset: int,
        records: Sequence[Record],
        done: Callable[[bool], None],
        *,
        move: bool = True,
        state: PartitionState | None = None,
        elsewhere: Sequence[tuple[str, int]] = (),
    ) -> None:
        assert not move
        self.records += records
        self.waiting.append(done)
        self.changed.set()

    def drain(self) -> None:
        waiting, self.waiting = self.waiting, []
        for done in waiting:
            done(True)


class ChangelogStore(MemoryDedupStore):
    """The memory store, but with changelog records, like the Kafka store."""

    def __init__(self) -> None:
        PartitionTables.__init__(self, create=True, changelog=True)


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 20))


def keyed(h: Harness, n: int, key: str, message_key: bytes | None = None) -> Any:
    """A keyed job, its message keyed by its idempotency key (as producers must) unless
    ``message_key`` is given."""
    job = Job(
        id=f"job-{n}", type="charge", payload=json.dumps({"n": n}).encode(), idempotency_key=key
    )
    return h.message("charge", value=h.app.codec.encode(job), key=message_key or key.encode())


def make(store: MemoryDedupStore, mover: HeldMover, app: Pipeline) -> Deduplicator:
    return Deduplicator(
        store,
        changelog="acme.dedup",
        topics={p: app.topics.jobs(p) for p in PRIORITIES},
        mover=mover,  # type: ignore[arg-type]
        metrics=WorkerMetrics(),
        default_ttl_s=60.0,
    )


def test_duplicates_are_acknowledged_without_running_and_keys_settle_with_the_offset() -> None:
    ran: list[int] = []

    async def main() -> None:
        app = Pipeline(transport=InMemoryTransport())

        @app.job("charge")
        async def charge(n: int) -> None:
            ran.append(n)

        mover = HeldMover()
        store = ChangelogStore()
        dedup = make(store, mover, app)
        h = Harness(app, dedup=dedup, concurrency=1)
        h.feed(keyed(h, 0, "a"), keyed(h, 1, "a"), keyed(h, 2, "b"), keyed(h, 3, "a"))
        # Both distinct keys ran, one after the other on the single slot: a job whose record
        # waits for the transaction does not hold its slot.
        await until(lambda: len(ran) >= 2 and len(mover.records) >= 2, mover.changed)
        assert ran == [0, 2]
        assert h.processor.in_flight == 0
        assert h.partition.commit_offset == 0, "an offset finished before its key's record"
        mover.drain()
        assert h.partition.commit_offset == 4
        assert [r.key for r in mover.records] == [b"*/a", b"*/b"]
        assert all(r.topic == "acme.dedup" and r.partition == 0 for r in mover.records)
        assert dict(dedup._metrics.deduplicated) == {("charge", "duplicate"): 2}

    run(main)


def test_a_job_keyed_by_another_message_key_runs_and_its_producer_is_warned_of(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Its copies under other message keys land on other partitions, whose tables do not hold
    its key: they run again, and only the worker can see why."""
    ran: list[int] = []

    async def main() -> None:
        app = Pipeline(transport=InMemoryTransport())

        @app.job("charge")
        def charge(n: int) -> None:
            ran.append(n)

        mover = HeldMover()
        h = Harness(app, dedup=make(ChangelogStore(), mover, app), concurrency=4)
        h.feed(keyed(h, 0, "a"), keyed(h, 1, "b", message_key=b"other"), keyed(h, 2, "c", b"\0"))
        await until(lambda: len(ran) == 3, mover.changed)

    with caplog.at_level(logging.WARNING, logger="pipeline.worker.dedup"):
        run(main)
    assert sorted(ran) == [0, 1, 2]
    [warning] = caplog.records  # once a minute per topic
    text = warning.getMessage()
    assert "job job-1 of type charge" in text
    assert "the idempotency key 'b' but the message key b'other'" in text
    assert "key each job's message by its idempotency key" in text


def test_a_job_ending_while_its_partition_is_revoked_still_records_its_key() -> None:
    """Its offset is committed on the way out: without the record, its key would run again."""
    app = Pipeline(transport=InMemoryTransport())
    store = PartitionTables(changelog=True)
    dedup = make(store, HeldMover(), app)  # type: ignore[arg-type]
    topic = app.topics.jobs(PRIORITIES[0])
    state = PartitionState(topic, 0, PRIORITIES[0], 0)
    store.install((topic, 0), DedupTable())
    job = Job(id="job-1", type="charge", payload=b"{}", idempotency_key="k")
    charge: Any = SimpleNamespace(name="charge", options=JobOptions())
    assert dedup.admit(state, job, charge, b"k")
    state.active = False  # revoking: the loop dispatches no more of it
    [record] = dedup.settle(state, job, charge, KeyOutcome.SUCCEEDED)
    assert record.key == b"*/k"
    store.drop((topic, 0))  # given up: the next owner runs it again
    assert dedup.settle(state, job, charge, KeyOutcome.SUCCEEDED) == []


@pytest.mark.parametrize("plain", [True, False], ids=["inlined", "through-endings"])
def test_a_revocation_waits_for_the_key_record_of_a_job_that_ended(plain: bool) -> None:
    """A keyed job that succeeded just before its partition was revoked: its key's record still
    waits for the transaction. The partition counts the job until the record is written, as it
    counts a failed job until its move is; else the revocation released the partition at once,
    the record was refused, the offset stayed unfinished and the next owner ran the job again."""

    async def main() -> None:
        app = Pipeline(transport=InMemoryTransport())

        @app.job("charge")
        async def charge(n: int) -> None:
            pass

        mover = HeldMover()
        h = Harness(app, dedup=make(ChangelogStore(), mover, app), plain=plain)
        h.feed(keyed(h, 0, "a"))
        await until(lambda: bool(mover.records), mover.changed)
        state = h.partition
        assert h.processor.in_flight == 0  # its slot is free
        assert state.in_flight == 1  # its partition still counts it
        state.active = False  # the revocation, as the worker's runtime makes it
        h.processor.drop([state])
        waiting: list[bool] = []

        def written() -> None:  # the record is in the transaction
            waiting.append(h.processor.idle.waiting)
            mover.drain()

        asyncio.get_running_loop().call_soon(written)
        assert await h.processor.wait_idle([state], 5.0)
        assert waiting == [True]  # the revocation waited for the record
        assert state.in_flight == 0
        assert state.commit_offset == 1  # committed with the record, not run again

    run(main)


def test_a_key_of_every_priority_expires_into_a_job_partition_the_worker_owns() -> None:
    """Namespace scope, priority topics of unequal partition counts: the worker owns partition
    4 of ``default`` alone (``high`` has 3). A ``*/<key>`` tombstone goes with default[4]:
    mapped to high[4], which nobody owns, it was refused, and changelog partition 4 never
    shed a key."""
    loop = asyncio.new_event_loop()
    producer = FakeProducer()
    mover = Mover(Settings(namespace="acme"), loop, producer_factory=lambda conf: producer)  # type: ignore[arg-type,return-value]
    app = Pipeline(transport=InMemoryTransport())
    store = ChangelogStore()
    dedup = Deduplicator(
        store,
        changelog="acme.dedup",
        topics={p: app.topics.jobs(p) for p in (Priority.HIGH, Priority.DEFAULT)},
        mover=mover,
        metrics=WorkerMetrics(),
        default_ttl_s=60.0,
    )
    where = (app.topics.jobs(Priority.DEFAULT), 4)
    policy = DedupPolicy(ttl_s=1)
    store.check(where, "order-1", "job-1", policy=policy, now_ms=1_000)
    store.settle(where, "order-1", "job-1", KeyOutcome.SUCCEEDED, policy=policy, now_ms=1_000)
    try:
        dedup.expire()  # now: long after its hold ended
        mover.drain(lambda w: w == where, lambda w: 0)
        assert producer.produced == [("acme.dedup", None, b"*/order-1", 4, None)]
        assert mover.touched() == [where]  # committed with default[4]'s offset
    finally:
        loop.close()


def test_priority_topics_of_unequal_partition_counts_are_warned_of_under_the_namespace_scope(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = Pipeline(transport=InMemoryTransport())
    dedup = make(MemoryDedupStore(), HeldMover(), app)
    high, default = app.topics.jobs(Priority.HIGH), app.topics.jobs(Priority.DEFAULT)
    dedup.partition_counts({high: 6, default: 6})
    assert not caplog.records
    for _ in range(2):  # once for the same counts
        dedup.partition_counts({high: 3, default: 6})
    [warning] = caplog.records
    assert f"({high}: 3, {default}: 6)" in warning.getMessage()
    assert "pipeline topics apply" in warning.getMessage()
    dedup._scope = DedupScope.PRIORITY
    dedup.partition_counts({high: 2, default: 6})
    assert len(caplog.records) == 1
