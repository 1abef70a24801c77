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


async def wait_for_async(
    condition: Callable[[], bool], timeout: float, interval: float = 0.01
) -> bool:
    """:func:`wait_for` on an event loop: the loop keeps running between the looks."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(interval)
    return True
