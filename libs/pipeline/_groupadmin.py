"""Setting the workers' group configs on the cluster (what they are: :mod:`._groupconfig`).

``pipeline topics apply`` calls :func:`apply_group_configs` and fails when Kafka refuses; a
worker calls :func:`ensure_group_configs` before it joins and only warns, since it works all
the same, with the timings the group already has.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from confluent_kafka import KafkaError

# confluent-kafka's admin package does not declare its re-exports to type checkers.
from confluent_kafka.admin import (  # type: ignore[attr-defined, unused-ignore]
    ConfigResource,
    ConfigSource,
    ResourceType,
)

from ._adminsession import AdminSession, config_sets, has_code
from ._errors import KafkaAuthenticationError, PipelineError, TopicAdminError
from ._groupconfig import GroupConfigChange, group_configs, plan_group_configs
from ._topicspec import GROUP_ROW, Change, ChangeAction

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping

    from ._settings import Settings

_log = logging.getLogger("pipeline.kafka.admin")

VISIBLE_WAIT_S = 15.0
"""How long an apply waits for the brokers to show the group configs it set."""
VISIBLE_READS = 3
"""Reads in a row that must show them: each read may be answered by another broker."""

ENSURE_TIMEOUT_S = 10.0
"""How long a starting worker tries to set its group's configs before it joins all the same."""

_BOUNDS_HINT = (
    "the broker bounds a group's session timeout by group.consumer.min.session.timeout.ms "
    "(default 45000) and its heartbeat interval by group.consumer.min.heartbeat.interval.ms "
    "(default 5000): lower those on the brokers, or set worker.session_timeout_ms "
    "(PIPELINE_WORKER__SESSION_TIMEOUT_MS) within them, or run the workers with "
    "worker.group_protocol=classic; then run `pipeline topics apply` again"
)


def _read(session: AdminSession, groups: Iterable[str]) -> dict[str, dict[str, str | None]]:
    """Each group's own config values (``None`` where the broker's default applies)."""
    resources = [ConfigResource(ResourceType.GROUP, group) for group in groups]
    futures = session.client.describe_configs(resources, request_timeout=session.remaining())
    found: dict[str, dict[str, str | None]] = {}
    for resource, future in futures.items():
        entries = session.result(future, f"describe the configs of group {resource.name}", None)
        found[resource.name] = {
            key: entry.value if entry.source == ConfigSource.GROUP_CONFIG.value else None
            for key, entry in entries.items()
        }
    return found


def _alter(
    session: AdminSession, changes: Iterable[GroupConfigChange], *, validate_only: bool
) -> None:
    by_group: dict[str, dict[str, str]] = {}
    for change in changes:
        by_group.setdefault(change.group, {})[change.key] = change.wanted
    resources = config_sets(ResourceType.GROUP, by_group)
    futures = session.client.incremental_alter_configs(
        resources, request_timeout=session.remaining(), validate_only=validate_only
    )
    for resource, future in futures.items():
        wanted = ", ".join(f"{k}={v}" for k, v in by_group[resource.name].items())
        try:
            session.result(future, f"set {wanted} on group {resource.name}", None)
        except TopicAdminError as exc:
            if has_code(exc.__cause__, KafkaError.INVALID_CONFIG):
                raise TopicAdminError(None, f"{exc}; {_BOUNDS_HINT}") from exc
            raise


def _apply(
    session: AdminSession, wanted: Mapping[str, Mapping[str, str]], *, dry_run: bool
) -> list[GroupConfigChange]:
    changes = plan_group_configs(wanted, _read(session, wanted))
    if not changes:
        return changes
    brokers = _brokers(session)
    changes = _confirmed(session, wanted, changes, brokers)
    if changes:
        _alter(session, changes, validate_only=dry_run)
        if not dry_run:
            _wait_visible(session, wanted, brokers)
    return changes


def _confirmed(
    session: AdminSession,
    wanted: Mapping[str, Mapping[str, str]],
    changes: list[GroupConfigChange],
    brokers: int,
) -> list[GroupConfigChange]:
    """The ``changes`` a first read planned that more reads confirm: a broker behind the
    metadata log still shows a value set a moment ago (by the apply run just before) as unset,
    and a value any broker shows as wanted is set (the controller has it). With several
    brokers, :data:`VISIBLE_READS` reads in all, a little apart, must each show the value
    other than wanted (whatever they show instead)."""
    if brokers == 1:
        return changes
    later = _later_reads(session, wanted)
    for _ in range(VISIBLE_READS - 1):
        if not changes:
            break
        again = {(c.group, c.key) for c in next(later)}
        changes = [change for change in changes if (change.group, change.key) in again]
    return changes


def _later_reads(
    session: AdminSession, wanted: Mapping[str, Mapping[str, str]]
) -> Iterator[list[GroupConfigChange]]:
    """What each further read of the groups' configs plans, the reads a little apart (20 ms,
    then twice as long each time, up to 0.1 s) so that a broker behind may catch up."""
    pause = 0.02
    while True:
        time.sleep(pause)
        pause = min(pause * 2, 0.1)
        yield plan_group_configs(wanted, _read(session, wanted))


def _brokers(session: AdminSession) -> int:
    """How many brokers may answer a read; several if the cluster does not say (the change
    is made: a failed look must not fail it)."""
    try:
        return len(session.metadata().brokers)
    except PipelineError:
        return VISIBLE_READS


def _wait_visible(
    session: AdminSession, wanted: Mapping[str, Mapping[str, str]], brokers: int
) -> None:
    """Wait (within the session's time) until the brokers answer with the new values: a
    broker behind the metadata log still shows the old ones, and an apply run right after
    would then set them again. Any of the ``brokers`` may answer a read, so with several one
    read that shows them is not enough: :data:`VISIBLE_READS` in a row must (one for a
    single broker, which answers them all)."""
    reads = 1 if brokers == 1 else VISIBLE_READS
    deadline = time.monotonic() + min(VISIBLE_WAIT_S, session.remaining())
    later = _later_reads(session, wanted)
    plan = plan_group_configs(wanted, _read(session, wanted))
    seen = 0
    while True:
        seen = 0 if plan else seen + 1
        if seen >= reads or time.monotonic() >= deadline:
            return
        plan = next(later)


def apply_group_configs(
    settings: Settings,
    *,
    dry_run: bool = False,
    timeout: float = 30.0,
) -> list[GroupConfigChange]:
    """Set the group configs the workers' groups need (none under the classic protocol);
    return what differed. ``dry_run``: the broker validates the change, nothing changes."""
    wanted = group_configs(settings)
    if not wanted:
        return []
    return _apply(AdminSession(settings, timeout), wanted, dry_run=dry_run)


def group_config_changes(session: AdminSession, *, dry_run: bool) -> list[Change]:
    """The group configs as rows of ``pipeline topics apply`` (one per group, ``group <id>``).

    A refusal is a warning there, not a failure: the topics are what ``apply`` is for, and a
    cluster whose bounds or permissions refuse the group configs runs the workers all the same.
    """
    rows = []
    for group, values in group_configs(session.settings).items():
        name = f"{GROUP_ROW}{group}"
        try:
            changes = _apply(session, {group: values}, dry_run=dry_run)
        except TopicAdminError as exc:
            rows.append(Change(name, ChangeAction.WARNING, str(exc)))
            continue
        rows += [Change(name, ChangeAction.CONFIG, c.describe()) for c in changes]
        if not changes:
            rows.append(Change(name, ChangeAction.UNCHANGED))
    return rows


def ensure_group_configs(settings: Settings, timeout: float = ENSURE_TIMEOUT_S) -> None:
    """What a worker does before it joins: set its groups' configs, or warn why it could not."""
    try:
        changes = apply_group_configs(settings, timeout=timeout)
    except KafkaAuthenticationError:
        raise  # the worker cannot join either: it stops with this
    except PipelineError as exc:
        _log.warning(
            "could not set the consumer group configs for worker.session_timeout_ms=%d: %s. "
            "The group keeps its own session timeout and heartbeat interval",
            settings.worker.session_timeout_ms,
            exc,
        )
        return
    for change in changes:
        _log.info("group %s: set %s", change.group, change.describe())
