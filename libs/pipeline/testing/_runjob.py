"""``run_job``: one job of an application, encoded as its producer would and run as its worker
would, in the test's own process."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from .._errors import ConfigurationError
from .._job import new_job_id
from .._jobfunction import EnqueueOptions
from ._clock import FakeClock
from ._execution import execute
from ._transport import InMemoryTransport

if TYPE_CHECKING:
    from confluent_kafka import KafkaError, Message

    from .._app import Pipeline
    from ._results import JobResult
    from ._transport import SentMessage


def run_job(
    app: Pipeline,
    job_type: str,
    payload: Mapping[str, Any] | None = None,
    *,
    attempt: int = 1,
    key: str | bytes | None = None,
    headers: Mapping[str, str] | None = None,
    clock: FakeClock | None = None,
    rand: random.Random | None = None,
    **options: Any,
) -> JobResult:
    """Run one ``job_type`` job with ``payload`` through the real codec, context, interceptors,
    payload validation, time limit and failure classification; return what happened.

    ``attempt`` is the run to pretend this is (``max_attempts`` is judged against it).
    ``options`` are those of ``app.enqueue`` that shape the job (``priority``, ``tenant``,
    ``idempotency_key``, ``max_attempts``). The payload is not refused up front as
    ``enqueue`` refuses it: the worker's validation judges it, so a payload that does not fit
    comes back ``DEAD`` with reason ``validation_error``. ``clock``: the clock the run happens
    at (default: the wall clock); ``rand`` draws the backoff's jitter (default: seeded, so a
    run repeats). From an ``async def`` test it blocks the test's event loop until the run
    ends: :func:`run_job_async` does not.
    """
    _check_arguments(attempt, clock, rand, options)
    options = {"key": key, "headers": headers, **options}
    message = _produce(app, job_type, payload or {}, attempt=attempt, clock=clock, options=options)
    on = clock.now_ms if clock is not None else None
    # What the handler enqueues stays in the test, as under the stub worker: never to Kafka.
    children = InMemoryTransport()
    saved, app._transport = app._transport, children
    try:
        result = execute(app, message, clock=on, rand=rand or random.Random(0)).result
    finally:
        children.flush(0)  # acknowledged: the application waits for none of them at exit
        app._transport = saved
    return replace(result, enqueued=tuple(app.codec.decode(m.value) for m in children.messages))


async def run_job_async(
    app: Pipeline,
    job_type: str,
    payload: Mapping[str, Any] | None = None,
    *,
    attempt: int = 1,
    key: str | bytes | None = None,
    headers: Mapping[str, str] | None = None,
    clock: FakeClock | None = None,
    rand: random.Random | None = None,
    **options: Any,
) -> JobResult:
    """:func:`run_job`, awaited from an ``async def`` test: it runs on a helper thread while the
    test's event loop goes on, so the handler can talk to a server or client on that loop
    (``run_job`` blocks the loop until the run ends)."""
    return await asyncio.to_thread(
        run_job,
        app,
        job_type,
        payload,
        attempt=attempt,
        key=key,
        headers=headers,
        clock=clock,
        rand=rand,
        **options,
    )


_SHAPING = ("priority", "tenant", "idempotency_key", "max_attempts")
"""The options of ``app.enqueue`` that ``run_job`` takes: those that shape the job."""


def _check_arguments(
    attempt: object, clock: object, rand: object, options: Mapping[str, Any]
) -> None:
    """Refuse a mistyped argument, naming it, rather than fail somewhere inside the run."""
    if isinstance(attempt, bool) or not isinstance(attempt, int):
        raise ConfigurationError(f"run_job(attempt=...) must be an int, got {attempt!r}")
    if attempt < 1:
        raise ConfigurationError(f"run_job(attempt=...) must be at least 1, got {attempt}")
    if clock is not None and not isinstance(clock, FakeClock):
        raise ConfigurationError(
            f"run_job(clock=...) must be a pipeline.testing.FakeClock, got {clock!r}"
        )
    if rand is not None and not isinstance(rand, random.Random):
        raise ConfigurationError(f"run_job(rand=...) must be a random.Random, got {rand!r}")
    for name in options:
        if name in ("delay", "run_at", "wait"):
            raise ConfigurationError(
                f"run_job runs the job now and takes no {name}=; "
                "to test delays use the stub worker (pipeline.testing.stub_worker)"
            )
        if name not in _SHAPING:
            raise TypeError(
                f"run_job() got an unexpected keyword argument {name!r}; besides attempt, key, "
                f"headers, clock and rand it takes {', '.join(_SHAPING)}"
            )


def _produce(
    app: Pipeline,
    job_type: str,
    payload: Mapping[str, Any],
    *,
    attempt: int,
    clock: FakeClock | None,
    options: dict[str, Any],
) -> SentMessage:
    """The job as the application's producer encodes and routes it (on an in-memory topic)."""
    route = app._route(job_type, EnqueueOptions(**options), app._added_headers())
    data = route.payload_codec.encode(job_type, payload)
    job = route.job(new_job_id(), data)
    job = replace(job, attempt=attempt)
    if clock is not None:
        job = replace(job, created_at=clock.now_ms())
    transport = InMemoryTransport(partitions=app.settings.topics.partitions)
    transport.produce(route.topic, app.codec.encode(job), route.key, _ignore)
    transport.poll()
    return transport.messages[0]


def _ignore(error: KafkaError | None, message: Message) -> None:
    return None
