"""One partition's table of idempotency keys (:class:`DedupTable`), compact in memory, and the
fold of changelog records into tables when a partition's keys are restored. Pure; the
semantics are those of :mod:`._dedup`."""

from __future__ import annotations

import heapq
import re
import struct
from binascii import unhexlify
from collections.abc import Iterable, Mapping
from typing import Final

from ._dedup import (
    ANY_PRIORITY,
    UNCHANGED,
    DedupMode,
    DedupPolicy,
    Entry,
    KeyOutcome,
    Settled,
    Verdict,
    check_expiry,
    decode_entry,
    encode_entry,
    split_changelog_key,
)

__all__ = ["BUCKET_MS", "DedupTable", "restore_record"]

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

    __slots__ = (
        "_buckets",
        "_due",
        "_entries",
        "_foreign",
        "_foreign_due",
        "_foreign_held",
        "_stale",
    )

    def __init__(self) -> None:
        self._entries: dict[str, bytes] = {}
        self._buckets: dict[int, list[str]] = {}
        self._due: list[int] = []
        """A heap of the keys of ``_buckets``."""
        self._stale: list[str] = []
        """Keys whose record had expired when it was restored: dropped, but the compacted
        changelog keeps such a record until a tombstone replaces it (see :meth:`take_stale`)."""
        self._foreign: dict[tuple[str, str], int] = {}
        """(priority part, key) -> expiry of the records of the other scope restored here (see
        :meth:`restore_foreign`); empty unless the scope changed."""
        self._foreign_due: list[tuple[int, str, str]] = []
        """A heap of the expiries of ``_foreign`` (an entry replaced since is skipped)."""
        self._foreign_held: dict[str, str] = {}
        """Key -> the priority part of the record of the other scope that set its entry (not a
        record of this scope restored after it): only a tombstone of that record removes it."""

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
        return encode_entry(job_id, completed, expires, plain=bool(header & _HEX_ID))

    def put(self, key: str, entry: Entry, now_ms: int) -> None:
        """Set ``key`` to ``entry`` (a restore); an entry expired at ``now_ms`` removes the key."""
        if not self._put(key, entry, now_ms):
            self._stale.append(key)

    def _put(self, key: str, entry: Entry, now_ms: int) -> bool:
        """:meth:`put`, without listing a stale record; False when ``entry`` had expired."""
        value = self._entries.get(key)
        before = None if value is None else _HEADER.unpack_from(value)[0] >> 2
        if entry.expires_at_ms <= now_ms:
            if value is not None:
                del self._entries[key]
            return False
        packed = _pack(entry.job_id, entry.completed, entry.expires_at_ms)
        self._store(key, packed, entry.expires_at_ms, before)
        return True

    def restore_foreign(self, priority: str, key: str, raw: bytes | None, now_ms: int) -> None:
        """Restore the changelog record ``<priority>/<key>`` of the other scope (value ``raw``,
        None for a tombstone).

        It counts as any record, but no write of this table's scope ever replaces it (those
        are keyed by this scope's priority part): the last one of its key is listed for a
        tombstone of its own once it has expired (:meth:`expire_foreign`), or the compacted
        changelog would keep it.
        """
        if raw is None:
            # Only the entry a record of the other scope set: this scope's record restored
            # after it is newer (claimed once the other's had expired, whose tombstone comes
            # from the next expiry pass, so after it in the changelog).
            # And only that record's: one of another priority set it after this one.
            if self._foreign_held.get(key) == priority:
                self.remove(key)
            self._foreign.pop((priority, key), None)
            return
        entry = decode_entry(raw)
        if (
            entry.expires_at_ms <= now_ms
            and key in self._entries
            and self._foreign_held.get(key) != priority
        ):
            pass  # a hold of another priority, over: the entry a later record set stays
        elif self._put(key, entry, now_ms):
            self._foreign_held[key] = priority
        else:
            self._foreign_held.pop(key, None)
        self._foreign[(priority, key)] = expires = entry.expires_at_ms
        heapq.heappush(self._foreign_due, (expires, priority, key))

    def expire_foreign(self, now_ms: int) -> list[tuple[str, str]]:
        """(priority part, key) of the records of the other scope that expired by ``now_ms``."""
        foreign, due = self._foreign, self._foreign_due
        expired: list[tuple[str, str]] = []
        while due and due[0][0] <= now_ms:
            expires, priority, key = heapq.heappop(due)
            if foreign.get((priority, key)) == expires:  # else a later record replaced it
                del foreign[(priority, key)]
                if self._foreign_held.get(key) == priority:
                    del self._foreign_held[key]
                expired.append((priority, key))
        return expired

    def restore(self, key: str, raw: bytes, now_ms: int) -> None:
        """``put(key, decode_entry(raw), now_ms)``: the changelog value ``raw`` restored.

        A restore reads a million of these: a value as :func:`encode_entry` writes it for a
        32-hex job id goes from its bytes to the packed entry without JSON or an
        :class:`Entry`; any other goes through :func:`decode_entry` (ValueError included).
        """
        match = _WRITTEN(raw)
        if match is None:
            entry = decode_entry(raw)
            if self._foreign_held:  # this scope's record replaces what the other's set
                self._foreign_held.pop(key, None)
            self.put(key, entry, now_ms)
            return
        hex_id, completed, expires_text = match.groups()
        expires = check_expiry(int(expires_text))
        if self._foreign_held:
            self._foreign_held.pop(key, None)
        entries = self._entries
        value = entries.get(key)
        if expires <= now_ms:
            if value is not None:
                del entries[key]
            self._stale.append(key)
            return
        before = None if value is None else _HEADER.unpack_from(value)[0] >> 2
        header = expires << 2 | _HEX_ID | (completed == b"1")
        self._store(key, _HEADER.pack(header) + unhexlify(hex_id), expires, before)

    def remove(self, key: str) -> bool:
        """Forget ``key``; False if it was not held."""
        if self._foreign_held:
            self._foreign_held.pop(key, None)
        return self._entries.pop(key, None) is not None

    def take_stale(self) -> list[str]:
        """The keys restored expired since the last call and not held now (a later record or
        a new claim holds the others): their changelog records need a tombstone, or every
        restore after would read them again, for good."""
        stale, self._stale = self._stale, []
        entries = self._entries
        return [key for key in dict.fromkeys(stale) if key not in entries]

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
    own = table is not None and table is tables.get(priority)
    if table is not None:
        targets: Iterable[DedupTable] = (table,)
    elif priority == ANY_PRIORITY and tables:
        targets = tables.values()
    else:
        return False
    for target in targets:  # a malformed value raises at the first, before it changes
        if not own:  # a record of the other scope (written before the scope changed)
            target.restore_foreign(priority, idempotency_key, value, now_ms)
        elif value is None:
            target.remove(idempotency_key)
        else:
            target.restore(idempotency_key, value, now_ms)
    return True
