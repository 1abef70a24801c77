"""``pipeline topics apply|describe``: the namespace's topics, declared by the settings."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from pipeline._admin import (
    ChangeAction,
    ObservedTopic,
    apply_topics,
    describe_topics,
    plan_topic,
)

from ._output import (
    cli_errors,
    common_options,
    json_option,
    print_json,
    print_table,
    timeout_option,
)

if TYPE_CHECKING:
    from pipeline._admin import Change, TopicDescription
    from pipeline._settings import Settings

_UNITS = (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000))


@click.group(name="topics")
def topics() -> None:
    """Create, update and inspect the topics of a namespace.

    The topic set (jobs per priority, deferred, retry tiers, dead letters, schedules, scheduler
    state, events) and its partitions, replication and retention come from the settings:
    PIPELINE_TOPICS__PARTITIONS, PIPELINE_TOPICS__REPLICATION_FACTOR, ... or a config file.
    """


def _change_text(change: Change, dry_run: bool) -> str:
    would = "would " if dry_run else ""
    match change.action:
        case ChangeAction.CREATED:
            return f"{'would create' if dry_run else 'created'} ({change.detail})"
        case ChangeAction.PARTITIONS:
            return f"{would}{'grow ' if dry_run else ''}partitions {change.detail}"
        case ChangeAction.CONFIG:
            return f"{would}{'set ' if dry_run else ''}config {change.detail}"
        case ChangeAction.WARNING:
            return f"warning: {change.detail}"
        case _:
            return change.action.value


@topics.command()
@click.option(
    "--dry-run",
    is_flag=True,
    help="Show what would change; Kafka validates each change but nothing is modified.",
)
@click.option(
    "--allow-retention-decrease",
    is_flag=True,
    help="Shorten retention.ms where the settings ask for less than a topic has (Kafka then "
    "deletes the jobs or dead letters older than that).",
)
@timeout_option
@json_option
@common_options
@cli_errors()
def apply(
    settings: Settings,
    dry_run: bool,
    allow_retention_decrease: bool,
    timeout: float,
    as_json: bool,
) -> None:
    """Create missing topics and bring existing ones in line with the settings.

    Idempotent: a second run reports every topic unchanged. Partitions only ever grow (a
    decrease is reported as a warning and left), and so does retention unless
    --allow-retention-decrease; only the managed configs are set (others are never touched),
    and a replication factor that differs is reported: changing it needs a partition
    reassignment. Returns once new partitions have leaders, so producers can start.
    """
    report = apply_topics(
        settings,
        dry_run=dry_run,
        timeout=timeout,
        allow_retention_decrease=allow_retention_decrease,
    )
    if as_json:
        print_json(
            {
                "namespace": settings.namespace,
                "dry_run": report.dry_run,
                "changed": report.changed,
                "changes": report.changes,
                "summary": report.summary(),
            }
        )
        return
    print_table([(c.topic, _change_text(c, dry_run)) for c in report.changes], ("topic", "change"))
    click.echo(report.summary())


def _duration(ms: str | None) -> str | None:
    if ms is None:
        return None
    try:
        value = int(ms)
    except ValueError:
        return ms
    if value < 0:
        return "forever"
    for unit, size in _UNITS:
        if value and value % size == 0:
            return f"{value // size}{unit}"
    return f"{value}ms"


def _status(topic: TopicDescription) -> str:
    if not topic.exists:
        return "MISSING"
    observed = ObservedTopic(topic.name, topic.partitions, topic.replication_factor, topic.configs)
    actions = {c.action for c in plan_topic(topic.spec, observed).changes}
    if actions == {ChangeAction.UNCHANGED}:
        return "ok"
    if actions == {ChangeAction.WARNING}:
        return "warning"
    return "differs"


def _row(topic: TopicDescription) -> tuple[object, ...]:
    if not topic.exists:
        return (topic.name, _status(topic), None, None, None, None, None, None)
    policy = topic.configs.get("cleanup.policy")
    retention = _duration(topic.configs.get("retention.ms")) if "delete" in (policy or "") else None
    return (
        topic.name,
        _status(topic),
        topic.partitions,
        topic.replication_factor,
        policy,
        retention,
        topic.configs.get("min.insync.replicas"),
        topic.messages,
    )


def _as_dict(topic: TopicDescription) -> dict[str, object]:
    return {
        "topic": topic.name,
        "purpose": topic.spec.purpose,
        "exists": topic.exists,
        "status": _status(topic),
        "partitions": topic.partitions,
        "replication_factor": topic.replication_factor,
        "configs": topic.configs,
        "messages": topic.messages,
        "offsets": topic.offsets,
        "spec": topic.spec,
    }


@topics.command()
@timeout_option
@json_option
@common_options
@cli_errors()
def describe(settings: Settings, timeout: float, as_json: bool) -> None:
    """Show each topic as Kafka has it: partitions, replication, retention, message counts.

    STATUS is ok, differs (`topics apply` would change it), warning (it differs in a way apply
    will not change) or MISSING. MESSAGES sums end minus start offsets: an estimate that also
    counts transaction markers.
    """
    described = describe_topics(settings, timeout=timeout)
    if as_json:
        print_json({"namespace": settings.namespace, "topics": [_as_dict(t) for t in described]})
        return
    print_table(
        [_row(t) for t in described],
        (
            "topic",
            "status",
            "partitions",
            "replication",
            "cleanup.policy",
            "retention",
            "min.insync.replicas",
            "messages",
        ),
    )
    missing = [t.name for t in described if not t.exists]
    if missing:
        click.echo(
            f"{len(missing)} of {len(described)} topics are missing; "
            "create them with `pipeline topics apply`"
        )
