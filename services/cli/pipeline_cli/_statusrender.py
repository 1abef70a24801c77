"""How ``pipeline status`` shows a snapshot: tables like ``kubectl get``, or JSON, stable keys."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from pipeline._human import age, when
from pipeline._status import topic_rates

from ._output import print_table

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pipeline._backlogmodel import GroupMember, GroupMembers, TopicBacklog
    from pipeline._status import StatusSnapshot
    from pipeline._workerbeats import WorkerBeat


def _lag_json(lag: TopicBacklog, at: int, pair: tuple[float, float] | None) -> dict[str, Any]:
    return {
        "name": lag.label,
        "topic": lag.topic,
        "group": lag.group,
        "backlog": lag.waiting,
        "oldest_age_s": lag.oldest_age_s(at),
        "rate_in": None if pair is None else round(pair[0], 3),
        "rate_out": None if pair is None else round(pair[1], 3),
        "partitions": [
            {
                "partition": p.partition,
                "end": p.end,
                "committed": p.committed,
                "backlog": p.waiting,
                "oldest_at": p.oldest_ms,
            }
            for p in lag.partitions
        ],
    }


def _member_json(member: GroupMember) -> dict[str, Any]:
    return {
        "client_id": member.client_id,
        "member_id": member.member_id,
        "host": member.host,
        "partitions": [f"{topic}[{partition}]" for topic, partition in member.partitions],
    }


def _group_json(group: GroupMembers) -> dict[str, Any]:
    return {
        "group": group.group,
        "state": group.state,
        "members": [_member_json(m) for m in group.members],
    }


def _worker_json(snapshot: StatusSnapshot, member: GroupMember) -> dict[str, Any]:
    """A worker member with its heartbeat's fields (``null``: no heartbeat, or a stale one)."""
    beat = snapshot.beat_of(member)
    return {
        **_member_json(member),
        "in_flight": None if beat is None else beat.in_flight,
        "concurrency": None if beat is None else beat.concurrency,
        "utilization": None if beat is None else beat.utilization,
        "jobs_done": None if beat is None else beat.jobs_done,
        "pid": None if beat is None else beat.pid,
        "started_at": None if beat is None else when(beat.started_at_ms),
        "heartbeat_age_s": None if beat is None else round(beat.age_s(snapshot.at), 3),
    }


def _busy_text(beat: WorkerBeat | None) -> tuple[str, str]:
    if beat is None:
        return "n/a", "n/a"
    return f"{beat.in_flight}/{beat.concurrency}", f"{beat.utilization:.0%}"


def status_json(snapshot: StatusSnapshot, previous: StatusSnapshot | None) -> dict[str, Any]:
    """The snapshot as JSON; rates are ``null`` without a previous snapshot to compare with."""
    pairs = topic_rates(previous, snapshot)
    at = snapshot.at

    def lags(items: Sequence[TopicBacklog]) -> list[dict[str, Any]]:
        return [_lag_json(lag, at, pairs.get(lag.topic)) for lag in items]

    leader = snapshot.leader
    return {
        "namespace": snapshot.namespace,
        "at": when(at),
        "at_ms": at,
        "priorities": lags(snapshot.priorities),
        "retry_tiers": lags(snapshot.retry_tiers),
        "deferred": lags(snapshot.deferred),
        "workers": {
            **_group_json(snapshot.workers),
            "members": [_worker_json(snapshot, m) for m in snapshot.workers.members],
        },
        "scheduler": {
            **_group_json(snapshot.scheduler),
            "leader": None if leader is None else _member_json(leader),
            "cron_lateness_s": snapshot.cron_lateness_s,
        },
        "dead_letters_pending": snapshot.dead_letters_pending,
        "schedules": [
            {
                "name": s.name,
                "cron": s.cron,
                "timezone": s.timezone,
                "job_type": s.job_type,
                "enabled": s.enabled,
                "last_fire": when(s.last_fire),
                "next_fire": when(s.next_fire),
                "overdue_s": s.overdue_s(at),
            }
            for s in snapshot.schedules
        ],
    }


def _partitions_text(member: GroupMember) -> str:
    """``0,1,2 of 4 topics``: a co-partitioned member owns the same numbers on every topic."""
    numbers = sorted({partition for _, partition in member.partitions})
    topics = {topic for topic, _ in member.partitions}
    if not numbers:
        return "-"
    suffix = f" of {len(topics)} topics" if len(topics) > 1 else f" of {next(iter(topics))}"
    return ",".join(str(n) for n in numbers) + suffix


def _lag_rows(
    items: Sequence[TopicBacklog], at: int, pairs: dict[str, tuple[float, float]]
) -> list[list[object]]:
    rows: list[list[object]] = []
    for lag in items:
        pair = pairs.get(lag.topic)
        rows.append(
            [
                lag.label,
                lag.topic,
                lag.waiting,
                age(lag.oldest_age_s(at)) or "-",
                "n/a" if pair is None else f"{pair[0]:.1f}",
                "n/a" if pair is None else f"{pair[1]:.1f}",
            ]
        )
    return rows


def print_status(snapshot: StatusSnapshot, previous: StatusSnapshot | None) -> None:
    """The snapshot as tables; IN/S and OUT/S say ``n/a`` until a previous refresh exists."""
    pairs = topic_rates(previous, snapshot)
    at = snapshot.at
    click.echo(f"namespace {snapshot.namespace} at {when(at)}")
    for title, items in [
        ("priority", snapshot.priorities),
        ("retry tier", snapshot.retry_tiers),
        ("deferred", snapshot.deferred),
    ]:
        if items:
            click.echo()
            print_table(
                _lag_rows(items, at, pairs), [title, "topic", "backlog", "oldest", "in/s", "out/s"]
            )
    workers = snapshot.workers
    click.echo()
    count = len(workers.members)
    click.echo(
        f"workers: group {workers.group} ({workers.state.lower()}), "
        f"{count} member{'' if count == 1 else 's'}"
    )
    if workers.members:
        print_table(
            [
                [m.client_id, m.host, *_busy_text(snapshot.beat_of(m)), _partitions_text(m)]
                for m in workers.members
            ],
            ["client", "host", "in flight", "busy", "partitions"],
        )
    click.echo()
    leader = snapshot.leader
    standbys = len(snapshot.scheduler.members) - (leader is not None)
    who = "none" if leader is None else f"{leader.client_id} on {leader.host}"
    click.echo(
        f"scheduler: leader {who}, {standbys} standby{'' if standbys == 1 else 's'}; "
        f"cron lateness {age(snapshot.cron_lateness_s)}"
    )
    click.echo(f"dead letters pending: {snapshot.dead_letters_pending}")
    if snapshot.schedules:
        click.echo()
        print_table(
            [
                [
                    s.name,
                    s.cron,
                    s.job_type,
                    when(s.last_fire),
                    when(s.next_fire) if s.enabled else "disabled",
                    age(s.overdue_s(at)) if s.overdue_s(at) else "-",
                ]
                for s in snapshot.schedules
            ],
            ["schedule", "cron", "type", "last fire", "next fire", "overdue"],
        )
