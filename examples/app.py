"""An example application: three job types on different priorities.

Run a worker for it with ``pipeline-worker --app examples.app``.
"""

from __future__ import annotations

import asyncio
import hashlib
import sys

from pipeline import JobContext, Pipeline

app = Pipeline()


def say(line: str) -> None:
    # One write per line: handlers on several threads print at once.
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


@app.job("email.send", priority="high", max_attempts=5, time_limit=10)
async def send_email(ctx: JobContext, to: str, subject: str) -> None:
    """An I/O-bound job: async handlers share one event loop."""
    await asyncio.sleep(0.05)  # stands in for an SMTP call
    say(f"[{ctx.priority:>8}] email.send      to={to} subject={subject!r}")


@app.job("thumbnail.make", priority="default", concurrency=2)
def make_thumbnail(ctx: JobContext, image_id: int) -> None:
    """A CPU-bound job: plain functions run on the worker's thread pool."""
    digest = hashlib.sha256(str(image_id).encode() * 20_000).hexdigest()[:12]
    say(f"[{ctx.priority:>8}] thumbnail.make  image={image_id} digest={digest}")


@app.job("report.build", priority="low")
def build_report(ctx: JobContext, report_id: int) -> None:
    say(f"[{ctx.priority:>8}] report.build    report={report_id}")


def enqueue_examples() -> int:
    """What ``make run`` enqueues: emails, a keyed album of thumbnails, reports, and one email
    delayed by 30 s (on the deferred topic); returns how many jobs are ready at once."""
    for i in range(8):
        send_email.enqueue(to=f"user{i}@example.com", subject="Welcome")
    make_thumbnail.with_options(key="album-1").enqueue_many({"image_id": i} for i in range(6))
    for i in range(4):
        build_report.enqueue(report_id=i)
    app.enqueue("email.send", {"to": "later@example.com", "subject": "Delayed"}, delay=30)
    return 8 + 6 + 4
