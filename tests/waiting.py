"""The suite's one way to wait for something that has no event to await: poll with a deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


def wait_for(condition: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    """Poll ``condition`` for up to ``timeout`` seconds; return whether it came true."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
    return True


async def until(
    condition: Callable[[], bool], timeout: float = 10.0, interval: float = 0.005
) -> None:
    """On an event loop: :func:`wait_for` ``condition`` on a thread of its own for up to
    ``timeout`` seconds while the loop runs on, then look again on the loop's thread (what the
    loop's callbacks change is only whole there); fail the test saying so when it never came
    true."""
    deadline = time.monotonic() + timeout
    while not condition():
        left = deadline - time.monotonic()
        if left <= 0 or not await asyncio.to_thread(wait_for, condition, left, interval):
            raise AssertionError(f"not true within {timeout:g}s: {condition!r}")
