"""JobTemplate writes exactly the bytes JobCodec writes, for any job and any varying fields."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline import Job, JobCodec, Priority
from pipeline._jobtemplate import JobTemplate

CODEC = JobCodec()

jobs = st.builds(
    Job,
    id=st.text(min_size=1, max_size=40),
    type=st.text(min_size=1, max_size=30),
    payload=st.binary(max_size=300),
    priority=st.sampled_from(list(Priority)),
    max_attempts=st.integers(1, 2**31 - 1),
    created_at=st.integers(0, 2**62),
    not_before=st.none() | st.integers(0, 2**62),
    idempotency_key=st.none() | st.text(max_size=20),
    tenant=st.none() | st.text(max_size=20),
    headers=st.dictionaries(st.text(max_size=10), st.text(max_size=10), max_size=3),
)


@given(
    prototype=jobs,
    job_id=st.text(max_size=70),
    payload=st.binary(max_size=400),
    created_at=st.integers(0, 2**62),
)
def test_template_matches_the_codec(
    prototype: Job, job_id: str, payload: bytes, created_at: int
) -> None:
    template = JobTemplate(CODEC, prototype)
    expected = CODEC.encode(
        dataclasses.replace(prototype, id=job_id, payload=payload, created_at=created_at)
    )
    assert template.encode(job_id, payload, created_at) == expected
    decoded = CODEC.decode(template.encode(job_id, payload, created_at))
    assert (decoded.id, decoded.payload, decoded.created_at) == (job_id, payload, created_at)


def test_same_millisecond_is_encoded_once_and_still_right() -> None:
    prototype = Job(id="x", type="t", payload=b"{}", created_at=1)
    template = JobTemplate(CODEC, prototype)
    first = template.encode("a" * 32, b"{}", 1_800_000_000_000)
    second = template.encode("b" * 32, b"{}", 1_800_000_000_000)
    assert CODEC.decode(first).id == "a" * 32
    assert CODEC.decode(second).created_at == 1_800_000_000_000


@given(
    prototype=jobs,
    job_id=st.text(alphabet="0123456789abcdef", min_size=32, max_size=32) | st.text(max_size=70),
    size=st.sampled_from([0, 1, 63, 64, 2047, 2048, 2049, 70_000]),
)
def test_template_matches_the_codec_for_job_ids_and_payloads_of_every_length(
    prototype: Job, job_id: str, size: int
) -> None:
    # 32-character ids and payloads under 2 KiB take precomputed length prefixes; others not.
    payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
    expected = CODEC.encode(
        dataclasses.replace(prototype, id=job_id, payload=payload, created_at=1_800_000_000_000)
    )
    assert JobTemplate(CODEC, prototype).encode(job_id, payload, 1_800_000_000_000) == expected


def test_job_ids_made_at_one_millisecond_are_distinct_ordered_and_carry_it() -> None:
    from pipeline._job import JobIdFactory

    factory = JobIdFactory()
    ids = [factory.at(1_800_000_000_000) for _ in range(3)] + [factory.at(1_800_000_000_001)]
    assert len(set(ids)) == 4
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    assert [int(i[:12], 16) for i in ids] == [1_800_000_000_000] * 3 + [1_800_000_000_001]
    assert len({i[12:16] for i in ids}) == 1  # the process's prefix
    counters = [int(i[16:], 16) for i in ids]
    assert all((b - a) % 2**64 == 1 for a, b in itertools.pairwise(counters))
    assert len(factory()) == 32


def test_a_thread_switch_inside_encode_never_pairs_one_time_with_another_times_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # One template serves every thread that enqueues a type: another thread may run between
    # any two steps of encode(). Here one does, while the first encodes its new millisecond.
    import pipeline._jobtemplate as module

    template = JobTemplate(CODEC, Job(id="0" * 32, type="t", payload=b"{}"))
    encode_long = module.encode_long  # type: ignore[attr-defined]
    switched = False

    def encode_long_with_a_switch(value: int) -> bytes:
        nonlocal switched
        if not switched:
            switched = True
            template.encode("b" * 32, b"{}", 2_000)  # the other thread, at another millisecond
        return encode_long(value)

    monkeypatch.setattr(module, "encode_long", encode_long_with_a_switch)
    first = CODEC.decode(template.encode("a" * 32, b"{}", 1_000))
    later = CODEC.decode(template.encode("c" * 32, b"{}", 2_000))
    assert (first.created_at, later.created_at) == (1_000, 2_000)
