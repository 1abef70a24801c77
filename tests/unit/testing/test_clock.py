"""FakeClock: a fixed start, moves only when told, never back."""

from __future__ import annotations

import pytest

from pipeline import ConfigurationError
from pipeline.testing import FakeClock


def test_it_starts_at_a_fixed_time_and_stands_still() -> None:
    clock = FakeClock()
    assert clock.now_ms() == 1_767_225_600_000 == FakeClock().now_ms()
    assert FakeClock(start_ms=5).now_ms() == 5


def test_advance_rounds_up_to_the_millisecond_and_never_goes_back() -> None:
    clock = FakeClock(start_ms=0)
    assert clock.advance(1.5) == 1500
    assert clock.advance(0.0001) == 1501
    assert clock.advance_to_ms(10_000) == 10_000
    assert clock.advance_to_ms(20) == 10_000, "a time already passed leaves it where it is"
    with pytest.raises(ConfigurationError, match="never goes back"):
        clock.advance(-1)
