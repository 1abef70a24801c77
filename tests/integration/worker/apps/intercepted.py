"""A job application with an interceptor, for ``pipeline-worker --app`` to load.

The interceptor writes an ``I`` line (``<type>@<tenant>`` as the type) before it calls the
handler and an ``O`` line after, in the recording app's format (see :mod:`.recording`); the
handlers write their ``S`` and ``E`` lines in between. A second one gives up on the handler of
an ``impatient`` job after ``GIVE_UP_S`` and answers for it, while its thread runs on.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from pipeline import CallNext, JobCall, Pipeline

from .recording import record


class Recorded:
    """Writes what it saw of each job, around the handler."""

    async def intercept(self, call: JobCall, next: CallNext) -> Any:
        n = call.kwargs["n"]
        record.line("I", call.ctx, f"{call.job.type}@{call.job.tenant}", n)
        result = await next(call)
        record.line("O", call.ctx, call.job.type, n)
        return result


GIVE_UP_S = 0.05

_impatient = threading.Condition()
_started: list[int] = []
"""The ``impatient`` jobs started in this process, in order."""
_given_up: set[str] = set()
"""The ids of the ``impatient`` jobs whose interceptor stopped waiting for their handler."""


class GivesUp:
    """Stops waiting for an ``impatient`` job's handler after ``GIVE_UP_S``: the job succeeds
    then, its plain function still running on its thread."""

    async def intercept(self, call: JobCall, next: CallNext) -> Any:
        if call.job.type != "impatient":
            return await next(call)
        try:
            return await asyncio.wait_for(next(call), GIVE_UP_S)
        except TimeoutError:
            with _impatient:
                _given_up.add(call.job.id)
                _impatient.notify_all()
            return None


app = Pipeline(middleware=[Recorded(), GivesUp()])


@app.job("noop")
def noop(n: int, ctx: Any) -> None:
    """A plain function: its handler runs on the pool, its chain on the event loop."""
    record.line("S", ctx, "noop", n)
    record.line("E", ctx, "noop", n)


@app.job("noop_async")
async def noop_async(n: int, ctx: Any) -> None:
    await asyncio.sleep(0)
    record.line("S", ctx, "noop_async", n)
    record.line("E", ctx, "noop_async", n)


@app.job("impatient")
def impatient(n: int, ms: float, ctx: Any) -> None:
    """Runs on after its interceptor stopped waiting for it: until another ``impatient`` job
    starts beside it (two runs of the key at once: it ends at once, and the recording shows
    the overlap), or ``ms`` milliseconds pass without one."""
    record.line("S", ctx, "impatient", n)
    with _impatient:
        _started.append(n)
        mine = len(_started)
        _impatient.notify_all()
        _impatient.wait_for(lambda: ctx.job.id in _given_up, timeout=30)
        _impatient.wait_for(lambda: len(_started) > mine, timeout=ms / 1000)
    record.line("E", ctx, "impatient", n)
