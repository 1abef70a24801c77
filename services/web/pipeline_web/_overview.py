"""The overview (``/``) and workers (``/workers``) pages: both render the monitor's latest
reading, so they cost no Kafka request; the page refreshes its live part itself."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from starlette.routing import Route

from ._chart import Chart, rate_chart
from ._dashboard import dashboard_of

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from pipeline._backlogmodel import GroupMember, TopicBacklog
    from pipeline._status import StatusSnapshot
    from pipeline._workerbeats import WorkerBeat

    from ._monitor import Rate, Reading


@dataclass(frozen=True, slots=True)
class TopicRow:
    """One line of a backlog table."""

    label: str
    topic: str
    waiting: int
    oldest_age_s: float | None
    rate: Rate | None
    chart: Chart


def _rows(
    topics: tuple[TopicBacklog, ...], latest: Reading, history: list[Reading]
) -> list[TopicRow]:
    at = latest.snapshot.at
    return [
        TopicRow(
            t.label,
            t.topic,
            t.waiting,
            t.oldest_age_s(at),
            latest.rates.get(t.topic),
            rate_chart(history, t.topic),
        )
        for t in topics
    ]


def overview(request: Request) -> Response:
    dashboard = dashboard_of(request)
    latest = dashboard.monitor.latest
    context: dict[str, object] = {"page": "overview", "reading": latest}
    if latest is not None:
        history = dashboard.monitor.history()
        snapshot = latest.snapshot
        context.update(
            snapshot=snapshot,
            priorities=_rows(snapshot.priorities, latest, history),
            retries=_rows(snapshot.retry_tiers, latest, history),
            deferred=_rows(snapshot.deferred, latest, history),
            leader=snapshot.leader,
        )
    return dashboard.render(request, "overview.html", context)


@dataclass(frozen=True, slots=True)
class WorkerRow:
    member: GroupMember
    partitions: list[tuple[str, str]]
    """(topic label, its partition numbers) for each topic the member owns."""
    beat: WorkerBeat | None
    """Its last heartbeat, unless it has none or a stale one."""
    beat_age: float | None


def _worker_row(snapshot: StatusSnapshot, member: GroupMember) -> WorkerRow:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in member.partitions:
        by_topic.setdefault(topic.rsplit(".", 1)[-1], []).append(partition)
    beat = snapshot.beat_of(member)
    return WorkerRow(
        member,
        [(label, ", ".join(map(str, sorted(ps)))) for label, ps in sorted(by_topic.items())],
        beat,
        None if beat is None else beat.age_s(snapshot.at),
    )


def workers(request: Request) -> Response:
    dashboard = dashboard_of(request)
    latest = dashboard.monitor.latest
    context: dict[str, object] = {"page": "workers", "reading": latest}
    if latest is not None:
        snapshot = latest.snapshot
        members = sorted(snapshot.workers.members, key=lambda m: m.client_id)
        context.update(group=snapshot.workers, rows=[_worker_row(snapshot, m) for m in members])
    return dashboard.render(request, "workers.html", context)


ROUTES = [Route("/", overview), Route("/workers", workers)]
