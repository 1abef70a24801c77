"""``pipeline topics apply|describe`` against a real Kafka, checked with an independent client."""

from __future__ import annotations

import json
import socket
import time
from typing import TYPE_CHECKING, Any

import pytest
from click.testing import CliRunner
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import (  # type: ignore[attr-defined, unused-ignore]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    ResourceType,
)

from pipeline._admin import (
    ApplyReport,
    Change,
    ChangeAction,
    TopicAdminError,
    apply_topics,
    describe_topics,
    topic_specs,
)
from pipeline._errors import KafkaUnavailableError
from pipeline._settings import Settings
from pipeline._topicspec import GROUP_ROW
from pipeline_cli._topics import topics

if TYPE_CHECKING:
    from collections.abc import Callable

pytestmark = pytest.mark.kafka

DAY_MS = 24 * 3600 * 1000


@pytest.fixture
def admin(bootstrap_servers: str) -> AdminClient:
    """A client of the test's own, so results are not checked with the code under test."""
    return AdminClient({"bootstrap.servers": bootstrap_servers})


def with_topics(settings: Settings, **changes: Any) -> Settings:
    return settings.model_copy(update={"topics": settings.topics.model_copy(update=changes)})


def partitions_of(admin: AdminClient, names: list[str]) -> dict[str, int]:
    metadata = admin.list_topics(timeout=10).topics
    return {n: len(metadata[n].partitions) for n in names if n in metadata}


def configs_of(admin: AdminClient, name: str) -> dict[str, str]:
    resource = ConfigResource(ResourceType.TOPIC, name)
    entries = admin.describe_configs([resource], request_timeout=10)[resource].result()
    return {key: entry.value for key, entry in entries.items()}


def eventually(check: Callable[[], bool], timeout: float = 10) -> None:
    """Poll ``check`` until true (Kafka applies some changes shortly after acknowledging)."""
    deadline = time.monotonic() + timeout
    while not check():  # each check is a broker round trip, which paces the loop
        assert time.monotonic() < deadline, "condition not met in time"


def same(current: str, wanted: str) -> bool:
    try:
        return float(current) == float(wanted)
    except ValueError:
        return current == wanted


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


# --- apply ---------------------------------------------------------------------------------


def topic_rows(report: ApplyReport) -> list[Change]:
    return [c for c in report.changes if not c.topic.startswith(GROUP_ROW)]


def group_rows(report: ApplyReport) -> list[tuple[str, ChangeAction, str]]:
    return [(c.topic, c.action, c.detail) for c in report.changes if c.topic.startswith(GROUP_ROW)]


def test_apply_creates_every_topic_as_specified(settings: Settings, admin: AdminClient) -> None:
    report = apply_topics(settings)

    specs = topic_specs(settings)
    assert [c.topic for c in topic_rows(report)] == [s.name for s in specs]
    assert {c.action for c in topic_rows(report)} == {ChangeAction.CREATED}
    assert report.summary() == f"created {len(specs)} topics, changed 4 settings on 2 groups"
    assert partitions_of(admin, [s.name for s in specs]) == {s.name: s.partitions for s in specs}
    for spec in specs:
        configs = configs_of(admin, spec.name)
        for key, wanted in spec.configs.items():
            assert same(configs[key], wanted), (spec.name, key, configs[key], wanted)
    assert configs_of(admin, f"{settings.namespace}.schedules")["cleanup.policy"] == "compact"
    assert configs_of(admin, f"{settings.namespace}.dlq")["retention.ms"] == str(14 * DAY_MS)


def test_apply_sets_the_workers_group_configs_under_the_consumer_protocol(
    settings: Settings,
) -> None:
    ns = settings.namespace
    short = settings.model_copy(
        update={"worker": settings.worker.model_copy(update={"session_timeout_ms": 6000})}
    )
    first = apply_topics(short)
    session, heartbeat = "consumer.session.timeout.ms", "consumer.heartbeat.interval.ms"
    for group in (f"{ns}.workers", f"{ns}.workers.retry"):
        assert (
            f"{GROUP_ROW}{group}",
            ChangeAction.CONFIG,
            f"{session} the broker default -> 6000",
        ) in group_rows(first)
        assert (
            f"{GROUP_ROW}{group}",
            ChangeAction.CONFIG,
            f"{heartbeat} the broker default -> 1000",
        ) in group_rows(first)
    assert not apply_topics(short).changed
    # Below the dev broker's group.consumer.min.session.timeout.ms: a warning, not a failure.
    refused = apply_topics(
        short.model_copy(
            update={"worker": short.worker.model_copy(update={"session_timeout_ms": 3000})}
        )
    )
    assert {a for _, a, _ in group_rows(refused)} == {ChangeAction.WARNING}
    assert all("group.consumer.min.session.timeout.ms" in d for _, _, d in group_rows(refused))
    classic = short.model_copy(
        update={"worker": short.worker.model_copy(update={"group_protocol": "classic"})}
    )
    assert group_rows(apply_topics(classic)) == []


def test_topics_take_writes_right_after_apply(
    settings: Settings, bootstrap_servers: str, admin: AdminClient
) -> None:
    apply_topics(settings)

    metadata = admin.list_topics(timeout=10).topics  # no retry: ready when apply returns
    for spec in topic_specs(settings):
        leaders = [p.leader for p in metadata[spec.name].partitions.values()]
        assert len(leaders) == spec.partitions
        assert min(leaders) >= 0, spec.name

    producer = Producer(
        {"bootstrap.servers": bootstrap_servers, "message.timeout.ms": 5000, "acks": "all"}
    )
    errors: list[str] = []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    for spec in topic_specs(settings):
        for partition in range(spec.partitions):
            # Keyed: compacted topics refuse records without a key.
            producer.produce(spec.name, b"x", key=b"k", partition=partition, on_delivery=delivered)
    assert producer.flush(10) == 0
    assert errors == []


def test_second_apply_changes_nothing(settings: Settings) -> None:
    apply_topics(settings)
    again = apply_topics(settings)

    assert {c.action for c in again.changes} == {ChangeAction.UNCHANGED}
    assert len(topic_rows(again)) == len(topic_specs(settings))
    assert len(group_rows(again)) == 2
    assert not again.changed
    assert again.summary() == "nothing to change"


def test_dry_run_changes_nothing(settings: Settings, admin: AdminClient) -> None:
    report = apply_topics(settings, dry_run=True)

    assert report.dry_run
    assert {c.action for c in topic_rows(report)} == {ChangeAction.CREATED}
    assert report.summary().startswith("would create ")
    assert partitions_of(admin, [s.name for s in topic_specs(settings)]) == {}


def test_more_partitions_are_added(settings: Settings, admin: AdminClient) -> None:
    apply_topics(settings)
    grown = with_topics(settings, partitions=8)

    report = apply_topics(grown)

    changed = {c.topic: c.detail for c in report.changes if c.action is ChangeAction.PARTITIONS}
    ns = settings.namespace
    assert changed[f"{ns}.jobs.high"] == "6 -> 8"
    assert f"{ns}.schedules" not in changed
    assert f"{ns}.events" not in changed
    # The job topics, deferred, the retry and wait tiers, the DLQ and the dedup changelog.
    assert len(changed) == (
        4 + 1 + len(settings.topics.retry_delays_s) + len(settings.scheduler.wait_tiers_s) + 2
    )
    assert changed[f"{ns}.dedup"] == "6 -> 8"
    counts = partitions_of(admin, [f"{ns}.jobs.high", f"{ns}.dlq", f"{ns}.schedules"])
    assert counts == {f"{ns}.jobs.high": 8, f"{ns}.dlq": 8, f"{ns}.schedules": 1}
    assert apply_topics(grown).summary() == "nothing to change"


def test_partitions_added_meanwhile_by_another_apply_are_not_an_error(
    settings: Settings, admin: AdminClient
) -> None:
    """Two applies (two deploys' init containers) both saw 6 and asked for 8: Kafka refuses
    the second with INVALID_PARTITIONS ("already has 8"), which failed that apply."""
    from pipeline._adminsession import AdminSession

    apply_topics(settings)
    topic = f"{settings.namespace}.jobs.high"
    for future in admin.create_partitions([NewPartitions(topic, 8)]).values():
        future.result(30)  # the other apply, first

    AdminSession(settings, 30).grow({topic: 8}, validate_only=False)

    assert partitions_of(admin, [topic]) == {topic: 8}
    assert apply_topics(with_topics(settings, partitions=8)).changed  # the others still grow
    assert partitions_of(admin, [topic]) == {topic: 8}


def test_fewer_partitions_are_left_with_a_warning(settings: Settings, admin: AdminClient) -> None:
    apply_topics(with_topics(settings, partitions=4))

    report = apply_topics(with_topics(settings, partitions=2))

    warnings = [c for c in report.changes if c.action is ChangeAction.WARNING]
    # deferred, the retry and wait tiers and the DLQ; the priority topics and the keys' topic
    # keep the count the largest of them has, with no word (see the next test).
    assert len(warnings) == 10
    assert "cannot decrease partitions from 4 to 2" in warnings[0].detail
    assert not report.changed
    assert partitions_of(admin, [f"{settings.namespace}.jobs.low"]) == {
        f"{settings.namespace}.jobs.low": 4
    }


def test_the_priority_topics_and_the_keys_topic_keep_one_partition_count(
    settings: Settings, admin: AdminClient
) -> None:
    """A job topic grown apart (by another tool): an apply with the settings' count grew the
    others (and <ns>.dedup, created by a later release) to it instead of leaving them apart."""
    ns = settings.namespace
    apply_topics(settings)
    for future in admin.create_partitions([NewPartitions(f"{ns}.jobs.high", 8)]).values():
        future.result(30)

    report = apply_topics(settings)

    changed = {c.topic: c.detail for c in report.changes if c.action is ChangeAction.PARTITIONS}
    together = [f"{ns}.jobs.{p}" for p in ("critical", "default", "low")] + [f"{ns}.dedup"]
    assert changed == dict.fromkeys(together, "6 -> 8")
    assert set(partitions_of(admin, [*together, f"{ns}.jobs.high"]).values()) == {8}
    assert apply_topics(settings).summary() == "nothing to change"


def test_a_shorter_retention_is_altered_only_when_allowed(
    settings: Settings, admin: AdminClient
) -> None:
    apply_topics(settings)
    ns = settings.namespace
    shorter = with_topics(settings, jobs_retention_ms=DAY_MS)
    job_topics = sorted(
        [*(f"{ns}.jobs.{p}" for p in ("critical", "high", "default", "low")), f"{ns}.deferred"]
        + [f"{ns}.retry.{i}" for i in range(len(settings.topics.retry_delays_s))]
        + [f"{ns}.deferred.{i}" for i in range(len(settings.scheduler.wait_tiers_s))]
    )

    left = apply_topics(shorter)

    warned = {c.topic: c.detail for c in left.changes if c.action is ChangeAction.WARNING}
    assert sorted(warned) == job_topics
    assert warned[f"{ns}.jobs.high"].startswith(f"retention.ms {7 * DAY_MS} -> {DAY_MS} ")
    assert not left.changed
    assert configs_of(admin, f"{ns}.jobs.high")["retention.ms"] == str(7 * DAY_MS)

    report = apply_topics(shorter, allow_retention_decrease=True)

    changed = {c.topic: c.detail for c in report.changes if c.action is ChangeAction.CONFIG}
    assert changed[f"{ns}.jobs.high"] == f"retention.ms {7 * DAY_MS} -> {DAY_MS}"
    assert sorted(changed) == job_topics
    assert {c.action for c in topic_rows(report)} == {ChangeAction.CONFIG, ChangeAction.UNCHANGED}
    # apply returns only once the new values are visible, so a re-run finds nothing to do.
    assert apply_topics(shorter).summary() == "nothing to change"
    assert configs_of(admin, f"{ns}.jobs.high")["retention.ms"] == str(DAY_MS)
    assert configs_of(admin, f"{ns}.dlq")["retention.ms"] == str(14 * DAY_MS)


def test_configs_apply_does_not_manage_are_kept(settings: Settings, admin: AdminClient) -> None:
    apply_topics(settings)
    dlq = f"{settings.namespace}.dlq"
    resource = ConfigResource(
        ResourceType.TOPIC,
        dlq,
        incremental_configs=[
            ConfigEntry("max.message.bytes", "2000000", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    admin.incremental_alter_configs([resource])[resource].result()
    eventually(lambda: configs_of(admin, dlq)["max.message.bytes"] == "2000000")

    report = apply_topics(with_topics(settings, dlq_retention_ms=30 * DAY_MS))

    changes = [c for c in report.changes if c.action is not ChangeAction.UNCHANGED]
    # The letters and their states (which go with them).
    assert {(c.topic, c.action) for c in changes} == {
        (dlq, ChangeAction.CONFIG),
        (f"{dlq}-state", ChangeAction.CONFIG),
    }
    configs = configs_of(admin, dlq)
    assert configs["retention.ms"] == str(30 * DAY_MS)
    assert configs["max.message.bytes"] == "2000000"
    assert configs["cleanup.policy"] == "delete"


def test_replication_larger_than_the_cluster_is_refused(
    settings: Settings, admin: AdminClient
) -> None:
    brokers = len(admin.list_topics(timeout=10).brokers)
    too_many = with_topics(settings, replication_factor=brokers + 1)

    with pytest.raises(TopicAdminError) as caught:
        apply_topics(too_many)

    assert (
        f"replication factor {brokers + 1} is larger than the {brokers} available broker(s)"
        in str(caught.value)
    )
    assert f"{settings.namespace}.jobs.critical" in str(caught.value)
    assert partitions_of(admin, [s.name for s in topic_specs(settings)]) == {}


@pytest.mark.parametrize("operation", [apply_topics, describe_topics])
def test_unreachable_broker_fails_fast(operation: Callable[..., Any], namespace: str) -> None:
    servers = f"127.0.0.1:{closed_port()}"
    started = time.monotonic()

    with pytest.raises(KafkaUnavailableError) as caught:
        operation(Settings(bootstrap_servers=servers, namespace=namespace), timeout=1.0)

    assert time.monotonic() - started < 5
    assert servers in str(caught.value)
    assert "pipeline dev up" in str(caught.value)
    assert isinstance(caught.value.__cause__, KafkaException)


# --- describe ------------------------------------------------------------------------------


def test_describe_flags_missing_topics(settings: Settings) -> None:
    described = describe_topics(settings)

    assert [d.name for d in described] == [s.name for s in topic_specs(settings)]
    assert not any(d.exists for d in described)


def test_describe_counts_messages(settings: Settings, bootstrap_servers: str) -> None:
    apply_topics(settings)
    target = f"{settings.namespace}.jobs.default"
    producer = Producer({"bootstrap.servers": bootstrap_servers})
    for i in range(3):
        producer.produce(target, f"job {i}".encode(), partition=2)
    assert producer.flush(10) == 0

    described = {d.name: d for d in describe_topics(settings)}

    topic = described[target]
    assert topic.exists
    assert topic.partitions == 6
    assert topic.replication_factor == 1
    assert topic.messages == 3
    assert [(o.partition, o.start, o.end) for o in topic.offsets] == [
        (0, 0, 0),
        (1, 0, 0),
        (2, 0, 3),
        (3, 0, 0),
        (4, 0, 0),
        (5, 0, 0),
    ]
    assert topic.configs["cleanup.policy"] == "delete"
    assert topic.configs["retention.ms"] == str(7 * DAY_MS)
    assert topic.configs["min.insync.replicas"] == "1"
    assert sum(d.messages for d in described.values()) == 3


# --- the CLI -------------------------------------------------------------------------------


def cli(*args: str) -> Any:
    return CliRunner().invoke(topics, list(args))


def test_cli_apply_twice(bootstrap_servers: str, namespace: str) -> None:
    options = ["--bootstrap-servers", bootstrap_servers, "--namespace", namespace]

    first = cli("apply", *options)
    second = cli("apply", *options)

    assert first.exit_code == 0, first.output
    assert f"{namespace}.jobs.high" in first.stdout
    assert "created (6 partitions, replication factor 1)" in first.stdout
    assert first.stdout.splitlines()[-1] == "created 21 topics, changed 4 settings on 2 groups"
    assert second.exit_code == 0, second.output
    assert second.stdout.splitlines()[-1] == "nothing to change"
    assert second.stdout.count("unchanged") == 23  # 21 topics, the 2 groups of the workers


def test_cli_shortens_retention_only_with_its_flag(bootstrap_servers: str, namespace: str) -> None:
    options = ["--bootstrap-servers", bootstrap_servers, "--namespace", namespace]
    assert cli("apply", *options).exit_code == 0
    dlq, shorter = f"{namespace}.dlq", {"PIPELINE_TOPICS__DLQ_RETENTION_MS": str(DAY_MS)}

    left = CliRunner().invoke(topics, ["apply", *options], env=shorter)
    applied = CliRunner().invoke(
        topics, ["apply", "--allow-retention-decrease", *options], env=shorter
    )

    assert left.exit_code == 0, left.output
    [row] = [line for line in left.stdout.splitlines() if line.startswith(f"{dlq} ")]
    assert f"warning: retention.ms {14 * DAY_MS} -> {DAY_MS} would shorten" in row
    # The letters and their states (which go with them).
    assert left.stdout.splitlines()[-1] == "nothing to change; 2 warnings"
    assert applied.exit_code == 0, applied.output
    assert applied.stdout.splitlines()[-1] == "changed 2 settings on 2 topics"


def test_cli_dry_run_and_json(bootstrap_servers: str, namespace: str) -> None:
    options = ["--bootstrap-servers", bootstrap_servers, "--namespace", namespace]

    dry = cli("apply", "--dry-run", "--json", *options)

    assert dry.exit_code == 0, dry.output
    data = json.loads(dry.stdout)
    assert data["dry_run"] is True
    assert data["changed"] is True
    actions = {c["topic"]: c["action"] for c in data["changes"]}
    assert {a for t, a in actions.items() if not t.startswith(GROUP_ROW)} == {"created"}
    assert {a for t, a in actions.items() if t.startswith(GROUP_ROW)} == {"config"}
    described = cli("describe", "--json", *options)
    assert described.exit_code == 0, described.output
    assert not any(t["exists"] for t in json.loads(described.stdout)["topics"])


def test_cli_describe_table(bootstrap_servers: str, namespace: str) -> None:
    options = ["--bootstrap-servers", bootstrap_servers, "--namespace", namespace]
    missing = cli("describe", *options)
    assert missing.exit_code == 0, missing.output
    assert "21 of 21 topics are missing" in missing.stdout

    assert cli("apply", *options).exit_code == 0
    present = cli("describe", *options)

    assert present.exit_code == 0, present.output
    lines = present.stdout.splitlines()
    assert lines[0].split() == [
        "TOPIC",
        "STATUS",
        "PARTITIONS",
        "REPLICATION",
        "CLEANUP.POLICY",
        "RETENTION",
        "MIN.INSYNC.REPLICAS",
        "MESSAGES",
    ]
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:]}
    assert rows[f"{namespace}.dlq"] == ["ok", "6", "1", "delete", "14d", "1", "0"]
    assert rows[f"{namespace}.schedules"] == ["ok", "1", "1", "compact", "-", "1", "0"]
    assert "missing" not in present.stdout


def test_cli_unreachable_broker_exits_1(namespace: str) -> None:
    servers = f"127.0.0.1:{closed_port()}"

    result = cli(
        "apply", "--bootstrap-servers", servers, "--namespace", namespace, "--timeout", "1"
    )

    assert result.exit_code == 1
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith("Error: Kafka at " + servers)


def test_cli_refusal_exits_1(bootstrap_servers: str, namespace: str, admin: AdminClient) -> None:
    brokers = len(admin.list_topics(timeout=10).brokers)
    options = ["--bootstrap-servers", bootstrap_servers, "--namespace", namespace]

    result = CliRunner().invoke(
        topics,
        ["apply", *options],
        env={"PIPELINE_TOPICS__REPLICATION_FACTOR": str(brokers + 1)},
    )

    assert result.exit_code == 1
    assert "is larger than the" in result.stderr
    assert result.stderr.startswith("Error: cannot create topic ")
