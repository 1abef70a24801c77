"""Job lookup (``/jobs?id=...``): a job's timeline from ``<ns>.events`` and its dead letters.

What the timeline holds depends on the workers' ``events`` setting (``errors``: retries and
dead letters; ``all``: every start, progress and success too); a dead letter adds what its job
carries (when it was enqueued, every attempt's error) even where no event was written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from starlette.routing import Route

from pipeline._errors import PipelineError
from pipeline._eventlog import job_history
from pipeline._human import event_detail
from pipeline._topics import TopicNames

from ._dashboard import JOB_LOOKUPS, dashboard_of

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from pipeline._deadletters import StoredLetter
    from pipeline._eventlog import JobHistory


@dataclass(frozen=True, slots=True)
class Step:
    """One line of a timeline."""

    at: int
    what: str
    attempt: int | None = None
    worker: str | None = None
    detail: str | None = None
    letter_id: str | None = None


def _letter_steps(stored: StoredLetter, with_errors: bool) -> list[Step]:
    letter = stored.letter
    steps: list[Step] = []
    job = letter.job
    if job is not None:
        steps.append(Step(job.created_at, "enqueued", detail=f"priority {job.priority.value}"))
        if with_errors:
            steps += [
                Step(e.at, "failed", e.attempt, e.worker, f"{e.error_class}: {e.message}")
                for e in job.errors
            ]
    error = f"{letter.error_class}: {letter.message}" if letter.error_class else letter.message
    steps.append(
        Step(letter.dead_at, f"dead-lettered ({letter.reason})", detail=error, letter_id=letter.id)
    )
    if stored.state is not None:
        state = stored.state
        where = f" to {state.to}" if state.to else ""
        steps.append(
            Step(state.at, f"{state.status.value} by {state.by}{where}", letter_id=letter.id)
        )
    return steps


def timeline(history: JobHistory) -> list[Step]:
    """The job's steps in time order; an enqueue time seen twice is shown once."""
    steps = [Step(e.at, e.kind, e.attempt, e.worker, event_detail(e)) for e in history.events]
    has_failures = any(e.kind == "retried" for e in history.events)
    for stored in history.letters:
        steps += _letter_steps(stored, with_errors=not has_failures)
    unique = list(dict.fromkeys(steps))
    return sorted(unique, key=lambda s: s.at)


def job_page(request: Request) -> Response:
    dashboard = dashboard_of(request)
    job_id = (request.query_params.get("id") or "").strip()
    context: dict[str, object] = {"page": "jobs", "job_id": job_id}
    if job_id:
        # Each lookup reads the events topic to its end: a few at once, not one per request.
        if not dashboard.lookups.acquire(blocking=False):
            events = TopicNames(dashboard.settings.namespace).events
            context["error"] = (
                f"{JOB_LOOKUPS} job lookups are reading {events} already; try again in a moment"
            )
            return dashboard.render(request, "job.html", context, status_code=503)
        try:
            history = dashboard.monitor.guarded(
                lambda: job_history(
                    dashboard.settings,
                    job_id,
                    timeout=10.0,
                    letters=lambda job: dashboard.letters_of_job(job, timeout=10.0),
                )
            )
        except PipelineError as exc:  # the lookup did not happen: not a "nothing is known"
            context["error"] = str(exc)
            return dashboard.render(request, "job.html", context, status_code=503)
        else:
            context.update(history=history, steps=timeline(history))
        finally:
            dashboard.lookups.release()
    return dashboard.render(request, "job.html", context)


ROUTES = [Route("/jobs", job_page)]
