"""The application both sides of the behaviour suite run: the same job types, the same handlers.

``pipeline-worker --app tests.behaviour.app`` loads :data:`app`; the stub side drives an app made
by :func:`make_app` in the test process. An interceptor, :class:`Observer`, appends a line to the
file named by ``BEHAVIOUR_RECORD`` for every handler call (``call``), and for every call that
returned (``return``, with the value) or raised (``raise``). Each line is one ``os.write`` to a
file opened with ``O_APPEND``, so lines of concurrent jobs never interleave and the file's order is
the order of the calls. A line has two times: ``at`` on :data:`recorder`'s clock (the wall clock
in a worker process, the fake clock on the stub side) and ``wall``, the wall clock always.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import os
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from pipeline import Backoff, JobContext, Pipeline, Retry, Settings

if TYPE_CHECKING:
    from collections.abc import Callable

    from pipeline import CallNext, JobCall
    from pipeline._producer import Transport

RECORD_ENV = "BEHAVIOUR_RECORD"
FAST_BACKOFF = Backoff(base_s=0.5, factor=2.0, cap_s=2.0, jitter=0.0)
"""0.5 s, then 1 s, then 2 s: retries fit the suite's retry tiers of 0.5 s and 2 s."""
TIME_LIMIT_S = 0.3
FIRST_JOB: contextvars.ContextVar[str | None] = contextvars.ContextVar("first_job", default=None)
"""Set by ``remember`` in its job's context: a job that sees another job's value shares its
context."""


class KeyOverlapError(RuntimeError):
    """Two jobs of one key ran at once."""


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


class Recorder:
    """Appends the suite's lines to one file; ``use`` points it at a file and a clock."""

    def __init__(self) -> None:
        self.clock: Callable[[], int] = wall_ms
        self._path: str | None = None
        self._fd: int | None = None
        self._pid = 0

    def use(self, path: str | None, clock: Callable[[], int] = wall_ms) -> None:
        """Write to ``path`` with times from ``clock`` (None: the file ``BEHAVIOUR_RECORD``
        names, and the wall clock)."""
        self.close()
        self._path, self.clock = path, clock

    def close(self) -> None:
        if self._fd is not None and self._pid == os.getpid():
            os.close(self._fd)
        self._fd = None

    def write(self, kind: str, call: JobCall, **extra: Any) -> None:
        line = {
            "kind": kind,
            "id": call.job.id,
            "type": call.job.type,
            "attempt": call.ctx.attempt,
            "key": _text(call.ctx.key),
            "priority": str(call.ctx.priority),
            "partition": call.ctx.partition,
            "max_attempts": call.ctx.max_attempts,
            "last": call.ctx.is_last_attempt,
            "at": self.clock(),
            "wall": wall_ms(),
            **extra,
        }
        os.write(self._open(), (json.dumps(line) + "\n").encode())

    def _open(self) -> int:
        if self._fd is None or self._pid != os.getpid():  # a forked worker opens its own
            path = self._path or os.environ[RECORD_ENV]
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self._pid = os.getpid()
        return self._fd


def _text(key: bytes | str | None) -> str | None:
    return key.decode("utf-8", "replace") if isinstance(key, bytes) else key


recorder = Recorder()


class Observer:
    """Records each handler call, and what it returned or raised, around the handler."""

    async def intercept(self, call: JobCall, next: CallNext) -> Any:
        recorder.write("call", call)
        try:
            value = await next(call)
        except BaseException as exc:
            recorder.write("raise", call, error=type(exc).__name__)
            raise
        recorder.write("return", call, value=value)
        return value


class UnrecoverableError(Exception):
    """Declared fatal for ``doomed``: retrying cannot help."""


def make_app(settings: Settings | None = None, transport: Transport | None = None) -> Pipeline:
    """The suite's application: every job type of the scenarios, with the observer."""
    app = _add_context_jobs(Pipeline(settings, transport=transport, middleware=[Observer()]))

    @app.job("echo")
    def echo(text: str, ctx: JobContext) -> dict[str, Any]:
        """Succeeds at once with a value made of its payload and attempt."""
        return {"echo": text, "attempt": ctx.attempt}

    @app.job("later", backoff=FAST_BACKOFF)
    def later(after_s: float, ctx: JobContext) -> str:
        """Asks for another run ``after_s`` seconds later on its first attempt (``Retry``)."""
        if ctx.attempt == 1:
            raise Retry(after=after_s)
        return f"done at attempt {ctx.attempt}"

    @app.job("later_at", backoff=FAST_BACKOFF)
    def later_at(after_s: float, ctx: JobContext) -> str:
        """On its first attempt asks for another run at the wall-clock time ``after_s`` seconds
        from now (``Retry(at=...)``), the way a handler computes such a time."""
        if ctx.attempt == 1:
            raise Retry(at=datetime.now(UTC) + timedelta(seconds=after_s))
        return f"done at attempt {ctx.attempt}"

    @app.job("flaky", backoff=FAST_BACKOFF, max_attempts=3)
    def flaky(n: int) -> None:
        """Fails with a transient error every time; its type allows three runs."""
        raise ValueError(f"job {n} fails on purpose")

    @app.job("doomed", backoff=FAST_BACKOFF, fatal=(UnrecoverableError,))
    async def doomed(n: int) -> None:
        """Fails with an error its type declares fatal."""
        raise UnrecoverableError(f"job {n} cannot succeed")

    @app.job("typed")
    def typed(count: int) -> int:
        """Takes an ``int``: a payload with a string there fails validation."""
        return count

    @app.job("slow", backoff=FAST_BACKOFF, max_attempts=2, time_limit=TIME_LIMIT_S)
    async def slow(seconds: float) -> None:
        """Waits for an event nobody sets: only its type's time limit ends it (``seconds``, far
        past that limit, bounds it should the limit fail)."""
        await asyncio.wait_for(asyncio.Event().wait(), seconds)

    @app.job("slow_sync", backoff=FAST_BACKOFF, max_attempts=2, time_limit=TIME_LIMIT_S)
    def slow_sync(seconds: float) -> None:
        """A plain function (a pool thread) blocked on an event nobody sets, ``seconds`` at
        most: a thread cannot be stopped, so the time limit gives up on it."""
        threading.Event().wait(seconds)

    @app.job("bulk")
    def bulk(items: list[int]) -> int:
        """Takes a long list: its producer spends milliseconds validating and encoding it."""
        return len(items)

    @app.job("chain")
    def chain(text: str) -> str:
        """Enqueues an ``echo`` job of its own; returns that job's id."""
        return app.enqueue("echo", {"text": text})

    overlaps: dict[bytes | None, asyncio.Event] = {}

    @app.job("ordered")
    async def ordered(n: int, ctx: JobContext, pause_ms: float = 0.0) -> int:
        """Stays running up to ``pause_ms``, or until a job of its key starts meanwhile: then
        both fail (``KeyOverlapError``), which the ordering scenario would see."""
        if ctx.key in overlaps:
            overlaps[ctx.key].set()
            raise KeyOverlapError(f"job {n} started while another job of its key ran")
        overlap = overlaps[ctx.key] = asyncio.Event()
        try:
            await asyncio.wait_for(overlap.wait(), pause_ms / 1000)
        except TimeoutError:
            return n  # nothing else of its key started: the usual end
        finally:
            overlaps.pop(ctx.key, None)
        raise KeyOverlapError(f"another job of its key started while job {n} ran")

    @app.job("gate")
    async def gate(port: int) -> None:
        """Holds its worker slot until the test closes the connection it opens to ``port``."""
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        await reader.read()
        writer.close()
        await writer.wait_closed()

    return app


def _add_context_jobs(app: Pipeline) -> Pipeline:
    """``app`` with the job types that report what their context holds."""

    @app.job("remember")
    async def remember(n: int, ctx: JobContext) -> str | None:
        """Sets :data:`FIRST_JOB` in its context when unset; returns what it found there."""
        seen = FIRST_JOB.get()
        if seen is None:
            FIRST_JOB.set(ctx.id)
        return seen

    @app.job("located", backoff=FAST_BACKOFF)
    def located(retries: int, ctx: JobContext) -> dict[str, Any]:
        """Asks for another run 0.6 s later until ``retries`` retries were made; then returns
        where its message was read from (whether its priority's topic, and the offset)."""
        if ctx.attempt <= retries:
            raise Retry(after=0.6)
        return {"own_topic": ctx.topic == app.topics.jobs(ctx.priority), "offset": ctx.offset}

    return app


app = make_app()
