"""Idempotency keys: which job holds each key of a job partition, and the changelog of it. Pure.

Producers key a job's message by its idempotency key, so every duplicate lands on the partition
of the original, and the worker owning that partition decides alone: it keeps the keys it has
seen in a :class:`DedupTable` and acknowledges a duplicate without running it.

The scope (:class:`DedupScope`) is the namespace by default: every priority topic has as many
partitions, so a key lands on the same partition number p in each, and the group's assignor
gives partition p of every priority topic to one worker (co-partitioning), which keeps one table
for p. The same key enqueued at two priorities is one key. With the scope ``priority`` each
priority topic's partition has a table of its own, and the same key at two priorities is two.

Two modes per job type (:class:`DedupPolicy`):

- ``until_complete``: a duplicate is dropped while the original is queued, running or waiting in
  a retry tier, and for ``ttl`` after the original succeeded; a dead-lettered original releases
  the key. Each move to a retry tier renews the hold for ``ttl``, so a lock never outlives its
  job by more than ``ttl``: locks always release.
- ``until_ttl``: the key is held for ``ttl`` from the original's first run, whatever its outcome.

A job's own redelivery (the same job id: back from a retry tier, or read again after a crash) is
not a duplicate of itself: it runs while its entry is pending and is skipped once completed.

The state of a partition survives a change of owner through the compacted ``<ns>.dedup``
changelog: its partition p holds the keys of partition p of every priority topic, keyed
``*/<key>`` (scope namespace) or ``<priority>/<key>`` (scope priority). Records of one scope
are read into the tables of the other too: a ``<priority>/<key>`` record into the namespace
table of its partition (the upgrade from the per-priority scope), a ``*/<key>`` record into
every priority's table. A key is claimed in memory when its job starts; the changelog learns of it
when the job ends, in the transaction that commits the job's offset. So a crash between the
handler and the commit runs the job again (as it would without a key), and a committed job is
never run again for a duplicate: the next owner restores its entry before reading the partition.

:mod:`._deduptable` has a partition's table, :mod:`._dedupstores` the extension point for stores
(Redis, Postgres...); the worker's Kafka store is
``pipeline_worker.route.changelog.KafkaDedupStore``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Final, Literal, NamedTuple, TypeAlias

from ._errors import ConfigurationError, PipelineError

__all__ = [
    "ANY_PRIORITY",
    "UNCHANGED",
    "ChangelogRecord",
    "DedupMode",
    "DedupNotLoadedError",
    "DedupPolicy",
    "DedupScope",
    "Entry",
    "KeyOutcome",
    "Settled",
    "Unchanged",
    "Verdict",
    "changelog_key",
    "decode_entry",
    "encode_entry",
    "split_changelog_key",
    "topic_priority",
]

Where: TypeAlias = tuple[str, int]
"""A job partition: (topic, partition)."""


class DedupMode(StrEnum):
    """How long a job's idempotency key keeps its duplicates out (see the module docstring)."""

    UNTIL_COMPLETE = "until_complete"
    UNTIL_TTL = "until_ttl"


class DedupScope(StrEnum):
    """Where one idempotency key keeps its duplicates out (see the module docstring)."""

    NAMESPACE = "namespace"
    """Every priority topic of the namespace: partition p of each shares one table."""
    PRIORITY = "priority"
    """One priority topic: the same key at two priorities is two keys."""


ANY_PRIORITY: Final = "*"
"""The priority part of a changelog key whose table covers every priority (scope namespace)."""


class Verdict(Enum):
    """What to do with a job that carries an idempotency key."""

    RUN = "run"
    """No live entry: the key is now claimed (pending) by this job. Run it."""
    RETRY = "retry"
    """The key is held by this same job, still pending (a retry or a re-read). Run it."""
    DONE = "done"
    """The key is held by this same job, completed. Skip it: it already ran."""
    DUPLICATE = "duplicate"
    """Another job holds the key. Skip it."""


class KeyOutcome(Enum):
    """How a job that holds a key ended this run."""

    SUCCEEDED = "succeeded"
    RETRYING = "retrying"
    """Moved to a retry tier or deferred: the job is still alive."""
    DEAD = "dead"
    """Dead-lettered."""


TTL_MAX_S = 1000 * 365.25 * 86400
"""The longest ``ttl_s`` (a thousand years): an expiry must fit a table's entry."""
EXPIRY_MAX_MS = 2**61 - 1
"""The largest expiry a table's entry holds (61 bits of milliseconds, about 73 million years)."""


@dataclass(frozen=True, slots=True)
class DedupPolicy:
    """The deduplication of one job type: its mode and how long a key is held."""

    mode: DedupMode = DedupMode.UNTIL_COMPLETE
    ttl_s: float = 3600.0
    ttl_ms: int = field(init=False, repr=False, compare=False)
    """``ttl_s`` in whole milliseconds, at least 1 (worked out once: it is read for every job)."""

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "mode", DedupMode(self.mode))
        except ValueError:
            modes = ", ".join(m.value for m in DedupMode)
            raise ConfigurationError(
                f"unknown deduplication mode {self.mode!r}; use one of: {modes}"
            ) from None
        if not 0 < self.ttl_s <= TTL_MAX_S:
            raise ConfigurationError(
                f"deduplication ttl_s must be positive and finite, at most {TTL_MAX_S:g} s (a "
                f"thousand years), got {self.ttl_s}"
            )
        object.__setattr__(self, "ttl_ms", max(1, round(self.ttl_s * 1000)))


@dataclass(frozen=True, slots=True)
class Entry:
    """The holder of one key: its job, whether that job completed, and when the hold ends."""

    job_id: str
    completed: bool
    expires_at_ms: int


class ChangelogRecord(NamedTuple):
    """One record for the changelog topic; ``value`` None is a tombstone.

    A named tuple, not a frozen dataclass: a store makes one for every keyed job that ends,
    and a tuple is made in under half the time."""

    partition: int
    key: bytes
    value: bytes | None


class Unchanged(Enum):
    """The type of :data:`UNCHANGED`."""

    UNCHANGED = "unchanged"


UNCHANGED: Final = Unchanged.UNCHANGED
"""What :meth:`DedupTable.settle` returns when the changelog needs no record."""

Settled: TypeAlias = bytes | Literal[Unchanged.UNCHANGED] | None
"""A settle's changelog value: bytes to write, None for a tombstone, or UNCHANGED: nothing."""


class DedupNotLoadedError(PipelineError, LookupError):
    """A store was asked about a partition whose state it has not loaded."""

    def __init__(self, where: Where) -> None:
        super().__init__(
            f"the deduplication state of {where[0]}[{where[1]}] is not loaded; "
            "a worker loads it when the partition is assigned, before reading it"
        )
        self.where = where


# --- the changelog codec -------------------------------------------------------------------


def topic_priority(topic: str) -> str:
    """The priority of a job topic: its last dot-separated part (``ns.jobs.high`` -> high)."""
    return topic.rpartition(".")[2]


def changelog_key(priority: str, key: str) -> bytes:
    """The changelog key of idempotency key ``key`` on the topic of ``priority``, or on every
    priority topic (``priority`` :data:`ANY_PRIORITY`)."""
    if not priority or "/" in priority:
        raise ValueError(f"a priority must be non-empty and free of '/', got {priority!r}")
    return f"{priority}/{key}".encode()


def split_changelog_key(raw: bytes) -> tuple[str, str]:
    """(priority, idempotency key) of a changelog key; ValueError unless it is one."""
    try:
        text = raw.decode()
    except UnicodeDecodeError as exc:
        raise ValueError(f"changelog key is not UTF-8: {raw[:64]!r}") from exc
    priority, slash, key = text.partition("/")
    if not slash or not priority:
        raise ValueError(f"changelog key is not '<priority>/<key>': {raw[:64]!r}")
    return priority, key


def encode_entry(job_id: str, completed: bool, expires_at_ms: int, *, plain: bool = False) -> bytes:
    """A changelog value: compact JSON, ``{"j":"<job id>","c":1,"x":<expires at, ms>}``.
    ``plain``: the caller knows ``job_id`` has nothing to escape (hex digits)."""
    if plain or _PLAIN_ID(job_id) is not None:  # nothing to escape: the JSON of it, faster
        return b'{"j":"%s","c":%d,"x":%d}' % (job_id.encode(), completed, expires_at_ms)
    return json.dumps(
        {"j": job_id, "c": int(completed), "x": expires_at_ms}, separators=(",", ":")
    ).encode()


_PLAIN_ID: Final = re.compile(r"[ !#-\[\]-~]*").fullmatch
"""A job id that ``json.dumps`` writes as it is: printable ASCII but ``"`` and backslash."""


def decode_entry(raw: bytes) -> Entry:
    """The entry of a changelog value; ValueError on anything that is not one."""
    try:
        record = json.loads(raw.decode())  # decoding first: twice as fast as json.loads(bytes)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are
        raise ValueError(f"changelog value is not JSON: {raw[:64]!r}") from exc
    if not isinstance(record, dict):
        raise ValueError(f"changelog value is not a JSON object: {raw[:64]!r}")
    job_id, completed, expires = record.get("j"), record.get("c"), record.get("x")
    if (
        not isinstance(job_id, str)
        or type(completed) is not int
        or completed not in (0, 1)
        or type(expires) is not int
    ):
        raise ValueError(f"changelog value lacks a valid j, c or x: {raw[:64]!r}")
    check_expiry(expires)
    return Entry(job_id, bool(completed), expires)


def check_expiry(expires_at_ms: int) -> int:
    """``expires_at_ms`` if a table can hold it (within :data:`EXPIRY_MAX_MS` of the epoch),
    else ValueError: a record from another writer, or corrupted."""
    if not -EXPIRY_MAX_MS <= expires_at_ms <= EXPIRY_MAX_MS:
        raise ValueError(f"changelog value has an expiry out of range: {expires_at_ms}")
    return expires_at_ms
