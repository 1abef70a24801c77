"""An example application: three job types on different priorities.

Run a worker for it with ``pipeline-worker --app examples.app``.
"""

from __future__ import annotations

import asyncio
import hashlib

from pipeline import JobContext, Pipeline

app = Pipeline()


@app.job("email.send", priority="high", max_attempts=5, time_limit=10)
async def send_email(to: str, subject: str, ctx: JobContext) -> None:
    """An I/O-bound job: async handlers share one event loop."""
    await asyncio.sleep(0.05)  # stands in for an SMTP call
    print(f"[{ctx.priority:>8}] email.send      to={to} subject={subject!r}", flush=True)


@app.job("thumbnail.make", priority="default", concurrency=2)
def make_thumbnail(image_id: int, ctx: JobContext) -> None:
    """A CPU-bound job: plain functions run on the worker's thread pool."""
    digest = hashlib.sha256(str(image_id).encode() * 20_000).hexdigest()[:12]
    print(f"[{ctx.priority:>8}] thumbnail.make  image={image_id} digest={digest}", flush=True)


@app.job("report.build", priority="low")
def build_report(report_id: int, ctx: JobContext) -> None:
    print(f"[{ctx.priority:>8}] report.build    report={report_id}", flush=True)
