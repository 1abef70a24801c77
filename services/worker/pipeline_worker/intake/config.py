"""The librdkafka options of the worker's consumer, and why each is chosen."""

from __future__ import annotations

from typing import Any

from pipeline import Settings
from pipeline._groupconfig import group_protocol, heartbeat_interval_ms
from pipeline._workersettings import WorkerSettings

from .groupproto import CO_PARTITIONING

COOPERATIVE = "cooperative-sticky"
"""The retry relay's classic assignor: its partitions need no co-partitioning."""
PREFETCH_MESSAGES = 100
"""librdkafka fetches a partition again once fewer messages than this wait in its queue."""
PREFETCH_BYTES = 64 * 1024
"""The most one fetch takes from a partition (a larger record batch still comes whole). With
``fetch.queue.backoff.ms`` at 10 a consumer still reads about 480,000 1-KB messages a second."""


def membership_config(
    worker: WorkerSettings, *, classic_assignor: str, remote_assignor: str | None
) -> dict[str, Any]:
    """The group protocol's options. Under ``consumer`` (KIP-848) librdkafka refuses the
    assignment strategy, the session timeout and the heartbeat interval: the broker assigns
    (``group.remote.assignor``; None: the broker's default) and takes the timings from the
    group's configs (:mod:`pipeline._groupconfig`). Under ``classic`` the client sets them."""
    if group_protocol(worker) == "consumer":
        conf: dict[str, Any] = {"group.protocol": "consumer"}
        if remote_assignor is not None:
            conf["group.remote.assignor"] = remote_assignor
        return conf
    session = worker.session_timeout_ms
    return {
        "group.protocol": "classic",
        "partition.assignment.strategy": classic_assignor,
        "session.timeout.ms": session,
        "heartbeat.interval.ms": heartbeat_interval_ms(session),
    }


def consumer_config(settings: Settings, group_id: str) -> dict[str, Any]:
    """librdkafka options for the worker's consumer; ``Settings.kafka`` and then
    ``WorkerSettings.kafka_consumer`` win over these defaults."""
    worker = settings.worker
    conf: dict[str, Any] = {
        "group.id": group_id,
        **membership_config(
            worker,
            classic_assignor=CO_PARTITIONING,
            remote_assignor=CO_PARTITIONING,
        ),
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
        "max.poll.interval.ms": worker.max_poll_interval_ms,
        # End-of-partition events tell a burst run that a partition is drained.
        "enable.partition.eof": worker.burst,
        # Our own per-partition buffers hold the jobs waiting to run; librdkafka's prefetch only
        # needs to keep them fed. Pausing a full partition throws away what was fetched for it
        # and not yet delivered (its queue, and the answer of a fetch in flight), and a backlog
        # pauses every partition again and again: with librdkafka's 1 MiB a partition a fetch,
        # a drain fetched and decompressed 13 times the bytes a plain consumer reads.
        "queued.min.messages": PREFETCH_MESSAGES,
        "max.partition.fetch.bytes": PREFETCH_BYTES,
        "queued.max.messages.kbytes": 16384,
        # A resumed partition is fetched only once the fetch in flight returns, and a fetch of
        # partitions with nothing new waits up to fetch.wait.max.ms on the broker: with the
        # default 500 ms a drained buffer would wait that long for its refill. 50 ms costs an
        # idle worker 20 small fetches a second per broker. librdkafka also backs off a
        # partition whose prefetch queue was full for fetch.queue.backoff.ms (1 s by default).
        "fetch.wait.max.ms": 50,
        "fetch.queue.backoff.ms": 10,
        # Fetch and commit requests go out at once, as the producer's do (see producer_config).
        "socket.nagle.disable": True,
    }
    conf.update(settings.client_config())
    conf.update(worker.kafka_consumer)
    return conf
