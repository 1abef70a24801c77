"""A blocking call that is given up on once it outlives its deadline.

librdkafka's ``send_offsets_to_transaction`` can block for good although it was given a
timeout: the request it makes of the group coordinator has a timeout that librdkafka never
checks, and a coordinator it cached may never be asked again after a broker restart
(confluentinc/librdkafka#5456 and #5511, open in librdkafka 2.16). A worker whose commit hung
there ran no job again until it was restarted. :class:`BoundedCalls` makes such a call on a
helper thread and waits for it at most a deadline; past it, :class:`CallOutlivedError` says so
and the call is left on its thread, which is not waited for again (the caller replaces what the
call was stuck in).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

__all__ = ["BoundedCalls", "CallOutlivedError"]


class CallOutlivedError(Exception):
    """The call did not return within its deadline; it goes on, on a thread left behind."""

    def __init__(self, deadline_s: float) -> None:
        super().__init__(f"the call did not return within {deadline_s:g}s")
        self.deadline_s = deadline_s


class BoundedCalls:
    """Calls made one at a time on a helper thread named ``name``; a call that outlives its
    deadline keeps that thread, and the next call gets a new one."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._executor: ThreadPoolExecutor | None = None
        self.left_behind = 0
        """Calls given up on (each still holds its thread)."""

    def call(self, deadline_s: float, fn: Callable[..., object], *args: Any) -> None:
        """``fn(*args)``: what it raises comes out of here; :class:`CallOutlivedError` when it
        has not returned after ``deadline_s``."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix=self._name)
        future = self._executor.submit(fn, *args)
        try:
            future.result(deadline_s)
        except FutureTimeout:
            self._executor.shutdown(wait=False)  # its thread stays in the call
            self._executor = None
            self.left_behind += 1
            raise CallOutlivedError(deadline_s) from None

    def close(self) -> None:
        """End the helper thread (not one left behind in a call)."""
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None
