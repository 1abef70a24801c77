"""``Retry`` and ``Backoff``: when a failed job runs again."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from pipeline import Backoff, ConfigurationError, JobOptions, Retry


def test_retry_after_seconds_or_timedelta_is_relative_to_the_failure() -> None:
    assert Retry(after=30).due_ms(1_000) == 31_000
    assert Retry(after=timedelta(minutes=2)).due_ms(1_000) == 121_000
    assert "30s" in str(Retry(after=30))


def test_retry_at_is_an_absolute_time_and_needs_a_time_zone() -> None:
    at = datetime(2026, 1, 1, 12, tzinfo=UTC)
    assert Retry(at=at).due_ms(0) == int(at.timestamp() * 1000)
    with pytest.raises(ConfigurationError, match="time zone"):
        Retry(at=datetime(2026, 1, 1, 12))


def test_retry_without_a_time_leaves_it_to_the_backoff() -> None:
    assert Retry().due_ms(5) is None
    assert Retry("rate limited").args == ("rate limited",)


def test_retry_rejects_contradictions() -> None:
    with pytest.raises(ConfigurationError, match="not both"):
        Retry(after=1, at=datetime.now(UTC))


def test_a_retry_after_a_negative_wait_is_due_now_as_one_at_a_past_time() -> None:
    # A raised ConfigurationError instead: no Retry, so a `fatal=(Exception,)` type
    # dead-lettered the job, and others waited for the backoff.
    assert Retry(after=-0.001).due_ms(5_000) == 5_000
    assert Retry(after=timedelta(seconds=-3)).due_ms(5_000) == 5_000


@pytest.mark.parametrize("after", [float("nan"), float("inf"), 1e17])
def test_retry_refuses_a_time_the_job_could_not_carry(after: float) -> None:
    # Accepted, it failed later, while the worker built the job's move: the offset stuck.
    with pytest.raises(ConfigurationError, match="finite number of seconds"):
        Retry(after=after)


def test_backoff_grows_by_its_factor_up_to_the_cap() -> None:
    backoff = Backoff(base_s=2, factor=3, cap_s=50, jitter=0)
    assert [backoff.delay_s(n) for n in range(1, 6)] == [2, 6, 18, 50, 50]


def test_backoff_jitter_spreads_each_delay_within_its_fraction() -> None:
    backoff = Backoff(base_s=10, factor=1, jitter=0.2)
    rand = random.Random(1)
    delays = [backoff.delay_s(1, rand) for _ in range(500)]
    assert min(delays) >= 8.0
    assert max(delays) <= 12.0
    assert max(delays) - min(delays) > 3.0, "jitter actually spreads"


@pytest.mark.parametrize(
    "kwargs",
    [{"base_s": 0}, {"cap_s": -1}, {"factor": 0.5}, {"jitter": 1.0}, {"jitter": -0.1}],
)
def test_backoff_rejects_nonsense(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigurationError):
        Backoff(**kwargs)


def test_job_options_take_one_fatal_class_or_several() -> None:
    assert JobOptions(fatal=KeyError).fatal == (KeyError,)  # type: ignore[arg-type]
    assert JobOptions(fatal=[KeyError, ValueError]).fatal == (KeyError, ValueError)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="exception classes"):
        JobOptions(fatal=("KeyError",))  # type: ignore[arg-type]


@pytest.mark.parametrize("factor", [4, 4.0, 10])
def test_backoff_of_a_late_attempt_is_the_cap_not_an_overflow(factor: float) -> None:
    # factor**(n-1) passes a float's range by attempt 513 (factor 4): the move failed, the
    # offset stuck.
    backoff = Backoff(base_s=5, factor=factor, cap_s=3600, jitter=0)
    assert backoff.delay_s(1000) == 3600
    assert backoff.delay_s(2**40) == 3600  # not computed as an int: that took minutes


@pytest.mark.parametrize(
    "kwargs",
    [{"factor": float("nan")}, {"base_s": float("nan")}, {"cap_s": float("inf")},
     {"cap_s": 1e300}, {"base_s": float("inf")}],
)  # fmt: skip
def test_backoff_rejects_a_time_no_job_could_carry(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigurationError):
        Backoff(**kwargs)


@pytest.mark.parametrize(
    ("base_s", "cap_s", "jitter"), [(100, 100, 0.5), (90, 100, 0.2), (3600, 3600, 0.9)]
)
def test_backoff_jitter_never_takes_a_delay_past_the_cap(
    base_s: float, cap_s: float, jitter: float
) -> None:
    # It did: a delay at or near the cap came out up to ``jitter`` of itself above it.
    backoff = Backoff(base_s=base_s, factor=1, cap_s=cap_s, jitter=jitter)
    rand = random.Random(5)
    delays = [backoff.delay_s(1, rand) for _ in range(1000)]
    low = base_s * (1 - jitter)
    assert max(delays) <= cap_s
    assert min(delays) >= low > 0
    # Spread over the whole span below the cap, not piled up on it.
    assert sum(delay == cap_s for delay in delays) <= 1
    assert max(delays) - min(delays) > 0.9 * (cap_s - low)


def test_backoff_jitter_below_the_cap_is_drawn_as_before() -> None:
    backoff = Backoff(base_s=10, factor=2, cap_s=3600, jitter=0.2)
    ours, theirs = random.Random(11), random.Random(11)
    for attempt in range(1, 8):  # 10 s ... 640 s: all of ±20% below the cap
        expected = 10 * 2 ** (attempt - 1) * (1 + theirs.uniform(-0.2, 0.2))
        assert backoff.delay_s(attempt, ours) == expected


@pytest.mark.parametrize("backoff", [{"base_s": 1}, 5, None])
def test_a_backoff_that_is_not_a_backoff_is_refused_at_registration(backoff: object) -> None:
    """A dict was taken: at the job's first failure the worker could not build its move
    ('dict' object has no attribute 'delay_s'), and the offset stayed unfinished for good."""
    with pytest.raises(ConfigurationError, match="backoff must be a Backoff"):
        JobOptions(backoff=backoff)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"after": "5"}, "Retry(after=...) takes seconds or a timedelta, got '5'"),
        ({"after": True}, "Retry(after=...) takes seconds or a timedelta, got True"),
        ({"at": "2030-01-01T00:00:00Z"}, "Retry(at=...) takes a datetime"),
    ],
)
def test_a_retry_time_of_the_wrong_kind_says_what_it_takes(
    options: dict[str, object], says: str
) -> None:
    """It was a bare TypeError ("'<' not supported between instances of 'str' and 'int'")."""
    with pytest.raises(ConfigurationError) as raised:
        Retry(**options)  # type: ignore[arg-type]
    assert says in str(raised.value)
