"""Enqueueing from a web handler without an outbox: answer 503 with Retry-After while Kafka is away.

``enqueue(..., wait=True)`` returns once Kafka acknowledged the job and raises
:class:`pipeline.KafkaUnavailableError` when it did not within the producer's delivery timeout
(``PIPELINE_PRODUCER__DELIVERY_TIMEOUT_S``; keep it under the client's own request timeout).
The handler turns that into ``503 Service Unavailable`` with ``Retry-After``, so the client
retries later and no job is lost silently; a body it cannot make a job of (not JSON, no
``email``, a payload the job type refuses) is ``400 Bad Request``, and nothing is sent. Run it
with ``uvicorn examples.web_enqueue:web``.
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from pipeline import KafkaUnavailableError, PayloadValidationError, Pipeline

RETRY_AFTER_S = 30


def make_web(app: Pipeline) -> Starlette:
    """The ASGI application of a signup endpoint that enqueues a welcome email."""

    async def signup(request: Request) -> JSONResponse:
        try:
            body = await request.json()
        except ValueError:
            return JSONResponse({"error": "the body is not JSON"}, status_code=400)
        email = body.get("email") if isinstance(body, dict) else None
        if not isinstance(email, str):
            return JSONResponse({"error": 'give the address as "email"'}, status_code=400)
        try:
            # wait=True blocks until Kafka answers: off the event loop, on a thread.
            job_id = await run_in_threadpool(
                app.enqueue, "email.send", {"to": email, "subject": "Welcome"}, wait=True
            )
        except PayloadValidationError as exc:  # the job type's handler would refuse it
            return JSONResponse({"error": str(exc)}, status_code=400)
        except KafkaUnavailableError:
            return JSONResponse(
                {"error": "the job queue is unavailable, try again later"},
                status_code=503,
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        return JSONResponse({"job_id": job_id}, status_code=202)

    return Starlette(routes=[Route("/signup", signup, methods=["POST"])])


def _default_web() -> Starlette:
    from .app import app

    return make_web(app)


web = _default_web()
