"""The event loop's side of idempotency keys: check each keyed job at intake, settle it at its end.

A job whose type is registered and that carries an ``idempotency_key`` is checked against the
:class:`pipeline.DedupStore` before it is queued, in offset order. A duplicate (another job has
the key) or a job that already completed is acknowledged without running: its offset finishes
at once. When a checked job ends, the store decides what its key becomes, and the changelog
records this needs go into the worker's transaction *with the job's offset* (through the
:class:`..commit.moves.Mover`), so that either both are committed or neither is: a crash between
the handler and the commit runs the job again, a committed job never runs again for a duplicate.
The records of the jobs that end in one turn of the loop go to the mover together, one
submission per partition: with every job keyed, a submission per job would cost the loop and
the consumer thread more than the records do.

Every call that changes the store's tables is made on the event loop thread; the consumer
thread only loads (installs) and unloads whole partitions (see :class:`pipeline.DedupStore`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from pipeline._dedup import (
    ANY_PRIORITY,
    ChangelogRecord,
    DedupNotLoadedError,
    DedupPolicy,
    DedupScope,
    KeyOutcome,
    Verdict,
    split_changelog_key,
)
from pipeline._dedupstores import DedupStore
from pipeline._job import now_ms
from pipeline._ratelog import RateLimitedLog

from .policy import Record

if TYPE_CHECKING:
    from pipeline import Job, JobType, Priority

    from .._metrics import WorkerMetrics
    from .._work import PartitionState
    from ..commit.moves import Mover

_log = logging.getLogger("pipeline.worker.dedup")

UNEVEN = (
    "the priority topics do not have as many partitions each (%s): under the dedup scope "
    "namespace a key's copies at two priorities may then land on different partition numbers "
    "and both run; give them as many partitions (`pipeline topics apply` grows them alike)"
)

Where = tuple[str, int]
Written = Callable[["PartitionState", list[int], bool], None]
"""Told, on the loop, whether the key records of a partition's offsets are in the transaction."""


class Deduplicator:
    """Checks and settles the idempotency keys of one worker process's jobs."""

    def __init__(
        self,
        store: DedupStore,
        *,
        changelog: str,
        topics: Mapping[Priority, str],
        mover: Mover,
        metrics: WorkerMetrics,
        default_ttl_s: float,
        scope: DedupScope = DedupScope.NAMESPACE,
    ) -> None:
        self.store = store
        self._scope = scope
        self._uneven: dict[str, int] = {}
        """The uneven partition counts last warned of."""
        self._changelog = changelog
        self._topics = {p.value: topic for p, topic in topics.items()}
        self._mover = mover
        self._metrics = metrics
        self._default_ttl_s = default_ttl_s
        self._policies: dict[str, DedupPolicy] = {}
        self._warnings = RateLimitedLog(_log, interval_s=60.0)
        """Jobs whose message key is not their idempotency key, once a minute per topic."""
        self._writes: dict[PartitionState, tuple[list[Record], list[int], Written]] = {}
        """Records written in this turn of the loop, with their offsets and the callback for
        them, by partition."""

    def policy(self, job_type: JobType) -> DedupPolicy:
        policy = self._policies.get(job_type.name)
        if policy is None:
            policy = job_type.options.dedup_policy(self._default_ttl_s)
            self._policies[job_type.name] = policy
        return policy

    def admit(
        self, state: PartitionState, job: Job, job_type: JobType, message_key: bytes | None
    ) -> bool:
        """Whether a job with an idempotency key runs; False: acknowledge it without running.
        ``message_key``: its Kafka message's key, which should be the idempotency key."""
        key = job.idempotency_key
        assert key is not None
        if message_key is None or message_key != key.encode():
            self._misrouted(state, job, message_key)
        policy = self._policies.get(job_type.name) or self.policy(job_type)
        verdict = self.store.check(
            (state.topic, state.partition), key, job.id, policy=policy, now_ms=now_ms()
        )
        if verdict is Verdict.RUN or verdict is Verdict.RETRY:
            return True
        self._metrics.count_dedup(job.type, verdict.value)
        return False

    def _misrouted(self, state: PartitionState, job: Job, message_key: bytes | None) -> None:
        """A job keyed by something else than its idempotency key (a producer other than this
        library's): its copies may land on other partitions, whose tables this one's key is not
        in, and run again. It runs (checked here as any keyed job); the producer is told."""
        self._warnings.warning(
            state.topic,
            "job %s of type %s on %s[%d] has the idempotency key %r but the message key %r: "
            "copies of it sent to other partitions run again; producers must key each job's "
            "message by its idempotency key (docs/wire-format.md)",
            job.id, job.type, state.topic, state.partition, job.idempotency_key, message_key,
        )  # fmt: skip

    def settle(
        self, state: PartitionState, job: Job, job_type: JobType, outcome: KeyOutcome
    ) -> list[Record]:
        """The changelog records for the end of a job that :meth:`admit` let run."""
        key = job.idempotency_key
        assert key is not None
        # A partition being revoked still has its keys loaded while its running jobs finish
        # (the grace period): their offsets are committed on the way out, so their records must
        # be too, or the next owner would run those keys again.
        policy = self._policies.get(job_type.name) or self.policy(job_type)
        try:
            records = self.store.settle(
                (state.topic, state.partition), key, job.id, outcome, policy=policy, now_ms=now_ms()
            )
        except DedupNotLoadedError:
            return []  # given up: the next owner runs it again (its offset is not committed)
        return list(map(self._record, records))  # no comprehension frame: one call a record

    def write(
        self,
        state: PartitionState,
        offset: int,
        records: Sequence[Record],
        done: Written,
    ) -> None:
        """Put ``records`` in the open transaction; ``done(state, offsets, written)`` as for a
        move (the offset stays), once for the offsets of ``state`` written in this turn.

        Submitted to the mover at the end of this turn of the loop, with the other records of
        the partition written in it (on the loop thread, like every call here)."""
        writes = self._writes
        if not writes:
            asyncio.get_running_loop().call_soon(self._submit)
        held = writes.get(state)
        if held is None:
            writes[state] = (list(records), [offset], done)
        else:
            held[0].extend(records)
            held[1].append(offset)

    def _submit(self) -> None:
        writes, self._writes = self._writes, {}
        for state, (records, offsets, done) in writes.items():
            where = (state.topic, state.partition)
            # Tied to ``state``: not written into a later assignment of the partition, which
            # runs these jobs again (their offsets stay unfinished here).
            self._mover.submit(
                where, -1, records, functools.partial(done, state, offsets), move=False, state=state
            )

    def expire(self) -> None:
        """Drop the keys whose time is over and write their tombstones, counting both the
        expired keys and those held. A store that fails is logged, and asked again next time."""
        metrics = self._metrics
        try:
            records = self.store.expire(now_ms())
        except Exception as exc:
            _log.warning("could not expire idempotency keys: %s", exc)
            records = ()
        for record in records:
            wheres = self._wheres(record)
            if wheres:
                self._mover.submit(
                    wheres[0], -1, [self._record(record)], _ignore, move=False, elsewhere=wheres[1:]
                )
        metrics.dedup_expired += len(records)
        size = getattr(self.store, "size", None)
        if isinstance(size, int):
            metrics.dedup_keys = size

    def _record(self, record: ChangelogRecord) -> Record:
        return Record(self._changelog, record.value, record.key, None, record.partition)

    def _wheres(self, record: ChangelogRecord) -> list[Where]:
        """The job partitions whose transaction may carry a changelog record of this worker's
        (the first one owned does, see :meth:`.Mover.submit`): that of its key's priority, or
        for a key of every priority (``*/<key>``) partition p of each topic consumed, as the
        priority topics may not all have a partition p (the worker owns those that do
        together)."""
        try:
            priority, _ = split_changelog_key(record.key)
        except ValueError:
            return []
        partition = record.partition
        if priority == ANY_PRIORITY:
            return [(topic, partition) for topic in self._topics.values()]
        topic = self._topics.get(priority)
        return [(topic, partition)] if topic is not None else []

    def partition_counts(self, counts: Mapping[str, int]) -> None:
        """The consumed topics' partition counts, read again after each assignment change: under
        the namespace scope, a warning when the priority topics do not all have as many."""
        known = {t: counts[t] for t in self._topics.values() if t in counts}
        if self._scope is not DedupScope.NAMESPACE or len(set(known.values())) < 2:
            return
        if known != self._uneven:
            self._uneven = known
            _log.warning(UNEVEN, ", ".join(f"{t}: {n}" for t, n in known.items()))


def _ignore(done: bool) -> None:
    """A tombstone no job partition of its number took: the slot was given up (its keys are
    unloaded), and the tombstone is the next owner's to write, who restores the key and expires
    it in turn (written here, in a later assignment, it could undo a newer record of the key)."""
