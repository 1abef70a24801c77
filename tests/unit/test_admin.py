"""Topic specs, the spec-vs-cluster diff and the apply report: everything that needs no broker."""

from __future__ import annotations

import dataclasses

import click
import pytest
from click.testing import CliRunner

from pipeline._admin import (
    ApplyReport,
    Change,
    ChangeAction,
    ObservedTopic,
    TopicSpec,
    copartitioned,
    plan_topic,
    topic_specs,
)
from pipeline._settings import Settings, TopicSettings
from pipeline_cli._output import cli_errors, print_table
from pipeline_cli._topics import _change_text, _duration

DAY_MS = 24 * 3600 * 1000
JOB_TOPICS = ["jobs.critical", "jobs.high", "jobs.default", "jobs.low"]


def specs_by_suffix(settings: Settings) -> dict[str, TopicSpec]:
    prefix = settings.namespace + "."
    specs = topic_specs(settings)
    assert all(s.name.startswith(prefix) for s in specs)
    return {s.name.removeprefix(prefix): s for s in specs}


def observed_as_spec(spec: TopicSpec, **changes: object) -> ObservedTopic:
    """What a broker reports for a topic created exactly from ``spec``, then changed."""
    fields: dict[str, object] = {
        "name": spec.name,
        "partitions": spec.partitions,
        "replication_factor": spec.replication_factor,
        "configs": dict(spec.configs),
    }
    fields.update(changes)
    return ObservedTopic(**fields)  # type: ignore[arg-type]


# --- topic_specs ---------------------------------------------------------------------------


def test_default_specs_cover_the_design_topic_set() -> None:
    specs = specs_by_suffix(Settings(namespace="acme"))
    assert list(specs) == [
        *JOB_TOPICS,
        "deferred",
        "retry.0",
        "retry.1",
        "retry.2",
        "retry.3",
        "deferred.0",
        "deferred.1",
        "deferred.2",
        "deferred.3",
        "scheduler-control",
        "dlq",
        "dlq-state",
        "dedup",
        "schedules",
        "scheduler-state",
        "events",
        "workers",
    ]
    partitions = {name: spec.partitions for name, spec in specs.items()}
    assert partitions == {
        **dict.fromkeys([*JOB_TOPICS, "deferred", "retry.0", "retry.1", "retry.2"], 6),
        "retry.3": 6,
        **dict.fromkeys(["deferred.0", "deferred.1", "deferred.2", "deferred.3"], 6),
        "scheduler-control": 1,
        "dlq": 6,
        "dlq-state": 1,
        "dedup": 6,
        "schedules": 1,
        "scheduler-state": 1,
        "events": 3,
        "workers": 1,
    }
    assert {spec.replication_factor for spec in specs.values()} == {1}


def test_default_specs_retention_and_cleanup() -> None:
    specs = specs_by_suffix(Settings())
    for name in [*JOB_TOPICS, "deferred", "retry.0", "retry.3", "deferred.3"]:
        assert specs[name].configs["cleanup.policy"] == "delete"
    for name in [*JOB_TOPICS, "deferred"]:
        assert specs[name].configs["retention.ms"] == str(7 * DAY_MS)
    # A tier's jobs are due after its delay: they are kept as long as the others from then on.
    assert specs["retry.0"].configs["retention.ms"] == str(7 * DAY_MS + 5_000)
    assert specs["retry.3"].configs["retention.ms"] == str(7 * DAY_MS + 1_800_000)
    short = specs_by_suffix(Settings(topics={"jobs_retention_ms": 3_600_000}))
    assert short["deferred.3"].configs["retention.ms"] == str(7 * 3_600_000)  # a 6 h tier
    forever = specs_by_suffix(Settings(topics={"jobs_retention_ms": -1}))
    assert forever["retry.3"].configs["retention.ms"] == "-1"
    assert specs["dlq"].configs["retention.ms"] == str(14 * DAY_MS)
    assert specs["events"].configs["retention.ms"] == str(3 * DAY_MS)
    # The letters' states: compacted, and gone with the letters (each is written after its own).
    assert specs["dlq-state"].configs["cleanup.policy"] == "compact,delete"
    assert specs["dlq-state"].configs["retention.ms"] == str(14 * DAY_MS)
    for name in ["dedup", "schedules", "scheduler-state"]:
        configs = specs[name].configs
        assert configs["cleanup.policy"] == "compact"
        # retention.ms means nothing to a compact-only topic: not managed, so never "changed".
        assert "retention.ms" not in configs
        assert 0 < float(configs["min.cleanable.dirty.ratio"]) < 0.5
        assert int(configs["segment.ms"]) <= DAY_MS
    # One tombstone per expired key: kept an hour, not a day, so a restore reads 24 times less,
    # and at least twice the restore's timeout, so a restore never misses one.
    assert specs["dedup"].configs["delete.retention.ms"] == str(3600_000)
    slow = Settings(worker={"dedup_restore_timeout_s": 3600})
    assert specs_by_suffix(slow)["dedup"].configs["delete.retention.ms"] == str(7200_000)
    # Heartbeats: a table whose dead workers' last records go after a day; small segments, so
    # a reader reads little beyond the latest record of each worker.
    workers = specs["workers"].configs
    assert workers["cleanup.policy"] == "compact,delete"
    assert workers["retention.ms"] == str(DAY_MS)
    assert int(workers["segment.bytes"]) <= 1024 * 1024
    assert int(workers["segment.ms"]) <= 3600_000
    for spec in specs.values():
        assert spec.configs["min.insync.replicas"] == "1"
        assert spec.configs["message.timestamp.type"] == "CreateTime"
        assert spec.purpose


def test_specs_follow_topic_settings() -> None:
    topics = TopicSettings(
        partitions=12,
        replication_factor=3,
        jobs_retention_ms=DAY_MS,
        dlq_retention_ms=-1,
        events_retention_ms=3600_000,
        events_partitions=2,
    )
    specs = specs_by_suffix(Settings(topics=topics))
    assert specs["jobs.high"].partitions == 12
    assert specs["retry.1"].partitions == 12
    assert specs["events"].partitions == 2
    assert specs["schedules"].partitions == 1
    assert {s.replication_factor for s in specs.values()} == {3}
    # min.insync.replicas defaults to replication_factor - 1: one broker may be down.
    assert {s.configs["min.insync.replicas"] for s in specs.values()} == {"2"}
    assert specs["jobs.low"].configs["retention.ms"] == str(DAY_MS)
    assert specs["dlq"].configs["retention.ms"] == "-1"
    assert specs["events"].configs["retention.ms"] == "3600000"


def test_explicit_min_insync_replicas_wins() -> None:
    topics = TopicSettings(replication_factor=3, min_insync_replicas=3)
    specs = topic_specs(Settings(topics=topics))
    assert {s.configs["min.insync.replicas"] for s in specs} == {"3"}


def test_one_retry_topic_per_configured_delay() -> None:
    settings = Settings(namespace="n", topics=TopicSettings(retry_delays_s=[1, 60]))
    retry = [s for s in topic_specs(settings) if ".retry." in s.name]
    assert [s.name for s in retry] == ["n.retry.0", "n.retry.1"]
    assert "1s" in retry[0].purpose
    assert "60s" in retry[1].purpose


def test_specs_are_frozen() -> None:
    spec = topic_specs(Settings())[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.partitions = 99  # type: ignore[misc]


# --- plan_topic ----------------------------------------------------------------------------


@pytest.fixture
def spec() -> TopicSpec:
    return specs_by_suffix(Settings(namespace="p"))["jobs.default"]


def test_missing_topic_is_created(spec: TopicSpec) -> None:
    plan = plan_topic(spec, None)
    assert plan.create
    assert plan.changes == (
        Change("p.jobs.default", ChangeAction.CREATED, "6 partitions, replication factor 1"),
    )


def test_matching_topic_is_unchanged(spec: TopicSpec) -> None:
    # The broker reports configs the spec does not manage as well; they are not compared.
    observed = observed_as_spec(spec, configs={**spec.configs, "max.message.bytes": "1"})
    plan = plan_topic(spec, observed)
    assert not plan.create
    assert plan.grow_to is None
    assert plan.set_configs == {}
    assert plan.changes == (Change(spec.name, ChangeAction.UNCHANGED),)


def test_numbers_compare_by_value() -> None:
    table = specs_by_suffix(Settings())["schedules"]
    observed = observed_as_spec(
        table, configs={**table.configs, "min.cleanable.dirty.ratio": "0.10"}
    )
    assert plan_topic(table, observed).changes[0].action is ChangeAction.UNCHANGED


def test_more_partitions_grow(spec: TopicSpec) -> None:
    plan = plan_topic(spec, observed_as_spec(spec, partitions=3))
    assert plan.grow_to == 6
    assert plan.changes == (Change(spec.name, ChangeAction.PARTITIONS, "3 -> 6"),)


def test_fewer_partitions_are_never_removed(spec: TopicSpec) -> None:
    plan = plan_topic(spec, observed_as_spec(spec, partitions=10))
    assert plan.grow_to is None
    [change] = plan.changes
    assert change.action is ChangeAction.WARNING
    assert "cannot decrease partitions from 10 to 6" in change.detail


def test_replication_difference_is_a_warning(spec: TopicSpec) -> None:
    plan = plan_topic(spec, observed_as_spec(spec, replication_factor=3))
    [change] = plan.changes
    assert change.action is ChangeAction.WARNING
    assert "replication factor is 3" in change.detail
    assert "reassignment" in change.detail
    assert not plan.create
    assert plan.set_configs == {}


def test_only_differing_managed_configs_are_set(spec: TopicSpec) -> None:
    configs = {**spec.configs, "retention.ms": "1000", "max.message.bytes": "5"}
    del configs["message.timestamp.type"]
    plan = plan_topic(spec, observed_as_spec(spec, configs=configs))
    assert plan.set_configs == {
        "retention.ms": str(7 * DAY_MS),
        "message.timestamp.type": "CreateTime",
    }
    assert [c.detail for c in plan.changes] == [
        f"retention.ms 1000 -> {7 * DAY_MS}",
        "message.timestamp.type None -> CreateTime",
    ]
    assert {c.action for c in plan.changes} == {ChangeAction.CONFIG}


def test_min_insync_above_replication_is_not_set() -> None:
    spec = specs_by_suffix(Settings(topics=TopicSettings(replication_factor=3)))["dlq"]
    observed = observed_as_spec(
        spec, replication_factor=1, configs={**spec.configs, "min.insync.replicas": "1"}
    )
    plan = plan_topic(spec, observed)
    assert "min.insync.replicas" not in plan.set_configs
    warnings = [c.detail for c in plan.changes if c.action is ChangeAction.WARNING]
    assert len(warnings) == 2
    assert "min.insync.replicas 2 exceeds the replication factor 1" in warnings[1]


@pytest.mark.parametrize(("suffix", "current"), [("dlq", 30 * DAY_MS), ("jobs.default", -1)])
def test_a_shorter_retention_is_left_with_a_warning(suffix: str, current: int) -> None:
    """Shortening retention.ms deletes the jobs or dead letters older than the new value: a
    laptop's default settings must not cut an operator's 30 days of dead letters to 14."""
    spec = specs_by_suffix(Settings(namespace="p"))[suffix]
    observed = observed_as_spec(spec, configs={**spec.configs, "retention.ms": str(current)})
    plan = plan_topic(spec, observed)
    assert plan.set_configs == {}
    [change] = plan.changes
    assert change.action is ChangeAction.WARNING
    assert change.detail.startswith(f"retention.ms {current} -> {spec.configs['retention.ms']} ")
    assert "--allow-retention-decrease" in change.detail
    allowed = plan_topic(spec, observed, allow_retention_decrease=True)
    assert allowed.set_configs == {"retention.ms": spec.configs["retention.ms"]}
    assert [c.action for c in allowed.changes] == [ChangeAction.CONFIG]


def test_a_longer_retention_is_set() -> None:
    spec = specs_by_suffix(Settings(topics=TopicSettings(dlq_retention_ms=-1)))["dlq"]
    observed = observed_as_spec(spec, configs={**spec.configs, "retention.ms": str(DAY_MS)})
    assert plan_topic(spec, observed).set_configs == {"retention.ms": "-1"}


def test_several_differences_are_all_reported(spec: TopicSpec) -> None:
    configs = {**spec.configs, "cleanup.policy": "compact"}
    plan = plan_topic(spec, observed_as_spec(spec, partitions=2, configs=configs))
    assert [c.action for c in plan.changes] == [ChangeAction.PARTITIONS, ChangeAction.CONFIG]
    assert plan.grow_to == 6
    assert plan.set_configs == {"cleanup.policy": "delete"}


# --- ApplyReport ---------------------------------------------------------------------------


def report(*changes: tuple[ChangeAction, str], dry_run: bool = False) -> ApplyReport:
    made = tuple(Change(f"t{i}", action, detail) for i, (action, detail) in enumerate(changes))
    return ApplyReport(made, dry_run=dry_run)


def test_summary_of_a_first_apply() -> None:
    done = report(*[(ChangeAction.CREATED, "")] * 11)
    assert done.summary() == "created 11 topics"
    assert done.changed


def test_summary_when_nothing_changes() -> None:
    done = report((ChangeAction.UNCHANGED, ""), (ChangeAction.UNCHANGED, ""))
    assert done.summary() == "nothing to change"
    assert not done.changed
    warned = report((ChangeAction.UNCHANGED, ""), (ChangeAction.WARNING, "x"))
    assert warned.summary() == "nothing to change; 1 warning"
    assert not warned.changed


def test_summary_of_mixed_changes() -> None:
    changes = (
        Change("a", ChangeAction.CREATED),
        Change("b", ChangeAction.PARTITIONS, "3 -> 6"),
        Change("b", ChangeAction.CONFIG, "retention.ms 1 -> 2"),
        Change("b", ChangeAction.CONFIG, "cleanup.policy compact -> delete"),
        Change("c", ChangeAction.WARNING, "cannot decrease"),
    )
    assert ApplyReport(changes).summary() == (
        "created 1 topic, added partitions to 1 topic, changed 2 settings on 1 topic; 1 warning"
    )
    assert ApplyReport(changes, dry_run=True).summary() == (
        "would create 1 topic, would add partitions to 1 topic, would change 2 settings on "
        "1 topic; 1 warning (dry run: nothing was changed)"
    )


# --- CLI rendering -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("action", "dry_run", "text"),
    [
        (ChangeAction.CREATED, False, "created (6 partitions)"),
        (ChangeAction.CREATED, True, "would create (6 partitions)"),
        (ChangeAction.PARTITIONS, False, "partitions 3 -> 6"),
        (ChangeAction.PARTITIONS, True, "would grow partitions 3 -> 6"),
        (ChangeAction.CONFIG, False, "config 3 -> 6"),
        (ChangeAction.WARNING, True, "warning: 3 -> 6"),
        (ChangeAction.UNCHANGED, False, "unchanged"),
    ],
)
def test_change_lines(action: ChangeAction, dry_run: bool, text: str) -> None:
    detail = "6 partitions" if action is ChangeAction.CREATED else "3 -> 6"
    assert _change_text(Change("t", action, detail), dry_run) == text


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        ("604800000", "7d"),
        ("3600000", "1h"),
        ("90000", "90s"),
        ("1500", "1500ms"),
        ("-1", "forever"),
    ],
)
def test_retention_is_shown_in_units(ms: str, text: str) -> None:
    assert _duration(ms) == text


def test_table_aligns_text_left_and_numbers_right() -> None:
    @click.command()
    def show() -> None:
        print_table([("a.long.name", 6, None), ("b", 12, "x")], ("topic", "partitions", "note"))

    result = CliRunner().invoke(show)
    assert result.output.splitlines() == [
        "TOPIC        PARTITIONS  NOTE",
        "a.long.name           6  -",
        "b                    12  x",
    ]


def test_pipeline_errors_become_one_line_and_exit_1() -> None:
    from pipeline._errors import KafkaUnavailableError

    @click.command()
    @cli_errors()
    def fail() -> None:
        raise KafkaUnavailableError("Kafka at h:1 did not answer")

    result = CliRunner().invoke(fail)
    assert result.exit_code == 1
    assert result.stderr == "Error: Kafka at h:1 did not answer\n"
    assert result.stdout == ""


def test_the_priority_topics_and_the_keys_topic_are_planned_with_one_partition_count() -> None:
    """One job topic grown to 12 (another tool, an earlier apply with more partitions): the
    others, and a new <ns>.dedup, got the settings' 6, and no later apply mended it (the
    workers could not restore the keys of partitions 6-11)."""
    settings = Settings(namespace="orders")
    specs = topic_specs(settings)
    grown = {"orders.jobs.high": ObservedTopic("orders.jobs.high", 12, 1)}
    planned = {s.name: s.partitions for s in copartitioned(specs, grown, "orders")}
    for name in ("jobs.critical", "jobs.high", "jobs.default", "jobs.low", "dedup"):
        assert planned[f"orders.{name}"] == 12, name
    assert planned["orders.deferred"] == 6  # not co-partitioned: as the settings say
    assert planned["orders.events"] == settings.topics.events_partitions
    assert copartitioned(specs, {}, "orders") == specs
