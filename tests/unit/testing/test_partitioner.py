"""The in-memory transport partitions keys as Kafka's default partitioner does (murmur2)."""

from __future__ import annotations

import pytest

from pipeline import Pipeline, Settings
from pipeline.testing import InMemoryTransport
from pipeline.testing._partitioner import murmur2, partition_for

# Published with Kafka's own client (UtilsTest.testMurmur2) and, for the short keys, in Akka's
# test of its port of Kafka's Utils.murmur2: Java's signed 32-bit results.
KNOWN = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
    (b"1", -1993445489),
    (b"12", 126087238),
    (b"123", -267702483),
    (b"1234", -1614185708),
    (b"12345", -1188365604),
]


@pytest.mark.parametrize(("key", "expected"), KNOWN, ids=[k.decode() for k, _ in KNOWN])
def test_murmur2_gives_kafka_s_published_values(key: bytes, expected: int) -> None:
    assert murmur2(key) == expected


def test_the_partition_is_the_positive_hash_modulo_the_partitions() -> None:
    # -973932308 & 0x7fffffff = 1173551340; "abc" is positive already.
    assert partition_for(b"21", 6) == 1173551340 % 6
    assert partition_for(b"abc", 7) == 479470107 % 7
    assert partition_for(b"", 3) == (murmur2(b"") & 0x7FFFFFFF) % 3


def test_keyed_jobs_land_on_kafka_s_partition_and_unkeyed_ones_spread() -> None:
    transport = InMemoryTransport(partitions=6)
    app = Pipeline(Settings(namespace="acme"), transport=transport)
    for key in ("21", "foobar", "abc", "21"):
        app.enqueue("t", {}, key=key)
    for _ in range(6):
        app.enqueue("t", {})
    app.flush()
    keyed = [m.partition for m in transport.messages[:4]]
    assert keyed == [partition_for(k, 6) for k in (b"21", b"foobar", b"abc", b"21")]
    assert {m.partition for m in transport.messages[4:]} == set(range(6))
