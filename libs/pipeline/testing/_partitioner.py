"""Kafka's default partitioner for keyed messages: murmur2 of the key, made positive, modulo
the partition count.

This is the hash of the Java client (``Utils.murmur2``, ``Utils.toPositive``) and of
librdkafka's ``murmur2_random`` partitioner, which the library's producer is configured with,
so a key lands on the same partition number in the in-memory transport as on a real topic with
as many partitions.
"""

from __future__ import annotations

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """The 32-bit MurmurHash2 of ``data`` with Kafka's seed, as a signed int (as Java returns)."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    body = length - length % 4
    for i in range(0, body, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    rest = length - body
    if rest:
        if rest == 3:
            h ^= data[body + 2] << 16
        if rest >= 2:
            h ^= data[body + 1] << 8
        h ^= data[body]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner gives a message with ``key``."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions
