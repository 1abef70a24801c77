"""Worker heartbeats on ``<ns>.workers``: how busy each worker process is, read from Kafka alone.

Every ``worker.heartbeat_interval_s`` a worker process writes one small JSON record keyed by
:func:`beat_key` (its consumer's client id, the one the group coordinator reports for the member,
with its host and pid: replicas that share a client id still write, and tombstone, records of
their own), and a tombstone when it stops cleanly. Records keyed by the client id alone (workers
before the host and pid were added) are still read. The topic is compacted: reading it to its
end gives each live worker's latest heartbeat. A heartbeat older than
:data:`STALE_INTERVALS` of its own interval is stale (the worker died without its tombstone, or
cannot reach Kafka). The record (version 2)::

    {"v": 2, "client_id": "...", "group": "...", "host": "...", "pid": 12,
     "started_at_ms": ..., "at_ms": ..., "interval_s": 5.0, "concurrency": 64,
     "in_flight": 3, "utilization": 0.05, "jobs_done": 1200,
     "partitions": [["pipeline.jobs.high", 0], ...], "member_id": "..."}

``member_id`` (version 2) is the consumer's group member id, as the group coordinator reports
it: ``pipeline status`` joins a member to its heartbeat by it, since replicas may share a client
id. It is ``""`` until the worker joined its group; a version 1 record has none.

Readers ignore fields they do not know and skip records they cannot read (never raising), so
a later version may add fields without breaking them. The publisher is the worker's
(``pipeline_worker._beats``); this module is the contract and the reader.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._job import now_ms
from ._tablereader import read_table
from ._topics import TopicNames

if TYPE_CHECKING:
    from ._settings import Settings

__all__ = [
    "STALE_INTERVALS",
    "VERSION",
    "WorkerBeat",
    "beat_key",
    "by_client_id",
    "decode_beat",
    "encode_beat",
    "read_process_beats",
    "read_worker_beats",
]

VERSION = 2
STALE_INTERVALS = 3
"""A heartbeat older than this many of its worker's intervals is stale."""

_log = logging.getLogger("pipeline.workerbeats")


@dataclass(frozen=True, slots=True)
class WorkerBeat:
    """One worker process's latest heartbeat."""

    client_id: str
    group: str
    host: str
    pid: int
    started_at_ms: int
    at_ms: int
    """When the heartbeat was written (ms since the epoch, the worker's clock)."""
    interval_s: float
    """The worker's ``worker.heartbeat_interval_s``: the next one is due this long after."""
    concurrency: int
    in_flight: int
    utilization: float
    """The busy share of the concurrency slots, averaged over the last interval (0..1)."""
    jobs_done: int
    """Offsets the process finished since it started (succeeded, retried, dead-lettered)."""
    partitions: tuple[tuple[str, int], ...] = ()
    member_id: str = ""
    """The worker consumer's group member id (``""``: not joined yet, or a version 1 record)."""

    def age_s(self, at_ms: int | None = None) -> float:
        """Seconds between the heartbeat and ``at_ms`` (default: now); never negative."""
        return max(0.0, ((now_ms() if at_ms is None else at_ms) - self.at_ms) / 1000)

    def stale_at(self, at_ms: int | None = None) -> bool:
        """Whether the heartbeat is older than :data:`STALE_INTERVALS` intervals at ``at_ms``."""
        return self.age_s(at_ms) > STALE_INTERVALS * self.interval_s

    @property
    def stale(self) -> bool:
        """:meth:`stale_at` now."""
        return self.stale_at()


def beat_key(client_id: str, host: str, pid: int) -> str:
    """The key of a worker process's heartbeats: ``<client_id>@<host>:<pid>``, its own even
    when its client id is not (every replica of a Deployment given one ``PIPELINE_CLIENT_ID``)."""
    return f"{client_id}@{host}:{pid}"


def encode_beat(beat: WorkerBeat) -> bytes:
    """The record's value: compact JSON of version :data:`VERSION`."""
    record = {
        "v": VERSION,
        "client_id": beat.client_id,
        "group": beat.group,
        "host": beat.host,
        "pid": beat.pid,
        "started_at_ms": beat.started_at_ms,
        "at_ms": beat.at_ms,
        "interval_s": beat.interval_s,
        "concurrency": beat.concurrency,
        "in_flight": beat.in_flight,
        "utilization": round(beat.utilization, 4),
        "jobs_done": beat.jobs_done,
        "partitions": [[topic, partition] for topic, partition in beat.partitions],
        "member_id": beat.member_id,
    }
    return json.dumps(record, separators=(",", ":")).encode()


def decode_beat(key: str, value: bytes | None) -> WorkerBeat | None:
    """The heartbeat in a record keyed ``key``; ``None`` for a tombstone or anything that is not
    a heartbeat of version 1 or later keyed by its :func:`beat_key` (or, written before that,
    by its ``client_id``). Never raises."""
    if value is None:
        return None
    try:
        record = json.loads(value)
        if not isinstance(record, dict) or not _count(record.get("v")) or record["v"] < 1:
            return None
        beat = WorkerBeat(
            client_id=_text(record, "client_id"),
            group=_text(record, "group"),
            host=_text(record, "host"),
            pid=_int(record, "pid"),
            started_at_ms=_int(record, "started_at_ms"),
            at_ms=_int(record, "at_ms"),
            interval_s=_number(record, "interval_s"),
            concurrency=_int(record, "concurrency"),
            in_flight=_int(record, "in_flight"),
            utilization=_number(record, "utilization"),
            jobs_done=_int(record, "jobs_done"),
            partitions=_partitions(record.get("partitions", [])),
            member_id=_optional_text(record, "member_id"),
        )
    except (ValueError, TypeError, KeyError, RecursionError):
        return None
    if key not in (beat_key(beat.client_id, beat.host, beat.pid), beat.client_id):
        return None
    if beat.interval_s <= 0:
        return None
    return beat


def read_worker_beats(settings: Settings, *, timeout: float = 10.0) -> dict[str, WorkerBeat]:
    """The latest heartbeat of each worker process on ``<ns>.workers``, by client id, stale
    ones included (see :attr:`WorkerBeat.stale`); empty when the topic does not exist (a
    deployment whose topics were not applied since heartbeats came). Records that are not
    heartbeats are skipped. Raises :class:`KafkaUnavailableError` when Kafka does not answer
    within ``timeout`` seconds.

    Where processes share a client id, the one fresh heartbeat among theirs is the client id's
    (the others died without a tombstone); with none fresh, the newest; with several fresh,
    none: the table cannot tell which member is which, and one process's numbers must not be
    shown for all of them. :func:`read_process_beats` has them all."""
    return by_client_id(read_process_beats(settings, timeout=timeout).values())


def read_process_beats(settings: Settings, *, timeout: float = 10.0) -> dict[str, WorkerBeat]:
    """:func:`read_worker_beats` for each process: every latest heartbeat, by its record's key
    (:func:`beat_key`, or the client id for a worker that predates it)."""
    topic = TopicNames(settings.namespace).workers
    beats: dict[str, WorkerBeat] = {}
    for key, value in read_table(settings, topic, timeout, missing_ok=True):
        beat = decode_beat(key, value)
        if beat is not None:
            beats[key] = beat
        else:
            if value is not None:
                _log.debug("skipped a record of %s keyed %r: not a heartbeat", topic, key)
            beats.pop(key, None)
    return beats


def by_client_id(beats: Iterable[WorkerBeat], at_ms: int | None = None) -> dict[str, WorkerBeat]:
    """One heartbeat per client id, chosen as :func:`read_worker_beats` says, at ``at_ms``."""
    at_ms = now_ms() if at_ms is None else at_ms
    shared: dict[str, list[WorkerBeat]] = {}
    for beat in beats:
        shared.setdefault(beat.client_id, []).append(beat)
    chosen: dict[str, WorkerBeat] = {}
    for client_id, group in shared.items():
        fresh = [beat for beat in group if not beat.stale_at(at_ms)]
        if len(fresh) > 1:
            _log.debug("%d live workers share the client id %r", len(fresh), client_id)
            continue
        chosen[client_id] = fresh[0] if fresh else max(group, key=lambda beat: beat.at_ms)
    return chosen


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _int(record: dict[str, Any], name: str) -> int:
    value = record[name]
    if not _count(value):
        raise ValueError(name)
    return int(value)


def _number(record: dict[str, Any], name: str) -> float:
    value = record[name]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(name)
    if value < 0:
        raise ValueError(name)
    return float(value)


def _text(record: dict[str, Any], name: str) -> str:
    value = record[name]
    if not isinstance(value, str):
        raise ValueError(name)
    return value


def _optional_text(record: dict[str, Any], name: str) -> str:
    """A text field a version 1 record lacks (or a writer left ``null``): ``""`` then."""
    return "" if record.get(name) is None else _text(record, name)


def _partitions(value: Any) -> tuple[tuple[str, int], ...]:
    if not isinstance(value, list):
        raise ValueError("partitions")
    found = []
    for item in value:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)):
            raise ValueError("partitions")
        if not _count(item[1]):
            raise ValueError("partitions")
        found.append((item[0], int(item[1])))
    return tuple(found)
