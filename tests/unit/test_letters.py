"""The dead letters the scheduler and the retry relay write for a message they cannot pass on go
keyed by the message's key and hold that key too (``raw_key``, which a replay sends the job
with). A key over half of what the producer sends cannot be there twice: the letter goes
without a Kafka key and keeps its copy, or, where even one copy would not fit (another producer
allowed larger messages), without either. Else the producer refused it and every transaction
holding it aborted (the scheduler rewound for good behind it, the retry relay stopped its
worker)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pipeline import Job
from pipeline._codec import DeadLetterCodec
from pipeline._letters import letter_key, too_large, undecodable
from pipeline._producer import fits_in_message

MAX_BYTES = 10_000
BIG_KEY = b"k" * 6_000  # over half of what the producer sends
CODEC = DeadLetterCodec()


@dataclass
class Message:
    """The part of a confluent_kafka Message a letter reads."""

    _key: bytes | None
    _value: bytes | None

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def headers(self) -> list[tuple[str, bytes]]:
        return [("h", b"v")]

    def topic(self) -> str:
        return "acme.deferred"

    def partition(self) -> int:
        return 3

    def offset(self) -> int:
        return 41


@pytest.mark.parametrize("value", [b"?" * 3_000, b"?" * 100], ids=["large value", "small value"])
def test_an_undecodable_message_with_a_large_key_gets_a_letter_that_fits(value: bytes) -> None:
    message = Message(BIG_KEY, value)
    letter = undecodable(CODEC, message, "not a job", MAX_BYTES)  # type: ignore[arg-type]
    assert letter_key(message.key(), MAX_BYTES) is None
    assert fits_in_message(MAX_BYTES, letter, None)
    decoded = CODEC.decode(letter)
    assert decoded.raw_key == BIG_KEY  # what a replay sends the job with
    assert decoded.source_offset == 41


def test_a_job_too_large_with_a_large_key_gets_a_letter_that_fits() -> None:
    job = Job(id="j", type="t", payload=b"{}")
    source = ("acme.deferred", 3, 41)
    letter = too_large(CODEC, job, "too large", source=source, key=BIG_KEY, max_bytes=MAX_BYTES)
    assert fits_in_message(MAX_BYTES, letter, letter_key(BIG_KEY, MAX_BYTES))
    assert (CODEC.decode(letter).job_id, CODEC.decode(letter).raw_key) == ("j", BIG_KEY)


def test_a_key_larger_than_the_producer_sends_leaves_the_letter_without_it() -> None:
    huge = b"k" * (MAX_BYTES + 500)  # written by a producer that allowed larger messages
    message = Message(huge, b"?" * 100)
    letter = undecodable(CODEC, message, "not a job", MAX_BYTES)  # type: ignore[arg-type]
    assert letter_key(huge, MAX_BYTES) is None
    assert fits_in_message(MAX_BYTES, letter, None)
    assert CODEC.decode(letter).raw_key is None


def test_a_small_key_stays_in_the_letter() -> None:
    message = Message(b"order-7", b"?" * 100)
    letter = undecodable(CODEC, message, "not a job", MAX_BYTES)  # type: ignore[arg-type]
    assert CODEC.decode(letter).raw_key == b"order-7"
