"""A job application with an interceptor, for ``pipeline-worker --app`` to load.

The interceptor writes an ``I`` line (``<type>@<tenant>`` as the type) before it calls the
handler and an ``O`` line after, in the recording app's format (see :mod:`.recording`); the
handlers write their ``S`` and ``E`` lines in between. A second one gives up on the handler of
an ``impatient`` job after ``GIVE_UP_S`` and answers for it, while its thread runs on.
"""

from __future__ import annotations

import asyncio
import time
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


class GivesUp:
    """Stops waiting for an ``impatient`` job's handler after ``GIVE_UP_S``: the job succeeds
    then, its plain function still running on its thread."""

    async def intercept(self, call: JobCall, next: CallNext) -> Any:
        if call.job.type != "impatient":
            return await next(call)
        try:
            return await asyncio.wait_for(next(call), GIVE_UP_S)
        except TimeoutError:
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
    """Runs longer than its interceptor waits for it."""
    record.line("S", ctx, "impatient", n)
    time.sleep(ms / 1000)
    record.line("E", ctx, "impatient", n)
