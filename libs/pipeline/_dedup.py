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

:mod:`._dedupstores` has the extension point for stores (Redis, Postgres...); the worker's
Kafka store is ``pipeline_worker.route.changelog.KafkaDedupStore``.
"""

from __future__ import annotations

import heapq
import json
import math
import re
import struct
from binascii import unhexlify
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Final, Literal, TypeAlias

from ._errors import ConfigurationError, PipelineError

__all__ = [
    "ANY_PRIORITY",
    "UNCHANGED",
    "ChangelogRecord",
    "DedupMode",
    "DedupNotLoadedError",
    "DedupPolicy",
    "DedupScope",
    "DedupTable",
    "Entry",
    "KeyOutcome",
    "Settled",
    "Unchanged",
    "Verdict",
    "changelog_key",
    "decode_entry",
    "encode_entry",
    "restore_record",
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
        if not 0 < self.ttl_s < math.inf:
            raise ConfigurationError(
                f"deduplication ttl_s must be positive and finite, got {self.ttl_s}"
            )
        object.__setattr__(self, "ttl_ms", max(1, round(self.ttl_s * 1000)))


@dataclass(frozen=True, slots=True)
class Entry:
    """The holder of one key: its job, whether that job completed, and when the hold ends."""

    job_id: str
    completed: bool
    expires_at_ms: int


@dataclass(frozen=True, slots=True)
class ChangelogRecord:
    """One record for the changelog topic; ``value`` None is a tombstone."""

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


def encode_entry(job_id: str, completed: bool, expires_at_ms: int) -> bytes:
    """A changelog value: compact JSON, ``{"j":"<job id>","c":1,"x":<expires at, ms>}``."""
    if _PLAIN_ID(job_id) is not None:  # nothing to escape: the JSON of it, at a third the cost
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
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError both are
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
    return Entry(job_id, bool(completed), expires)


# --- one partition's table -----------------------------------------------------------------

# An entry is held as one bytes object: an 8-byte header (expiry << 2 | HEX_ID | COMPLETED), then
# the job id: 16 raw bytes when it is 32 lowercase hex digits (the ids pipeline makes), else its
# UTF-8 text. That is about 60 bytes an entry where a (str, bool, int) tuple takes about 180.
_HEADER = struct.Struct(">q")
_COMPLETED = 1
_HEX_ID = 2
_HEX_ID_LENGTH = 32

_WRITTEN: Final = re.compile(
    rb'\{"j":"([0-9a-f]{32})","c":([01]),"x":(-?(?:0|[1-9][0-9]*))\}'
).fullmatch
"""A changelog value exactly as :func:`encode_entry` writes one for a job id of 32 hex digits;
any value it matches decodes (JSON) to the same entry."""

BUCKET_MS = 1000
"""Expiry granularity of the timing wheel of a :class:`DedupTable` (never of expiry itself)."""


def _pack_id(job_id: str) -> tuple[int, bytes]:
    if len(job_id) == _HEX_ID_LENGTH:
        try:
            raw = bytes.fromhex(job_id)
        except ValueError:
            pass
        else:
            if raw.hex() == job_id:  # lowercase, no spaces: the id comes back as it was
                return _HEX_ID, raw
    return 0, job_id.encode("utf-8", "surrogatepass")


def _pack(job_id: str, completed: bool, expires_at_ms: int) -> bytes:
    flag, raw = _pack_id(job_id)
    return _HEADER.pack(expires_at_ms << 2 | flag | completed) + raw


def _unpack(value: bytes) -> Entry:
    header: int = _HEADER.unpack_from(value)[0]
    raw = value[_HEADER.size :]
    job_id = raw.hex() if header & _HEX_ID else raw.decode("utf-8", "surrogatepass")
    return Entry(job_id, bool(header & _COMPLETED), header >> 2)


def _holds(value: bytes, header: int, job_id: str) -> bool:
    if header & _HEX_ID:  # a hex id as it came: the stored bytes in hex are it, nothing else
        return value[_HEADER.size :].hex() == job_id
    flag, raw = _pack_id(job_id)
    return flag == 0 and value[_HEADER.size :] == raw


class DedupTable:
    """The keys seen on one job partition: key -> (job id, completed, expires at).

    Expiry is a timing wheel: each entry is listed in the bucket of its expiry (one bucket per
    :data:`BUCKET_MS`), and the buckets that come due are found with a heap. Replacing an entry
    leaves its old listing behind, skipped when its bucket comes due (its entry has moved on),
    so :meth:`expire` costs what expired plus one bucket, never a scan of every key. Restored
    entries may come in any order, whatever their TTLs.

    Times are epoch milliseconds given by the caller; an entry expires at ``now_ms >=
    expires_at_ms`` and counts as absent from then on, before :meth:`expire` removes it.
    """

    __slots__ = ("_buckets", "_due", "_entries")

    def __init__(self) -> None:
        self._entries: dict[str, bytes] = {}
        self._buckets: dict[int, list[str]] = {}
        self._due: list[int] = []
        """A heap of the keys of ``_buckets``."""

    def __len__(self) -> int:
        """Entries held, counting expired ones that :meth:`expire` has not removed yet."""
        return len(self._entries)

    def get(self, key: str) -> Entry | None:
        """The entry of ``key``, expired or not, or None."""
        value = self._entries.get(key)
        return None if value is None else _unpack(value)

    def check(self, key: str, job_id: str, now_ms: int, ttl_ms: int) -> Verdict:
        """What to do with job ``job_id`` carrying ``key``; RUN claims the key for ``ttl_ms``."""
        value = self._entries.get(key)
        before = None
        if value is not None:
            header: int = _HEADER.unpack_from(value)[0]
            before = header >> 2
            if before > now_ms:
                if not _holds(value, header, job_id):
                    return Verdict.DUPLICATE
                return Verdict.DONE if header & _COMPLETED else Verdict.RETRY
        expires = now_ms + ttl_ms
        self._store(key, _pack(job_id, False, expires), expires, before)
        return Verdict.RUN

    def settle(
        self, key: str, job_id: str, outcome: KeyOutcome, policy: DedupPolicy, now_ms: int
    ) -> Settled:
        """Record how the run of ``job_id`` ended; returns the changelog value it needs.

        Only the job holding a live, pending entry changes it: settling a completed entry, an
        expired one or another job's returns :data:`UNCHANGED`. ``until_complete``: SUCCEEDED
        completes the entry and RETRYING keeps it pending, both for ``ttl`` from now; DEAD
        removes it (None: a tombstone). ``until_ttl``: the expiry stays where the claim put it;
        SUCCEEDED completes the entry, RETRYING and DEAD leave it pending.
        """
        value = self._entries.get(key)
        if value is None:
            return UNCHANGED
        header: int = _HEADER.unpack_from(value)[0]
        expires = header >> 2
        if expires <= now_ms or header & _COMPLETED or not _holds(value, header, job_id):
            return UNCHANGED
        before = expires
        if policy.mode is DedupMode.UNTIL_COMPLETE:
            if outcome is KeyOutcome.DEAD:
                del self._entries[key]
                return None
            expires = now_ms + policy.ttl_ms
        completed = outcome is KeyOutcome.SUCCEEDED
        # The same job id: keep its packed bytes, only the header changes.
        packed = _HEADER.pack(expires << 2 | header & _HEX_ID | completed) + value[_HEADER.size :]
        self._store(key, packed, expires, before)
        return encode_entry(job_id, completed, expires)

    def put(self, key: str, entry: Entry, now_ms: int) -> None:
        """Set ``key`` to ``entry`` (a restore); an entry expired at ``now_ms`` removes the key."""
        value = self._entries.get(key)
        before = None if value is None else _HEADER.unpack_from(value)[0] >> 2
        if entry.expires_at_ms <= now_ms:
            if value is not None:
                del self._entries[key]
            return
        packed = _pack(entry.job_id, entry.completed, entry.expires_at_ms)
        self._store(key, packed, entry.expires_at_ms, before)

    def restore(self, key: str, raw: bytes, now_ms: int) -> None:
        """``put(key, decode_entry(raw), now_ms)``: the changelog value ``raw`` restored.

        A restore reads a million of these: a value as :func:`encode_entry` writes it for a
        32-hex job id goes from its bytes to the packed entry without JSON or an
        :class:`Entry`; any other goes through :func:`decode_entry` (ValueError included).
        """
        match = _WRITTEN(raw)
        if match is None:
            self.put(key, decode_entry(raw), now_ms)
            return
        hex_id, completed, expires_text = match.groups()
        expires = int(expires_text)
        entries = self._entries
        value = entries.get(key)
        if expires <= now_ms:
            if value is not None:
                del entries[key]
            return
        before = None if value is None else _HEADER.unpack_from(value)[0] >> 2
        header = expires << 2 | _HEX_ID | (completed == b"1")
        self._store(key, _HEADER.pack(header) + unhexlify(hex_id), expires, before)

    def remove(self, key: str) -> bool:
        """Forget ``key``; False if it was not held."""
        return self._entries.pop(key, None) is not None

    def expire(self, now_ms: int) -> list[str]:
        """Remove every entry expired at ``now_ms`` and return their keys."""
        expired: list[str] = []
        entries, buckets, due = self._entries, self._buckets, self._due
        now_bucket = now_ms // BUCKET_MS
        while due and due[0] <= now_bucket:
            bucket = due[0]
            keep: list[str] = []
            for key in buckets[bucket]:
                value = entries.get(key)
                if value is None:
                    continue
                expires = _HEADER.unpack_from(value)[0] >> 2
                if expires // BUCKET_MS != bucket:
                    continue  # listed again in the bucket of a later expiry
                if expires <= now_ms:
                    del entries[key]
                    expired.append(key)
                else:
                    keep.append(key)  # only in the current bucket, which ends the loop
            if keep:
                buckets[bucket] = keep
                break
            heapq.heappop(due)
            del buckets[bucket]
        return expired

    def _store(self, key: str, value: bytes, expires: int, before: int | None) -> None:
        """Set ``key``, listing it in the bucket of ``expires`` unless its listing is there."""
        self._entries[key] = value
        bucket = expires // BUCKET_MS
        if before is not None and before // BUCKET_MS == bucket:
            return
        listed = self._buckets.get(bucket)
        if listed is None:
            self._buckets[bucket] = [key]
            heapq.heappush(self._due, bucket)
        else:
            listed.append(key)


def restore_record(
    tables: Mapping[str, DedupTable], key: bytes | None, value: bytes | None, now_ms: int
) -> bool:
    """Fold one changelog record into the tables it is about (``tables`` by priority, or one
    table under :data:`ANY_PRIORITY` for the scope namespace): the table of its priority, else
    the namespace table; a namespace record goes into every priority's table.

    False when no table here is about it; ValueError when the record is malformed.
    """
    if key is None:
        raise ValueError("changelog record without a key")
    priority, idempotency_key = split_changelog_key(key)
    table = tables.get(priority)
    if table is None:
        table = tables.get(ANY_PRIORITY)
    if table is not None:
        targets: Iterable[DedupTable] = (table,)
    elif priority == ANY_PRIORITY and tables:
        targets = tables.values()
    else:
        return False
    for target in targets:  # a malformed value raises at the first, before it changes
        if value is None:
            target.remove(idempotency_key)
        else:
            target.restore(idempotency_key, value, now_ms)
    return True
