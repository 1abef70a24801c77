"""Schedules (``/schedules``): each cron schedule with its next fires, last fire and missed-fire
policy; pause, resume and trigger now.

The actions are the ones ``pipeline schedules pause|resume|trigger`` run. A trigger's form
carries the time the page was rendered, which the fire's job id and idempotency key derive
from: submitting the same form twice enqueues one job, run once.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING
from urllib.parse import urlencode

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.responses import RedirectResponse
from starlette.routing import Route

from pipeline._cronexpr import next_fire_ms
from pipeline._cronstate import read_last_fires
from pipeline._deadletters import LATEST_MS
from pipeline._errors import ConfigurationError, PipelineError
from pipeline._job import now_ms
from pipeline._schedule import payload_text
from pipeline._scheduleops import pause_schedule, resume_schedule, trigger_schedule
from pipeline._scheduletable import read_schedule_records

from ._dashboard import dashboard_of
from ._letters import whole_number
from ._notices import signed_notice

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from pipeline import Settings
    from pipeline._records import Schedule

    from ._dashboard import Dashboard

NEXT_FIRES = 3
ACTIONS = ("pause", "resume", "trigger")


@dataclass(frozen=True, slots=True)
class ScheduleRow:
    name: str
    schedule: Schedule | None
    problem: str | None
    last_fire: int | None
    next_fires: list[int]
    payload: str


def _next_fires(schedule: Schedule, after: int) -> list[int]:
    fires: list[int] = []
    for _ in range(NEXT_FIRES):
        try:
            after = next_fire_ms(schedule.cron, schedule.timezone, after)
        except (ConfigurationError, ValueError):
            break
        fires.append(after)
    return fires


def read_rows(settings: Settings, timeout: float) -> list[ScheduleRow]:
    """Every schedule record, valid or not, with its last fire and its next fires from now."""
    records = read_schedule_records(settings, timeout=timeout)
    last = read_last_fires(settings, timeout=timeout) if records else {}
    now = now_ms()
    rows = []
    for name, record in sorted(records.items()):
        schedule = record.schedule
        rows.append(
            ScheduleRow(
                name,
                schedule,
                record.problem,
                last.get(name),
                _next_fires(schedule, now) if schedule and not record.problem else [],
                payload_text(schedule) if schedule else "",
            )
        )
    return rows


def schedules_page(request: Request) -> Response:
    dashboard = dashboard_of(request)
    context: dict[str, object] = {"page": "schedules", "rendered_at": now_ms()}
    settings = dashboard.settings
    try:
        context["rows"] = dashboard.monitor.guarded(lambda: read_rows(settings, timeout=10.0))
    except PipelineError as exc:  # Kafka unreachable, or the topics missing: not a page of none
        context.update(rows=[], error=str(exc))
        return dashboard.render(request, "schedules.html", context, status_code=503)
    return dashboard.render(request, "schedules.html", context)


def _back(dashboard: Dashboard, notice: str) -> RedirectResponse:
    query = urlencode(signed_notice(dashboard.gate, notice))
    return RedirectResponse(f"/schedules?{query}", status_code=303)


def _schedule_name(request: Request) -> str:
    """The name of the schedule to act on: the query's ``name`` (as the page sends it), or
    the path's (``/schedules/<name>/<action>``, with a "/" in the name sent as %2F)."""
    name = request.path_params.get("name", request.query_params.get("name"))
    if not isinstance(name, str) or not name:
        raise HTTPException(400, "no schedule named: POST /schedules/<action>?name=<name>")
    return name


async def schedule_action(request: Request) -> Response:
    dashboard = dashboard_of(request)
    form = await dashboard.action_form(request)
    action = request.path_params["action"]
    if action not in ACTIONS:
        raise HTTPException(404, f"no schedule action {action!r}")
    name = _schedule_name(request)
    settings, writing = dashboard.settings, dashboard.monitor.writing
    target: dict[str, object] = {"schedule": name}
    changed = True
    try:
        if action == "pause":
            pause = partial(pause_schedule, settings, name, timeout=10.0)
            changed = await run_in_threadpool(writing, pause)
            notice = (
                f"Schedule {name} paused: it fires no more until resumed."
                if changed
                else f"Schedule {name} was paused already."
            )
        elif action == "resume":
            resume = partial(resume_schedule, settings, name, timeout=10.0)
            changed = await run_in_threadpool(writing, resume)
            notice = f"Schedule {name} resumed." if changed else f"Schedule {name} was not paused."
        else:
            at = _fire_time(form.get("at"))
            target["at"] = at
            trigger = partial(trigger_schedule, settings, name, at, timeout=10.0)
            job = await run_in_threadpool(writing, trigger)
            target["job_id"] = job.id
            notice = f"Schedule {name} triggered: job {job.id} enqueued."
    except PipelineError as exc:
        dashboard.audit.record(
            request.state.who, f"schedule.{action}", target=target, count=0, outcome=str(exc)
        )
        return _back(dashboard, f"Could not {action} {name}: {exc}")
    dashboard.audit.record(
        request.state.who, f"schedule.{action}", target=target, count=int(changed)
    )
    return _back(dashboard, notice)


def _fire_time(raw: object) -> int:
    """The fire time a trigger form sends (``at``, epoch milliseconds: the page's, so that a
    form sent twice fires once); now without one."""
    if not isinstance(raw, str):
        return now_ms()
    at = whole_number(raw)
    if at is None or at > LATEST_MS:
        raise HTTPException(400, f"'at' must be epoch milliseconds, got {raw!r}")
    return at


ROUTES = [
    Route("/schedules", schedules_page),
    # The page's forms name the schedule in the query (?name=..): in the path, a browser (or
    # curl) removes a segment "." or ".." (percent-encoded too), so a schedule named so could
    # not be acted on; in a hidden field, a browser would send a line break in it as CR LF.
    # The name may also be the path (a "/" in it sent as %2F); the action is the last segment.
    Route("/schedules/{action}", schedule_action, methods=["POST"]),
    Route("/schedules/{name:path}/{action}", schedule_action, methods=["POST"]),
]
