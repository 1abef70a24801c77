"""The job application the worker tests run: each handler appends what it did to a file.

Every run writes a start line (``S``) when the handler begins and an end line (``E``) when it
returns, so a test can tell which jobs ran, how often, in which order, and which were in flight
at any moment. Each line is one ``os.write`` to a file opened with ``O_APPEND``: small appends are
atomic, so lines from many threads and processes never interleave, and the file's order is the
order in which the lines were written.

Handlers that fail on purpose write a failure line (``F``) just before they raise.

Line format (space separated, see ``harness.RunEvent``)::

    S|E|F job_id time_ns pid type topic partition offset key n

Configuration comes from the environment (the worker runs this module in its own process):
``WORKER_TEST_RECORD`` names the file, ``WORKER_TEST_RATE_LIMIT`` and
``WORKER_TEST_CONCURRENCY_CAP`` set the options of the rate-limited and capped job types.
"""

from __future__ import annotations

import asyncio
import os
import random
import socket
import time
from typing import Any

from pipeline import Backoff, Pipeline, Retry

RECORD_ENV = "WORKER_TEST_RECORD"
RATE_LIMIT_ENV = "WORKER_TEST_RATE_LIMIT"
CONCURRENCY_CAP_ENV = "WORKER_TEST_CONCURRENCY_CAP"

app = Pipeline()


class _Recorder:
    """Appends lines to the recording file; opened lazily so forked workers get their own fd."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self._pid = 0

    def _open(self) -> int:
        pid = os.getpid()
        if self._fd is None or self._pid != pid:
            path = os.environ[RECORD_ENV]
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self._pid = pid
        return self._fd

    def line(self, event: str, ctx: Any, job_type: str, n: int) -> None:
        key = getattr(ctx, "key", None)
        if isinstance(key, bytes):
            key = key.decode("utf-8", "replace")
        topic = getattr(ctx, "topic", None) or app.topics.jobs(getattr(ctx, "priority", "default"))
        # The brief names the id ``ctx.job_id``; pipeline.JobContext calls it ``ctx.id``.
        job_id = getattr(ctx, "job_id", None) or getattr(ctx, "id", "?")
        fields = (
            event,
            job_id,
            time.time_ns(),
            os.getpid(),
            job_type,
            topic,
            getattr(ctx, "partition", -1),
            getattr(ctx, "offset", -1),
            key or "-",
            n,
        )
        os.write(self._open(), (" ".join(map(str, fields)) + "\n").encode())


record = _Recorder()


def _duration_s(min_ms: float, max_ms: float) -> float:
    return random.uniform(min_ms, max_ms) / 1000.0


@app.job("noop")
def noop(n: int, ctx: Any) -> None:
    """Does nothing but record its run."""
    record.line("S", ctx, "noop", n)
    record.line("E", ctx, "noop", n)


@app.job("sleepy")
def sleepy(n: int, ctx: Any, min_ms: float = 0.0, max_ms: float = 5.0) -> None:
    """A plain-function job that takes a random time (thread pool)."""
    record.line("S", ctx, "sleepy", n)
    time.sleep(_duration_s(min_ms, max_ms))
    record.line("E", ctx, "sleepy", n)


@app.job("sleepy_async")
async def sleepy_async(n: int, ctx: Any, min_ms: float = 0.0, max_ms: float = 5.0) -> None:
    """An ``async def`` job that takes a random time (event loop)."""
    record.line("S", ctx, "sleepy_async", n)
    await asyncio.sleep(_duration_s(min_ms, max_ms))
    record.line("E", ctx, "sleepy_async", n)


@app.job("long")
def long(n: int, ctx: Any, seconds: float) -> None:
    """A job that runs for ``seconds`` (far longer than max.poll.interval.ms in its test)."""
    record.line("S", ctx, "long", n)
    time.sleep(seconds)
    record.line("E", ctx, "long", n)


@app.job("gate")
def gate(n: int, ctx: Any, port: int, timeout_s: float = 120.0) -> None:
    """A long job: it holds until the test closes the connection it opens to ``port``
    (``harness.gates.Gates``), ``timeout_s`` at most (then it fails)."""
    record.line("S", ctx, "gate", n)
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as connection:
        connection.recv(1)  # b"" once the test closes its end
    record.line("E", ctx, "gate", n)


@app.job("gate_fail", max_attempts=1)
def gate_fail(n: int, ctx: Any, port: int) -> None:
    """A gate that fails once the test closes its connection (dead-lettered: one attempt)."""
    record.line("S", ctx, "gate_fail", n)
    with socket.create_connection(("127.0.0.1", port), timeout=120.0) as connection:
        connection.recv(1)
    record.line("F", ctx, "gate_fail", n)
    raise RuntimeError(f"gate {n} fails on purpose")


@app.job("ordered")
async def ordered(n: int, ctx: Any, max_ms: float = 5.0) -> None:
    """A keyed job whose start/end lines show per-key order and overlap."""
    record.line("S", ctx, "ordered", n)
    await asyncio.sleep(_duration_s(0.0, max_ms))
    record.line("E", ctx, "ordered", n)


@app.job("limited", rate_limit=float(os.environ.get(RATE_LIMIT_ENV, "200")))
def limited(n: int, ctx: Any) -> None:
    """A rate-limited job type: the whole fleet starts at most ``WORKER_TEST_RATE_LIMIT``/s."""
    record.line("S", ctx, "limited", n)
    record.line("E", ctx, "limited", n)


@app.job("capped", concurrency=int(os.environ.get(CONCURRENCY_CAP_ENV, "3")))
async def capped(n: int, ctx: Any, max_ms: float = 20.0) -> None:
    """A job type with a per-process concurrency cap of ``WORKER_TEST_CONCURRENCY_CAP``."""
    record.line("S", ctx, "capped", n)
    await asyncio.sleep(_duration_s(0.0, max_ms))
    record.line("E", ctx, "capped", n)


# -- failure routing ------------------------------------------------------------------------------

FAST_BACKOFF = Backoff(base_s=0.5, factor=2.0, cap_s=5.0, jitter=0.0)
"""0.5 s, then 1 s, 2 s, ...: the tests' retry tiers are 0.5 s and 2 s."""


class UnrecoverableError(Exception):
    """Declared fatal for ``doomed``: no retry."""


@app.job("flaky", backoff=FAST_BACKOFF)
def flaky(n: int, ctx: Any, failures: int) -> None:
    """Fails its first ``failures`` attempts, then succeeds."""
    record.line("S", ctx, "flaky", n)
    if ctx.attempt <= failures:
        record.line("F", ctx, "flaky", n)
        raise RuntimeError(f"attempt {ctx.attempt} fails on purpose")
    record.line("E", ctx, "flaky", n)


@app.job("doomed", backoff=FAST_BACKOFF, fatal=(UnrecoverableError,))
async def doomed(n: int, ctx: Any, fatal: bool = False) -> None:
    """Always fails: with a transient error, or with a fatal one."""
    record.line("S", ctx, "doomed", n)
    record.line("F", ctx, "doomed", n)
    if fatal:
        raise UnrecoverableError(f"job {n} cannot succeed")
    raise ValueError(f"attempt {ctx.attempt} of job {n} fails")


@app.job("padded", backoff=FAST_BACKOFF, max_attempts=2)
def padded(n: int, ctx: Any, pad: str) -> None:
    """Always fails, with a payload as large as ``pad`` makes it (near Kafka's message size)."""
    record.line("S", ctx, "padded", n)
    record.line("F", ctx, "padded", n)
    raise ValueError(f"attempt {ctx.attempt} of job {n} fails " + "e" * 1500)


@app.job("twice", backoff=FAST_BACKOFF, max_attempts=2)
def twice(n: int, ctx: Any) -> None:
    """Always fails; its type allows two runs in all."""
    record.line("S", ctx, "twice", n)
    record.line("F", ctx, "twice", n)
    raise ValueError(f"attempt {ctx.attempt} of job {n} fails")


@app.job("loud")
def loud(n: int, ctx: Any) -> None:
    """Fails with an error whose traceback is far longer than a dead letter keeps."""
    record.line("S", ctx, "loud", n)
    record.line("F", ctx, "loud", n)
    raise ValueError("x" * 20_000 + " END")


@app.job("later")
def later(n: int, ctx: Any, after: float) -> None:
    """Asks to run again in ``after`` seconds on its first attempt (``Retry``), then succeeds."""
    record.line("S", ctx, "later", n)
    if ctx.attempt == 1:
        record.line("F", ctx, "later", n)
        raise Retry(after=after)
    record.line("E", ctx, "later", n)


@app.job("brief", dedup_ttl=3.0)
def brief(n: int, ctx: Any) -> None:
    """Holds its idempotency key for 3 s only."""
    record.line("S", ctx, "brief", n)
    record.line("E", ctx, "brief", n)


_senders: dict[str, Pipeline] = {}


@app.job("forward", backoff=FAST_BACKOFF, max_attempts=2)
def forward(n: int, ctx: Any, namespace: str | None = None) -> None:
    """Enqueues a ``noop`` job ``n``: with the app, or with an application of ``namespace``
    (one whose topics do not exist: Kafka refuses the job within about 3 s)."""
    record.line("S", ctx, "forward", n)
    sender = app
    if namespace is not None:
        sender = _senders.get(namespace) or _senders.setdefault(
            namespace,
            Pipeline(
                app.settings.model_copy(
                    update={
                        "namespace": namespace,
                        "producer": app.settings.producer.model_copy(
                            update={"delivery_timeout_s": 6.0}
                        ),
                    }
                )
            ),
        )
    sender.enqueue("noop", {"n": n})
    record.line("E", ctx, "forward", n)


@app.job("poison")
def poison(n: int, ctx: Any, after_s: float = 0.0) -> None:
    """Kills the worker process that runs it, every time (``after_s`` seconds after it starts)."""
    record.line("S", ctx, "poison", n)
    if after_s:
        time.sleep(after_s)
    os._exit(1)
