"""A job application with an interceptor, for ``pipeline-worker --app`` to load.

The interceptor writes an ``I`` line (``<type>@<tenant>`` as the type) before it calls the
handler and an ``O`` line after, in the recording app's format (see :mod:`.recording`); the
handlers write their ``S`` and ``E`` lines in between.
"""

from __future__ import annotations

import asyncio
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


app = Pipeline(middleware=[Recorded()])


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
