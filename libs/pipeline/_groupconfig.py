"""The consumer group protocol of the workers' groups, and the group configs it needs: no Kafka.

Under the consumer group protocol (KIP-848, ``group.protocol=consumer``) the broker, not the
client, owns the session timeout and the heartbeat interval: librdkafka refuses
``session.timeout.ms`` and ``heartbeat.interval.ms``, and each group takes them from its dynamic
group configs ``consumer.session.timeout.ms`` and ``consumer.heartbeat.interval.ms`` (else the
broker's defaults, 45 s and 5 s), within the broker's ``group.consumer.min.*``/``max.*``
bounds. :func:`group_configs` turns ``worker.session_timeout_ms`` into those group configs for
the worker group and the retry relay's group; ``pipeline topics apply`` and each worker at
start set them (:mod:`pipeline._groupadmin`). Under the classic protocol they stay client
settings and no group config is needed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._topics import retry_group, worker_group

if TYPE_CHECKING:
    from ._settings import Settings
    from ._workersettings import WorkerSettings

SESSION_TIMEOUT = "consumer.session.timeout.ms"
HEARTBEAT_INTERVAL = "consumer.heartbeat.interval.ms"
GROUP_CONFIG_KEYS = (SESSION_TIMEOUT, HEARTBEAT_INTERVAL)


def group_protocol(worker: WorkerSettings) -> str:
    """``classic`` or ``consumer``: ``worker.group_protocol``, unless ``worker.kafka_consumer``
    names ``group.protocol`` itself (then the consumer's options follow that one)."""
    return worker.kafka_consumer.get("group.protocol", worker.group_protocol)


def heartbeat_interval_ms(session_timeout_ms: int) -> int:
    """The heartbeat interval that goes with a session timeout.

    Members learn of a rebalance from a heartbeat response: beating every second instead of
    every 3 s (classic) or 5 s (consumer protocol) makes each round of a rebalance that much
    faster; a third of the session timeout leaves two beats to miss before it expires.
    """
    return max(100, min(1000, session_timeout_ms // 3))


def group_configs(settings: Settings) -> dict[str, dict[str, str]]:
    """The group configs the worker's consumer groups need, by group id (none under classic)."""
    worker = settings.worker
    if group_protocol(worker) != "consumer":
        return {}
    session = worker.session_timeout_ms
    values = {
        SESSION_TIMEOUT: str(session),
        HEARTBEAT_INTERVAL: str(heartbeat_interval_ms(session)),
    }
    return {worker_group(settings): values, retry_group(settings): dict(values)}


@dataclass(frozen=True, slots=True)
class GroupConfigChange:
    """One group config that differs: its value now (``None``: the broker's default) and the
    value the settings ask for."""

    group: str
    key: str
    current: str | None
    wanted: str

    def describe(self) -> str:
        now = "the broker default" if self.current is None else self.current
        return f"{self.key} {now} -> {self.wanted}"


def plan_group_configs(
    wanted: Mapping[str, Mapping[str, str]],
    observed: Mapping[str, Mapping[str, str | None]],
) -> list[GroupConfigChange]:
    """What must be set so that each group's configs (``observed``: its values, ``None`` where
    the broker's default applies) are the ``wanted`` ones. A default equal to the wanted value
    is set all the same: the broker's default could change, the setting should not."""
    changes = []
    for group, values in wanted.items():
        current = observed.get(group, {})
        for key, value in values.items():
            if current.get(key) != value:
                changes.append(GroupConfigChange(group, key, current.get(key), value))
    return changes
