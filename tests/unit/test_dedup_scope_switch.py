"""After ``worker.dedup_scope`` changes, the changelog records of the other scope go too.

A record of the other scope (``<priority>/<key>`` read under the scope namespace, ``*/<key>``
under the scope priority) is folded into the tables, but no write of this scope ever replaces
it: each such record gets its own tombstone once it has expired, or the compacted changelog
would keep it, and every restore read it, for good.
"""

from __future__ import annotations

from pipeline._dedup import ChangelogRecord, DedupScope, Entry, KeyOutcome, Verdict, encode_entry

from .test_dedup import (
    COMPLETE,
    HIGH_0,
    HOUR_MS,
    JOB_A,
    JOB_B,
    NOW,
    FakeConsumer,
    kafka_store,
    live,
)

JOB_C = "0190f5c2a1b2c3d4e5f60718293a4b5e"


def tombstones(records: object) -> list[bytes]:
    return sorted(r.key for r in records if r.value is None)  # type: ignore[attr-defined]


def test_records_of_the_per_priority_scope_are_tombstoned_under_the_namespace_scope() -> None:
    consumer = FakeConsumer({})
    consumer.add(0, b"high/live", live(JOB_A))
    consumer.add(0, b"high/expired", encode_entry(JOB_B, True, NOW))
    consumer.add(0, b"*/own", live(JOB_B))
    store = kafka_store(consumer, DedupScope.NAMESPACE)
    store.load([HIGH_0])
    assert store.table(HIGH_0).get("live") is not None
    assert b"high/expired" in tombstones(store.expire(NOW + 1))
    later = tombstones(store.expire(NOW + HOUR_MS + 1))
    assert b"high/live" in later
    assert b"*/own" in later
    assert store.expire(NOW + HOUR_MS + 2) == []  # once


def test_a_record_of_the_namespace_scope_is_tombstoned_once_under_the_priority_scope() -> None:
    consumer = FakeConsumer({})
    consumer.add(0, b"*/shared", live(JOB_A))
    store = kafka_store(consumer, DedupScope.PRIORITY)
    low_0 = ("ns.jobs.low", 0)
    store.load([HIGH_0, low_0])
    assert store.table(HIGH_0).get("shared") == store.table(low_0).get("shared")
    assert store.expire(NOW + 1) == []
    gone = tombstones(store.expire(NOW + HOUR_MS + 1))
    assert gone.count(b"*/shared") == 1
    assert {b"high/shared", b"low/shared"} <= set(gone)


def test_a_foreign_record_replaced_by_a_claim_is_still_tombstoned_at_its_expiry() -> None:
    consumer = FakeConsumer({})
    consumer.add(0, b"high/k", encode_entry(JOB_A, False, NOW + 10))
    store = kafka_store(consumer, DedupScope.NAMESPACE)
    store.load([HIGH_0])
    assert store.table(HIGH_0).get("k") is not None
    # Claimed again in this scope once the old claim expired: its record will be ``*/k``.
    store.check(HIGH_0, "k", JOB_B, policy=COMPLETE, now_ms=NOW + 20)
    assert tombstones(store.expire(NOW + 21)) == [b"high/k"]


def test_only_the_last_record_of_a_foreign_key_gets_the_tombstone_and_at_its_expiry() -> None:
    """Before compaction a key may have several records: the first one's expiry must not
    tombstone the key while the last one holds it (the next owner would restore nothing)."""
    consumer = FakeConsumer({})
    consumer.add(0, b"high/k", encode_entry(JOB_A, False, NOW + 10))
    consumer.add(0, b"high/k", encode_entry(JOB_A, True, NOW + HOUR_MS))
    consumer.add(0, b"high/gone", live(JOB_B))
    consumer.add(0, b"high/gone", None)
    store = kafka_store(consumer, DedupScope.NAMESPACE)
    store.load([HIGH_0])
    assert store.table(HIGH_0).get("gone") is None
    assert store.expire(NOW + 11) == []
    assert b"high/k" in tombstones(store.expire(NOW + HOUR_MS))
    assert b"high/gone" not in tombstones(store.expire(NOW + HOUR_MS + 1))


def changelog_of(records: object) -> FakeConsumer:
    """A changelog holding ``records`` (ChangelogRecords) in the order they were written."""
    consumer = FakeConsumer({})
    for record in records:  # type: ignore[attr-defined]
        consumer.add(record.partition, record.key, record.value)
    return consumer


def test_a_key_claimed_again_after_a_foreign_record_expired_survives_its_tombstone() -> None:
    """The other scope's record expires, a job claims its key again in this scope and
    succeeds, and only then does the expiry pass write the old record's tombstone: the next
    owner restores both, in that order, and must still hold the key."""
    old = [ChangelogRecord(0, b"high/k", encode_entry(JOB_A, False, NOW + 10))]
    first = kafka_store(changelog_of(old), DedupScope.NAMESPACE)
    first.load([HIGH_0])
    written = list(old)
    assert first.check(HIGH_0, "k", JOB_B, policy=COMPLETE, now_ms=NOW + 20) is Verdict.RUN
    written += first.settle(
        HIGH_0, "k", JOB_B, KeyOutcome.SUCCEEDED, policy=COMPLETE, now_ms=NOW + 30
    )
    written += first.expire(NOW + 40)
    assert [r.key for r in written] == [b"high/k", b"*/k", b"high/k"]

    second = kafka_store(changelog_of(written), DedupScope.NAMESPACE)
    second.load([("ns.jobs.low", 0)])
    duplicate = second.check(("ns.jobs.low", 0), "k", JOB_C, policy=COMPLETE, now_ms=NOW + 50)
    assert duplicate is Verdict.DUPLICATE
    assert second.table(HIGH_0).get("k") == Entry(JOB_B, True, NOW + 30 + COMPLETE.ttl_ms)


def test_a_namespace_tombstone_leaves_a_newer_per_priority_record_under_the_priority_scope() -> (
    None
):
    consumer = FakeConsumer({})
    consumer.add(0, b"*/k", encode_entry(JOB_A, False, NOW - 5))
    consumer.add(0, b"high/k", live(JOB_B))
    consumer.add(0, b"*/k", None)
    consumer.add(0, b"*/gone", live(JOB_A))
    consumer.add(0, b"*/gone", None)
    store = kafka_store(consumer, DedupScope.PRIORITY)
    store.load([HIGH_0])
    assert store.table(HIGH_0).get("k") == Entry(JOB_B, True, NOW + HOUR_MS)
    assert store.table(HIGH_0).get("gone") is None  # a tombstone of what it set still removes


def test_a_record_of_another_priority_leaves_the_hold_a_later_one_set() -> None:
    """Under the priority scope, job C held k at default, then job A at high; C's hold ended,
    and its tombstone came after A's record. Under the namespace scope, that tombstone (or C's
    record restored expired) ended A's hold, and a duplicate of A ran."""
    for tail in ([(b"default/k", None)], [(b"default/k", encode_entry(JOB_C, True, NOW - 1))]):
        consumer = FakeConsumer({})
        consumer.add(0, b"default/k", encode_entry(JOB_C, True, NOW + 10))
        consumer.add(0, b"high/k", live(JOB_A))
        for key, value in tail:
            consumer.add(0, key, value)
        consumer.add(0, b"default/gone", live(JOB_B))
        consumer.add(0, b"default/gone", None)
        store = kafka_store(consumer, DedupScope.NAMESPACE)
        store.load([HIGH_0])
        assert store.table(HIGH_0).get("k") == Entry(JOB_A, True, NOW + HOUR_MS), tail
        duplicate = store.check(HIGH_0, "k", JOB_B, policy=COMPLETE, now_ms=NOW + 1)
        assert duplicate is Verdict.DUPLICATE, tail
        assert store.table(HIGH_0).get("gone") is None  # its own tombstone still removes it
