"""``KafkaDedupStore.load`` against a real Kafka: the committed, live records and only those."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from pipeline._dedup import (
    ChangelogRecord,
    DedupPolicy,
    DedupScope,
    Entry,
    KeyOutcome,
    Verdict,
    encode_entry,
)
from pipeline._job import now_ms
from pipeline_worker.route.changelog import DedupRestoreError, KafkaDedupStore

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

pytestmark = pytest.mark.kafka

JOB_A = "0190f5c2a1b2c3d4e5f60718293a4b5c"
JOB_B = "0190f5c2a1b2c3d4e5f60718293a4b5d"
JOB_C = "0190f5c2a1b2c3d4e5f60718293a4b5e"
HOUR_MS = 3_600_000
PARTITIONS = 3


@pytest.fixture
def changelog(bootstrap_servers: str, namespace: str) -> Iterator[str]:
    """A compacted ``<namespace>.dedup`` of three partitions, deleted after the test."""
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    topic = f"{namespace}.dedup"
    spec = NewTopic(topic, PARTITIONS, 1, config={"cleanup.policy": "compact"})
    admin.create_topics([spec], operation_timeout=30)[topic].result()
    yield topic
    admin.delete_topics([topic], operation_timeout=30)[topic].result()


@pytest.fixture
def producer(bootstrap_servers: str, namespace: str) -> Producer:
    producer = Producer(
        {"bootstrap.servers": bootstrap_servers, "transactional.id": f"{namespace}.dedup-test"}
    )
    producer.init_transactions(30)
    return producer


def write(
    producer: Producer,
    topic: str,
    records: Sequence[ChangelogRecord],
    *,
    commit: bool = True,
) -> None:
    producer.begin_transaction()
    for record in records:
        producer.produce(topic, record.value, record.key, partition=record.partition)
    if commit:
        producer.commit_transaction(30)
    else:
        producer.flush(30)  # on the broker, then thrown away
        producer.abort_transaction(30)


def store(bootstrap_servers: str, changelog: str) -> KafkaDedupStore:
    # The per-priority scope: each priority's table shows what was restored into it.
    scope = DedupScope.PRIORITY
    return KafkaDedupStore(changelog, {"bootstrap.servers": bootstrap_servers}, scope=scope)


def test_load_restores_exactly_the_committed_live_records(
    bootstrap_servers: str, changelog: str, producer: Producer
) -> None:
    now = now_ms()
    live, expired = now + HOUR_MS, now - 1_000
    write(
        producer,
        changelog,
        [
            ChangelogRecord(0, b"high/a", encode_entry(JOB_A, True, live)),
            ChangelogRecord(0, b"high/b", encode_entry(JOB_A, False, live)),
            ChangelogRecord(0, b"low/c", encode_entry(JOB_B, True, live)),
            ChangelogRecord(0, b"high/old", encode_entry(JOB_A, True, expired)),
            ChangelogRecord(0, b"high/bad", b"not an entry"),
            ChangelogRecord(1, b"high/d", encode_entry(JOB_A, False, live)),
            ChangelogRecord(1, b"default/e", encode_entry(JOB_B, True, live)),
        ],
    )
    write(
        producer,
        changelog,
        [
            ChangelogRecord(0, b"high/a", None),
            ChangelogRecord(0, b"high/x", encode_entry(JOB_B, True, live)),
            ChangelogRecord(1, b"high/d", encode_entry(JOB_B, True, live)),
            ChangelogRecord(2, b"high/y", encode_entry(JOB_B, True, live)),
        ],
        commit=False,
    )
    write(
        producer,
        changelog,
        [
            ChangelogRecord(0, b"high/b", None),
            ChangelogRecord(0, b"high/z", encode_entry(JOB_B, False, live)),
        ],
    )
    # Partition 0 ends in aborted records and partition 1 in an abort marker; 2 has nothing else.
    write(producer, changelog, [ChangelogRecord(0, b"high/z", None)], commit=False)

    loaded = store(bootstrap_servers, changelog)
    ns = changelog.removesuffix(".dedup")
    high = [(f"{ns}.jobs.high", p) for p in range(PARTITIONS)]
    loaded.load([*high, (f"{ns}.jobs.default", 1)], timeout_s=30)

    high_0 = loaded.table(high[0])
    assert {k: high_0.get(k) for k in ("a", "b", "x", "z")} == {
        "a": Entry(JOB_A, True, live),
        "b": None,
        "x": None,
        "z": Entry(JOB_B, False, live),
    }
    assert len(high_0) == 2  # neither low/c, nor the expired, nor the malformed record
    assert loaded.table(high[1]).get("d") == Entry(JOB_A, False, live)
    assert len(loaded.table(high[1])) == 1
    assert loaded.table((f"{ns}.jobs.default", 1)).get("e") == Entry(JOB_B, True, live)
    assert len(loaded.table(high[2])) == 0


def test_what_a_store_settles_is_what_the_next_owner_restores(
    bootstrap_servers: str, changelog: str, producer: Producer
) -> None:
    ns = changelog.removesuffix(".dedup")
    where = (f"{ns}.jobs.critical", 2)
    policy = DedupPolicy()
    now = now_ms()
    first = store(bootstrap_servers, changelog)
    first.load([where])
    for key, job_id, outcome in [
        ("paid", JOB_A, KeyOutcome.SUCCEEDED),
        ("waiting", JOB_A, KeyOutcome.RETRYING),
        ("failed", JOB_B, KeyOutcome.DEAD),
    ]:
        assert first.check(where, key, job_id, policy=policy, now_ms=now) is Verdict.RUN
        write(
            producer,
            changelog,
            first.settle(where, key, job_id, outcome, policy=policy, now_ms=now),
        )

    second = store(bootstrap_servers, changelog)
    second.load([where], timeout_s=30)
    check = second.check
    assert check(where, "paid", JOB_A, policy=policy, now_ms=now) is Verdict.DONE
    assert check(where, "paid", JOB_B, policy=policy, now_ms=now) is Verdict.DUPLICATE
    assert check(where, "waiting", JOB_A, policy=policy, now_ms=now) is Verdict.RETRY
    assert check(where, "waiting", JOB_B, policy=policy, now_ms=now) is Verdict.DUPLICATE
    assert check(where, "failed", JOB_A, policy=policy, now_ms=now) is Verdict.RUN


def test_a_commit_behind_a_transaction_left_open_by_a_crash_is_restored(
    bootstrap_servers: str, changelog: str, producer: Producer, namespace: str
) -> None:
    """A worker that died inside a transaction holds the changelog's last stable offset back
    until Kafka aborts it; the next owner's commits land behind it. A restore reads them all
    (after a second crash, those keys must not run again) and none of the dead one's."""
    ns = changelog.removesuffix(".dedup")
    where = (f"{ns}.jobs.low", 2)
    live = now_ms() + HOUR_MS
    crashed = Producer(
        {
            "bootstrap.servers": bootstrap_servers,
            "transactional.id": f"{namespace}.dedup-test-crashed",
            # Kafka aborts it this long after its last write (checked every 10 s by default).
            "transaction.timeout.ms": 1000,
            "delivery.timeout.ms": 1000,
        }
    )
    crashed.init_transactions(30)
    crashed.begin_transaction()
    crashed.produce(changelog, encode_entry(JOB_A, True, live), b"low/crashed", partition=2)
    crashed.flush(30)  # written, never committed: the worker is gone
    write(producer, changelog, [ChangelogRecord(2, b"low/after", encode_entry(JOB_B, True, live))])

    loaded = store(bootstrap_servers, changelog)
    loaded.load([where], timeout_s=60)
    assert loaded.table(where).get("after") == Entry(JOB_B, True, live)
    assert loaded.table(where).get("crashed") is None


def test_a_restore_waits_for_an_open_transaction_and_counts_it_once_committed(
    bootstrap_servers: str, changelog: str, producer: Producer
) -> None:
    ns = changelog.removesuffix(".dedup")
    where = (f"{ns}.jobs.low", 2)
    live = now_ms() + HOUR_MS
    write(producer, changelog, [ChangelogRecord(2, b"low/kept", encode_entry(JOB_A, True, live))])
    producer.begin_transaction()
    producer.produce(changelog, encode_entry(JOB_B, True, live), b"low/open", partition=2)
    producer.flush(30)

    loaded = store(bootstrap_servers, changelog)
    with ThreadPoolExecutor(1) as pool:
        loading = pool.submit(loaded.load, [where], timeout_s=60)
        producer.commit_transaction(30)
        loading.result(90)
    assert loaded.table(where).get("kept") == Entry(JOB_A, True, live)
    assert loaded.table(where).get("open") == Entry(JOB_B, True, live)


def test_a_changelog_with_too_few_partitions_is_reported(
    bootstrap_servers: str, changelog: str
) -> None:
    ns = changelog.removesuffix(".dedup")
    with pytest.raises(DedupRestoreError, match=rf"{changelog} partition {PARTITIONS} .*apply"):
        store(bootstrap_servers, changelog).load([(f"{ns}.jobs.high", PARTITIONS)])


def test_a_key_claimed_again_survives_the_tombstone_of_the_other_scope_written_after_it(
    bootstrap_servers: str, changelog: str, producer: Producer
) -> None:
    """After a switch to the namespace scope: the per-priority record expires, a job claims its
    key again and succeeds, then the expiry pass tombstones the old record. The next owner
    reads the three in that order and must still hold the key."""
    ns = changelog.removesuffix(".dedup")
    high, low = (f"{ns}.jobs.high", 1), (f"{ns}.jobs.low", 1)
    policy = DedupPolicy()
    now = now_ms()
    old = ChangelogRecord(1, b"high/k", encode_entry(JOB_A, False, now - 1))
    write(producer, changelog, [old])
    conf = {"bootstrap.servers": bootstrap_servers}
    first = KafkaDedupStore(changelog, conf, scope=DedupScope.NAMESPACE)
    first.load([high, low], timeout_s=30)
    assert first.check(high, "k", JOB_B, policy=policy, now_ms=now) is Verdict.RUN
    write(
        producer,
        changelog,
        first.settle(high, "k", JOB_B, KeyOutcome.SUCCEEDED, policy=policy, now_ms=now),
    )
    write(producer, changelog, first.expire(now))

    second = KafkaDedupStore(changelog, conf, scope=DedupScope.NAMESPACE)
    second.load([high, low], timeout_s=30)
    assert second.check(low, "k", JOB_C, policy=policy, now_ms=now) is Verdict.DUPLICATE
