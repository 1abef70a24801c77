"""Where workers keep idempotency keys: the store protocol, and the stores built on tables.

The semantics are those of :mod:`._dedup`; :class:`DedupStore` is what an application
implements to keep the keys elsewhere (Redis, Postgres...) and passes as
``Pipeline(dedup_store=...)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeAlias, runtime_checkable

from ._dedup import (
    ANY_PRIORITY,
    UNCHANGED,
    ChangelogRecord,
    DedupNotLoadedError,
    DedupPolicy,
    DedupScope,
    KeyOutcome,
    Verdict,
    Where,
    changelog_key,
    topic_priority,
)
from ._deduptable import DedupTable

__all__ = ["DedupStore", "MemoryDedupStore", "PartitionTables"]


@runtime_checkable
class DedupStore(Protocol):
    """Where a worker keeps the idempotency keys of the partitions it owns.

    The worker calls, for the job partitions (``where`` = (topic, partition)) it owns:

    - :meth:`load` when partitions are assigned, before reading them; it returns once their
      state is ready (a Kafka store restores it; an external store may do nothing).
    - :meth:`check` for each job with an idempotency key, in offset order.
    - :meth:`settle` when such a job ends, unless its verdict was DONE or DUPLICATE. The records
      it returns are written to the changelog topic in the transaction that commits the job's
      offset; a store that keeps its state elsewhere writes it itself and returns ().
    - :meth:`expire` now and then; its records (tombstones) are written like those of settle.
    - :meth:`unload` when partitions are revoked or lost.

    Under ``worker.dedup_scope = "namespace"`` (the default) a key must count once across every
    priority topic: the worker loads partition p of every priority topic it consumes together,
    and a store keeps one key space for them (a store keyed by the idempotency key alone does).

    A store implements the semantics of the :mod:`pipeline._dedup` docstring, as
    :class:`DedupTable` does. Calls for one partition never overlap, and never come before its
    load returned or after its unload (a partition given up while it loads is unloaded once
    its load returned). Load runs on a helper thread of its own, one load at a time, while the
    worker goes on calling unload (for other partitions) and check, settle and expire (on
    other threads): a store's load must be safe beside them. A load that raises is tried
    again after a wait that doubles, from 1 s up to 30 s; the worker does not wait for a load
    still running when it stops. A check that raises runs the job (at least once) and a settle
    that raises leaves the key as it was; both are logged, neither fails the job's run.
    """

    def load(self, partitions: Sequence[Where]) -> None: ...

    def unload(self, partitions: Sequence[Where]) -> None: ...

    def check(
        self, where: Where, key: str, job_id: str, *, policy: DedupPolicy, now_ms: int
    ) -> Verdict: ...

    def settle(
        self,
        where: Where,
        key: str,
        job_id: str,
        outcome: KeyOutcome,
        *,
        policy: DedupPolicy,
        now_ms: int,
    ) -> Sequence[ChangelogRecord]: ...

    def expire(self, now_ms: int) -> Sequence[ChangelogRecord]: ...


Slot: TypeAlias = tuple[str, int]
"""What one table covers: (priority or :data:`ANY_PRIORITY`, partition number)."""


class PartitionTables:
    """A :class:`DedupTable` per slot of the scope, and the changelog records their changes need.

    The check, settle and expire of a :class:`DedupStore`, for stores to build on. Under the
    scope namespace, partition p of every priority topic shares one table (slot ``("*", p)``);
    under the scope priority each job partition has its own. A table lasts while one of its
    partitions is installed. With ``create``, a partition's table is made on first use;
    without, using a partition that was not installed raises :class:`DedupNotLoadedError`.
    Without ``changelog``, no records.
    """

    def __init__(
        self,
        *,
        create: bool = False,
        changelog: bool = True,
        scope: DedupScope = DedupScope.NAMESPACE,
    ) -> None:
        self.scope = scope
        self._tables: dict[Slot, DedupTable] = {}
        self._holders: dict[Slot, set[Where]] = {}
        self._create = create
        self._changelog = changelog
        self._places: dict[Where, tuple[DedupTable, str, int]] = {}
        """Partition -> (its table, its slot): worked out once, not for every key (a check
        and a settle per keyed job); forgotten whenever a table is installed or dropped."""

    @property
    def size(self) -> int:
        """Keys held in all, counting expired ones that expire() has not removed yet."""
        return sum(len(table) for table in list(self._tables.values()))

    def slot(self, where: Where) -> Slot:
        """The slot whose table holds the keys of job partition ``where``."""
        topic, partition = where
        if self.scope is DedupScope.NAMESPACE:
            return ANY_PRIORITY, partition
        return topic_priority(topic), partition

    def table(self, where: Where) -> DedupTable:
        """The table of partition ``where``."""
        slot = self.slot(where)
        table = self._tables.get(slot)
        if table is None:
            if not self._create:
                raise DedupNotLoadedError(where)
            table = self._tables[slot] = DedupTable()
        return table

    def _place(self, where: Where) -> tuple[DedupTable, str, int]:
        """(table, slot priority, slot partition) of ``where``, as :meth:`table` finds it."""
        place = self._places.get(where)
        if place is None:
            label, partition = self.slot(where)
            place = self._places[where] = (self.table(where), label, partition)
        return place

    def install(self, where: Where, table: DedupTable) -> None:
        """Make ``table`` the table of ``where``'s slot (and of the partitions holding it)."""
        self._places.clear()
        slot = self.slot(where)
        self._tables[slot] = table
        self._holders.setdefault(slot, set()).add(where)

    def join(self, where: Where) -> bool:
        """Let ``where`` share the table its slot has already; False when it has none."""
        self._places.clear()
        slot = self.slot(where)
        if slot not in self._tables:
            return False
        self._holders.setdefault(slot, set()).add(where)
        return True

    def drop(self, where: Where) -> None:
        """``where`` is given up; its slot's table goes once no installed partition holds it."""
        self._places.clear()
        slot = self.slot(where)
        holders = self._holders.get(slot)
        if holders is not None:
            holders.discard(where)
            if holders:
                return
            del self._holders[slot]
        self._tables.pop(slot, None)

    def check(
        self, where: Where, key: str, job_id: str, *, policy: DedupPolicy, now_ms: int
    ) -> Verdict:
        return self._place(where)[0].check(key, job_id, now_ms, policy.ttl_ms)

    def settle(
        self,
        where: Where,
        key: str,
        job_id: str,
        outcome: KeyOutcome,
        *,
        policy: DedupPolicy,
        now_ms: int,
    ) -> Sequence[ChangelogRecord]:
        table, label, partition = self._place(where)
        value = table.settle(key, job_id, outcome, policy, now_ms)
        if value is UNCHANGED or not self._changelog:
            return ()
        return (ChangelogRecord(partition, changelog_key(label, key), value),)

    def expire(self, now_ms: int) -> Sequence[ChangelogRecord]:
        records: list[ChangelogRecord] = []
        foreign: dict[tuple[int, bytes], None] = {}
        """Records of the other scope: a ``*/<key>`` one is in every priority's table."""
        for (label, partition), table in list(self._tables.items()):  # a copy: load may add
            expired = table.expire(now_ms) + table.take_stale()
            others = table.expire_foreign(now_ms)
            if self._changelog:
                records += [
                    ChangelogRecord(partition, changelog_key(label, k), None) for k in expired
                ]
                foreign.update(((partition, changelog_key(p, k)), None) for p, k in others)
        records += [ChangelogRecord(partition, key, None) for partition, key in foreign]
        return records


class MemoryDedupStore(PartitionTables):
    """A :class:`DedupStore` in this process's memory, without a changelog.

    For tests and single-process use. Its state is its own, like an external store's: it
    outlives load and unload, and lasts as long as the object.
    """

    def __init__(self, *, scope: DedupScope = DedupScope.NAMESPACE) -> None:
        super().__init__(create=True, changelog=False, scope=scope)

    def load(self, partitions: Sequence[Where]) -> None:
        return None

    def unload(self, partitions: Sequence[Where]) -> None:
        return None
