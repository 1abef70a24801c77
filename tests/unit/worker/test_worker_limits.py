"""Token buckets and each worker's share of a fleet-wide rate limit."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline_worker.dispatch.limits import BURST_SECONDS, TokenBucket, TypeLimit, fleet_share


def test_share_is_proportional_to_owned_partitions() -> None:
    assert fleet_share(100.0, 3, 12) == 25.0
    assert fleet_share(10.0, 12, 12) == 10.0
    assert fleet_share(10.0, 0, 12) == 0.0
    assert fleet_share(10.0, 5, 0) == 0.0  # no metadata yet: admit nothing rather than all


@given(
    rate=st.floats(min_value=0.01, max_value=1e6),
    total=st.integers(min_value=1, max_value=10_000),
    members=st.integers(min_value=1, max_value=50),
)
def test_the_shares_of_a_whole_group_add_up_to_the_rate(
    rate: float, total: int, members: int
) -> None:
    # Partitions dealt out as an assignor would: as evenly as possible, some members maybe none.
    owned = [total // members + (1 if i < total % members else 0) for i in range(members)]
    assert sum(fleet_share(rate, n, total) for n in owned) == pytest.approx(rate)


def test_negative_inputs_are_rejected() -> None:
    with pytest.raises(ValueError, match="negative"):
        fleet_share(-1.0, 1, 1)


def take_over(bucket: TokenBucket, seconds: float, step: float) -> int:
    taken = 0
    for tick in range(round(seconds / step) + 1):
        while bucket.try_take(tick * step):
            taken += 1
    return taken


@pytest.mark.parametrize("rate", [0.5, 5.0, 123.0, 5000.0])
def test_a_bucket_admits_its_rate(rate: float) -> None:
    bucket = TokenBucket(rate, now=0.0)
    taken = take_over(bucket, 100.0, 0.001)
    burst = max(1.0, rate * BURST_SECONDS)
    # One token to start with, then the rate; never more than the burst capacity ahead.
    assert rate * 100.0 - 2 <= taken <= rate * 100.0 + burst + 1


def test_delay_says_when_the_next_token_comes() -> None:
    bucket = TokenBucket(4.0, now=0.0)
    assert bucket.delay(0.0) == 0.0
    assert bucket.try_take(0.0)
    assert not bucket.try_take(0.0)
    assert bucket.delay(0.0) == pytest.approx(0.25)
    assert bucket.delay(0.2) == pytest.approx(0.05)
    assert bucket.try_take(0.25)


def test_a_zero_rate_admits_nothing_after_the_first_token() -> None:
    bucket = TokenBucket(0.0, now=0.0)
    assert bucket.try_take(0.0)
    assert not bucket.try_take(1000.0)
    assert math.isinf(bucket.delay(1000.0))


def test_changing_the_rate_keeps_the_earned_tokens_within_the_new_capacity() -> None:
    bucket = TokenBucket(100.0, now=0.0)
    assert bucket.try_take(0.0)
    bucket.set_rate(1.0, now=1.0)  # earned 10 (capacity at 100/s) but the new capacity is 1
    assert bucket.try_take(1.0)
    assert not bucket.try_take(1.0)
    with pytest.raises(ValueError, match="rate"):
        bucket.set_rate(-1.0, now=2.0)


def test_a_gate_takes_its_share_of_the_rate() -> None:
    limit = TypeLimit[object]("t", cap=None, rate_limit=60.0, now=0.0)
    limit.set_share(2, 6, now=0.0)  # 20/s for this worker
    assert limit.bucket is not None
    assert limit.bucket.rate == pytest.approx(20.0)
    admitted = 0
    now = 0.0
    while now < 10.0:
        while limit.try_admit(now):
            admitted += 1
            limit.release()
        now += 0.01
    assert admitted == pytest.approx(200, abs=3)


def test_a_gate_caps_concurrency() -> None:
    limit = TypeLimit[object]("t", cap=2, rate_limit=None, now=0.0)
    assert limit.try_admit(0.0)
    assert limit.try_admit(0.0)
    assert limit.capped
    assert not limit.try_admit(0.0)
    limit.release()
    assert limit.try_admit(0.0)
